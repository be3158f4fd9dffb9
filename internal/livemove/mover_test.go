package livemove_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	stretchv1alpha1 "github.com/druid-stretch/druid-stretch/api/stretch/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	move "github.com/druid-stretch/druid-stretch/api/v1alpha1/migration"
	"github.com/druid-stretch/druid-stretch/internal/etcdview"
	"github.com/druid-stretch/druid-stretch/internal/livemove"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
)

// Two kube-apiservers, the source and the destination cluster, without
// controllers: these tests check what the Mover writes and refuses; the
// moves themselves, with controllers and etcd, are in test/e2e.
var srcClient, dstClient client.Client

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	if testbin.Short() {
		fmt.Println("every test of this package runs real binaries: none runs under -short")
		return 0
	}
	if _, err := testbin.KubeAPIServer(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	envs := make([]*envtest.Environment, 2)
	clients := make([]client.Client, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range envs {
		env, err := testbin.Environment()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		envs[i] = env
		wg.Go(func() {
			cfg, err := envs[i].Start()
			if err != nil {
				errs[i] = err
				return
			}
			clients[i], errs[i] = livemove.NewClient(cfg)
		})
	}
	wg.Wait()
	defer func() {
		for _, e := range envs {
			_ = e.Stop()
		}
	}()
	for _, err := range errs {
		if err != nil {
			fmt.Fprintln(os.Stderr, "starting envtest:", err)
			return 1
		}
	}
	srcClient, dstClient = clients[0], clients[1]
	return m.Run()
}

// setup creates a namespace in both clusters and the source Etcd in it,
// with its EtcdMembership.
func setup(t *testing.T) (namespace string, src *v1alpha1.Etcd) {
	t.Helper()
	return setupWith(t, 3)
}

// setupWith is setup with a source of the given replicas.
func setupWith(t *testing.T, replicas int32) (namespace string, src *v1alpha1.Etcd) {
	t.Helper()
	g := NewWithT(t)
	namespace = fmt.Sprintf("mover-%d", time.Now().UnixNano())
	for _, c := range []client.Client{srcClient, dstClient} {
		g.Expect(c.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}})).To(Succeed())
	}
	src = &v1alpha1.Etcd{ObjectMeta: metav1.ObjectMeta{Name: "etcd-main", Namespace: namespace}}
	src.Spec.Replicas = replicas
	src.Spec.Labels = map[string]string{"app": "etcd-statefulset"}
	// Opted in, as a source is before a move: its EtcdMembership exists.
	src.Spec.OrdinalStart = ptr.To[int32](0)
	g.Expect(etcdview.Create(t.Context(), srcClient, src)).To(Succeed())
	return namespace, src
}

func mover(t *testing.T, namespace string, events *[]livemove.Event, options ...func(*livemove.Options)) *livemove.Mover {
	t.Helper()
	tmpl := func(site string) livemove.URLTemplates {
		return livemove.URLTemplates{
			Peer:    "http://{pod}." + site + ".example:2380",
			Client:  "http://{pod}." + site + ".example:2379",
			Sidecar: "https://{pod}." + site + ".example:8090",
		}
	}
	var mu sync.Mutex
	o := livemove.Options{
		Source: srcClient, Destination: dstClient, Namespace: namespace, Name: "etcd-main",
		SourceAddresses: tmpl("seed-a").Addresses(), DestinationAddresses: tmpl("seed-b").Addresses(),
		StepTimeout: 2 * time.Second, PollInterval: 50 * time.Millisecond,
		Progress: func(e livemove.Event) {
			mu.Lock()
			defer mu.Unlock()
			if events != nil {
				*events = append(*events, e)
			}
		},
	}
	for _, f := range options {
		f(&o)
	}
	m, err := livemove.New(o)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// get reads the Etcd of namespace as the mover sees it: the view of the
// Etcd and its EtcdMembership; nil when there is no Etcd.
func get(t *testing.T, c client.Client, namespace string) *v1alpha1.Etcd {
	t.Helper()
	p, err := etcdview.Get(t.Context(), c, client.ObjectKey{Namespace: namespace, Name: "etcd-main"})
	if err != nil {
		return nil
	}
	return p.View
}

// apply changes the Etcd of namespace as the mover does: mutate edits its
// view, and each part is written back where it lives.
func apply(t *testing.T, c client.Client, namespace string, mutate func(*v1alpha1.Etcd)) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p, err := etcdview.Get(t.Context(), c, client.ObjectKey{Namespace: namespace, Name: "etcd-main"})
		if err != nil {
			return err
		}
		want := p.View.DeepCopy()
		mutate(want)
		return etcdview.Apply(t.Context(), c, p, want)
	})
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
}

// report writes the status.membership that the controller of c's cluster
// would write, planned from the current pair: st gets the pair's
// generation to observe.
func report(t *testing.T, c client.Client, namespace string, st func(gen int64) *v1alpha1.MembershipStatus) {
	t.Helper()
	g := NewWithT(t)
	p, err := etcdview.Get(t.Context(), c, client.ObjectKey{Namespace: namespace, Name: "etcd-main"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(p.Membership).NotTo(BeNil(), "the controller reports into the EtcdMembership")
	m := p.Membership.DeepCopy()
	m.Status.Membership = st(p.View.Generation)
	g.Expect(c.Status().Update(t.Context(), m)).To(Succeed())
}

func TestNewRefusesMissingOptions(t *testing.T) {
	g := NewWithT(t)
	_, err := livemove.New(livemove.Options{Namespace: "ns"})
	g.Expect(err).To(MatchError(ContainSubstring("both the source and the destination client are required")))
	g.Expect(err).To(MatchError(ContainSubstring(`namespace and name are required, got "ns"/""`)))
	g.Expect(err).To(MatchError(ContainSubstring("SourceAddresses and DestinationAddresses are required")))
}

// Without controllers nothing converges: the first step writes the
// destination's members into the source, waits its time limit, and says so;
// the destination is not created before the source is prepared.
func TestPrepareSourceWritesTheDestinationMembersAndWaits(t *testing.T) {
	g := NewWithT(t)
	ns, _ := setup(t)
	var events []livemove.Event
	err := mover(t, ns, &events).Move(context.Background())
	g.Expect(err).To(MatchError(ContainSubstring("step prepare-source did not finish within 2s (run the move again to continue)")))

	src := get(t, srcClient, ns)
	g.Expect(src.Spec.GetExternalMembersPolicy()).To(Equal(v1alpha1.ExternalMembersPolicyKeep))
	g.Expect(src.Spec.ExternalMembers).To(Equal([]v1alpha1.ExternalMember{
		{Name: "etcd-main-3", PeerURLs: []string{"http://etcd-main-3.seed-b.example:2380"}, ClientURLs: []string{"http://etcd-main-3.seed-b.example:2379"}, SidecarURL: "https://etcd-main-3.seed-b.example:8090"},
		{Name: "etcd-main-4", PeerURLs: []string{"http://etcd-main-4.seed-b.example:2380"}, ClientURLs: []string{"http://etcd-main-4.seed-b.example:2379"}, SidecarURL: "https://etcd-main-4.seed-b.example:8090"},
		{Name: "etcd-main-5", PeerURLs: []string{"http://etcd-main-5.seed-b.example:2380"}, ClientURLs: []string{"http://etcd-main-5.seed-b.example:2379"}, SidecarURL: "https://etcd-main-5.seed-b.example:8090"},
	}))
	g.Expect(get(t, dstClient, ns)).To(BeNil(), "the destination is created by the next step only")
	g.Expect(events).NotTo(BeEmpty())
	g.Expect(events[0].Kind).To(Equal(livemove.StepStarted))
	g.Expect(events[0].Step).To(Equal(move.StepPrepareSource))
	g.Expect(events[len(events)-1].Kind).To(Equal(livemove.StepWaiting))
	g.Expect(events[len(events)-1].Phase).To(Equal(move.PhasePreparingSource))

	// Running it again writes the same, and an abort before the join only
	// takes the external members back (and waits for the controller).
	err = mover(t, ns, nil).Abort(context.Background())
	g.Expect(err).To(MatchError(ContainSubstring("step abort did not finish")))
	g.Expect(get(t, srcClient, ns).Spec.ExternalMembers).To(BeEmpty())
}

// A destination Etcd with replicas and no external members is a separate
// etcd cluster: the move refuses it and changes neither object.
func TestMoveRefusesASeparateDestinationCluster(t *testing.T) {
	g := NewWithT(t)
	ns, _ := setup(t)
	dst := move.NewDestination(get(t, srcClient, ns), 3)
	dst.ResourceVersion = ""
	g.Expect(etcdview.Create(t.Context(), dstClient, dst)).To(Succeed())
	srcBefore, dstBefore := get(t, srcClient, ns), get(t, dstClient, ns)

	err := mover(t, ns, nil).Move(context.Background())
	g.Expect(err).To(MatchError(ContainSubstring("refusing to change")))
	g.Expect(err).To(MatchError(ContainSubstring("it is a separate etcd cluster")))
	g.Expect(get(t, srcClient, ns)).To(Equal(srcBefore))
	g.Expect(get(t, dstClient, ns)).To(Equal(dstBefore))
}

// retiringMove writes the two Etcds of a move in retire-source (hold: the
// source members held back) with the destination's controller reporting
// members, converged or not, and returns the namespace.
func retiringMove(t *testing.T, hold int32, converged bool, observed ...v1alpha1.ObservedMember) string {
	t.Helper()
	return startedMove(t, converged, func(dst *v1alpha1.Etcd) { move.RetireSource(dst, 3, hold) }, observed...)
}

// startedMove is a move whose destination joined, then had step applied
// to its spec, with its controller's report of observed members
// (converged or not); it returns the namespace.
func startedMove(t *testing.T, converged bool, step func(dst *v1alpha1.Etcd), observed ...v1alpha1.ObservedMember) string {
	t.Helper()
	g := NewWithT(t)
	ns, src := setup(t)
	dstMembers, err := move.ExternalMembers(move.NewDestination(src, 3), livemove.URLTemplates{Peer: "http://{pod}.b:2380"}.Addresses())
	g.Expect(err).NotTo(HaveOccurred())
	srcMembers, err := move.ExternalMembers(src, livemove.URLTemplates{Peer: "http://{pod}.a:2380"}.Addresses())
	g.Expect(err).NotTo(HaveOccurred())
	apply(t, srcClient, ns, func(v *v1alpha1.Etcd) { move.PrepareSource(v, dstMembers) })
	dst := move.NewDestination(get(t, srcClient, ns), 3)
	move.JoinDestination(dst, srcMembers)
	step(dst)
	dst.ResourceVersion, dst.Generation, dst.Spec.ExternalMembers = "", 0, srcMembers
	g.Expect(etcdview.Create(t.Context(), dstClient, dst)).To(Succeed())
	report(t, dstClient, ns, func(gen int64) *v1alpha1.MembershipStatus {
		now := metav1.Now()
		st := &v1alpha1.MembershipStatus{ObservedGeneration: gen, ObservedTime: &now, Members: observed}
		if converged {
			st.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionMembershipConverged, Status: metav1.ConditionTrue,
				ObservedGeneration: gen, Reason: v1alpha1.ReasonConverged, LastTransitionTime: now}}
		}
		return st
	})
	return ns
}

// joinedMove is a move whose destination's first member joined: 3+1
// voters, policy Keep, its controller converged. It returns the namespace
// and the observed members.
func joinedMove(t *testing.T) (string, []v1alpha1.ObservedMember) {
	t.Helper()
	joined := []v1alpha1.ObservedMember{
		observedMember("1", "etcd-main-0", v1alpha1.MemberRoleLeader, v1alpha1.MemberOriginExternal),
		observedMember("2", "etcd-main-1", v1alpha1.MemberRoleVoter, v1alpha1.MemberOriginExternal),
		observedMember("3", "etcd-main-2", v1alpha1.MemberRoleVoter, v1alpha1.MemberOriginExternal),
		observedMember("4", "etcd-main-3", v1alpha1.MemberRoleVoter, v1alpha1.MemberOriginLocal),
	}
	ns := startedMove(t, true, func(*v1alpha1.Etcd) {}, joined...)
	NewWithT(t).Expect(move.Phase(get(t, srcClient, ns), get(t, dstClient, ns))).To(Equal(move.PhaseDestinationJoined))
	return ns, joined
}

// reportConverged writes what the destination's controller reports once
// it converged on the destination's current spec: the observed members.
func reportConverged(t *testing.T, ns string, observed ...v1alpha1.ObservedMember) {
	t.Helper()
	report(t, dstClient, ns, func(gen int64) *v1alpha1.MembershipStatus { return converged(gen, observed...) })
}

// converged is a controller's report of observed members, converged on
// generation gen of the pair.
func converged(gen int64, observed ...v1alpha1.ObservedMember) *v1alpha1.MembershipStatus {
	now := metav1.Now()
	return &v1alpha1.MembershipStatus{ObservedGeneration: gen, ObservedTime: &now, Members: observed,
		Conditions: []metav1.Condition{{Type: v1alpha1.ConditionMembershipConverged, Status: metav1.ConditionTrue,
			ObservedGeneration: gen, Reason: v1alpha1.ReasonConverged, LastTransitionTime: now}}}
}

// observedMember is a healthy member as a controller reports it.
func observedMember(id, name string, role v1alpha1.MemberRole, origin v1alpha1.MemberOrigin) v1alpha1.ObservedMember {
	return v1alpha1.ObservedMember{ID: id, Name: name, Role: role, Origin: origin, Healthy: true}
}

// Once the destination's controller reports the majority on its side, an
// abort is refused with the voter counts and changes nothing.
func TestAbortRefusedOnceTheDestinationHoldsTheMajority(t *testing.T) {
	g := NewWithT(t)
	// What the destination's controller would report: one source voter
	// left, two of its own.
	ns := retiringMove(t, 0, false,
		observedMember("1", "etcd-main-2", v1alpha1.MemberRoleVoter, v1alpha1.MemberOriginExternal),
		observedMember("2", "etcd-main-3", v1alpha1.MemberRoleLeader, v1alpha1.MemberOriginLocal),
		observedMember("3", "etcd-main-4", v1alpha1.MemberRoleVoter, v1alpha1.MemberOriginLocal))
	srcBefore, dstBefore := get(t, srcClient, ns), get(t, dstClient, ns)

	err := mover(t, ns, nil).Abort(context.Background())
	g.Expect(err).To(MatchError(ContainSubstring("the destination holds the majority (2 of 3 voters; the source has 1)")))
	g.Expect(get(t, srcClient, ns)).To(Equal(srcBefore))
	g.Expect(get(t, dstClient, ns)).To(Equal(dstBefore))
}

// Once the destination joined, the move runs the caller's switch of the
// source site's clients before it retires any source member; a switch that
// fails changes nothing.
func TestSwitchClientsComesBeforeAnySourceMemberGoes(t *testing.T) {
	g := NewWithT(t)
	ns, joined := joinedMove(t)
	srcBefore, dstBefore := get(t, srcClient, ns), get(t, dstClient, ns)

	moveWithFailingSwitch(t, ns, "no source member is retired while the clients are not switched", true)
	// The destination's controller converges on the warm destination: its
	// further members joined as learners.
	reportConverged(t, ns, append(joined,
		observedMember("5", "etcd-main-4", v1alpha1.MemberRoleLearner, v1alpha1.MemberOriginLocal),
		observedMember("6", "etcd-main-5", v1alpha1.MemberRoleLearner, v1alpha1.MemberOriginLocal))...)
	g.Expect(move.Phase(get(t, srcClient, ns), get(t, dstClient, ns))).To(Equal(move.PhaseDestinationJoined))
	warmBefore := get(t, dstClient, ns)
	// Nobody plays the destination's controller here: the wait for the
	// source's retirement runs out.
	switched, events := moveWithSwitch(t, ns, "waiting in RetiringSource")
	g.Expect(switched).To(HaveLen(1), "the switch ran once")
	// The switch ran before the destination was told to retire the source,
	// with the destination warmed (by the failed try): its further members
	// are learners.
	g.Expect(switched[0]).To(Equal(warmBefore))
	g.Expect(warmBefore.Spec.GetExternalMembersPolicy()).To(Equal(v1alpha1.ExternalMembersPolicyKeep))
	g.Expect(warmBefore.Spec.Replicas).To(BeNumerically("==", 3))
	g.Expect(warmBefore.Spec.ExternalMembers).To(Equal(dstBefore.Spec.ExternalMembers))
	g.Expect(warmBefore.Spec.AdditionalAdvertisePeerURLs).To(HaveLen(3), "the learners advertise the URLs the source reaches them by, in the EtcdMembership (druid admits none of the ordinals 3..5)")
	retiring := get(t, dstClient, ns)
	g.Expect(retiring.Spec.GetExternalMembersPolicy()).To(Equal(v1alpha1.ExternalMembersPolicyRetire))
	g.Expect(retiring.Spec.Replicas).To(BeNumerically("==", 3))
	g.Expect(retiring.Spec.RetainedExternalMembers).To(BeNil(), "no source member is held back: the clients are switched")
	g.Expect(retiring.Spec.LearnerReplicas).To(BeNil(), "the warm learners may vote")
	var steps []move.Step
	for _, e := range events {
		if e.Kind == livemove.StepStarted {
			steps = append(steps, e.Step)
		}
	}
	g.Expect(steps).To(Equal([]move.Step{move.StepSwitchClients, move.StepRetireSource}))
	g.Expect(get(t, srcClient, ns)).To(Equal(srcBefore), "the source is not touched by the switch")
}

// A destination that holds a source member back (spec.retainedExternalMembers,
// set by a caller that could not switch its clients first) gets it released
// after the caller's switch; a switch that fails changes nothing.
func TestHeldSourceMemberIsReleasedAfterTheSwitch(t *testing.T) {
	g := NewWithT(t)
	// The destination retired all but one source member, which it holds
	// for the source site's clients.
	ns := retiringMove(t, 1, true,
		observedMember("1", "etcd-main-2", v1alpha1.MemberRoleVoter, v1alpha1.MemberOriginExternal),
		observedMember("2", "etcd-main-3", v1alpha1.MemberRoleLeader, v1alpha1.MemberOriginLocal),
		observedMember("3", "etcd-main-4", v1alpha1.MemberRoleVoter, v1alpha1.MemberOriginLocal),
		observedMember("4", "etcd-main-5", v1alpha1.MemberRoleVoter, v1alpha1.MemberOriginLocal))
	g.Expect(move.Phase(get(t, srcClient, ns), get(t, dstClient, ns))).To(Equal(move.PhaseSourceHeld))
	srcBefore := get(t, srcClient, ns)

	moveWithFailingSwitch(t, ns, "the held member stays while the clients are not switched", false)
	// Nobody plays the destination's controller here: the wait for the
	// released member's removal runs out.
	switched, events := moveWithSwitch(t, ns, "waiting in RetiringSource")
	g.Expect(switched).To(HaveLen(1))
	g.Expect(switched[0].Spec.GetRetainedExternalMembers()).To(Equal(1), "the member was held while the clients were switched")
	released := get(t, dstClient, ns)
	g.Expect(released.Spec.RetainedExternalMembers).To(BeNil(), "released after the switch")
	g.Expect(released.Annotations).To(HaveKeyWithValue("druid.gardener.cloud/operation", "reconcile"),
		"a spec change asks druid to reconcile, as gardenlet's writes do")
	g.Expect(events).NotTo(BeEmpty())
	g.Expect(events[0].Step).To(Equal(move.StepSwitchClients))
	g.Expect(get(t, srcClient, ns)).To(Equal(srcBefore), "the source is not touched by the switch")
}

// A hold the source cannot give (the migrate command's default of one
// held member, on a one-member source) is refused before the first step:
// the source is not prepared and no destination is created, instead of
// the move stopping once the destination has joined.
func TestHoldSourceRefusedBeforeAnythingChanges(t *testing.T) {
	g := NewWithT(t)
	ns, _ := setupWith(t, 1)
	srcBefore := get(t, srcClient, ns)

	var calls int
	err := mover(t, ns, nil, func(o *livemove.Options) {
		o.HoldSource = 1
		o.SwitchClients = func(context.Context) error { calls++; return nil }
	}).Move(context.Background())
	g.Expect(err).To(MatchError(ContainSubstring("HoldSource 1 (the migrate command's --hold-source) would hold every one of the source's 1 members")))
	g.Expect(get(t, srcClient, ns)).To(Equal(srcBefore), "the source is not prepared")
	g.Expect(get(t, dstClient, ns)).To(BeNil(), "no destination Etcd is created")
	g.Expect(calls).To(BeZero())
}

// With HoldSource the joined destination is told to retire the source
// while holding that many of its members, and the clients are not switched
// before: the switch waits for SourceHeld. A hold of every source member
// is refused with nothing changed, and so are options that cannot work.
func TestHoldSourceRetiresBeforeTheSwitch(t *testing.T) {
	g := NewWithT(t)
	ns, _ := joinedMove(t)
	srcBefore, dstBefore := get(t, srcClient, ns), get(t, dstClient, ns)

	holding := func(n int32) func(*livemove.Options) {
		return func(o *livemove.Options) { o.HoldSource = n }
	}
	var calls int
	switching := func(o *livemove.Options) {
		o.SwitchClients = func(context.Context) error { calls++; return nil }
	}
	err := mover(t, ns, nil, switching, holding(3)).Move(context.Background())
	g.Expect(err).To(MatchError(ContainSubstring("HoldSource 3 (the migrate command's --hold-source) would hold every one of the source's 3 members")))
	g.Expect(get(t, srcClient, ns)).To(Equal(srcBefore))
	g.Expect(get(t, dstClient, ns)).To(Equal(dstBefore))
	g.Expect(calls).To(BeZero())

	var events []livemove.Event
	err = mover(t, ns, &events, switching, holding(1)).Move(context.Background())
	// Nobody plays the destination's controller: the wait for SourceHeld
	// runs out.
	g.Expect(err).To(MatchError(ContainSubstring("step retire-source did not finish")))
	g.Expect(calls).To(BeZero(), "the clients are switched once the destination holds the majority, not before")
	retiring := get(t, dstClient, ns)
	g.Expect(retiring.Spec.GetExternalMembersPolicy()).To(Equal(v1alpha1.ExternalMembersPolicyRetire))
	g.Expect(retiring.Spec.GetRetainedExternalMembers()).To(Equal(1))
	g.Expect(retiring.Spec.Replicas).To(BeNumerically("==", 3))
	g.Expect(retiring.Spec.LearnerReplicas).To(BeNil(), "no warm learners: the destination's members join and vote as the source's go")
	g.Expect(events).NotTo(BeEmpty())
	g.Expect(events[0].Step).To(Equal(move.StepRetireSource))
	g.Expect(get(t, srcClient, ns)).To(Equal(srcBefore))

	for _, tc := range []struct {
		o    func(*livemove.Options)
		want string
	}{
		{holding(-1), "HoldSource is -1"},
		{holding(1), "HoldSource is 1, but there is no SwitchClients"},
	} {
		o := livemove.Options{Source: srcClient, Destination: dstClient, Namespace: ns, Name: "etcd-main",
			SourceAddresses: livemove.URLTemplates{Peer: "http://{pod}.a:2380"}.Addresses(), DestinationAddresses: livemove.URLTemplates{Peer: "http://{pod}.b:2380"}.Addresses()}
		tc.o(&o)
		_, err := livemove.New(o)
		g.Expect(err).To(MatchError(ContainSubstring(tc.want)))
	}
}

// moveWithFailingSwitch runs the move of ns with a switch of the clients
// that fails, and checks that the error names it and that neither Etcd
// changed.
func moveWithFailingSwitch(t *testing.T, ns, unchanged string, warms bool) {
	t.Helper()
	g := NewWithT(t)
	srcBefore, dstBefore := get(t, srcClient, ns), get(t, dstClient, ns)
	failing := func(o *livemove.Options) {
		o.SwitchClients = func(context.Context) error { return errors.New("the shoot's DNS record is not writable") }
	}
	err := mover(t, ns, nil, failing).Move(context.Background())
	g.Expect(err).To(MatchError(ContainSubstring("switching the source site's clients to the destination: the shoot's DNS record is not writable")))
	g.Expect(get(t, srcClient, ns)).To(Equal(srcBefore))
	after := get(t, dstClient, ns)
	if !warms {
		g.Expect(after).To(Equal(dstBefore), unchanged)
		return
	}
	// The warm before the switch stays: learners hold no vote, and the
	// move run again goes on from it.
	g.Expect(after.Spec.LearnerReplicas).To(HaveValue(BeNumerically("==", after.Spec.Replicas-1)), "the destination is warmed before the switch")
	g.Expect(after.Spec.ExternalMembersPolicy).To(Equal(dstBefore.Spec.ExternalMembersPolicy), unchanged)
	g.Expect(after.Spec.ExternalMembers).To(Equal(dstBefore.Spec.ExternalMembers), unchanged)
	g.Expect(after.Spec.RetainedExternalMembers).To(Equal(dstBefore.Spec.RetainedExternalMembers), unchanged)
}

// moveWithSwitch runs the move of ns with a switch that succeeds until the
// move ends with an error containing wantErr, and returns the destination
// as each call of the switch saw it and the move's events.
func moveWithSwitch(t *testing.T, ns, wantErr string) (switched []*v1alpha1.Etcd, events []livemove.Event) {
	t.Helper()
	switching := func(o *livemove.Options) {
		o.SwitchClients = func(ctx context.Context) error {
			switched = append(switched, get(t, dstClient, ns))
			return nil
		}
	}
	err := mover(t, ns, &events, switching).Move(context.Background())
	NewWithT(t).Expect(err).To(MatchError(ContainSubstring(wantErr)))
	return switched, events
}

// TestPatchOutlastsStatusWrites: druid and the membership controllers
// write an Etcd's status several times a second during a move, and each
// write makes a patch guarded by the resourceVersion conflict. Here the
// first eight patches of the source Etcd each meet a status write made
// just before them: the move's first patch still lands (client-go's
// DefaultRetry gives up after five tries within 50 ms).
func TestPatchOutlastsStatusWrites(t *testing.T) {
	g := NewWithT(t)
	ns, _ := setup(t)
	racing := &statusWriterBeforePatch{Client: srcClient}
	racing.left.Store(8)
	err := mover(t, ns, nil, func(o *livemove.Options) { o.Source = racing }).Move(context.Background())
	g.Expect(err).To(MatchError(ContainSubstring("step prepare-source did not finish within 2s")), "the patch landed; the step then waits for the controller")
	g.Expect(get(t, srcClient, ns).Spec.ExternalMembers).To(HaveLen(3))
	g.Expect(racing.left.Load()).To(BeNumerically("<=", 0), "every one of the eight patches met a status write")
}

// statusWriterBeforePatch writes the status of the object to be patched
// right before each of its first left patches, as a concurrent writer
// would between the patch's read and its write.
type statusWriterBeforePatch struct {
	client.Client
	left atomic.Int32
}

func (c *statusWriterBeforePatch) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	if c.left.Add(-1) >= 0 {
		cur := obj.DeepCopyObject().(client.Object)
		if err := c.Client.Get(ctx, client.ObjectKeyFromObject(obj), cur); err != nil {
			return err
		}
		gen := cur.GetGeneration() + int64(c.left.Load()) + 100
		switch o := cur.(type) {
		case *v1alpha1.Etcd:
			o.Status.ObservedGeneration = ptr.To(gen)
		case *stretchv1alpha1.EtcdMembership:
			o.Status.ObservedGeneration = gen
		default:
			return fmt.Errorf("no status to write for a %T", cur)
		}
		if err := c.Client.Status().Update(ctx, cur); err != nil {
			return err
		}
	}
	return c.Client.Patch(ctx, obj, patch, opts...)
}

// TestTimeoutExplainsTheLastRead: the read that the step's time limit cuts
// short has neither object; the error explains the last pair that was read
// instead of calling the move inconsistent.
func TestTimeoutExplainsTheLastRead(t *testing.T) {
	g := NewWithT(t)
	ns, _ := setup(t)
	err := mover(t, ns, nil, func(o *livemove.Options) {
		o.Source = cutAtDeadline{Client: srcClient, within: 300 * time.Millisecond}
	}).Move(context.Background())
	g.Expect(err).To(MatchError(ContainSubstring("step prepare-source did not finish within 2s")))
	g.Expect(err).To(MatchError(ContainSubstring("waiting in PreparingSource")))
	g.Expect(err).NotTo(MatchError(ContainSubstring("there is no source Etcd")))
}

// cutAtDeadline blocks every read made in the last moments before its
// context's deadline until that deadline passes, as an API server that is
// slow at the wrong time would.
type cutAtDeadline struct {
	client.Client
	within time.Duration
}

func (c cutAtDeadline) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < c.within {
		<-ctx.Done()
		return ctx.Err()
	}
	return c.Client.Get(ctx, key, obj, opts...)
}

// The join creates the destination with one member in the first order,
// and warm in the held order: its final replicas, all but its first member
// as learners, so that all its pods start at once and its further members
// catch up while the first one joins. Nobody plays the destination's
// controller, so the join's wait runs out; the source is not touched.
func TestHeldOrderJoinsWarm(t *testing.T) {
	for _, tc := range []struct {
		name     string
		hold     int32
		replicas int32
		learners *int32
	}{
		{"switch first", 0, 1, nil},
		{"held order", 1, 3, ptr.To[int32](2)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			ns, src := setup(t)
			dstMembers, err := move.ExternalMembers(move.NewDestination(src, 3), livemove.URLTemplates{Peer: "http://{pod}.seed-b.example:2380"}.Addresses())
			g.Expect(err).NotTo(HaveOccurred())
			apply(t, srcClient, ns, func(v *v1alpha1.Etcd) { move.PrepareSource(v, dstMembers) })
			report(t, srcClient, ns, func(gen int64) *v1alpha1.MembershipStatus { return converged(gen) })
			srcBefore := get(t, srcClient, ns)

			options := []func(*livemove.Options){func(o *livemove.Options) {
				o.SwitchClients = func(context.Context) error { return nil }
				o.HoldSource = tc.hold
			}}
			err = mover(t, ns, nil, options...).Move(context.Background())
			g.Expect(err).To(MatchError(ContainSubstring("step join-destination did not finish")))
			dst := get(t, dstClient, ns)
			g.Expect(dst).NotTo(BeNil())
			g.Expect(dst.Spec.Replicas).To(Equal(tc.replicas))
			g.Expect(dst.Spec.LearnerReplicas).To(Equal(tc.learners))
			g.Expect(dst.Spec.GetExternalMembersPolicy()).To(Equal(v1alpha1.ExternalMembersPolicyKeep))
			g.Expect(dst.Spec.ExternalMembers).To(HaveLen(3))
			g.Expect(get(t, srcClient, ns)).To(Equal(srcBefore), "the join does not touch the source")
		})
	}
}
