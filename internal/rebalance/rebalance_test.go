package rebalance_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/druid-stretch/druid-stretch/internal/planner"
	"github.com/druid-stretch/druid-stretch/internal/rebalance"
	"github.com/druid-stretch/druid-stretch/internal/testing/localetcd"
	"github.com/druid-stretch/druid-stretch/internal/testing/localetcd/etcdtest"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
	"github.com/druid-stretch/druid-stretch/internal/testing/workload"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// testCluster is a real 3-member etcd cluster a-0..a-2 with TLS and an
// in-process sidecar per member, and three more members b-0..b-2 reserved
// (ports, certificates, sidecar port) but not started: the target.
type testCluster struct {
	*etcdtest.Cluster
	t        *testing.T
	old, new []*localetcd.Member
}

func startCluster(t *testing.T) *testCluster {
	t.Helper()
	tc := &testCluster{t: t, Cluster: etcdtest.Start(t, etcdtest.Options{Names: etcdtest.Numbered("a", 3), ClientName: "rebalance-operator"})}
	tc.old = tc.Members
	for _, name := range etcdtest.Numbered("b", 3) {
		m, err := tc.Runtime.NewMember(name, localetcd.MemberOptions{})
		if err != nil {
			t.Fatalf("reserving %s: %v", name, err)
		}
		tc.new = append(tc.new, m)
	}
	return tc
}

// spec is the move a-0..a-2 (group a) to b-0..b-2 (group b).
func (tc *testCluster) spec() rebalance.Spec {
	s := rebalance.Spec{Groups: map[string][]string{"a": {"a-0", "a-1", "a-2"}}}
	for _, m := range append(slices.Clone(tc.old), tc.new...) {
		s.Sidecars = append(s.Sidecars, rebalance.Sidecar{Member: m.Name, URL: m.SidecarURL})
	}
	for _, m := range tc.new {
		s.Target = append(s.Target, rebalance.TargetMember{Name: m.Name, PeerURLs: []string{m.PeerURL}, Group: "b"})
	}
	return s
}

// memberList is etcd's member list read directly, "id:name:role" sorted,
// to compare before and after.
func (tc *testCluster) memberList(g Gomega) []string {
	var out []string
	for _, m := range tc.MemberList(g) {
		role := "voter"
		if m.IsLearner {
			role = "learner"
		}
		out = append(out, fmt.Sprintf("%x:%s:%s", m.ID, m.Name, role))
	}
	slices.Sort(out)
	return out
}

// members lists the cluster through any running member's sidecar.
func (tc *testCluster) members(ctx context.Context) (*sidecar.MemberList, error) {
	var last error
	for _, m := range tc.Runtime.Members() {
		if !m.Running() {
			continue
		}
		callCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
		list, err := sidecar.NewClient(m.SidecarURL, tc.ClientTLS).Members(callCtx)
		cancel()
		if err == nil {
			return list, nil
		}
		last = err
	}
	return nil, fmt.Errorf("no sidecar answered: %v", last)
}

// operator plays the person running rebalance: it watches the member list
// through the sidecars and starts a target member's etcd once its learner
// has been added, with the initial cluster etcd wants of a joining member.
type operator struct {
	mu      sync.Mutex
	started []string
	errs    []error
	// starting names the member whose start has not returned yet: a
	// member joined from a snapshot serves clients seconds after its raft
	// connects, and the planner may finish the move in between.
	starting string
}

func (tc *testCluster) playOperator(ctx context.Context) *operator {
	op := &operator{}
	var wg sync.WaitGroup
	wg.Add(1)
	tc.t.Cleanup(wg.Wait)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			time.Sleep(100 * time.Millisecond)
			list, err := tc.members(ctx)
			if err != nil {
				continue
			}
			for _, lm := range list.Members {
				for _, m := range tc.new {
					if !lm.IsLearner || lm.Name != "" || !slices.Contains(lm.PeerURLs, m.PeerURL) || m.Running() {
						continue
					}
					op.mu.Lock()
					op.started = append(op.started, m.Name)
					op.starting = m.Name
					op.mu.Unlock()
					startCtx, cancel := context.WithTimeout(ctx, time.Minute)
					err := m.Start(startCtx, rebalance.InitialCluster(list, m.Name, []string{m.PeerURL}), localetcd.ClusterStateExisting)
					cancel()
					op.mu.Lock()
					op.starting = ""
					if err != nil {
						op.errs = append(op.errs, fmt.Errorf("starting %s: %w", m.Name, err))
					}
					op.mu.Unlock()
				}
			}
		}
	}()
	return op
}

// report returns the members started and the starts that failed, and
// what is still starting ("" when nothing is).
func (op *operator) report() (started []string, errs []error, starting string) {
	op.mu.Lock()
	defer op.mu.Unlock()
	return slices.Clone(op.started), slices.Clone(op.errs), op.starting
}

// TestRebalanceMovesClusterToNewMembers moves a live 3-member cluster to
// three new members while a client writes: zero failed and zero lost
// acknowledged writes, a linearizable history, and the planner's shape of a
// move (one member more at most, every old member removed once).
func TestRebalanceMovesClusterToNewMembers(t *testing.T) {
	testbin.Need(t)
	tc := startCluster(t)
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()

	var eps []string
	for _, m := range tc.old {
		eps = append(eps, m.ClientURL)
	}
	w, err := workload.New(workload.Options{Endpoints: eps, TLS: tc.old[0].ClientTLSConfig(), PreloadKeys: 200})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = w.Close() })
	_, err = w.Preload(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(w.Start(ctx)).To(Succeed())
	g.Eventually(func() int64 { return w.Live().Writes }).WithTimeout(30 * time.Second).Should(BeNumerically(">=", 50))
	w.MarkPhase("during")

	op := tc.playOperator(ctx)
	var out bytes.Buffer
	res, err := rebalance.Run(ctx, rebalance.Config{
		Spec:   tc.spec(),
		TLS:    tc.ClientTLS,
		Policy: planner.Policy{LearnerProgressTimeout: time.Minute},
		Out:    &out,
		BeforeChange: func(ctx context.Context, s planner.Step) {
			w.Mark(string(s.Kind) + " " + s.Member)
			if s.Kind != planner.Remove {
				return
			}
			// The workload leaves the member before its removal is sent.
			list, err := tc.members(ctx)
			if err != nil {
				t.Errorf("listing members before removing %s: %v", s.Member, err)
				return
			}
			var stay []string
			for _, m := range list.Members {
				if !m.IsLearner && m.Healthy && m.Name != s.Member && !strings.EqualFold(m.ID, s.ID) {
					stay = append(stay, m.ClientURLs...)
				}
			}
			if err := w.SetEndpoints(stay...); err != nil {
				t.Errorf("routing the workload to %v: %v", stay, err)
			}
		},
	})
	t.Logf("rebalance output:\n%s", out.String())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Done).To(BeTrue())

	w.MarkPhase("after")
	target := w.Live().Writes + 50
	g.Eventually(func() int64 { return w.Live().Writes }).WithTimeout(30 * time.Second).Should(BeNumerically(">=", target))
	w.Stop()

	// The last member may still be starting: it votes once its raft is
	// connected, before it serves clients (etcd checks its log when it is
	// promoted), so the move can end first. Its start must still succeed.
	g.Eventually(func() string {
		_, _, starting := op.report()
		return starting
	}).WithTimeout(time.Minute).WithPolling(100*time.Millisecond).Should(BeEmpty(), "the operator's last start returns")
	started, opErrs, _ := op.report()
	g.Expect(opErrs).To(BeEmpty())
	g.Expect(started).To(ConsistOf("b-0", "b-1", "b-2"), "each new member started once, when its learner was added")

	// The cluster is the target, read from etcd itself.
	final := tc.memberList(g)
	g.Expect(final).To(HaveLen(3))
	g.Expect(strings.Join(final, " ")).To(And(ContainSubstring(":b-0:voter"), ContainSubstring(":b-1:voter"), ContainSubstring(":b-2:voter")))

	// The shape of the move: every change applied once, never more than one
	// member above the size, every removal sent to a healthy voter.
	changes := res.Changes()
	t.Logf("changes: %v", changes)
	count := func(prefix string) int {
		n := 0
		for _, c := range changes {
			if strings.HasPrefix(c, prefix) {
				n++
			}
		}
		return n
	}
	for _, n := range []string{"b-0", "b-1", "b-2"} {
		g.Expect(changes).To(ContainElement("AddLearner "+n), "added once")
		g.Expect(changes).To(ContainElement("Promote "+n), "promoted once")
	}
	for _, n := range []string{"a-0", "a-1", "a-2"} {
		g.Expect(changes).To(ContainElement("Remove "+n), "removed once")
	}
	g.Expect(count("AddLearner")).To(Equal(3))
	g.Expect(count("Promote")).To(Equal(3))
	g.Expect(count("Remove")).To(Equal(3))
	g.Expect(count("MoveLeader")).To(BeNumerically("<=", 2), "leadership moves once per move, twice if an election intervened")
	size, maxSize := 3, 3
	for _, c := range changes {
		switch {
		case strings.HasPrefix(c, "AddLearner"):
			size++
		case strings.HasPrefix(c, "Remove"):
			size--
		}
		maxSize = max(maxSize, size)
	}
	g.Expect(maxSize).To(Equal(4), "n, n+1, n, ...: never n, 2n, n")
	for _, s := range res.Steps {
		if s.Step.Kind == planner.Remove {
			g.Expect(s.Via).NotTo(HavePrefix(s.Step.Member+" "), "a removal never goes through the member removed")
		}
	}

	// The printed log names each step with the membership it was planned
	// from, and tells the operator what to start.
	text := out.String()
	g.Expect(text).To(ContainSubstring("step 1: AddLearner b-"))
	g.Expect(text).To(ContainSubstring("membership: 3 voters (a: 3, leader a-"))
	g.Expect(text).To(MatchRegexp(`waiting for the operator: start etcd member b-\d with --name=b-\d --initial-advertise-peer-urls=https://127\.0\.0\.1:\d+ --initial-cluster=\S+ --initial-cluster-state=existing`))
	g.Expect(text).To(ContainSubstring("done: target reached: 3 voters (b: 3, leader b-"))

	// The client saw nothing of it.
	f, lost, err := w.Verify(ctx, workload.VerifyOptions{LinearizabilityTimeout: 2 * time.Minute})
	g.Expect(err).NotTo(HaveOccurred())
	during := phase(f, "during")
	t.Logf("workload: %d writes (%d during the move of %s), %d reads, failed %d, retries %d, lost %d of %d checked, max write gap %s (during the move %s), p99 %s, linearizable: %s",
		f.Writes, during.Writes, during.End-during.Start, f.Reads, f.FailedRequests, f.Retries, f.LostAcknowledgedWrites, lost.Checked,
		f.MaxWriteGap, during.MaxWriteGap, f.WriteLatency.P99, f.LinearizabilityResult)
	g.Expect(f.FailedRequests).To(BeZero(), "no failed write or read")
	g.Expect(f.LostAcknowledgedWrites).To(BeZero())
	g.Expect(f.FinalReadMismatches).To(BeZero())
	g.Expect(lost.Checked).To(Equal(f.Writes), "every acknowledged write was read back")
	g.Expect(f.Linearizable).To(BeTrue(), "porcupine: %s", f.LinearizabilityResult)
	g.Expect(during.Writes).To(BeNumerically(">", 100), "writes went on during the move")

	// Run again: the target is there, nothing to do.
	out.Reset()
	again, err := rebalance.Run(ctx, rebalance.Config{Spec: tc.spec(), TLS: tc.ClientTLS, Out: &out})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(again.Done).To(BeTrue())
	g.Expect(again.Steps).To(BeEmpty())
	g.Expect(tc.memberList(g)).To(Equal(final))
}

func phase(f workload.Figures, name string) workload.PhaseFigures {
	for _, p := range f.Phases {
		if p.Name == name {
			return p
		}
	}
	return workload.PhaseFigures{}
}

// TestRebalanceChangesNothingItShouldNot runs the cases that must leave the
// membership as it was: a dry run, a learner the operator never starts
// (removed again after the timeout), and a target that contradicts the
// cluster.
func TestRebalanceChangesNothingItShouldNot(t *testing.T) {
	testbin.Need(t)
	tc := startCluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	before := tc.memberList(NewWithT(t))

	t.Run("dry run prints the next step only", func(t *testing.T) {
		g := NewWithT(t)
		var out bytes.Buffer
		called := false
		res, err := rebalance.Run(ctx, rebalance.Config{Spec: tc.spec(), TLS: tc.ClientTLS, DryRun: true, Out: &out,
			BeforeChange: func(context.Context, planner.Step) { called = true }})
		g.Expect(err).NotTo(HaveOccurred())
		t.Logf("output:\n%s", out.String())
		g.Expect(res.Next).NotTo(BeNil())
		g.Expect(res.Next.Kind).To(Equal(planner.AddLearner))
		g.Expect(res.Steps).To(BeEmpty())
		g.Expect(called).To(BeFalse())
		g.Expect(out.String()).To(And(ContainSubstring("next step: AddLearner b-"), ContainSubstring("membership: 3 voters (a: 3")))
		g.Expect(tc.memberList(g)).To(Equal(before))
	})

	t.Run("a learner never started is removed again", func(t *testing.T) {
		g := NewWithT(t)
		var out bytes.Buffer
		res, err := rebalance.Run(ctx, rebalance.Config{Spec: tc.spec(), TLS: tc.ClientTLS, Out: &out,
			Policy: planner.Policy{LearnerProgressTimeout: 2 * time.Second}, Interval: 200 * time.Millisecond})
		t.Logf("output:\n%s", out.String())
		g.Expect(err).To(MatchError(rebalance.ErrLearnerStalled))
		g.Expect(err.Error()).To(ContainSubstring("start its etcd"))
		g.Expect(res.Changes()).To(HaveLen(2))
		g.Expect(res.Changes()[0]).To(HavePrefix("AddLearner b-"))
		g.Expect(res.Changes()[1]).To(HavePrefix("Remove "))
		g.Expect(out.String()).To(ContainSubstring("waiting for the operator: start etcd member b-"))
		g.Expect(tc.memberList(g)).To(Equal(before), "the same members, IDs and roles as before")
		list, err := tc.members(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(list.Lock).To(BeNil(), "the lock is given up")
	})

	t.Run("a target member under a name the cluster uses with other URLs", func(t *testing.T) {
		g := NewWithT(t)
		spec := tc.spec()
		spec.Target[0].Name, spec.Target[0].Group = "a-0", "" // a-0 runs with its own peer URL, not b-0's
		var out bytes.Buffer
		_, err := rebalance.Run(ctx, rebalance.Config{Spec: spec, TLS: tc.ClientTLS, Out: &out})
		g.Expect(err).To(MatchError(ContainSubstring("PeerURLMismatch: member a-0")))
		g.Expect(tc.memberList(g)).To(Equal(before))
	})

	t.Run("no sidecar answers", func(t *testing.T) {
		g := NewWithT(t)
		spec := tc.spec()
		for i := range spec.Sidecars {
			spec.Sidecars[i].URL = "https://127.0.0.1:1"
		}
		_, err := rebalance.Run(ctx, rebalance.Config{Spec: spec, TLS: tc.ClientTLS, DryRun: true})
		g.Expect(err).To(MatchError(ContainSubstring("no sidecar answered")))
		g.Expect(tc.memberList(g)).To(Equal(before))
	})
}
