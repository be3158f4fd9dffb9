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
	"github.com/druid-stretch/druid-stretch/internal/etcdview"
	"github.com/druid-stretch/druid-stretch/internal/planner"
	"github.com/druid-stretch/druid-stretch/internal/sidecarcluster"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
	"github.com/druid-stretch/druid-stretch/internal/testing/workload"
	"github.com/druid-stretch/druid-stretch/test/framework/apiload"
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
// logs. On the way the Etcd is upgraded from the extended Etcd CRD of
// earlier releases to the EtcdMembership, its status is dropped after every
// step, and its fields vanish for a while after the first promotion.
func TestRebalanceBetweenNodeGroups(t *testing.T) {
	g := NewWithT(t)
	ctx := testContext(t, siteTestDeadline)
	// The first promotion of the rebalance is the moment its fields are
	// taken away (below).
	promoted := make(chan struct{})
	var promotedOnce sync.Once
	r := newRebalance(ctx, t, rebalanceOptions{fromExtendedCRD: true, onStep: func(step planner.Step, res *sidecarcluster.Result) {
		if step.Kind == planner.Promote && res != nil && res.Outcome == sidecarcluster.Succeeded && res.Changed {
			promotedOnce.Do(func() { close(promoted) })
		}
	}})
	s, key := r.s, r.key
	deployer := r.upgradeToEtcdMembership(ctx, t)

	ties, tieSum, tiesUnder, err := tieHistogram()
	g.Expect(err).NotTo(HaveOccurred())
	druidReady := WatchDruidReady(s, key)
	t.Cleanup(func() { druidReady.Stop() })
	r.begin(ctx, t)
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
	vanished, err := dropExtensionFields(ctx, s, key)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(vanished.reported(ctx)).To(Succeed())
	reconciles := membershipReconciles(t)
	cli := etcdClientVia(t, s, r.eps...)
	before, err := vanished.state(ctx, cli)
	g.Expect(err).NotTo(HaveOccurred())
	t.Logf("the fields are reported lost; %s", before)
	g.Expect(vanished.druidWriteRefused(ctx)).To(Succeed())
	expectFieldsLostInProcess(t, key, reconciles)
	g.Expect(vanished.unchanged(ctx, cli, before)).To(Succeed())
	g.Expect(vanished.restore(ctx)).To(Succeed())
	t.Logf("the EtcdMembership %s was created again from its spec", key)
	r.waitNewVoters(ctx, g)
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
	membershipTook := time.Since(r.start)
	if n, sum, under, err := tieHistogram(); err == nil {
		ties, tieSum, tiesUnder = n-ties, sum-tieSum, under-tiesUnder
	}
	out := r.finish(ctx, t, g)
	samples := druidReady.Stop()
	t.Logf("the rebalance took %s: voters %v after %s, pods ready and druid Ready after %s",
		out.took.Round(100*time.Millisecond), rebalanceNewRange, membershipTook.Round(100*time.Millisecond), out.took.Round(100*time.Millisecond))
	logTemplateChanges(t, s, r.e.Namespace, MoveEtcdName)

	firstReady := slices.Index(samples, true)
	g.Expect(firstReady).To(BeNumerically(">=", 0), "druid reported the Etcd Ready during the rebalance (%d samples)", len(samples))
	g.Expect(samples[firstReady:]).To(HaveEach(BeTrue()), "once Ready, druid reports the Etcd Ready for the rest of the rebalance")
	t.Logf("druid's Ready, sampled every second from the patch: first Ready at sample %d, then %d samples, all Ready", firstReady, len(samples)-firstReady)

	for _, name := range rebalanceNewRange {
		_, runs, err := s.ContainerLogs(r.e.Namespace, name, "etcd")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(runs).To(Equal(1), "%s ran once, on group-b: no template change restarted it", name)
	}
	// The client gate drains a member before its removal and holds calls
	// through the leader transfer (chart value
	// sidecar.clientGateBackendPort, on in every site). Within one site
	// the transfer's hold ends in well under a second on a quiet machine
	// (docs/benchmarks.md); a busy one stretches it.
	expectKubeAPIServersSawNothing(t, out.api, s)
	expectInterleavedMove(t, r.history, appliedConfChanges(t, s, r.e.Namespace, "etcd-main-3"), "an old member")
	tie, polledTies := r.history.LongestTie(func(name string) bool { return memberOrdinal(name) >= 3 })
	t.Logf("polls saw the voters tied %d time(s), the longest for %s; the controller measured %d tie(s), %.3f s in all",
		polledTies, tie, ties, tieSum)
	g.Expect(polledTies).To(BeNumerically("<=", 1), "the rebalance passes through one tie at most")
	g.Expect(ties).To(BeNumerically("==", 1), "the majority changed ranges through one tie")
	logTieLength(t, tie, ties, tiesUnder)
	// backup-restore of every pod of both ranges, over every run, never
	// changed the membership itself.
	for i := range 6 {
		name := fmt.Sprintf("etcd-main-%d", i)
		log, runs, err := s.ContainerLogs(r.e.Namespace, name, "backup-restore")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(runs).To(BeNumerically(">=", 1), "pod %s ran", name)
		g.Expect(log).NotTo(ContainSubstring("Attempting to promote member"), "backup-restore of %s promoted", name)
	}
	// Each node ran the pods of its range only, each pod once: the old
	// range in group-a, the new one in group-b (the nodes' pod folders).
	for _, n := range s.Nodes {
		var ran []string
		for _, pattern := range []string{"etcd-main-[012]", "etcd-main-[345]"} {
			dirs, err := filepath.Glob(filepath.Join(n.Dir, "pods", r.e.Namespace+"_"+pattern+"_*"))
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

// rebalanceNewRange are the members' names after the rebalance.
var rebalanceNewRange = []string{"etcd-main-3", "etcd-main-4", "etcd-main-5"}

// rebalanceOptions shape a rebalance's site and Etcd.
type rebalanceOptions struct {
	// onStep is the controller's Options.OnStep.
	onStep func(planner.Step, *sidecarcluster.Result)
	// fromExtendedCRD starts the Etcd as an earlier release of
	// druid-stretch left it: the extended Etcd CRD in place of druid's,
	// druid-stretch's field inline (upgradeToEtcdMembership moves it).
	// Otherwise the Etcd is druid's with an EtcdMembership of
	// ordinalStart 0.
	fromExtendedCRD bool
}

// rebalance is a site with two node groups and a 3-member Etcd running in
// group-a, with the clients that judge its rebalance to group-b: the
// project's own etcd client and client-go clients of a shoot
// kube-apiserver, which runs in group-a on the Etcd's client Service and
// stays there (only the etcd members move), and the member list recorded.
type rebalance struct {
	s       *Site
	e       *v1alpha1.Etcd
	key     client.ObjectKey
	eps     []string // both ranges' members by their in-cluster names
	w       *workload.Workload
	history *MembershipHistory
	load    *apiload.Load
	shoot   string
	// start is when begin asked for the rebalance.
	start time.Time
}

// newRebalance starts the site, the Etcd and the clients; the clients
// have written for 5 s when it returns.
func newRebalance(ctx context.Context, t *testing.T, o rebalanceOptions) *rebalance {
	testbin.Need(t)
	if os.Geteuid() != 0 {
		t.Fatal("a real site needs root: its pods get network namespaces and chroots")
	}
	g := NewWithT(t)
	s := startSites(t, Options{DruidStretch: true, ClusterIdentity: "site", OnStep: o.onStep, Nodes: []NodeOptions{
		{Name: groupANode, Labels: map[string]string{nodeGroupLabel: "group-a"}},
		{Name: groupBNode, Labels: map[string]string{nodeGroupLabel: "group-b"}},
	}})[0]
	ns := createNamespace(t, s, rebalanceNamespace)
	key := client.ObjectKey{Namespace: ns, Name: MoveEtcdName}
	// group-b's node is cordoned, so the Etcd lands on group-a.
	g.Expect(s.Cordon(ctx, groupBNode, true)).To(Succeed())
	if o.fromExtendedCRD {
		installExtendedEtcdCRD(t, s)
		g.Eventually(func() error {
			// The CRD's new schema reaches the API server's handlers
			// shortly after it is established; a strict create fails
			// until then.
			_, err := s.CreateEtcd(ctx, ns, func(o *unstructured.Unstructured) error {
				return unstructured.SetNestedField(o.Object, int64(0), "spec", "ordinalStart")
			})
			return err
		}).WithTimeout(30*time.Second).WithPolling(time.Second).Should(Succeed(), "the Etcd with its inline ordinalStart")
	} else {
		opted := &stretchv1alpha1.EtcdMembership{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: MoveEtcdName}}
		opted.Spec.OrdinalStart = ptr.To[int32](0)
		g.Expect(s.Client.Create(ctx, opted)).To(Succeed())
		_, err := s.CreateEtcd(ctx, ns, nil)
		g.Expect(err).NotTo(HaveOccurred())
	}
	r := &rebalance{s: s, key: key, e: &v1alpha1.Etcd{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: MoveEtcdName}}}
	waitEtcdReady(t, s, r.e, 3)
	waitVoters(t, s, r.e, 3)
	for _, p := range etcdPods(t, s, r.e) {
		g.Expect(p.Spec.NodeName).To(Equal(groupANode), "pod %s runs in group-a", p.Name)
	}
	for i := range 6 {
		r.eps = append(r.eps, "https://"+podAddr(r.e, fmt.Sprintf("etcd-main-%d", i), 2379))
	}
	clientTLS, err := s.EtcdClientTLS()
	g.Expect(err).NotTo(HaveOccurred())
	r.w, err = workload.New(workload.Options{
		Endpoints: r.eps, DialContext: s.DialContext, Prefix: "/rebalance/", TLS: clientTLS,
		Log: ctrlzap.New(ctrlzap.WriteTo(logFileOf(t, s, "workload.log"))),
	})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = r.w.Close() })
	g.Expect(r.w.Start(ctx)).To(Succeed())
	t.Cleanup(r.w.Stop)
	r.history = recordMembership(t, etcdClientVia(t, s, r.eps...))

	shoot, err := s.NewShootAPIServer("shoot", ns, "etcd-main", nil)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(shoot.Start(ctx)).To(Succeed())
	r.shoot = shoot.Name
	r.load, err = apiload.New(apiload.Options{Servers: []apiload.Server{{Name: shoot.Name, Config: shoot.Config}},
		Log: ctrlzap.New(ctrlzap.WriteTo(logFileOf(t, s, "apiload.log")))})
	g.Expect(err).NotTo(HaveOccurred())
	startCtx, cancelStart := context.WithTimeout(ctx, 3*time.Minute)
	defer cancelStart()
	g.Expect(r.load.Start(startCtx)).To(Succeed(), "the shoot kube-apiserver serves")
	t.Cleanup(r.load.Stop)
	// A baseline of acknowledged writes before the move: 5 s from when the
	// clients began, not from the load's clock, which started while the
	// kube-apiserver was still starting (a minute on a busy machine).
	trafficFrom := time.Since(r.load.StartedAt())
	g.Eventually(func() bool {
		return time.Since(r.load.StartedAt()) >= trafficFrom+5*time.Second && wroteSince(r.load, shoot.Name, trafficFrom)
	}).WithTimeout(time.Minute).WithPolling(200*time.Millisecond).Should(BeTrue(), "the clients write before the move")
	return r
}

// upgradeToEtcdMembership runs the upgrade of an Etcd made with
// fromExtendedCRD: from here on, druid's own CRDs are written every 30 s
// as gardenlet's CRD deployer writes them on every seed reconcile, which
// takes the extended Etcd CRD away: the Etcd's inline fields and
// status.membership are pruned at its next write. The controller copied
// them into the Etcd's EtcdMembership when it first planned, and
// everything after writes and reads the pair as the migration adapter
// does. The deployer goes on until the caller stops it.
func (r *rebalance) upgradeToEtcdMembership(ctx context.Context, t *testing.T) *CRDDeployer {
	g := NewWithT(t)
	s, key := r.s, r.key
	g.Eventually(func() (*stretchv1alpha1.EtcdMembership, error) {
		return etcdview.GetMembership(ctx, s.Client, key)
	}).WithTimeout(time.Minute).Should(HaveField("Spec.OrdinalStart", Equal(ptr.To[int32](0))), "the controller copied the Etcd's fields into its EtcdMembership")
	deployer, err := s.DeployDruidCRDs(ctx, 30*time.Second)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { deployer.Stop() })
	g.Eventually(func(g Gomega) {
		// Any write stores the pruned object; druid's status writes do
		// it too, this one only does not wait for them.
		patchEtcd(t, s, r.e, func(x *v1alpha1.Etcd) {
			metav1.SetMetaDataAnnotation(&x.ObjectMeta, "test/touched", time.Now().Format(time.RFC3339Nano))
		})
		var stored v1alpha1.Etcd
		g.Expect(s.Client.Get(ctx, key, &stored)).To(Succeed())
		g.Expect(stored.Spec.MembershipSpec).To(BeZero())
		g.Expect(stored.Status.Membership).To(BeNil())
	}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed(), "druid's own CRD pruned the Etcd's inline fields")
	// The upgrade changed no membership: etcd went through one member list
	// from the start, the three voters the Etcd was created with.
	lists := r.history.Snapshot()
	g.Expect(lists).To(HaveLen(1), "the member list did not change during the upgrade to the EtcdMembership: %v", lists)
	var voters []string
	for _, m := range lists[0] {
		g.Expect(m.Learner).To(BeFalse(), "member %s", m.Name)
		voters = append(voters, m.Name)
	}
	g.Expect(voters).To(ConsistOf("etcd-main-0", "etcd-main-1", "etcd-main-2"))
	return deployer
}

// begin takes the operator's steps: open group-b, close group-a, move the
// ordinal range (and ask druid to reconcile the changed spec, as gardenlet
// does with every spec it writes).
func (r *rebalance) begin(ctx context.Context, t *testing.T) {
	g := NewWithT(t)
	r.w.MarkPhase("during")
	r.load.MarkPhase("during")
	r.start = time.Now()
	g.Expect(r.s.Cordon(ctx, groupBNode, false)).To(Succeed())
	g.Expect(r.s.Cordon(ctx, groupANode, true)).To(Succeed())
	g.Expect(retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		p, err := etcdview.Get(ctx, r.s.Client, r.key)
		if err != nil {
			return err
		}
		x := p.View.DeepCopy()
		x.Spec.OrdinalStart = ptr.To[int32](3)
		move.RequestDruidReconcile(x)
		return etcdview.Apply(ctx, r.s.Client, p, x)
	})).To(Succeed())
}

// waitNewVoters waits until status.membership lists the new range's
// members as the voters.
func (r *rebalance) waitNewVoters(ctx context.Context, g Gomega) {
	var last []string
	err := wait.PollUntilContextTimeout(ctx, time.Second, 10*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := etcdview.Get(ctx, r.s.Client, r.key)
		if err != nil {
			return false, nil
		}
		last = p.View.Status.Membership.Voters()
		return slices.Equal(sortedCopy(last), rebalanceNewRange), nil
	})
	g.Expect(err).NotTo(HaveOccurred(), "status.membership shows the voters %v (last seen %v)", rebalanceNewRange, last)
}

// rebalanceOutcome is what the clients and the member list saw.
type rebalanceOutcome struct {
	took         time.Duration
	fewestVoters int
	own          workload.Figures
	lost         int
	api          apiload.Results
}

// finish waits for the new range's pods ready in group-b, the old ones
// gone and druid Ready, lets the clients write 5 s more, and checks the
// clients' histories and the member list with g: no acknowledged write
// lost, linearizable, never fewer than 3 voters, one cluster, no etcd
// crash, each new pod bound to group-b.
func (r *rebalance) finish(ctx context.Context, t *testing.T, g Gomega) rebalanceOutcome {
	var out rebalanceOutcome
	g.Expect(r.s.waitRolledOut(ctx, r.key, 3, 3*time.Minute)).To(Succeed())
	g.Expect(r.s.WaitEtcdReady(ctx, r.key, 3, 5*time.Minute)).To(Succeed())
	out.took = time.Since(r.start)
	r.w.MarkPhase("after")
	r.load.MarkPhase("after")
	afterMove := time.Since(r.load.StartedAt())
	pods := etcdPods(t, r.s, r.e)
	g.Expect(pods).To(HaveLen(3))
	for _, p := range pods {
		g.Expect(p.Name).To(BeElementOf(rebalanceNewRange))
		g.Expect(p.Spec.NodeName).To(Equal(groupBNode), "pod %s is bound to group-b's node", p.Name)
		g.Expect(podReady(&p)).To(BeTrue(), "pod %s is ready", p.Name)
	}

	// The clients write after the move, then the histories are checked.
	g.Eventually(func() bool {
		return time.Since(r.load.StartedAt()) >= afterMove+5*time.Second && wroteSince(r.load, r.shoot, afterMove)
	}).WithTimeout(time.Minute).WithPolling(time.Second).Should(BeTrue(), "the kube-apiserver serves writes on the moved members")
	r.w.Stop()
	g.Expect(r.w.SetEndpoints(r.eps[3:]...)).To(Succeed())
	f, lost, err := r.w.Verify(ctx, workload.VerifyOptions{LinearizabilityTimeout: time.Minute})
	g.Expect(err).NotTo(HaveOccurred())
	out.own, out.lost = f, len(lost.Lost)
	t.Logf("own etcd client: %d writes, %d reads, %d failed (%v), %d retries, max write gap %s", f.Writes, f.Reads, f.FailedRequests, f.FailedErrors, f.Retries, f.MaxWriteGap)
	g.Expect(lost.Lost).To(BeEmpty(), "no acknowledged write of the own client lost")
	g.Expect(f.Linearizable).To(BeTrue(), "the own client's history is linearizable: %s", f.LinearizabilityResult)
	r.load.Stop()
	out.api, err = r.load.Results(ctx, apiload.VerifyOptions{LinearizabilityTimeout: time.Minute})
	g.Expect(err).NotTo(HaveOccurred())

	r.history.Stop()
	expectTLSMembers(t, r.history)
	fewest, from, lasted := r.history.FewestVoters()
	t.Logf("the fewest voters: %d, from %s for %s", fewest, from.Format("15:04:05.000"), lasted.Round(100*time.Millisecond))
	out.fewestVoters = fewest
	g.Expect(fewest).To(Equal(3), "the Etcd never had fewer than 3 voters: %v", r.history.Snapshot())
	expectOneCluster(g, r.history)
	crashes, err := r.s.EtcdCrashes()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(crashes).To(BeEmpty(), "etcd panics or fatal exits")
	return out
}

// sortedCopy is names sorted, s untouched.
func sortedCopy(names []string) []string {
	out := slices.Clone(names)
	slices.Sort(out)
	return out
}
