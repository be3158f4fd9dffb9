package site

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlzap "sigs.k8s.io/controller-runtime/pkg/log/zap"

	stretchv1alpha1 "github.com/druid-stretch/druid-stretch/api/stretch/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	move "github.com/druid-stretch/druid-stretch/api/v1alpha1/migration"
	"github.com/druid-stretch/druid-stretch/internal/apiload"
	"github.com/druid-stretch/druid-stretch/internal/etcdview"
	"github.com/druid-stretch/druid-stretch/internal/membership"
	"github.com/druid-stretch/druid-stretch/internal/planner"
	"github.com/druid-stretch/druid-stretch/internal/testbin"
	"github.com/druid-stretch/druid-stretch/internal/workload"
)

// The node groups of the rebalancing site: one node each, told apart by a
// label, as a cluster's worker pools are.
const (
	nodeGroupLabel = "node.druid-stretch.test/group"
	groupANode     = "node-0"
	groupBNode     = "node-1"
)

// rebalanceNamespace is the shoot namespace of the rebalanced Etcd.
const rebalanceNamespace = "shoot--dev--rebalance"

// TestRebalanceBetweenNodeGroups moves a running 3-member Etcd from one
// node group of a site to the other, as an operator rebalances: with the
// target group's node uncordoned and the source group's cordoned, a new
// spec.ordinalStart makes druid-stretch's controller move the members to
// the new ordinal range one safe step at a time (add a learner, promote it,
// remove an old member; leadership moved once), and the scheduler puts the
// new range's pods on the target group. It is judged as the live move is:
// by client-go clients of a shoot kube-apiserver on the Etcd's client
// Service (no failed request, no acknowledged write lost, a linearizable
// history), by the member list (the planner's steps and nothing else, one
// tie under a second), by druid's Ready, and by the etcd and backup-restore
// logs.
func TestRebalanceBetweenNodeGroups(t *testing.T) {
	testbin.Need(t)
	if os.Geteuid() != 0 {
		t.Fatal("a real site needs root: its pods get network namespaces and chroots")
	}
	g := NewWithT(t)
	ctx := testContext(t, siteTestDeadline)
	// The first promotion of the rebalance is the moment its fields are
	// taken away (below).
	promoted := make(chan struct{})
	var promotedOnce sync.Once
	onStep := func(step planner.Step, res *membership.Result) {
		if step.Kind == planner.Promote && res != nil && res.Outcome == membership.Succeeded && res.Changed {
			promotedOnce.Do(func() { close(promoted) })
		}
	}
	s := startSites(t, Options{DruidStretch: true, ClusterIdentity: "site", OnStep: onStep, Nodes: []NodeOptions{
		{Name: groupANode, Labels: map[string]string{nodeGroupLabel: "group-a"}},
		{Name: groupBNode, Labels: map[string]string{nodeGroupLabel: "group-b"}},
	}})[0]
	ns := createNamespace(t, s, rebalanceNamespace)

	// The Etcd starts as an earlier release of druid-stretch left it: the
	// extended Etcd CRD in place of druid's, druid-stretch's field inline.
	// The upgrade to the EtcdMembership is part of this test.
	installExtendedEtcdCRD(t, s)
	// group-b's node is cordoned, so the Etcd lands on group-a.
	g.Expect(s.Cordon(ctx, groupBNode, true)).To(Succeed())
	var e *v1alpha1.Etcd
	g.Eventually(func() error {
		// The CRD's new schema reaches the API server's handlers shortly
		// after it is established; a strict create fails until then.
		var err error
		_, err = s.CreateEtcd(ctx, ns, func(o *unstructured.Unstructured) error {
			return unstructured.SetNestedField(o.Object, int64(0), "spec", "ordinalStart")
		})
		return err
	}).WithTimeout(30*time.Second).WithPolling(time.Second).Should(Succeed(), "the Etcd with its inline ordinalStart")
	e = &v1alpha1.Etcd{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: MoveEtcdName}}
	key := client.ObjectKeyFromObject(e)
	waitEtcdReady(t, s, e, 3)
	waitVoters(t, s, e, 3)
	for _, p := range etcdPods(t, s, e) {
		g.Expect(p.Spec.NodeName).To(Equal(groupANode), "pod %s runs in group-a", p.Name)
	}

	// The members of both ranges by their in-cluster names.
	var eps []string
	for i := range 6 {
		eps = append(eps, "https://"+podAddr(e, fmt.Sprintf("etcd-main-%d", i), 2379))
	}
	// The project's own etcd client, a second, lower-level check.
	clientTLS, err := s.EtcdClientTLS()
	g.Expect(err).NotTo(HaveOccurred())
	w, err := workload.New(workload.Options{
		Endpoints: eps, DialContext: s.DialContext, Prefix: "/rebalance/", TLS: clientTLS,
		Log: ctrlzap.New(ctrlzap.WriteTo(logFileOf(t, s, "workload.log"))),
	})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = w.Close() })
	g.Expect(w.Start(ctx)).To(Succeed())
	t.Cleanup(w.Stop)
	history := recordMembership(t, etcdClientVia(t, s, eps...))

	// The clients that matter: client-go clients of the shoot's
	// kube-apiserver, which runs in group-a on the Etcd's client Service
	// and stays there: only the etcd members move.
	shoot, err := s.NewShootAPIServer("shoot", ns, "etcd-main")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(shoot.Start(ctx)).To(Succeed())
	load, err := apiload.New(apiload.Options{Servers: []apiload.Server{{Name: shoot.Name, Config: shoot.Config}},
		Log: ctrlzap.New(ctrlzap.WriteTo(logFileOf(t, s, "apiload.log")))})
	g.Expect(err).NotTo(HaveOccurred())
	startCtx, cancelStart := context.WithTimeout(ctx, 3*time.Minute)
	defer cancelStart()
	g.Expect(load.Start(startCtx)).To(Succeed(), "the shoot kube-apiserver serves")
	t.Cleanup(load.Stop)
	// A baseline of acknowledged writes before the move: 5 s from when the
	// clients began, not from the load's clock, which started while the
	// kube-apiserver was still starting (a minute on a busy machine).
	trafficFrom := time.Since(load.StartedAt())
	g.Eventually(func() bool {
		return time.Since(load.StartedAt()) >= trafficFrom+5*time.Second && wroteSince(load, shoot.Name, trafficFrom)
	}).WithTimeout(time.Minute).WithPolling(200*time.Millisecond).Should(BeTrue(), "the clients write before the move")

	// The upgrade: from here on, druid's own CRDs are written every 30 s as gardenlet's
	// CRD deployer writes them on every seed reconcile, which takes the
	// extended Etcd CRD away: the Etcd's inline fields and status.membership
	// are pruned at its next write. The controller copied them into the
	// Etcd's EtcdMembership when it first planned, and everything below
	// writes and reads the pair as the migration adapter does.
	g.Eventually(func() (*stretchv1alpha1.EtcdMembership, error) {
		return etcdview.GetMembership(ctx, s.Client, key)
	}).WithTimeout(time.Minute).Should(HaveField("Spec.OrdinalStart", Equal(ptr.To[int32](0))), "the controller copied the Etcd's fields into its EtcdMembership")
	deployer, err := s.DeployDruidCRDs(ctx, 30*time.Second)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { deployer.Stop() })
	g.Eventually(func(g Gomega) {
		// Any write stores the pruned object; druid's status writes do
		// it too, this one only does not wait for them.
		patchEtcd(t, s, e, func(x *v1alpha1.Etcd) {
			metav1.SetMetaDataAnnotation(&x.ObjectMeta, "test/touched", time.Now().Format(time.RFC3339Nano))
		})
		var stored v1alpha1.Etcd
		g.Expect(s.Client.Get(ctx, key, &stored)).To(Succeed())
		g.Expect(stored.Spec.MembershipSpec).To(BeZero())
		g.Expect(stored.Status.Membership).To(BeNil())
	}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed(), "druid's own CRD pruned the Etcd's inline fields")
	// The upgrade changed no membership: etcd went through one member list
	// from the start, the three voters the Etcd was created with.
	lists := history.Snapshot()
	g.Expect(lists).To(HaveLen(1), "the member list did not change during the upgrade to the EtcdMembership: %v", lists)
	var voters []string
	for _, m := range lists[0] {
		g.Expect(m.Learner).To(BeFalse(), "member %s", m.Name)
		voters = append(voters, m.Name)
	}
	g.Expect(voters).To(ConsistOf("etcd-main-0", "etcd-main-1", "etcd-main-2"))

	ties, tieSum, tiesUnder, err := tieHistogram()
	g.Expect(err).NotTo(HaveOccurred())
	druidReady := WatchDruidReady(s, key)
	t.Cleanup(func() { druidReady.Stop() })

	// The operator's steps: open group-b, close group-a, move the
	// ordinal range (and ask druid to reconcile the changed spec, as
	// gardenlet does with every spec it writes).
	w.MarkPhase("during")
	load.MarkPhase("during")
	moveStart := time.Now()
	g.Expect(s.Cordon(ctx, groupBNode, false)).To(Succeed())
	g.Expect(s.Cordon(ctx, groupANode, true)).To(Succeed())
	g.Expect(retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		p, err := etcdview.Get(ctx, s.Client, key)
		if err != nil {
			return err
		}
		x := p.View.DeepCopy()
		x.Spec.OrdinalStart = ptr.To[int32](3)
		move.RequestDruidReconcile(x)
		return etcdview.Apply(ctx, s.Client, p, x)
	})).To(Succeed())
	druidReady.Start()
	// druid's compaction controller replaces the whole Etcd status, which
	// drops status.membership: here after every step of the rebalance, the
	// first learner's add and the first promotion among them, the moments
	// at which a dropped status once had the old members' pods deleted
	// (quorum lost) or a new cluster bootstrapped. The move must go on as
	// if nothing happened.
	wiper := wipeStatusAfterEveryStep(ctx, t, key, s)
	// Right after the first promotion, with the old voters and the first
	// new one voting side by side, the fields vanish as well: the
	// EtcdMembership, status and spec, is deleted. The controller and the
	// webhooks must keep every pod and member as they are until it comes
	// back, and then finish the rebalance from etcd's member list and the
	// pods, with no status to go by.
	select {
	case <-promoted:
	case <-time.After(5 * time.Minute):
		t.Fatal("the rebalance's first promotion did not come within 5 minutes")
	}
	vanished := dropExtensionFields(ctx, t, s, key)
	vanished.expectNothingChanges(ctx, t, etcdClientVia(t, s, eps...))
	vanished.restore(ctx, t)
	newRange := []string{"etcd-main-3", "etcd-main-4", "etcd-main-5"}
	var lastVoters []string
	err = wait.PollUntilContextTimeout(ctx, time.Second, 10*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := etcdview.Get(ctx, s.Client, key)
		if err != nil {
			return false, nil
		}
		lastVoters = p.View.Status.Membership.Voters()
		return slices.Equal(sortedCopy(lastVoters), newRange), nil
	})
	g.Expect(err).NotTo(HaveOccurred(), "status.membership shows the voters %v (last seen %v)", newRange, lastVoters)
	wipes := wiper.stop()
	t.Logf("status.membership was dropped %d times: %v", len(wipes), wipes)
	// A removal's record is often replaced by the next add before a poll
	// sees it (statusWiper); the adds and promotions are the steps after
	// which a dropped record once cost voters or a cluster.
	g.Expect(kinds(wipes)).To(ContainElements(v1alpha1.StepAddLearner, v1alpha1.StepPromoteLearner),
		"status.membership was dropped after the learners' adds and promotions")
	g.Expect(wipes[0].step).To(HaveField("Kind", v1alpha1.StepAddLearner), "the first drop came right after the first learner's add")
	applied := deployer.Stop()
	g.Expect(applied.Err).NotTo(HaveOccurred(), "writing druid's CRDs as gardenlet does")
	t.Logf("druid's own CRDs were written %d times during the rebalance", applied.Writes)
	// The first write came before the move; the loop's period is gardenlet's
	// order of magnitude, so a fast rebalance may see no second one.
	g.Expect(applied.Writes).To(BeNumerically(">=", 1), "druid's own CRDs were written")
	var stored v1alpha1.Etcd
	g.Expect(s.Client.Get(ctx, key, &stored)).To(Succeed())
	g.Expect(stored.Spec.MembershipSpec).To(BeZero(), "the Etcd stays druid's: the fields live in the EtcdMembership")
	membershipTook := time.Since(moveStart)
	if n, sum, under, err := tieHistogram(); err == nil {
		ties, tieSum, tiesUnder = n-ties, sum-tieSum, under-tiesUnder
	}
	// The new members' pods ready in group-b, the old ones gone, and druid
	// Ready with three ready replicas.
	g.Expect(s.waitRolledOut(ctx, key, 3, 3*time.Minute)).To(Succeed())
	g.Expect(s.WaitEtcdReady(ctx, key, 3, 5*time.Minute)).To(Succeed())
	moveTook := time.Since(moveStart)
	samples := druidReady.Stop()
	w.MarkPhase("after")
	load.MarkPhase("after")
	afterMove := time.Since(load.StartedAt())
	t.Logf("the rebalance took %s: voters %v after %s, pods ready and druid Ready after %s",
		moveTook.Round(100*time.Millisecond), newRange, membershipTook.Round(100*time.Millisecond), moveTook.Round(100*time.Millisecond))
	logTemplateChanges(t, s, ns, "etcd-main")

	firstReady := slices.Index(samples, true)
	g.Expect(firstReady).To(BeNumerically(">=", 0), "druid reported the Etcd Ready during the rebalance (%d samples)", len(samples))
	g.Expect(samples[firstReady:]).To(HaveEach(BeTrue()), "once Ready, druid reports the Etcd Ready for the rest of the rebalance")
	t.Logf("druid's Ready, sampled every second from the patch: first Ready at sample %d, then %d samples, all Ready", firstReady, len(samples)-firstReady)

	pods := etcdPods(t, s, e)
	g.Expect(pods).To(HaveLen(3))
	for _, p := range pods {
		g.Expect(p.Name).To(BeElementOf(newRange))
		g.Expect(p.Spec.NodeName).To(Equal(groupBNode), "pod %s is bound to group-b's node", p.Name)
		g.Expect(podReady(&p)).To(BeTrue(), "pod %s is ready", p.Name)
	}
	for _, name := range newRange {
		_, runs, err := s.ContainerLogs(ns, name, "etcd")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(runs).To(Equal(1), "%s ran once, on group-b: no template change restarted it", name)
	}

	// The clients write after the move, then the histories are checked.
	g.Eventually(func() bool {
		return time.Since(load.StartedAt()) >= afterMove+5*time.Second && wroteSince(load, shoot.Name, afterMove)
	}).WithTimeout(time.Minute).WithPolling(time.Second).Should(BeTrue(), "the kube-apiserver serves writes on the moved members")
	w.Stop()
	g.Expect(w.SetEndpoints(eps[3:]...)).To(Succeed())
	f, lost, err := w.Verify(ctx, workload.VerifyOptions{LinearizabilityTimeout: time.Minute})
	g.Expect(err).NotTo(HaveOccurred())
	t.Logf("own etcd client: %d writes, %d reads, %d failed (%v), %d retries, max write gap %s", f.Writes, f.Reads, f.FailedRequests, f.FailedErrors, f.Retries, f.MaxWriteGap)
	g.Expect(lost.Lost).To(BeEmpty(), "no acknowledged write of the own client lost")
	g.Expect(f.Linearizable).To(BeTrue(), "the own client's history is linearizable: %s", f.LinearizabilityResult)

	load.Stop()
	api, err := load.Results(ctx, apiload.VerifyOptions{LinearizabilityTimeout: time.Minute})
	g.Expect(err).NotTo(HaveOccurred())
	// The client gate drains a member before its removal and holds calls
	// through the leader transfer (chart value
	// sidecar.clientGateBackendPort, on in every site). Within one site
	// the transfer's hold ends in well under a second on a quiet machine
	// (docs/benchmarks.md); a busy one stretches it.
	expectKubeAPIServersSawNothing(t, api, s)

	history.Stop()
	expectTLSMembers(t, history)
	expectInterleavedMove(t, history, appliedConfChanges(t, s, ns, "etcd-main-3"), "an old member", false)
	tie, polledTies := history.LongestTie(func(name string) bool { return memberOrdinal(name) >= 3 })
	t.Logf("polls saw the voters tied %d time(s), the longest for %s; the controller measured %d tie(s), %.3f s in all",
		polledTies, tie, ties, tieSum)
	g.Expect(polledTies).To(BeNumerically("<=", 1), "the rebalance passes through one tie at most")
	g.Expect(ties).To(BeNumerically("==", 1), "the majority changed ranges through one tie")
	logTieLength(t, tie, ties, tiesUnder)

	crashes, err := s.EtcdCrashes()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(crashes).To(BeEmpty(), "etcd panics or fatal exits")
	// backup-restore of every pod of both ranges, over every run, never
	// changed the membership itself.
	for i := range 6 {
		name := fmt.Sprintf("etcd-main-%d", i)
		log, runs, err := s.ContainerLogs(ns, name, "backup-restore")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(runs).To(BeNumerically(">=", 1), "pod %s ran", name)
		g.Expect(log).NotTo(ContainSubstring("Attempting to promote member"), "backup-restore of %s promoted", name)
	}
	// Each node ran the pods of its range only, each pod once: the old
	// range in group-a, the new one in group-b (the nodes' pod folders).
	for _, n := range s.Nodes {
		var ran []string
		for _, pattern := range []string{"etcd-main-[012]", "etcd-main-[345]"} {
			dirs, err := filepath.Glob(filepath.Join(n.Dir, "pods", ns+"_"+pattern+"_*"))
			g.Expect(err).NotTo(HaveOccurred())
			ran = append(ran, fmt.Sprintf("%s: %d", pattern, len(dirs)))
		}
		want := []string{"etcd-main-[012]: 3", "etcd-main-[345]: 0"}
		if n.Name == groupBNode {
			want = []string{"etcd-main-[012]: 0", "etcd-main-[345]: 3"}
		}
		g.Expect(ran).To(Equal(want), "the etcd pods node %s ran", n.Name)
	}
}

// sortedCopy is names sorted, s untouched.
func sortedCopy(names []string) []string {
	out := slices.Clone(names)
	slices.Sort(out)
	return out
}
