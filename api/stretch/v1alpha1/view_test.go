package v1alpha1_test

import (
	"testing"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	stretchv1alpha1 "github.com/druid-stretch/druid-stretch/api/stretch/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
)

func etcd(spec v1alpha1.MembershipSpec, st *v1alpha1.MembershipStatus) *v1alpha1.Etcd {
	e := &v1alpha1.Etcd{ObjectMeta: metav1.ObjectMeta{Name: "etcd-main", Namespace: "shoot--p--s", UID: "u-1"}}
	e.Spec.Replicas = 3
	e.Spec.MembershipSpec = spec
	e.Status.Membership = st
	return e
}

func membership(spec v1alpha1.MembershipSpec, st *v1alpha1.MembershipStatus) *stretchv1alpha1.EtcdMembership {
	m := &stretchv1alpha1.EtcdMembership{ObjectMeta: metav1.ObjectMeta{Name: "etcd-main", Namespace: "shoot--p--s"}}
	m.Spec.MembershipSpec = spec
	m.Status.Membership = st
	return m
}

func TestView(t *testing.T) {
	at3 := v1alpha1.MembershipSpec{OrdinalStart: ptr.To[int32](3)}
	retire := v1alpha1.MembershipSpec{ExternalMembersPolicy: ptr.To(v1alpha1.ExternalMembersPolicyRetire), LearnerReplicas: ptr.To[int32](1)}
	onEtcd := &v1alpha1.MembershipStatus{Phase: v1alpha1.MembershipPhaseReconfiguring}
	onMembership := &v1alpha1.MembershipStatus{Phase: v1alpha1.MembershipPhaseConverged}
	tests := []struct {
		name       string
		e          *v1alpha1.Etcd
		m          *stretchv1alpha1.EtcdMembership
		wantSpec   v1alpha1.MembershipSpec
		wantSource stretchv1alpha1.SpecSource
		wantStatus *v1alpha1.MembershipStatus
	}{
		{"druid's alone", etcd(v1alpha1.MembershipSpec{}, nil), nil, v1alpha1.MembershipSpec{}, stretchv1alpha1.SpecNone, nil},
		{"fields inline, no EtcdMembership yet", etcd(at3, onEtcd), nil, at3, stretchv1alpha1.SpecFromEtcd, onEtcd},
		{"fields inline win over the EtcdMembership's", etcd(at3, nil), membership(retire, nil), at3, stretchv1alpha1.SpecFromEtcd, nil},
		{"fields pruned from the Etcd: the EtcdMembership's", etcd(v1alpha1.MembershipSpec{}, nil), membership(retire, onMembership), retire, stretchv1alpha1.SpecFromEtcdMembership, onMembership},
		{"the EtcdMembership's status wins over the Etcd's", etcd(at3, onEtcd), membership(at3, onMembership), at3, stretchv1alpha1.SpecFromEtcd, onMembership},
		{"an EtcdMembership without status keeps the Etcd's", etcd(at3, onEtcd), membership(at3, nil), at3, stretchv1alpha1.SpecFromEtcd, onEtcd},
		{"an empty EtcdMembership", etcd(v1alpha1.MembershipSpec{}, nil), membership(v1alpha1.MembershipSpec{}, nil), v1alpha1.MembershipSpec{}, stretchv1alpha1.SpecNone, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			e, m := tt.e.DeepCopy(), tt.m.DeepCopy()
			v, src := stretchv1alpha1.View(tt.e, tt.m)
			g.Expect(src).To(Equal(tt.wantSource))
			g.Expect(v.Spec.MembershipSpec).To(Equal(tt.wantSpec))
			g.Expect(v.Status.Membership).To(Equal(tt.wantStatus))
			g.Expect(v.Spec.Replicas).To(Equal(int32(3)), "druid's fields come from the Etcd")
			g.Expect(tt.e).To(Equal(e), "the Etcd is not changed")
			g.Expect(tt.m).To(Equal(m), "the EtcdMembership is not changed")
			if v.Status.Membership != nil {
				v.Status.Membership.Phase = "changed"
				g.Expect(tt.wantStatus.Phase).NotTo(Equal(v1alpha1.MembershipPhase("changed")), "the View owns its status")
			}
		})
	}
}

func TestFor(t *testing.T) {
	g := NewWithT(t)
	e := etcd(v1alpha1.MembershipSpec{OrdinalStart: ptr.To[int32](3)}, nil)
	m := stretchv1alpha1.For(e, e.Spec.MembershipSpec)
	g.Expect(m.Name).To(Equal(e.Name))
	g.Expect(m.Namespace).To(Equal(e.Namespace))
	g.Expect(m.Spec.OrdinalStart).To(Equal(ptr.To[int32](3)))
	g.Expect(m.OwnerReferences).To(ConsistOf(metav1.OwnerReference{APIVersion: "druid.gardener.cloud/v1alpha1", Kind: "Etcd", Name: "etcd-main", UID: "u-1"}))
	*e.Spec.OrdinalStart = 4
	g.Expect(m.Spec.OrdinalStart).To(Equal(ptr.To[int32](3)), "a copy of the spec")
	g.Expect(stretchv1alpha1.For(&v1alpha1.Etcd{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, v1alpha1.MembershipSpec{}).OwnerReferences).To(BeEmpty(), "no owner before the Etcd has a UID")
}

func TestSplitUndoesView(t *testing.T) {
	g := NewWithT(t)
	stored := etcd(v1alpha1.MembershipSpec{}, nil)
	stored.Status.Ready = ptr.To(true)
	m := membership(v1alpha1.MembershipSpec{OrdinalStart: ptr.To[int32](3)}, &v1alpha1.MembershipStatus{Phase: v1alpha1.MembershipPhaseConverged})
	v, _ := stretchv1alpha1.View(stored, m)
	v.Spec.Replicas = 4
	v.Spec.ExternalMembersPolicy = ptr.To(v1alpha1.ExternalMembersPolicyRetire)

	druid, split := stretchv1alpha1.Split(v)
	g.Expect(druid.Spec).To(Equal(v.Spec.EtcdSpec), "druid's fields, the caller's change included")
	g.Expect(druid.Spec.Replicas).To(Equal(int32(4)))
	g.Expect(druid.Status.Ready).To(Equal(ptr.To(true)))
	g.Expect(druid.Name).To(Equal(stored.Name))
	g.Expect(split.Name).To(Equal(stored.Name))
	g.Expect(split.Namespace).To(Equal(stored.Namespace))
	g.Expect(split.Spec.MembershipSpec).To(Equal(v1alpha1.MembershipSpec{OrdinalStart: ptr.To[int32](3), ExternalMembersPolicy: ptr.To(v1alpha1.ExternalMembersPolicyRetire)}))
	g.Expect(split.Status).To(BeZero(), "status.membership is the controller's to write")
	g.Expect(split.OwnerReferences).To(ConsistOf(HaveField("UID", stored.UID)))

	again, src := stretchv1alpha1.View(&v1alpha1.Etcd{ObjectMeta: druid.ObjectMeta, Spec: v1alpha1.EtcdSpec{EtcdSpec: druid.Spec}}, split)
	g.Expect(src).To(Equal(stretchv1alpha1.SpecFromEtcdMembership))
	g.Expect(again.Spec).To(Equal(v.Spec), "viewed again, the pair is the View that was split")
}

// A change of either spec makes the View's generation grow, so a status
// observed before it no longer passes for current.
func TestViewGeneration(t *testing.T) {
	g := NewWithT(t)
	e := etcd(v1alpha1.MembershipSpec{}, nil)
	e.Generation = 4
	m := membership(v1alpha1.MembershipSpec{OrdinalStart: ptr.To[int32](0)}, nil)
	m.Generation = 1
	v, _ := stretchv1alpha1.View(e, m)
	g.Expect(v.Generation).To(Equal(int64(5)))
	m.Generation++
	after, _ := stretchv1alpha1.View(e, m)
	g.Expect(after.Generation).To(BeNumerically(">", v.Generation), "the EtcdMembership's spec changed")
	e.Generation++
	later, _ := stretchv1alpha1.View(e, m)
	g.Expect(later.Generation).To(BeNumerically(">", after.Generation), "the Etcd's spec changed")
	alone, _ := stretchv1alpha1.View(e, nil)
	g.Expect(alone.Generation).To(Equal(e.Generation), "without an EtcdMembership, the Etcd's own")
	g.Expect(e.Generation).To(Equal(int64(5)), "the Etcd is not changed")
}
