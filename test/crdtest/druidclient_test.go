package crdtest

import (
	"testing"
	"time"

	druidapicommon "github.com/gardener/etcd-druid/api/common"
	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	. "github.com/onsi/gomega"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
)

// storedStretchedEtcd creates the stretched Etcd with a membership status, as
// the druid-stretch controller would have written it.
func storedStretchedEtcd(t *testing.T) *v1alpha1.Etcd {
	t.Helper()
	g := NewWithT(t)
	e := stretchedEtcd(newNamespace(t))
	e.Annotations = map[string]string{druidv1alpha1.GardenerOperationAnnotation: druidv1alpha1.DruidOperationReconcile}
	g.Expect(stretch.Create(ctx(t), e)).To(Succeed())
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	e.Status.Membership = &v1alpha1.MembershipStatus{
		ObservedGeneration:  e.Generation,
		Phase:               v1alpha1.MembershipPhaseReconfiguring,
		ObservedTime:        &now,
		ObservedFingerprint: "3f1c9a0e",
		ClusterID:           "cdf818194e3a8c32",
		Members: []v1alpha1.ObservedMember{
			{ID: "8e9e05c52164694d", Name: "seed-a-etcd-main-0", PeerURLs: []string{"https://etcd-main-0.seed-a.example:2380"}, Role: v1alpha1.MemberRoleLeader, Origin: v1alpha1.MemberOriginExternal, Healthy: true, CaughtUp: true},
			{ID: "91bc3c398fb3c146", Name: "seed-b-etcd-main-3", Role: v1alpha1.MemberRoleLearner, Origin: v1alpha1.MemberOriginLocal, Healthy: true},
		},
		Learners:       []v1alpha1.LearnerProgress{{ID: "91bc3c398fb3c146", Name: "seed-b-etcd-main-3", FirstObservedTime: &now, RaftIndex: 1234, LastAdvanceTime: &now}},
		RetiredMembers: []string{"seed-b-etcd-main-0"},
		LastStep: &v1alpha1.MembershipStep{Kind: v1alpha1.StepAddLearner, Member: "seed-b-etcd-main-3", MemberID: "91bc3c398fb3c146",
			Time: now, Outcome: v1alpha1.StepSucceeded, Message: "added as learner"},
		Conditions: []metav1.Condition{{Type: v1alpha1.ConditionMembershipProgressing, Status: metav1.ConditionTrue,
			Reason: v1alpha1.ReasonWaitingForLearner, Message: "seed-b-etcd-main-3 is catching up", LastTransitionTime: now}},
	}
	g.Expect(stretch.Status().Update(ctx(t), e)).To(Succeed())
	return e
}

// TestDruidClientKeepsExtension does what etcd-druid does to an Etcd with a
// client that knows only druid's type (finalizer patch, removal of the
// operation annotation, merge patch of its status, a scale through the scale
// subresource) and checks that no extension field is lost.
func TestDruidClientKeepsExtension(t *testing.T) {
	g := NewWithT(t)
	want := storedStretchedEtcd(t)
	key := client.ObjectKeyFromObject(want)

	etcd := &druidv1alpha1.Etcd{}
	g.Expect(druid.Get(ctx(t), key, etcd)).To(Succeed())

	// druid's ensureFinalizer: a merge patch with optimistic locking.
	patch := client.MergeFromWithOptions(etcd.DeepCopy(), client.MergeFromWithOptimisticLock{})
	controllerutil.AddFinalizer(etcd, druidapicommon.EtcdFinalizerName)
	g.Expect(druid.Patch(ctx(t), etcd, patch)).To(Succeed())

	// druid removes the operation annotation once it reconciled.
	patch = client.MergeFrom(etcd.DeepCopy())
	druidv1alpha1.RemoveOperationAnnotation(etcd.ObjectMeta)
	g.Expect(druid.Patch(ctx(t), etcd, patch)).To(Succeed())

	// druid's status update: a merge patch of the fields it owns.
	patch = client.MergeFrom(etcd.DeepCopy())
	etcd.Status.ObservedGeneration = ptr.To(etcd.Generation)
	etcd.Status.Ready = ptr.To(true)
	etcd.Status.ReadyReplicas = 3
	etcd.Status.CurrentReplicas = 3
	etcd.Status.Replicas = 3
	etcd.Status.Selector = ptr.To("app=etcd-statefulset,role=main")
	etcd.Status.PeerUrlTLSEnabled = ptr.To(true)
	etcd.Status.Conditions = []druidv1alpha1.Condition{{
		Type: druidv1alpha1.ConditionTypeReady, Status: druidv1alpha1.ConditionTrue, Reason: "Quorate", Message: "quorate",
		LastTransitionTime: metav1.NewTime(time.Now().Truncate(time.Second)), LastUpdateTime: metav1.NewTime(time.Now().Truncate(time.Second)),
	}}
	etcd.Status.LastOperation = &druidapicommon.LastOperation{Type: druidv1alpha1.LastOperationTypeReconcile,
		State: druidv1alpha1.LastOperationStateSucceeded, Description: "reconciled", RunID: "r1",
		LastUpdateTime: metav1.NewTime(time.Now().Truncate(time.Second))}
	g.Expect(druid.Status().Patch(ctx(t), etcd, patch)).To(Succeed())

	// Scaling through the scale subresource, as an autoscaler would.
	scale := &autoscalingv1.Scale{}
	g.Expect(druid.SubResource("scale").Get(ctx(t), etcd, scale)).To(Succeed())
	scale.Spec.Replicas = 5
	g.Expect(druid.SubResource("scale").Update(ctx(t), etcd, client.WithSubResourceBody(scale))).To(Succeed())

	var got v1alpha1.Etcd
	g.Expect(stretch.Get(ctx(t), key, &got)).To(Succeed())
	g.Expect(got.Spec.OrdinalStart).To(Equal(want.Spec.OrdinalStart))
	g.Expect(got.Spec.ExternalMembersPolicy).To(Equal(want.Spec.ExternalMembersPolicy))
	g.Expect(got.Spec.ExternalMembers).To(Equal(want.Spec.ExternalMembers))
	g.Expect(apiequality.Semantic.DeepEqual(got.Status.Membership, want.Status.Membership)).To(BeTrue(),
		"membership status: %+v", got.Status.Membership)

	// And druid's changes all landed.
	g.Expect(got.Finalizers).To(ContainElement(druidapicommon.EtcdFinalizerName))
	g.Expect(got.Annotations).NotTo(HaveKey(druidv1alpha1.GardenerOperationAnnotation))
	g.Expect(got.Status.Ready).To(Equal(ptr.To(true)))
	g.Expect(got.Status.ReadyReplicas).To(Equal(int32(3)))
	g.Expect(got.Status.Conditions).To(HaveLen(1))
	g.Expect(got.Spec.Replicas).To(Equal(int32(5)))
}

// TestStretchClientKeepsDruidStatus is the other direction: the controller's
// merge patch of status.membership leaves druid's status fields alone.
func TestStretchClientKeepsDruidStatus(t *testing.T) {
	g := NewWithT(t)
	e := storedStretchedEtcd(t)
	key := client.ObjectKeyFromObject(e)

	etcd := &druidv1alpha1.Etcd{}
	g.Expect(druid.Get(ctx(t), key, etcd)).To(Succeed())
	patch := client.MergeFrom(etcd.DeepCopy())
	etcd.Status.Ready = ptr.To(true)
	etcd.Status.Members = []druidv1alpha1.EtcdMemberStatus{{Name: "seed-b-etcd-main-3", ID: ptr.To("91bc3c398fb3c146"),
		Role: ptr.To(druidv1alpha1.EtcdRoleMember), Status: druidv1alpha1.EtcdMemberStatusReady, Reason: "LeaseSucceeded",
		LastTransitionTime: metav1.NewTime(time.Now().Truncate(time.Second))}}
	g.Expect(druid.Status().Patch(ctx(t), etcd, patch)).To(Succeed())
	wantDruid := etcd.Status.DeepCopy()

	g.Expect(stretch.Get(ctx(t), key, e)).To(Succeed())
	patch = client.MergeFrom(e.DeepCopy())
	e.Status.Membership.Phase = v1alpha1.MembershipPhaseConverged
	e.Status.Membership.Learners = nil
	g.Expect(stretch.Status().Patch(ctx(t), e, patch)).To(Succeed())

	var got druidv1alpha1.Etcd
	g.Expect(druid.Get(ctx(t), key, &got)).To(Succeed())
	g.Expect(apiequality.Semantic.DeepEqual(got.Status, *wantDruid)).To(BeTrue(), "druid status: %+v", got.Status)
	var gotExt v1alpha1.Etcd
	g.Expect(stretch.Get(ctx(t), key, &gotExt)).To(Succeed())
	g.Expect(gotExt.Status.Membership.Phase).To(Equal(v1alpha1.MembershipPhaseConverged))
	g.Expect(gotExt.Status.Membership.Learners).To(BeEmpty())
}

// TestDruidClientUpdateDropsExtension documents why a client that knows only
// druid's type must patch: a full update (PUT) writes back the object it
// decoded, and that object has no extension fields. etcd-druid patches.
func TestDruidClientUpdateDropsExtension(t *testing.T) {
	g := NewWithT(t)
	e := storedStretchedEtcd(t)
	etcd := &druidv1alpha1.Etcd{}
	g.Expect(druid.Get(ctx(t), client.ObjectKeyFromObject(e), etcd)).To(Succeed())
	g.Expect(druid.Update(ctx(t), etcd)).To(Succeed())

	var got v1alpha1.Etcd
	g.Expect(stretch.Get(ctx(t), client.ObjectKeyFromObject(e), &got)).To(Succeed())
	g.Expect(got.Spec.ExternalMembers).To(BeEmpty())
	g.Expect(got.Spec.OrdinalStart).To(BeNil())
	g.Expect(got.Status.Membership).NotTo(BeNil(), "status is a subresource: a spec update cannot touch it")
}
