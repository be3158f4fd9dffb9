package e2e

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	move "github.com/druid-stretch/druid-stretch/api/v1alpha1/migration"
	"github.com/druid-stretch/druid-stretch/internal/planner"
	"github.com/druid-stretch/druid-stretch/internal/testing/workload"
	"github.com/druid-stretch/druid-stretch/test/framework/apiload"
	"github.com/druid-stretch/druid-stretch/test/framework/demo"
	"github.com/druid-stretch/druid-stretch/test/framework/report"
)

// rehearsal is the client load of every test: a little preloaded data, so
// that joining members have something to catch up on, short baselines, and
// a shoot kube-apiserver per cluster with client-go clients through both,
// each ready for them once its /readyz but the RBAC bootstrap passes
// (apiload.RBACBootstrapCheck: the clients are system:masters, and the
// destination's bootstrap takes a round trip between the clusters per
// default role).
func rehearsal() demo.RehearsalOptions {
	return demo.RehearsalOptions{
		Workload:       workload.Options{PreloadKeys: 1000},
		Before:         2 * time.Second,
		After:          2 * time.Second,
		KubeAPIServers: true,
		ReadyzExclude:  []string{apiload.RBACBootstrapCheck},
	}
}

// newMove gives the test its own Etcd, running in cluster A with three
// members, and deletes it (stopping its pods) when the test ends.
func newMove(t *testing.T, name string) *demo.Env {
	t.Helper()
	return newMoveIn(t, env, name)
}

// newMoveIn is newMove in the clusters of base.
func newMoveIn(t *testing.T, base *demo.Env, name string) *demo.Env {
	t.Helper()
	e, err := base.In(t.Context(), "e2e-"+name, name)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.CreateSource(t.Context(), 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.Delete(context.Background(), 2*time.Minute); err != nil {
			t.Errorf("cleaning up: %v", err)
		}
	})
	// Registered after the deletion, so it runs before it: the excerpt
	// shows the pods and controllers as the failure left them.
	t.Cleanup(func() {
		if t.Failed() {
			logExcerpt(t, "e2e-"+name)
		}
	})
	return e
}

// expectClientsSawNothing asserts the clients' verdict: every request
// answered, every acknowledged write held, the history linearizable.
func expectClientsSawNothing(t *testing.T, rep report.Report) {
	t.Helper()
	g := NewWithT(t)
	t.Log("\n" + rep.String())
	g.Expect(rep.Writes).To(BeNumerically(">", 100), "the workload wrote throughout")
	g.Expect(rep.FailedRequests).To(BeZero(), "failed requests after the client's retries")
	g.Expect(rep.LostAcknowledgedWrites).To(BeZero(), "lost acknowledged writes")
	g.Expect(rep.FinalReadMismatches).To(BeZero(), "keys whose final value is not the last acknowledged write")
	g.Expect(rep.Linearizable).To(BeTrue(), "porcupine's verdict: %s", rep.LinearizabilityResult)
}

// expectKubeAPIServersKeptEveryWrite asserts the verdict on the requests
// of the client-go clients of both shoot kube-apiservers, checked as one
// history: every acknowledged write held, the history linearizable. It
// logs each server's failed requests by class and its longest write gap.
// A failed request is not retried by client-go (kube-apiserver sends no
// Retry-After with an etcd error), so where a test injects a fault the
// count is logged rather than asserted.
func expectKubeAPIServersKeptEveryWrite(t *testing.T, rep report.Report) {
	t.Helper()
	g := NewWithT(t)
	g.Expect(rep.KubeAPIServers).To(HaveLen(2), "a shoot kube-apiserver per cluster")
	for _, s := range rep.KubeAPIServers {
		t.Logf("kube-apiserver %s: ready %t from %.2f s, %d writes, %d reads, %d failed%s, max write gap %.0f ms from %.2f s, switched to %q at %.2f s",
			s.Name, s.BecameReady, s.FirstReadySeconds, s.Writes, s.Reads, s.Failed, classes(s), s.MaxWriteGapMs, s.MaxWriteGapAtSeconds, s.SwitchedTo, s.SwitchedAtSeconds)
		for _, e := range s.FailedErrors {
			t.Logf("  %dx %s", e.Count, e.Message)
		}
	}
	g.Expect(rep.KubeAPIServers[0].Writes+rep.KubeAPIServers[1].Writes).To(BeNumerically(">", 100), "the kube-apiservers' clients wrote throughout")
	h := rep.APIHistory
	g.Expect(h).NotTo(BeNil(), "the kube-apiservers' history was checked")
	t.Logf("kube-apiservers' history: %d lost acknowledged writes, %d unverified, linearizable %t (%s, %d operations)",
		h.LostAcknowledgedWrites, h.UnverifiedWrites, h.Linearizable, h.LinearizabilityResult, h.CheckedOperations)
	g.Expect(h.LostAcknowledgedWrites).To(BeZero(), "writes a kube-apiserver acknowledged and etcd lost: %v", h.LostWrites)
	g.Expect(h.Linearizable).To(BeTrue(), "porcupine's verdict on the kube-apiservers' history: %s", h.LinearizabilityResult)
}

// classes formats a server's failed requests by class.
func classes(s report.APIServer) string {
	if len(s.FailedByClass) == 0 {
		return ""
	}
	out := " ("
	for i, c := range s.FailedByClass {
		if i > 0 {
			out += ", "
		}
		out += fmt.Sprintf("%d %s", c.Count, c.Class)
	}
	return out + ")"
}

func names(e *demo.Env, ordinals ...int) []demo.EtcdMember {
	var out []demo.EtcdMember
	for _, o := range ordinals {
		out = append(out, demo.EtcdMember{Name: fmt.Sprintf("%s-%d", e.Config.Name, o)})
	}
	return out
}

// expectMovedToB checks the end state in etcd and in both clusters: the
// destination's three members are etcd's only members, all voters; the
// source has no replicas, forgot the destination and runs no pod.
func expectMovedToB(t *testing.T, e *demo.Env) {
	t.Helper()
	g := NewWithT(t)
	src, dst, err := e.Read(t.Context())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(move.Phase(src, dst)).To(Equal(move.PhaseCompleted), move.Explain(src, dst))
	g.Expect(src.Spec.Replicas).To(BeZero())
	g.Expect(src.Spec.ExternalMembers).To(BeEmpty())
	g.Expect(dst.Spec.ExternalMembers).To(BeEmpty())
	g.Expect(dst.Spec.GetOrdinalStart()).To(Equal(int32(3)))
	g.Expect(e.EtcdMembers(t.Context())).To(Equal(names(e, 3, 4, 5)))
	for o := range 3 {
		g.Expect(e.A.Runner.Running(e.Config.Namespace, fmt.Sprintf("%s-%d", e.Config.Name, o))).To(BeFalse(), "pod %d of cluster A", o)
	}
}

// expectBackAtA checks the end state of an aborted move in etcd and in
// both clusters: the source's three members are etcd's only members, all
// voters; the source forgot the destination, which has no replicas and
// runs no pod.
func expectBackAtA(t *testing.T, e *demo.Env) {
	t.Helper()
	g := NewWithT(t)
	src, dst, err := e.Read(t.Context())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(move.Phase(src, dst)).To(Equal(move.PhaseAborted), move.Explain(src, dst))
	g.Expect(src.Spec.Replicas).To(Equal(int32(3)))
	g.Expect(src.Spec.ExternalMembers).To(BeEmpty())
	g.Expect(dst.Spec.Replicas).To(BeZero())
	g.Expect(e.EtcdMembers(t.Context())).To(Equal(names(e, 0, 1, 2)), "the source's three members, all voters, and nothing else")
	for o := 3; o < 6; o++ {
		g.Expect(e.B.Runner.Running(e.Config.Namespace, fmt.Sprintf("%s-%d", e.Config.Name, o))).To(BeFalse(), "pod %d of cluster B", o)
	}
}

// leader is the leader in e's last observation.
func leader(e *v1alpha1.Etcd) string {
	if e == nil || e.Status.Membership == nil {
		return ""
	}
	for _, m := range e.Status.Membership.Members {
		if m.Role == v1alpha1.MemberRoleLeader {
			return m.Name
		}
	}
	return ""
}

// The destination's controller is restarted while its promotion of a
// destination member is on the wire: the call's outcome is unknown to the
// controller that sent it, and the new controller (same identity, same
// lock) resumes from what it observes.
func TestMoveSurvivesTheDestinationControllerRestartedMidStep(t *testing.T) {
	g := NewWithT(t)
	e := newMove(t, "etcd-restart")
	target := e.Config.Name + "-4"
	restarted := make(chan error, 1)
	var once sync.Once
	stop := e.OnStep(func(ev demo.StepEvent) {
		if ev.Cluster == "B" && ev.Kind == planner.Promote && ev.Member == target && !ev.Done() {
			// Not on the executor's goroutine: stopping the manager waits
			// for this very reconcile.
			once.Do(func() { go func() { restarted <- e.B.RestartController() }() })
		}
	})
	defer stop()
	rep, err := e.Rehearse(t.Context(), t.Output(), rehearsal())
	g.Expect(err).NotTo(HaveOccurred())
	select {
	case err := <-restarted:
		g.Expect(err).NotTo(HaveOccurred())
	default:
		t.Fatalf("the controller of B was not restarted: no promotion of %s was seen", target)
	}
	expectClientsSawNothing(t, rep)
	expectKubeAPIServersKeptEveryWrite(t, rep)
	expectMovedToB(t, e)
}

// The destination's controller is killed after every membership change it
// makes: its reconcile ends as the sidecar answers, before status, events or
// metrics, and a new controller process (new lock token, same identity)
// takes over. Each successor finds the change recorded in etcd, reports it,
// and goes on from what it observes; the move completes with every change
// applied exactly once.
func TestMoveSurvivesItsControllerKilledAfterEachStep(t *testing.T) {
	g := NewWithT(t)
	e := newMove(t, "etcd-killsteps")
	stop := e.B.CrashAfterSteps(demo.StepEvent.Applied)
	rep, err := e.Rehearse(t.Context(), t.Output(), rehearsal())
	crashes, crashErr := stop()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(crashErr).NotTo(HaveOccurred())
	expectClientsSawNothing(t, rep)
	expectKubeAPIServersKeptEveryWrite(t, rep)
	expectMovedToB(t, e)

	appliedOnce(t, e.Steps())
	t.Logf("%d controller crashes, one after each sidecar call that changed the cluster: %v", len(crashes), crashes)
	g.Expect(len(crashes)).To(BeNumerically(">=", 6), "three members joined and three left")
	for _, s := range e.Steps() {
		// A promotion's call may remove a member right after it (the tie);
		// the crash after that call covers both changes.
		if s.Cluster == "B" && s.Applied() {
			g.Expect(slices.ContainsFunc(crashes, func(c demo.StepEvent) bool { return !s.End.Before(c.Start) && !s.End.After(c.End) })).
				To(BeTrue(), "B's controller died right after the call that applied %s", s)
		}
	}
	expectNeverBelow(t, e, 3)
	_, dst, err := e.Read(t.Context())
	g.Expect(err).NotTo(HaveOccurred())
	last := dst.Status.Membership.LastStep
	g.Expect(last).NotTo(BeNil())
	g.Expect(last.Message).To(ContainSubstring("sent by an earlier process"), "the last change, whose sender died, is reported from its record in etcd")
}

// appliedOnce asserts that no membership change was applied twice (a
// controller that resumed after a crash repeating its predecessor's step).
func appliedOnce(t *testing.T, steps []demo.StepEvent) {
	t.Helper()
	seen := map[string]bool{}
	for _, s := range steps {
		if !s.Applied() {
			continue
		}
		if key := s.String(); seen[key] {
			t.Errorf("%s was applied twice", key)
		} else {
			seen[key] = true
		}
	}
}

// expectNeverBelow asserts that the cluster never had fewer than n
// voters.
func expectNeverBelow(t *testing.T, e *demo.Env, n int) {
	t.Helper()
	least, after := fewestVoters(e)
	t.Logf("fewest voters: %d (after %s)", least, after)
	if least < n {
		t.Errorf("the cluster went down to %d voters after %s; never fewer than %d", least, after, n)
	}
}

// The clusters are cut apart while the first destination member joins: the
// source keeps its majority (three voters of three) and serves; the
// learner cannot catch up, so nothing is promoted; after the heal the move
// resumes and completes.
func TestPartitionDuringTheJoin(t *testing.T) {
	const minWritesPartitioned = 20
	g := NewWithT(t)
	e := newMove(t, "etcd-partition")
	joiner := e.Config.Name + "-3"
	var (
		traffic             *demo.Traffic
		partitioned, healed time.Time
		writesDuring        int64
		perr                error
		once                sync.Once
		done                = make(chan struct{})
	)
	o := rehearsal()
	o.OnTraffic = func(tr *demo.Traffic) { traffic = tr }
	stop := e.OnStep(func(ev demo.StepEvent) {
		if ev.Cluster != "B" || ev.Kind != planner.AddLearner || ev.Member != joiner || !ev.Applied() {
			return
		}
		once.Do(func() {
			go func() {
				defer close(done)
				e.WAN.Partition(demo.SiteA, demo.SiteB)
				partitioned = time.Now()
				before := traffic.Workload.Live().Writes
				// The cut lasts well past an election timeout (2 s), and until
				// the majority side has shown that it keeps serving: a count
				// of writes, not a rate, which a busy machine divides.
				deadline := time.Now().Add(2 * time.Minute)
				for time.Now().Before(deadline) {
					writesDuring = traffic.Workload.Live().Writes - before
					if time.Since(partitioned) > 6*time.Second && writesDuring >= minWritesPartitioned {
						break
					}
					time.Sleep(100 * time.Millisecond)
				}
				if writesDuring < minWritesPartitioned {
					perr = fmt.Errorf("only %d writes acknowledged during the partition", writesDuring)
				}
				e.WAN.Heal(demo.SiteA, demo.SiteB)
				healed = time.Now()
			}()
		})
	})
	defer stop()
	rep, err := e.Rehearse(t.Context(), t.Output(), o)
	g.Expect(err).NotTo(HaveOccurred())
	<-done
	g.Expect(perr).NotTo(HaveOccurred())
	t.Logf("partitioned for %s; %d writes acknowledged meanwhile", healed.Sub(partitioned).Round(time.Millisecond), writesDuring)
	for _, s := range e.Steps() {
		if s.Cluster == "B" && s.Kind == planner.Promote && s.Member == joiner && s.Applied() {
			g.Expect(s.Start).To(BeTemporally(">", healed), "the learner was promoted only after the heal")
		}
	}
	expectClientsSawNothing(t, rep)
	expectKubeAPIServersKeptEveryWrite(t, rep)
	expectMovedToB(t, e)
}

// The move is aborted after the first source member was removed (two
// source voters, one destination voter): the destination's controller
// removes its member and withdraws its retirement record, the source's
// controller adds the retired member back, and the source ends as it began.
//
// An abort is a move back: the cluster never has fewer than three voters,
// the retired source member coming back as a voter before the destination's
// member goes. Both controllers are killed after every change they make
// once the abort began, and each successor resumes from what it observes.
func TestAbortRestoresTheSource(t *testing.T) {
	g := NewWithT(t)
	e := newMove(t, "etcd-abort")
	o := rehearsal()
	o.Abort = true
	var (
		aborted      sync.Once
		stopA, stopB func() ([]demo.StepEvent, error)
	)
	o.AbortWhen = func(src, dst *v1alpha1.Etcd) bool {
		s, d, ok := move.Voters(src, dst)
		if ok && s == 2 && d == 1 {
			aborted.Do(func() {
				stopA, stopB = e.A.CrashAfterSteps(demo.StepEvent.Applied), e.B.CrashAfterSteps(demo.StepEvent.Applied)
			})
			return true
		}
		return false
	}
	rep, err := e.Rehearse(t.Context(), t.Output(), o)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(stopA).NotTo(BeNil(), "the abort began")
	crashesA, errA := stopA()
	crashesB, errB := stopB()
	g.Expect(errA).NotTo(HaveOccurred())
	g.Expect(errB).NotTo(HaveOccurred())
	t.Logf("controller crashes after the abort began: A %v, B %v", crashesA, crashesB)
	g.Expect(crashesA).NotTo(BeEmpty(), "A's controller died after each change it made in the abort")
	g.Expect(crashesB).NotTo(BeEmpty(), "B's controller died after each change it made in the abort")
	expectClientsSawNothing(t, rep)
	expectKubeAPIServersKeptEveryWrite(t, rep)
	appliedOnce(t, e.Steps())
	expectNeverBelow(t, e, 3)

	expectBackAtA(t, e)
	var removed, readded []string
	for _, s := range e.Steps() {
		switch {
		case s.Cluster == "B" && s.Kind == planner.Remove && s.Applied() && e.SideOf(s.Member) == "A":
			removed = append(removed, s.Member)
		case s.Cluster == "A" && s.Kind == planner.AddLearner && s.Applied():
			readded = append(readded, s.Member)
		}
	}
	// The abort is asked for once one source member is retired, but the
	// destination's controller goes on with the retirement until the
	// abort's patch reaches it: a second source member can leave in that
	// window (the abort still may begin while the source holds the
	// majority). Every member that left comes back.
	t.Logf("source members retired before the abort took hold: %v", removed)
	g.Expect(removed).NotTo(BeEmpty(), "a source member was retired before the abort")
	g.Expect(readded).To(ContainElements(removed), "the source's controller added every retired member back")
}
