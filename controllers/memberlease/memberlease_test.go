package memberlease_test

import (
	"context"
	"testing"
	"time"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	"github.com/go-logr/logr/testr"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	stretchv1alpha1 "github.com/druid-stretch/druid-stretch/api/stretch/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/controllers/memberlease"
	membershipctrl "github.com/druid-stretch/druid-stretch/controllers/membership"
	"github.com/druid-stretch/druid-stretch/internal/etcdview"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
)

func etcd(replicas, start int32, prefix string) *v1alpha1.Etcd {
	e := &v1alpha1.Etcd{ObjectMeta: metav1.ObjectMeta{Name: "etcd-main", Namespace: "ns"}}
	e.Spec.Replicas, e.Spec.OrdinalStart = replicas, &start
	if prefix != "" {
		e.Spec.MemberNamePrefix = &prefix
	}
	return e
}

func TestPairs(t *testing.T) {
	g := NewWithT(t)
	g.Expect(memberlease.Pairs(etcd(3, 0, ""))).To(BeEmpty(), "druid's own naming needs no bridge")
	g.Expect(memberlease.Pairs(etcd(0, 3, ""))).To(BeEmpty())
	g.Expect(memberlease.Pairs(etcd(3, 3, ""))).To(Equal([]memberlease.Pair{
		{Druid: "etcd-main-0", Member: "etcd-main-3"}, {Druid: "etcd-main-1", Member: "etcd-main-4"}, {Druid: "etcd-main-2", Member: "etcd-main-5"}}))
	g.Expect(memberlease.Pairs(etcd(3, 1, ""))).To(Equal([]memberlease.Pair{{Druid: "etcd-main-0", Member: "etcd-main-3"}}),
		"names both use are the member's own lease")
	g.Expect(memberlease.Pairs(etcd(1, 3, "seed-b"))).To(Equal([]memberlease.Pair{{Druid: "seed-b-etcd-main-0", Member: "seed-b-etcd-main-3"}}))
}

// On a real kube-apiserver with druid's own Etcd CRD: the bridge creates
// the leases backup-restore renews (druid's labels and owner), and what a
// renewal writes there reaches the lease druid reads; druid's other fields
// stay. The ordinal range is the EtcdMembership's: its change alone is
// enough for the bridge.
func TestBridgeCopiesRenewals(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	env, err := testbin.Environment()
	g.Expect(err).NotTo(HaveOccurred())
	cfg, err := env.Start()
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = env.Stop() })
	scheme, err := membershipctrl.Scheme()
	g.Expect(err).NotTo(HaveOccurred())
	k8s, err := client.New(cfg, client.Options{Scheme: scheme})
	g.Expect(err).NotTo(HaveOccurred())
	ctx := t.Context()

	g.Expect(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}})).To(Succeed())
	e := etcd(2, 3, "")
	e.Spec.Labels = map[string]string{"app": "etcd"}
	// spec.ordinalStart goes into the EtcdMembership: druid's own Etcd CRD
	// would prune it from the Etcd.
	g.Expect(etcdview.Create(ctx, k8s, e)).To(Succeed())
	// druid's leases for ordinals 0..replicas-1, as its member lease
	// component creates them: labels, owner, nothing renewed.
	druidLeases := func(e *v1alpha1.Etcd) {
		for _, name := range druidv1alpha1.GetMemberLeaseNames(e.DruidEtcd()) {
			l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns",
				Labels: map[string]string{druidv1alpha1.LabelComponentKey: "etcd-member-lease", druidv1alpha1.LabelPartOfKey: e.Name,
					druidv1alpha1.LabelManagedByKey: druidv1alpha1.LabelManagedByValue, druidv1alpha1.LabelAppNameKey: name},
				OwnerReferences: []metav1.OwnerReference{druidv1alpha1.GetAsOwnerReference(e.ObjectMeta)}}}
			g.Expect(k8s.Create(ctx, l)).To(Succeed())
		}
	}
	druidLeases(e)

	mgr, err := ctrl.NewManager(cfg, ctrl.Options{Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"},
		Controller: config.Controller{SkipNameValidation: ptr.To(true)}})
	g.Expect(err).NotTo(HaveOccurred())
	r := &memberlease.Reconciler{Client: mgr.GetClient(), Log: testr.New(t), Resync: time.Second}
	g.Expect(r.SetupWithManager(mgr)).To(Succeed())
	mgrCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mgrCtx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("the manager: %v", err)
		}
	})

	// The member leases appear, as druid would have made them.
	get := func(g Gomega, name string) *coordinationv1.Lease {
		l := &coordinationv1.Lease{}
		g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: "ns", Name: name}, l)).To(Succeed())
		return l
	}
	for _, name := range []string{"etcd-main-3", "etcd-main-4"} {
		g.Eventually(func(g Gomega) {
			l := get(g, name)
			g.Expect(l.Labels).To(HaveKeyWithValue(druidv1alpha1.LabelComponentKey, "etcd-member-lease"))
			g.Expect(l.Labels).To(HaveKeyWithValue(druidv1alpha1.LabelPartOfKey, "etcd-main"))
			g.Expect(l.Labels).To(HaveKeyWithValue(druidv1alpha1.LabelAppNameKey, name))
			g.Expect(l.OwnerReferences).To(ConsistOf(HaveField("Name", "etcd-main")))
		}).WithTimeout(30 * time.Second).Should(Succeed())
	}
	g.Consistently(func(g Gomega) { g.Expect(get(g, "etcd-main-0").Spec.RenewTime).To(BeNil()) }).
		WithTimeout(2*time.Second).Should(Succeed(), "nothing to copy before a renewal")

	// backup-restore of etcd-main-4 renews its lease: druid's etcd-main-1
	// shows it.
	renewed := get(g, "etcd-main-4")
	before := renewed.DeepCopy()
	renewed.Spec.HolderIdentity = ptr.To("8e9e05c52164694d:cdf818194e3a8c32:Leader")
	renewed.Spec.RenewTime = &metav1.MicroTime{Time: time.Now().Truncate(time.Microsecond)}
	renewed.Annotations = map[string]string{"member.etcd.gardener.cloud/tls-enabled": "true", "other": "x"}
	g.Expect(k8s.Patch(ctx, renewed, client.MergeFrom(before))).To(Succeed())
	g.Eventually(func(g Gomega) {
		l := get(g, "etcd-main-1")
		g.Expect(l.Spec.HolderIdentity).To(HaveValue(Equal("8e9e05c52164694d:cdf818194e3a8c32:Leader")))
		g.Expect(l.Spec.RenewTime.Equal(renewed.Spec.RenewTime)).To(BeTrue())
		g.Expect(l.Annotations).To(Equal(map[string]string{"member.etcd.gardener.cloud/tls-enabled": "true"}), "only backup-restore's annotations")
		g.Expect(l.Labels).To(HaveKeyWithValue(druidv1alpha1.LabelAppNameKey, "etcd-main-1"), "druid's labels stay")
	}).WithTimeout(30 * time.Second).Should(Succeed())
	g.Expect(get(g, "etcd-main-0").Spec.RenewTime).To(BeNil(), "etcd-main-3 never renewed: nothing copied")

	// An Etcd on druid's ordinals needs no bridge, until its EtcdMembership
	// moves them: that write alone, with no Etcd or Lease event, has the
	// bridge create the leases of the new range.
	events := etcd(1, 0, "")
	events.Name, events.Spec.Labels, events.Spec.OrdinalStart = "etcd-events", map[string]string{"app": "etcd"}, nil
	g.Expect(etcdview.Create(ctx, k8s, events)).To(Succeed())
	druidLeases(events)
	g.Consistently(func(g Gomega) {
		err := k8s.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "etcd-events-1"}, &coordinationv1.Lease{})
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue())
	}).WithTimeout(2*time.Second).Should(Succeed(), "druid's naming needs no bridge")
	g.Expect(k8s.Create(ctx, stretchv1alpha1.For(events, v1alpha1.MembershipSpec{OrdinalStart: ptr.To[int32](1)}))).To(Succeed())
	g.Eventually(func(g Gomega) { get(g, "etcd-events-1") }).WithTimeout(30 * time.Second).Should(Succeed())
}
