package sidecarcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/druid-stretch/druid-stretch/internal/planner"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// callLog records what the test's sidecars were asked, safe for their
// concurrent handlers.
type callLog struct {
	mu    sync.Mutex
	calls []string
}

func (l *callLog) add(call string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls = append(l.calls, call)
}

func (l *callLog) list() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.calls)
}

// A removal waits for the member's clients to be drained only when its
// sidecar answers: a sidecar without a gate, or one that cannot be reached
// (the member's pod is gone), must not keep a member in the cluster.
func TestDrainBeforeRemoval(t *testing.T) {
	g := NewWithT(t)
	c, err := New(Config{Holder: "test"})
	g.Expect(err).NotTo(HaveOccurred())
	answer := func(code int, body string) string {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			_, _ = w.Write([]byte(body))
		}))
		t.Cleanup(s.Close)
		return s.URL
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	g.Expect(err).NotTo(HaveOccurred())
	unreachable := "http://" + l.Addr().String()
	g.Expect(l.Close()).To(Succeed())

	for _, tc := range []struct {
		name, url string
		postponed bool
	}{
		{"drained", answer(http.StatusOK, `{"ready":false,"inFlight":0}`), false},
		{"no gate", answer(http.StatusNotFound, `{"reason":"NoClientGate","message":"no gate"}`), false},
		{"refused", answer(http.StatusServiceUnavailable, `{"reason":"EtcdUnavailable","message":"still in flight"}`), true},
		{"unreachable", unreachable, false},
	} {
		d, err := c.drainClients(context.Background(), []Endpoint{{Member: "m-1", URL: "http://127.0.0.1:1"}, {Member: "m-0", URL: tc.url}}, "m-0", "a0")
		d.end(true)
		if tc.postponed {
			g.Expect(err).To(MatchError(ContainSubstring("draining the clients of m-0")), tc.name)
		} else {
			g.Expect(err).NotTo(HaveOccurred(), tc.name)
		}
	}
}

// A member drained for a removal that then did not happen (etcd refused the
// promotion sent with it) answers no poll again, yet votes: the planner
// goes on with the move instead of waiting for it forever, and only for a
// member this Cluster drained whose raft is connected.
func TestDrainedDepartingVoterHoldsNoMove(t *testing.T) {
	g := NewWithT(t)
	drainedGate := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"ready":false,"inFlight":0}`))
	}))
	t.Cleanup(drainedGate.Close)
	now := time.Now()
	member := func(id, name string, learner, leader bool) sidecar.Member {
		return sidecar.Member{ID: id, Name: name, PeerURLs: []string{"https://" + name + ":2380"}, ClientURLs: []string{"https://" + name + ":2379"},
			IsLearner: learner, IsLeader: leader, Healthy: true, HealthyForSeconds: 60, ConnectedForSeconds: 60}
	}
	// A hold-source move at its tie: two source voters (a-1's gate
	// drained, its poll refused), one destination voter, one caught-up
	// destination learner.
	a1 := member("a1", "a-1", false, false)
	a1.Healthy, a1.HealthyForSeconds, a1.Error = false, 0, "connection error: dial tcp 10.244.0.4:2379: connect: connection refused"
	list := &sidecar.MemberList{TransportOf: "a0", Retired: []sidecar.RetiredMember{}, Members: []sidecar.Member{
		member("a0", "a-0", false, true), a1, member("b3", "b-3", false, false), member("b4", "b-4", true, false)}}
	target := Target{
		Add:    []planner.Want{{Name: "b-3", PeerURLs: []string{"https://b-3:2380"}, Side: "b"}, {Name: "b-4", PeerURLs: []string{"https://b-4:2380"}, Side: "b"}},
		Remove: []string{"a-0", "a-1"},
		Side:   func(string) string { return "a" },
	}
	plan := func(c *Cluster, connected float64) Plan {
		l := *list
		l.Members = slices.Clone(list.Members)
		l.Members[1].ConnectedForSeconds = connected
		return c.Plan(&Observation{List: &l, At: now}, target, NewProgress(nil), nil, planner.Policy{MinHealthyFor: 5 * time.Second, MaxLearners: 1})
	}

	untouched, err := New(Config{Holder: "test"})
	g.Expect(err).NotTo(HaveOccurred())
	p := plan(untouched, 60)
	g.Expect(p.Step.Kind).To(Equal(planner.Wait), "a voter that misses a poll is waited for: %s", p.Step)
	g.Expect(p.Step.Reason).To(ContainSubstring("departing voter a-1"))

	c, err := New(Config{Holder: "test"})
	g.Expect(err).NotTo(HaveOccurred())
	d, err := c.drainClients(context.Background(), []Endpoint{{Member: "a-1", URL: drainedGate.URL}}, "a-1", "A1")
	g.Expect(err).NotTo(HaveOccurred())
	d.end(true)
	p = plan(c, 60)
	g.Expect(p.Step.Kind).To(Equal(planner.Promote), "%s", p.Step)
	g.Expect(p.Step.Member).To(Equal("b-4"))
	g.Expect(p.ThenRemove).NotTo(BeNil(), "the promotion makes the tie; a removal ends it")
	g.Expect(p.ThenRemove.Member).To(HavePrefix("a-"))
	in := p.Input.Members[1]
	g.Expect(in.Healthy).To(BeTrue())
	g.Expect(in.Problem).To(ContainSubstring("drained for its removal"))

	// Not connected: not known to vote, so it is not counted as healthy.
	p = plan(c, 0)
	g.Expect(p.Input.Members[1].Healthy).To(BeFalse())
}

// The gates of the transferee's side are held only once the other side's
// have answered: their clients are served first after the transfer, and
// each hold stalls its clients from the moment it arrives.
func TestHoldTheTransfereeSideLast(t *testing.T) {
	g := NewWithT(t)
	c, err := New(Config{Holder: "test"})
	g.Expect(err).NotTo(HaveOccurred())
	var events callLog
	note := events.add
	gate := func(name string, delay time.Duration) string {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			if r.URL.Path == "/v1/clients/hold" {
				note(r.Method + " " + name)
				if r.Method == http.MethodPost {
					// A hold answers once the calls in flight at its
					// gate are answered: here, after delay.
					time.Sleep(delay)
					note("held " + name)
				}
				_, _ = w.Write([]byte(`{"ready":true,"inFlight":0}`))
				return
			}
			_, _ = w.Write([]byte(`{}`))
		}))
		t.Cleanup(s.Close)
		return s.URL
	}
	in := planner.Observed{Members: []planner.Member{
		{ID: "a0", Name: "m-0", Side: "a"}, {ID: "a1", Name: "m-1", Side: "a"}, {ID: "b3", Name: "m-3", Side: "b"},
	}}
	endpoints := []Endpoint{{Member: "m-3", URL: gate("m-3", 0)}, {Member: "m-0", URL: gate("m-0", 100*time.Millisecond)}, {Member: "m-1", URL: gate("m-1", 0)}}

	release := c.holdClients(context.Background(), endpoints, "b3", onSideOf(in, "b3"))
	held := events.list()
	release()

	g.Expect(held).To(HaveLen(6))
	g.Expect(held[4:]).To(Equal([]string{"POST m-3", "held m-3"}), "the transferee's side is held last, after %v", held[:4])
	g.Expect(held[:4]).To(ContainElements("POST m-0", "held m-0", "POST m-1", "held m-1"))
	g.Expect(events.list()[6:]).To(ConsistOf("DELETE m-0", "DELETE m-1", "DELETE m-3"), "release ends every hold")
}

// Only the gates of the voters that may serve clients are held: the sidecar of
// a pod whose etcd is not a member yet has no clients, and one still
// starting may take the connection and answer nothing, which held the
// transfer back for a TLS handshake timeout (10 s) in an end-to-end run;
// a learner has no clients either, nor a voter not published yet, whose
// hold waits out the call's timeout while the gates already held keep
// their clients waiting.
func TestOnlyServingVotersGatesAreHeld(t *testing.T) {
	g := NewWithT(t)
	c, err := New(Config{Holder: "test"})
	g.Expect(err).NotTo(HaveOccurred())
	var calls callLog
	gate := func(name string) string {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			lock := ""
			if strings.HasPrefix(r.URL.Path, "/v1/clients/") {
				// The sidecar holds a member's clients only for the lock's holder.
				lock = " " + r.Header.Get(sidecar.HeaderLockHolder) + "/" + r.Header.Get(sidecar.HeaderLockToken)
			}
			calls.add(r.Method + " " + r.URL.Path + " " + name + lock)
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"ready":true,"inFlight":0}`))
		}))
		t.Cleanup(s.Close)
		return s.URL
	}
	published := []string{"https://m.example:2379"}
	obs := &Observation{List: &sidecar.MemberList{Members: []sidecar.Member{
		{ID: "a0", Name: "m-0", ClientURLs: published, Healthy: true},
		{ID: "b3", Name: "m-3", ClientURLs: published, Healthy: true},
		{ID: "b4", Name: "m-4", ClientURLs: published, IsLearner: true, Healthy: true},
		{ID: "b6", Name: "m-6", Unanswered: true},                        // promoted, not published yet
		{ID: "b7", Name: "m-7", ClientURLs: published, Unanswered: true}, // published; its last poll timed out
	}}}
	endpoints := []Endpoint{{Member: "m-0", URL: gate("m-0")}, {Member: "m-3", URL: gate("m-3")}, {Member: "m-4", URL: gate("m-4")}, {Member: "m-5", URL: gate("m-5")}, {Member: "m-6", URL: gate("m-6")}, {Member: "m-7", URL: gate("m-7")}}

	release := c.holdClients(context.Background(), servingVoters(obs, endpoints), "b3", func(e Endpoint) bool { return e.Member == "m-3" })
	release()

	called := calls.list()
	lock := " test/" + c.Token()
	g.Expect(called).To(ContainElements("POST /v1/clients/hold m-0"+lock, "POST /v1/clients/hold m-3"+lock, "DELETE /v1/clients/hold m-0"+lock, "DELETE /v1/clients/hold m-3"+lock),
		"every hold and release carries the lock headers")
	g.Expect(called).To(ContainElement("POST /v1/clients/hold m-7"+lock), "a published voter whose poll failed may still have clients")
	g.Expect(called).NotTo(ContainElement(ContainSubstring(" m-5")), "the sidecar of a pod that is no member is not called")
	g.Expect(called).NotTo(ContainElement(ContainSubstring(" m-4")), "a learner's sidecar is not called: no client reaches a learner, and etcd serves it no lock read")
	g.Expect(called).NotTo(ContainElement(ContainSubstring(" m-6")), "nor the sidecar of a voter not published yet: it serves no client, and its lock read would wait on its etcd")
}

// The connections are warmed before the hold with a call the sidecar
// answers at once: its /readyz asks its etcd member, which a member that
// does not serve yet answers only when the read times out.
func TestWarmingAsksNoMember(t *testing.T) {
	g := NewWithT(t)
	c, err := New(Config{Holder: "test"})
	g.Expect(err).NotTo(HaveOccurred())
	var calls callLog
	release := make(chan struct{})
	defer close(release)
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.add(r.Method + " " + r.URL.Path)
		if r.URL.Path == "/readyz" {
			<-release // a member that does not answer
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":"ok"}`))
	}))
	t.Cleanup(s.Close)

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	c.warmConnections(ctx, []Endpoint{{Member: "m-4", URL: s.URL}})
	g.Expect(ctx.Err()).NotTo(HaveOccurred())
	g.Expect(calls.list()).To(Equal([]string{"GET /healthz"}))
}

// A sidecar that only answered an observation later than another (one
// across sites always does) is asked after the others for a while, like
// a failed one, but a step that belongs at the leader's sidecar still
// goes there; a call that failed keeps it from steps.
func TestOvertakenIsNotAnError(t *testing.T) {
	g := NewWithT(t)
	c, err := New(Config{Holder: "test"})
	g.Expect(err).NotTo(HaveOccurred())
	far, broken := Endpoint{Member: "a-0", URL: "https://a-0"}, Endpoint{Member: "a-1", URL: "https://a-1"}

	c.noteOvertaken(far)
	g.Expect(c.failedRecently(far)).To(BeTrue(), "asked after the others")
	g.Expect(c.erredRecently(far)).To(BeFalse(), "no call to it failed")

	c.noteFailure(broken, true)
	c.noteOvertaken(broken)
	g.Expect(c.erredRecently(broken)).To(BeTrue(), "an error stays one when the sidecar is also overtaken")

	c.noteFailure(far, false)
	g.Expect(c.failedRecently(far)).To(BeFalse(), "an answer clears it")
}

// A drain made for a removal is renewed while the step runs, with the
// lock's holder and token, and undone when the step ends without the
// removal; one whose removal happened is left to its sidecar.
func TestDrainIsRenewedThenUndone(t *testing.T) {
	g := NewWithT(t)
	defer func(d time.Duration) { drainRenewal = d }(drainRenewal)
	drainRenewal = 50 * time.Millisecond
	var calls callLog
	gate := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body sidecar.ClientDrain
		_ = json.NewDecoder(r.Body).Decode(&body)
		calls.add(fmt.Sprintf("%s %s %v %v %s/%s", r.Method, r.URL.Path, body.Seconds, body.Renew, r.Header.Get(sidecar.HeaderLockHolder), r.Header.Get(sidecar.HeaderLockToken)))
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"ready":false,"inFlight":0}`))
	}))
	t.Cleanup(gate.Close)
	c, err := New(Config{Holder: "test"})
	g.Expect(err).NotTo(HaveOccurred())
	drainCall := fmt.Sprintf("POST /v1/clients/drain %v false test/%s", DrainLease.Seconds(), c.Token())
	renewCall := fmt.Sprintf("POST /v1/clients/drain %v true test/%s", DrainLease.Seconds(), c.Token())
	undoCall := fmt.Sprintf("DELETE /v1/clients/drain 0 false test/%s", c.Token())

	for _, removed := range []bool{false, true} {
		calls = callLog{}
		d, err := c.drainClients(context.Background(), []Endpoint{{Member: "m-0", URL: gate.URL}}, "m-0", "a0")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(c.wasDrained("a0", time.Now())).To(BeTrue())
		time.Sleep(8 * drainRenewal)
		d.end(removed)
		got := calls.list()
		time.Sleep(3 * drainRenewal)
		g.Expect(calls.list()).To(Equal(got), "no renewal after the step ended")
		g.Expect(got[0]).To(Equal(drainCall))
		if removed {
			g.Expect(got[1:]).To(HaveEach(renewCall), "the drain, then its renewals; no undo")
			g.Expect(c.wasDrained("a0", time.Now())).To(BeTrue())
		} else {
			g.Expect(got[len(got)-1]).To(Equal(undoCall), "the undo comes last")
			g.Expect(got[1 : len(got)-1]).To(HaveEach(renewCall))
			g.Expect(c.wasDrained("a0", time.Now())).To(BeFalse(), "an undone drain is forgotten")
		}
		g.Expect(len(got)).To(BeNumerically(">=", 4), "renewed while the step ran: %v", got)
	}
}

// Which step results keep the departing member drained: those whose
// removal happened or may have happened.
func TestDrainKept(t *testing.T) {
	g := NewWithT(t)
	remove := Plan{Step: planner.Step{Kind: planner.Remove, Member: "a-1"}}
	tie := Plan{Step: planner.Step{Kind: planner.Promote, Member: "b-1"}, ThenRemove: &planner.Step{Kind: planner.Remove, Member: "a-1"}}
	for _, tc := range []struct {
		name string
		plan Plan
		res  Result
		kept bool
	}{
		{"removed", remove, Result{Outcome: Succeeded}, true},
		{"removal refused", remove, Result{Outcome: Refused}, false},
		{"removal to retry", remove, Result{Outcome: Retry}, false},
		{"removal of unknown outcome", remove, Result{Outcome: Uncertain}, true},
		{"promoted and removed", tie, Result{Outcome: Succeeded, ThenRemoved: true}, true},
		{"promoted, the removal refused", tie, Result{Outcome: Succeeded}, false},
		{"the promotion refused", tie, Result{Outcome: Retry}, false},
		{"the promotion of unknown outcome", tie, Result{Outcome: Uncertain}, true},
	} {
		g.Expect(drainKept(tc.plan, tc.res)).To(Equal(tc.kept), tc.name)
	}
}
