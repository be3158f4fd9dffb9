package site

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/druid-stretch/druid-stretch/internal/planner"
	"github.com/druid-stretch/druid-stretch/internal/sidecarcluster"
)

var podDeletionSet = flag.String("pod-deletions", "off",
	"the pod deletions of TestLiveMoveSurvivesPodDeletion: off (make test), representative (one move: the leader's pod at four moments, a follower's and a learner's) or full (also the leader's pod at every step of the move, in rows of one move each; make fault-matrix)")

// victimRole is whose pod a deletion takes, decided at its moment from
// etcd's own view.
type victimRole string

const (
	victimLeader   victimRole = "leader"
	victimFollower victimRole = "follower"
	victimLearner  victimRole = "learner"
)

// stepMoment is a moment of the controllers' membership steps: right before
// a change's sidecar call, or right after etcd applied it.
type stepMoment struct {
	kind   planner.StepKind
	member string
	after  bool
	// nth counts the distinct members a step of this kind acted on, this
	// one included: a repeat of a refused step is the same moment.
	nth int
}

// podDeletion is one etcd pod deleted, as kubectl delete pod does, at a
// moment of a live move.
type podDeletion struct {
	victim victimRole
	at     moment
}

func (p podDeletion) String() string { return fmt.Sprintf("the %s's pod %s", p.victim, p.at.name) }

// stepCounter numbers, per step kind, the distinct members the steps of
// that kind acted on, so that a moment can name the nth.
type stepCounter map[planner.StepKind][]string

// moment is the stepMoment of a controller's OnStep call; false for the
// call after a step that failed or changed nothing, which is no moment.
func (c stepCounter) moment(step planner.Step, res *sidecarcluster.Result) (stepMoment, bool) {
	m := stepMoment{kind: step.Kind, member: step.Member, after: res != nil}
	if res != nil && (res.Outcome != sidecarcluster.Succeeded || !res.Changed) {
		return m, false
	}
	seen := c[step.Kind]
	i := slices.Index(seen, step.Member)
	if i < 0 {
		i = len(seen)
		if m.after {
			c[step.Kind] = append(seen, step.Member)
		}
	}
	m.nth = i + 1
	return m, true
}

// moment picks a stepMoment.
type moment struct {
	is   func(stepMoment) bool
	name string
}

// before is the moment right before the nth step of kind is sent.
func before(kind planner.StepKind, nth int) moment {
	return moment{func(m stepMoment) bool { return !m.after && m.kind == kind && m.nth == nth }, fmt.Sprintf("right before %s #%d", kind, nth)}
}

// after is the moment right after etcd applied the nth step of kind.
func after(kind planner.StepKind, nth int) moment {
	return moment{func(m stepMoment) bool { return m.after && m.kind == kind && m.nth == nth }, fmt.Sprintf("right after %s #%d", kind, nth)}
}

// deleteAt is the deletion of victim's pod at a moment.
func deleteAt(victim victimRole, at moment) podDeletion { return podDeletion{victim: victim, at: at} }

// The steps of a live move (TestLiveMoveBetweenRealSites): AddLearner #1
// (etcd-main-3), Promote #1, AddLearner #2 (etcd-main-4, which waits as a
// learner while the clients switch), Remove #1 (a source member), Promote
// #2 with Remove #2 in one call (the tie), MoveLeader #1 (to the
// destination), AddLearner #3, Promote #3, Remove #3 (the last source
// member). The rows below are in that order: a row's deletions come one
// after the other in one move.
var podDeletionRows = []struct {
	name      string
	full      bool
	deletions []podDeletion
}{
	// The moments a move is most exposed at: while the leader's side
	// changes its members, around the transfer, and before a removal,
	// plus a follower's pod (of the source, which still serves A's
	// kube-apiserver) and a learner's pod about to be promoted.
	{name: "representative", deletions: []podDeletion{
		deleteAt(victimLeader, after(planner.AddLearner, 1)),
		deleteAt(victimLeader, after(planner.Promote, 1)),
		deleteAt(victimFollower, after(planner.AddLearner, 2)),
		deleteAt(victimLeader, before(planner.MoveLeader, 1)),
		deleteAt(victimLearner, before(planner.Promote, 3)),
		deleteAt(victimLeader, before(planner.Remove, 3)),
	}},
	// The leader's pod at every other step. A deletion of the leader's
	// pod makes etcd hand leadership over as it stops, which may move it
	// to the destination before the planner's transfer: the transfer's
	// moments open their own row.
	{name: "join", full: true, deletions: []podDeletion{
		deleteAt(victimLeader, before(planner.AddLearner, 1)),
		deleteAt(victimLeader, before(planner.Promote, 1)),
		deleteAt(victimLeader, before(planner.AddLearner, 2)),
	}},
	{name: "retire", full: true, deletions: []podDeletion{
		deleteAt(victimLeader, before(planner.Remove, 1)),
		deleteAt(victimLeader, before(planner.Promote, 2)),
	}},
	{name: "transfer", full: true, deletions: []podDeletion{
		deleteAt(victimLeader, after(planner.Promote, 2)),
		deleteAt(victimLeader, after(planner.MoveLeader, 1)),
		deleteAt(victimLeader, after(planner.AddLearner, 3)),
	}},
	{name: "finish", full: true, deletions: []podDeletion{
		deleteAt(victimLeader, after(planner.Promote, 3)),
		deleteAt(victimLeader, after(planner.Remove, 3)),
	}},
}

// TestLiveMoveSurvivesPodDeletion is the live move of
// TestLiveMoveBetweenRealSites with etcd pods deleted through the sites'
// Kubernetes API at chosen moments of the controllers' steps (the
// StatefulSet recreates each pod, the node stand-in runs it again): the
// move completes, no request of either kube-apiserver's clients fails, no
// acknowledged write is lost, the history is linearizable, and the
// cluster never has fewer than MoveReplicas voters. -pod-deletions=full
// runs every row of podDeletionRows, one move each.
//
// It is off in make test for its time (the representative row takes a
// move of about five minutes, the full lane five moves); make fault-matrix
// runs it whole.
func TestLiveMoveSurvivesPodDeletion(t *testing.T) {
	if *podDeletionSet == "off" {
		t.Skip("a fault lane: run with -args -pod-deletions=representative or =full (make fault-matrix)")
	}
	for _, row := range podDeletionRows {
		if row.full && *podDeletionSet != "full" {
			continue
		}
		t.Run(row.name, func(t *testing.T) { liveMoveWithPodDeletions(t, row.deletions) })
	}
}

func liveMoveWithPodDeletions(t *testing.T, deletions []podDeletion) {
	g := NewWithT(t)
	// Every figure of a failed run counts, so the checks below report all
	// that failed, not the first.
	check := NewGomega(func(msg string, _ ...int) { t.Helper(); t.Errorf("\n%s", msg) })
	ctx := testContext(t, siteTestDeadline)
	root := moveRoot(t, "druid-stretch-poddel-")
	d := &podDeleter{plan: deletions, made: make([]bool, len(deletions)), applied: stepCounter{}}
	opts := MoveSiteOptions(root)
	for i := range opts {
		opts[i].OnStep = d.onStep
	}
	sites := startSites(t, opts...)
	a, b := sites[0], sites[1]

	mv, err := NewLiveMove(ctx, a, b, LiveMoveOptions{RTT: DefaultMoveRTT, Out: testWriter{t}, ReadyzExclude: testReadyzExclude})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(mv.CreateSource(ctx)).To(Succeed())
	// The source's creation installs the shoot's TLS, which the deleter's
	// etcd client needs.
	cli := etcdClientVia(t, a, ClientURLs()...)
	d.start(ctx, a, b, cli)
	t.Cleanup(func() { d.stop() })
	d.arm()
	run, err := mv.Run(ctx)
	for _, line := range d.stop() {
		t.Log(line)
	}
	logTemplateChanges(t, b, moveNamespace, MoveEtcdName)
	g.Expect(err).NotTo(HaveOccurred())
	t.Logf("the move took %s", run.MoveTook.Round(100*time.Millisecond))
	check.Expect(d.missing()).To(BeEmpty(), "every planned pod deletion was made")

	f := run.Own
	t.Logf("own etcd client: %d writes, %d reads, %d failed (%v), %d retries, max write gap %s", f.Writes, f.Reads, f.FailedRequests, f.FailedErrors, f.Retries, f.MaxWriteGap)
	check.Expect(run.OwnLost.Lost).To(BeEmpty(), "no acknowledged write lost")
	check.Expect(f.Linearizable).To(BeTrue(), "the own client's history is linearizable: %s", f.LinearizabilityResult)

	history := run.Membership
	expectTLSMembers(t, history)
	t.Logf("membership steps: %s", strings.Join(history.TransitionsInApplyOrder(appliedConfChanges(t, b, moveNamespace, "etcd-main-3")), "; "))
	tie, ties := history.LongestTie(func(name string) bool { return memberOrdinal(name) >= MoveReplicas })
	t.Logf("polls saw the voters tied %d time(s), the longest for %s; the controllers measured %d tie(s), %.3f s in all, %d under a second",
		ties, tie.Round(time.Millisecond), run.Ties, run.TieSeconds, run.TiesUnderOneSecond)
	fewest, from, lasted := history.FewestVoters()
	t.Logf("the fewest voters: %d, from %s for %s", fewest, from.Format("15:04:05.000"), lasted.Round(100*time.Millisecond))
	check.Expect(fewest).To(Equal(MoveReplicas), "the cluster never had fewer than %d voters: %v", MoveReplicas, history.Snapshot())
	check.Expect(history.Last()).To(ConsistOf(
		HaveField("Name", "etcd-main-3"), HaveField("Name", "etcd-main-4"), HaveField("Name", "etcd-main-5")))
	check.Expect(run.EtcdCrashes).To(BeEmpty(), "etcd panics or fatal exits")
	for _, s := range []*Site{a, b} {
		for i := range 2 * MoveReplicas {
			log, _, err := s.ContainerLogs(moveNamespace, fmt.Sprintf("%s-%d", MoveEtcdName, i), "backup-restore")
			check.Expect(err).NotTo(HaveOccurred())
			check.Expect(log).NotTo(ContainSubstring("Attempting to promote member"), "backup-restore of %s-%d in %s promoted", MoveEtcdName, i, s.opts.ClusterIdentity)
		}
	}
	expectKubeAPIServersSawNothing(t, run.API, a)
}

// podDeleter deletes the planned pods at their moments, from the
// controllers' OnStep hook, so a deletion lands before the step's call (or
// right after etcd applied it), not at some poll's distance from it. Each
// deletion waits for its own moment: a deletion may change the order of
// the steps after it (a departing member that is down is removed first).
type podDeleter struct {
	plan []podDeletion

	mu      sync.Mutex
	ctx     context.Context
	a, b    *Site
	cli     *clientv3.Client
	armed   bool
	done    bool
	made    []bool
	applied stepCounter
	deleted []deletedPod
	failed  []string
	lines   []string
}

// deletedPod is a pod a deletion took, to know when it runs again.
type deletedPod struct {
	site   *Site
	name   string
	uid    types.UID
	member uint64
}

func (d *podDeleter) start(ctx context.Context, a, b *Site, cli *clientv3.Client) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ctx, d.a, d.b, d.cli = ctx, a, b, cli
}

// arm starts counting steps: the source's own bootstrap is no moment of
// the move.
func (d *podDeleter) arm() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.armed = true
}

// stop ends the deletions and returns what was done, one line each.
func (d *podDeleter) stop() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.done = true
	return slices.Clone(d.lines)
}

// missing are the planned deletions that were not made: their moment
// did not come, or the deletion failed.
func (d *podDeleter) missing() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := slices.Clone(d.failed)
	for i, p := range d.plan {
		if !d.made[i] {
			out = append(out, p.String()+": its moment did not come")
		}
	}
	return out
}

func (d *podDeleter) logf(format string, args ...any) {
	d.lines = append(d.lines, time.Now().Format("15:04:05.000")+" "+fmt.Sprintf(format, args...))
}

// onStep is the sites' Options.OnStep. It runs on a controller's
// goroutine; both sites' controllers share it.
func (d *podDeleter) onStep(step planner.Step, res *sidecarcluster.Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.armed || d.done || d.ctx == nil {
		return
	}
	m, ok := d.applied.moment(step, res)
	if !ok {
		return
	}
	for i, p := range d.plan {
		if d.made[i] || !p.at.is(m) {
			continue
		}
		d.made[i] = true
		if err := d.deleteVictim(p, m); err != nil {
			d.logf("%s (%s %s): NOT deleted: %v", p, m.kind, m.member, err)
			d.failed = append(d.failed, fmt.Sprintf("%s: %v", p, err))
		}
	}
}

// deleteVictim waits until every pod deleted before runs again, finds the
// victim from etcd's own view, and deletes its pod. Two members down at
// once would be this test's doing, not the move's: a pod that is not back
// in time cancels the deletion, which the test reports. A pod comes back
// about 25 s after its deletion on a busy machine: the webhook's
// EtcdStopDelay, for which its etcd still runs, its stop, the new pod's
// start and backup-restore's check before etcd. Before a step the
// controller holds that step meanwhile, planned on what it saw before:
// like a controller slowed down, well within its lock's lease.
func (d *podDeleter) deleteVictim(p podDeletion, m stepMoment) error {
	ctx, cancel := context.WithTimeout(d.ctx, 40*time.Second)
	defer cancel()
	backWithin := 30 * time.Second
	waitCtx, cancelWait := context.WithTimeout(ctx, backWithin)
	defer cancelWait()
	start := time.Now()
	for _, prev := range d.deleted {
		if err := d.waitBack(waitCtx, prev); err != nil {
			return fmt.Errorf("pod %s deleted before did not run again within %s", prev.name, backWithin)
		}
	}
	if w := time.Since(start); w > 100*time.Millisecond {
		d.logf("%s: waited %s for the pods deleted before to run again", p, w.Round(time.Millisecond))
	}
	roles, err := etcdRoles(ctx, d.cli)
	if err != nil {
		return err
	}
	name, id := roles.pick(p.victim, m.member)
	if name == "" {
		return fmt.Errorf("no %s to take: %s", p.victim, roles)
	}
	s := d.a
	if memberOrdinal(name) >= MoveReplicas {
		s = d.b
	}
	pods := s.Kube.CoreV1().Pods(MoveNamespace)
	pod, err := pods.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading pod %s: %w", name, err)
	}
	if err := pods.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("deleting pod %s: %w", name, err)
	}
	d.deleted = append(d.deleted, deletedPod{site: s, name: name, uid: pod.UID, member: id})
	d.logf("%s (%s %s): deleted pod %s in %s (%s)", p, m.kind, m.member, name, s.opts.ClusterIdentity, roles)
	return nil
}

// waitBack waits until the deleted pod runs again as a new pod that is
// ready, or its member left the cluster (a removed member's pod is not
// recreated).
func (d *podDeleter) waitBack(ctx context.Context, prev deletedPod) error {
	return wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		pod, err := prev.site.Kube.CoreV1().Pods(MoveNamespace).Get(ctx, prev.name, metav1.GetOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return false, nil
		}
		recreated := err == nil && pod.UID != prev.uid
		if recreated && PodReady(pod) {
			return true, nil
		}
		callCtx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		list, err := d.cli.MemberList(callCtx)
		if err != nil {
			return false, nil
		}
		for _, mem := range list.Members {
			if mem.ID == prev.member {
				// A learner's pod is never ready (etcd-wrapper's readiness is
				// a linearizable read): running is as far as it gets.
				return mem.IsLearner && recreated && pod.Status.Phase == corev1.PodRunning, nil
			}
		}
		return true, nil
	})
}

// memberRoles is the cluster as etcd saw it at one moment.
type memberRoles struct {
	leader   string
	ids      map[string]uint64
	voters   []string
	learners []string
}

func (r memberRoles) String() string {
	return fmt.Sprintf("leader %s, voters %v, learners %v", r.leader, r.voters, r.learners)
}

// pick names the member of role: the leader; a voter that is not the
// leader nor acted on by the step (one of the source, whose pods A's
// kube-apiserver shares, before one of the destination, whose first
// member may be the only one B's kube-apiserver has); or a started learner,
// the step's own first.
func (r memberRoles) pick(role victimRole, stepMember string) (string, uint64) {
	var name string
	switch role {
	case victimLeader:
		name = r.leader
	case victimFollower:
		for _, v := range r.voters {
			if v != r.leader && v != stepMember && (name == "" || memberOrdinal(v) < MoveReplicas && memberOrdinal(name) >= MoveReplicas) {
				name = v
			}
		}
	case victimLearner:
		for _, l := range r.learners {
			if l != "" && (name == "" || l == stepMember) {
				name = l
			}
		}
	}
	return name, r.ids[name]
}

// etcdRoles asks every member's status at once and takes the leader from
// the answer of the highest raft term: a member that is stopping, or is
// drained, may not answer or may lag.
func etcdRoles(ctx context.Context, cli *clientv3.Client) (memberRoles, error) {
	var r memberRoles
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		callCtx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		list, err := cli.MemberList(callCtx)
		if err != nil {
			return false, nil
		}
		r = memberRoles{ids: map[string]uint64{}}
		names := map[uint64]string{}
		for _, m := range list.Members {
			names[m.ID] = m.Name
			r.ids[m.Name] = m.ID
			if m.IsLearner {
				r.learners = append(r.learners, m.Name)
			} else {
				r.voters = append(r.voters, m.Name)
			}
		}
		var (
			mu           sync.Mutex
			wg           sync.WaitGroup
			term, leader uint64
		)
		eps := ClientURLs()
		for _, m := range list.Members {
			i := memberOrdinal(m.Name)
			if i < 0 || i >= len(eps) {
				continue // a learner that has not started: no name yet
			}
			wg.Go(func() {
				st, err := cli.Status(callCtx, eps[i])
				if err != nil || st.Leader == 0 {
					return
				}
				mu.Lock()
				defer mu.Unlock()
				if st.RaftTerm > term {
					term, leader = st.RaftTerm, st.Leader
				}
			})
		}
		wg.Wait()
		r.leader = names[leader]
		slices.Sort(r.voters)
		slices.Sort(r.learners)
		return r.leader != "", nil
	})
	if err != nil {
		return r, fmt.Errorf("finding the leader: %w", err)
	}
	return r, nil
}
