package apiload_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"k8s.io/client-go/rest"

	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
	"github.com/druid-stretch/druid-stretch/internal/testing/workload"
	"github.com/druid-stretch/druid-stretch/test/framework/apiload"
)

// transportCounter counts the workload's HTTP requests (not /readyz
// probes) on one server's connection, independently of what the load
// records, and may hold each one for delay first, so that requests are in
// flight most of the time.
type transportCounter struct {
	delay time.Duration

	mu       sync.Mutex
	started  int
	inflight int
}

// config is cfg with every request through it counted by c.
func (c *transportCounter) config(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
			if req.URL.Path == "/readyz" {
				return rt.RoundTrip(req)
			}
			c.mu.Lock()
			c.started++
			c.inflight++
			c.mu.Unlock()
			defer func() {
				c.mu.Lock()
				c.inflight--
				c.mu.Unlock()
			}()
			time.Sleep(c.delay)
			return rt.RoundTrip(req)
		})
	})
	return cfg
}

func (c *transportCounter) counts() (started, inflight int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.started, c.inflight
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// served counts the acknowledged writes and answered reads served by
// server for origin's clients ("" for the server's own) that were called
// at or after since.
func served(l *apiload.Load, server, origin string, since time.Duration) (writes, reads int) {
	for _, r := range l.Requests() {
		if r.Server != server || r.Origin != origin || r.Call < since {
			continue
		}
		switch {
		case r.Acknowledged():
			writes++
		case r.Kind == workload.Read && !r.Failed():
			reads++
		}
	}
	return writes, reads
}

// sinceStart is now on the load's clock.
func sinceStart(l *apiload.Load) time.Duration { return time.Since(l.StartedAt()) }

func TestSwitchMovesClients(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	_, cfg := startEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	// Two connections to the same kube-apiserver (so one etcd, one
	// history), told apart by their transports; site-a's is slow, so
	// requests through it are in flight when the switch comes.
	viaA, viaB := &transportCounter{delay: 30 * time.Millisecond}, &transportCounter{}
	l := newLoad(t, apiload.Options{
		Servers:   []apiload.Server{{Name: "site-a", Config: viaA.config(cfg)}, {Name: "site-b", Config: viaB.config(cfg)}},
		Namespace: "switch",
	})
	g.Expect(l.Start(ctx)).To(Succeed())
	for _, s := range []string{"site-a", "site-b"} {
		g.Eventually(func() int { return acknowledged(l, s) }).WithTimeout(time.Minute).Should(BeNumerically(">=", 50))
	}

	begin := time.Now()
	g.Expect(l.Switch(ctx, "site-a", "site-b")).To(Succeed())
	switched := sinceStart(l)
	startedViaA, inflightViaA := viaA.counts()
	t.Logf("Switch took %s", time.Since(begin))
	// Switch returned: nothing of the workload is on site-a's connection.
	g.Expect(inflightViaA).To(BeZero())

	// site-a's clients go on, through site-b, on their own objects.
	g.Eventually(func() int {
		n := 0
		for _, r := range l.Requests() {
			if r.Server == "site-b" && r.Origin == "site-a" && r.Acknowledged() && r.Call >= switched &&
				strings.HasPrefix(r.Object, "switch/apiload-site-a-") {
				n++
			}
		}
		return n
	}).WithTimeout(time.Minute).Should(BeNumerically(">=", 100))
	g.Eventually(func() int { _, reads := served(l, "site-b", "site-a", switched); return reads }).WithTimeout(time.Minute).Should(BeNumerically(">", 0))
	g.Eventually(func() int { writes, _ := served(l, "site-b", "", switched); return writes }).WithTimeout(time.Minute).Should(BeNumerically(">", 0))
	// Long enough after the switch that site-a's write gap would show it
	// if it counted past the switch.
	g.Eventually(func() time.Duration { return sinceStart(l) - switched }).WithTimeout(time.Minute).Should(BeNumerically(">", 2*time.Second))
	l.Stop()

	for _, r := range l.Requests() {
		if r.Server == "site-a" {
			g.Expect(r.Call).To(BeNumerically("<", switched), "request through site-a called after the switch: %+v", r)
		}
		if r.Origin != "" {
			g.Expect(r.Origin).To(Equal("site-a"))
			g.Expect(r.Server).To(Equal("site-b"))
		}
	}
	startedNow, _ := viaA.counts()
	g.Expect(startedNow).To(Equal(startedViaA), "requests sent on site-a's connection after Switch returned")

	r, err := l.Results(ctx, apiload.VerifyOptions{LinearizabilityTimeout: time.Minute})
	g.Expect(err).NotTo(HaveOccurred())
	t.Log("\n" + r.String())
	a, b := r.Servers[0], r.Servers[1]
	g.Expect(a.SwitchedTo).To(Equal("site-b"))
	g.Expect(a.SwitchedAt).To(BeNumerically("<=", switched))
	g.Expect(a.String()).To(ContainSubstring(", switched to site-b at "))
	g.Expect(a.MaxWriteGap).To(BeNumerically("<", stall), "the switch stalled no writer")
	g.Expect(b.SwitchedTo).To(BeEmpty())
	g.Expect(r.Total.Failed).To(BeZero(), "failed requests: %v", r.Total.FailedErrors)
	g.Expect(r.Total.Writes).To(Equal(a.Writes + b.Writes))
	g.Expect(r.Linearizable).To(BeTrue(), r.LinearizabilityResult)
	g.Expect(r.LostAcknowledgedWrites).To(BeZero())
	g.Expect(r.UnverifiedWrites).To(BeZero())
	g.Expect(switchMarks(r)).To(Equal([]string{"switch site-a -> site-b"}))
}

func TestSwitchRejects(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	_, cfg := startEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	down := &rest.Config{Host: "https://" + freeAddress(t)}
	l := newLoad(t, apiload.Options{
		Servers:   []apiload.Server{{Name: "site-a", Config: cfg}, {Name: "site-b", Config: cfg}, {Name: "down", Config: down}},
		Namespace: "switch-rejects",
	})
	g.Expect(l.Switch(ctx, "site-a", "site-b")).To(MatchError(ContainSubstring("before Start")))
	g.Expect(l.Start(ctx)).To(Succeed())
	for _, s := range []string{"site-a", "site-b"} {
		g.Eventually(func() int { return acknowledged(l, s) }).WithTimeout(time.Minute).Should(BeNumerically(">=", 20))
	}

	canceled, cancelNow := context.WithCancel(ctx)
	cancelNow()
	for _, c := range []struct {
		from, to, err string
	}{
		{"site-x", "site-b", `unknown server "site-x" (servers: site-a, site-b, down)`},
		{"site-a", "site-y", `unknown server "site-y"`},
		{"site-a", "site-a", "from site-a to itself"},
		{"site-a", "down", "down never answered /readyz with 200"},
	} {
		g.Expect(l.Switch(ctx, c.from, c.to)).To(MatchError(ContainSubstring(c.err)), "%s -> %s", c.from, c.to)
	}
	g.Expect(l.Switch(canceled, "site-a", "site-b")).To(MatchError(context.Canceled))

	// Nothing changed: each server still serves its own clients, and only
	// its own.
	rejected := sinceStart(l)
	for _, s := range []string{"site-a", "site-b"} {
		g.Eventually(func() int { writes, _ := served(l, s, "", rejected); return writes }).WithTimeout(time.Minute).Should(BeNumerically(">=", 20))
	}
	for _, r := range l.Requests() {
		g.Expect(r.Origin).To(BeEmpty())
		g.Expect(r.Server).NotTo(Equal("down"))
	}

	// down's goroutines, still waiting for down's readiness, start through
	// site-a once switched there.
	g.Expect(l.Switch(ctx, "down", "site-a")).To(Succeed())
	g.Eventually(func() int { writes, _ := served(l, "site-a", "down", 0); return writes }).WithTimeout(time.Minute).Should(BeNumerically(">=", 20))
	g.Expect(l.Switch(ctx, "down", "site-b")).To(MatchError(ContainSubstring("down was switched to site-a already")))
	g.Expect(l.Switch(ctx, "site-b", "down")).To(MatchError(ContainSubstring("down was switched to site-a already, its clients no longer reach it")))
	// site-b's clients were never moved.
	since := sinceStart(l)
	g.Eventually(func() int { writes, _ := served(l, "site-b", "", since); return writes }).WithTimeout(time.Minute).Should(BeNumerically(">=", 20))
	l.Stop()
	g.Expect(l.Switch(ctx, "site-a", "site-b")).To(MatchError(ContainSubstring("after Stop")))

	for _, r := range l.Requests() {
		g.Expect(r.Server).NotTo(Equal("down"))
		if r.Origin != "" {
			g.Expect(r.Origin).To(Equal("down"))
			g.Expect(r.Server).To(Equal("site-a"))
		}
	}
	r, err := l.Results(ctx, apiload.VerifyOptions{LinearizabilityTimeout: time.Minute})
	g.Expect(err).NotTo(HaveOccurred())
	t.Log("\n" + r.String())
	d := r.Servers[2]
	g.Expect(d.BecameReady).To(BeFalse())
	g.Expect(d.SwitchedTo).To(Equal("site-a"))
	g.Expect(d.Writes + d.Reads + d.Failed).To(BeZero())
	g.Expect(d.String()).To(MatchRegexp(`never ready, switched to site-a at \d+\.\d s$`))
	g.Expect(r.Servers[0].SwitchedTo).To(BeEmpty())
	g.Expect(r.Servers[1].SwitchedTo).To(BeEmpty())
	g.Expect(r.Total.Failed).To(BeZero(), "failed requests: %v", r.Total.FailedErrors)
	g.Expect(r.Linearizable).To(BeTrue(), r.LinearizabilityResult)
	g.Expect(r.LostAcknowledgedWrites).To(BeZero())
	g.Expect(r.UnverifiedWrites).To(BeZero())
	g.Expect(switchMarks(r)).To(Equal([]string{"switch down -> site-a"}))
}

// switchMarks are the names of the switch marks, in time order.
func switchMarks(r apiload.Results) []string {
	var out []string
	for _, m := range r.Marks {
		if strings.HasPrefix(m.Name, "switch ") {
			out = append(out, m.Name)
		}
	}
	return out
}
