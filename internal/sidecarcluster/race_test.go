package sidecarcluster_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	. "github.com/onsi/gomega"

	"github.com/druid-stretch/druid-stretch/internal/planner"
	"github.com/druid-stretch/druid-stretch/internal/sidecarcluster"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// logBook keeps a process's log lines.
type logBook struct {
	mu    sync.Mutex
	lines []string
}

func (b *logBook) logger(t *testing.T, name string) logr.Logger {
	return funcr.New(func(prefix, args string) {
		b.mu.Lock()
		b.lines = append(b.lines, args)
		b.mu.Unlock()
		t.Logf("%s: %s %s", name, prefix, args)
	}, funcr.Options{})
}

// matching returns the lines that match re.
func (b *logBook) matching(re string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for _, l := range b.lines {
		if regexp.MustCompile(re).MatchString(l) {
			out = append(out, l)
		}
	}
	return out
}

func (b *logBook) has(substr string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, l := range b.lines {
		if strings.Contains(l, substr) {
			return true
		}
	}
	return false
}

// TestTwoProcessesRaceForOneMove runs two controller processes of the same
// holder (as when a controller restarts while its predecessor still runs)
// against one move: b-0 replaces a-0. The first takes the lock and plans
// its first change; the second takes the lock over before that change is
// sent; the first's change is refused for its stale token, changes nothing,
// and is logged; then both race freely to the end. Every step is applied
// exactly once, all by the second process.
func TestTwoProcessesRaceForOneMove(t *testing.T) {
	testbin.Need(t)
	tc := startCluster(t, "a", 3)
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	const holder = "seed-b"
	var logsX, logsY logBook
	x := tc.newCluster(holder, func(c *sidecarcluster.Config) { c.Logger = logsX.logger(t, "x") })
	y := tc.newCluster(holder, func(c *sidecarcluster.Config) { c.Logger = logsY.logger(t, "y") })
	g.Expect(x.Token()).NotTo(Equal(y.Token()), "a token per process")
	// a-0 leads, so the move has four steps: leadership leaves it first.
	b0, eps, target := tc.replaceLeader(ctx, g)
	plan := func(c *sidecarcluster.Cluster, progress *sidecarcluster.Progress) (*sidecarcluster.Observation, sidecarcluster.Plan) {
		obs, err := c.Observe(ctx, eps, sidecarcluster.Hint{Departing: []string{"a-0"}})
		g.Expect(err).NotTo(HaveOccurred())
		return obs, c.Plan(obs, target, progress, nil, planner.Policy{})
	}
	progX, progY := sidecarcluster.NewProgress(nil), sidecarcluster.NewProgress(nil)

	// x takes the lock, then plans its first change under it.
	_, err := sidecar.NewClient(tc.Members[1].SidecarURL, tc.ClientTLS).AcquireLock(ctx, holder, x.Token(), time.Minute)
	g.Expect(err).NotTo(HaveOccurred())
	obsX, planX := plan(x, progX)
	g.Expect(obsX.LockedBy(holder, x.Token())).To(BeTrue())
	g.Expect(planX.Step.Kind).To(Equal(planner.AddLearner))
	// y takes the lock over before x's change goes out.
	obs, p := plan(y, progY)
	g.Expect(y.Execute(ctx, obs, eps, p).Reason).To(Equal(sidecarcluster.ReasonLockAcquired), "the newer process takes its holder's lock over")
	before := tc.memberList(g)
	stale := x.Execute(ctx, obsX, eps, planX)
	g.Expect(stale.Outcome).To(Equal(sidecarcluster.Refused), "%v", stale.Err)
	g.Expect(stale.Reason).To(Equal(sidecar.ReasonStaleToken))
	g.Expect(tc.memberList(g)).To(Equal(before), "the stale change changed nothing")
	g.Expect(logsX.has("fenced off")).To(BeTrue(), "the refusal is logged by the fenced process")

	// Both race to the end; the joiner starts once either added it.
	var (
		mu      sync.Mutex
		applied = map[string][]string{}
		wg      sync.WaitGroup
	)
	run := func(name string, c *sidecarcluster.Cluster, progress *sidecarcluster.Progress) {
		defer wg.Done()
		for ctx.Err() == nil {
			obs, err := c.Observe(ctx, eps, sidecarcluster.Hint{Departing: []string{"a-0"}})
			if err != nil {
				continue
			}
			p := c.Plan(obs, target, progress, nil, planner.Policy{})
			switch p.Step.Kind {
			case planner.Done:
				_ = c.ReleaseLock(ctx, obs)
				return
			case planner.Wait:
				mu.Lock()
				startJoiner(ctx, g, tc, b0)
				mu.Unlock()
				time.Sleep(200 * time.Millisecond) // the poll interval of this loop
				continue
			}
			res := c.Execute(ctx, obs, eps, p)
			if res.Reason == sidecarcluster.ReasonFenced {
				return
			}
			if res.Outcome == sidecarcluster.Succeeded && res.Changed {
				mu.Lock()
				applied[string(p.Step.Kind)+" "+p.Step.Member] = append(applied[string(p.Step.Kind)+" "+p.Step.Member], name)
				mu.Unlock()
			}
		}
	}
	wg.Add(2)
	go run("x", x, progX)
	go run("y", y, progY)
	wg.Wait()
	g.Expect(ctx.Err()).NotTo(HaveOccurred(), "the move ended in time")

	g.Expect(applied).To(HaveLen(4), "add, promote, move leader and remove: %v", applied)
	for step, by := range applied {
		g.Expect(by).To(Equal([]string{"y"}), "%s is applied exactly once, by the process that holds the lock", step)
	}
	// Each change's log line says where its time went: the observation
	// it was planned from, until the step began, before the call, the call.
	executed := logsY.matching(`"membership step executed"`)
	g.Expect(executed).To(HaveLen(4), "a line per change")
	for _, l := range executed {
		g.Expect(l).To(MatchRegexp(`"observedVia"="[ab]-\d" "observeSeconds"=\d+(\.\d+)? "sinceObservedSeconds"=-?\d+(\.\d+)? "prepareSeconds"=\d+(\.\d+)? "callSeconds"=\d+(\.\d+)?$`))
	}
	final := strings.Join(tc.memberList(g), " ")
	g.Expect(final).To(And(ContainSubstring(":a-1:voter"), ContainSubstring(":a-2:voter"), ContainSubstring(":b-0:voter"), Not(ContainSubstring(":a-0:"))), fmt.Sprint(final))
}
