package v1alpha1_test

import (
	"testing"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	stretchv1alpha1 "github.com/druid-stretch/druid-stretch/api/stretch/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
)

var sourceMembers = []druidv1alpha1.BootstrapExistingMember{
	{Name: "etcd-main-0", PeerURLs: []string{"https://etcd-main-0.seed-a.example:2380"}},
	{Name: "etcd-main-1", PeerURLs: []string{"https://etcd-main-1.seed-a.example:2380"}},
	{Name: "etcd-main-2", PeerURLs: []string{"https://etcd-main-2.seed-a.example:2380"}},
}

// destination is the destination Etcd of a GEP-39 move as gardenlet
// writes it: druid's fields only.
func destination(replicas int32) *v1alpha1.Etcd {
	e := etcd(v1alpha1.MembershipSpec{}, nil)
	e.Spec.Replicas = replicas
	e.Spec.MemberNamePrefix = ptr.To("seed-b")
	e.Spec.Etcd.BootstrapWithExistingCluster = &druidv1alpha1.BootstrapWithExistingCluster{
		Members: sourceMembers, ClientEndpoints: []string{"https://etcd-main-client.seed-a.example:2379"},
	}
	return e
}

// joined is the destination after druid recorded the join and gardenlet
// unset the spec field.
func joined(e *v1alpha1.Etcd) *v1alpha1.Etcd {
	e = e.DeepCopy()
	e.Spec.Etcd.BootstrapWithExistingCluster = nil
	e.Status.BootstrapWithExistingCluster = &druidv1alpha1.BootstrapWithExistingClusterStatus{JoinedAt: metav1.Now()}
	for _, m := range sourceMembers {
		e.Status.BootstrapWithExistingCluster.Members = append(e.Status.BootstrapWithExistingCluster.Members, druidv1alpha1.BootstrapJoinedMember(m))
	}
	return e
}

func externals() []v1alpha1.ExternalMember {
	var out []v1alpha1.ExternalMember
	for _, m := range sourceMembers {
		out = append(out, v1alpha1.ExternalMember{Name: m.Name, PeerURLs: m.PeerURLs})
	}
	return out
}

func TestViewOfGEP39Fields(t *testing.T) {
	retire := ptr.To(v1alpha1.ExternalMembersPolicyRetire)
	for _, tc := range []struct {
		name       string
		e          *v1alpha1.Etcd
		m          *stretchv1alpha1.EtcdMembership
		want       v1alpha1.MembershipSpec
		wantSource stretchv1alpha1.SpecSource
	}{
		{"3+2: the source kept, both destination members vote", destination(2), nil,
			v1alpha1.MembershipSpec{ExternalMembers: externals()}, stretchv1alpha1.SpecFromBootstrap},
		{"3+3: the third destination member stays a learner while the source is kept", destination(3), nil,
			v1alpha1.MembershipSpec{ExternalMembers: externals(), LearnerReplicas: ptr.To[int32](1)}, stretchv1alpha1.SpecFromBootstrap},
		{"unset after the join: the recorded members retire", joined(destination(3)), nil,
			v1alpha1.MembershipSpec{ExternalMembers: externals(), ExternalMembersPolicy: retire}, stretchv1alpha1.SpecFromBootstrap},
		{"an empty EtcdMembership changes nothing", destination(3), membership(v1alpha1.MembershipSpec{}, nil),
			v1alpha1.MembershipSpec{ExternalMembers: externals(), LearnerReplicas: ptr.To[int32](1)}, stretchv1alpha1.SpecFromBootstrap},
		{"the EtcdMembership's own learner replicas win", destination(3), membership(v1alpha1.MembershipSpec{LearnerReplicas: ptr.To[int32](2)}, nil),
			v1alpha1.MembershipSpec{ExternalMembers: externals(), LearnerReplicas: ptr.To[int32](2)}, stretchv1alpha1.SpecFromEtcdMembership},
		{"unset before druid recorded a join: nothing is known, nothing retires", func() *v1alpha1.Etcd {
			e := destination(3)
			e.Spec.Etcd.BootstrapWithExistingCluster = nil
			return e
		}(), nil, v1alpha1.MembershipSpec{}, stretchv1alpha1.SpecNone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			v, src := stretchv1alpha1.View(tc.e, tc.m)
			g.Expect(src).To(Equal(tc.wantSource))
			g.Expect(v.Spec.MembershipSpec).To(Equal(tc.want))
			g.Expect(v.UsesExtension()).To(Equal(tc.wantSource != stretchv1alpha1.SpecNone))

			// Written back, nothing derived lands in the EtcdMembership.
			_, m := stretchv1alpha1.Split(v)
			own := v1alpha1.MembershipSpec{}
			if tc.m != nil {
				own = tc.m.Spec.MembershipSpec
			}
			g.Expect(m.Spec.MembershipSpec).To(Equal(own))
		})
	}
}

func TestConflictsWithGEP39Fields(t *testing.T) {
	keep, retire := ptr.To(v1alpha1.ExternalMembersPolicyKeep), ptr.To(v1alpha1.ExternalMembersPolicyRetire)
	other := externals()
	other[1].PeerURLs = []string{"https://elsewhere:2380"}
	prefixless := destination(3)
	prefixless.Spec.MemberNamePrefix = nil
	for _, tc := range []struct {
		name string
		e    *v1alpha1.Etcd
		s    v1alpha1.MembershipSpec
		want []string
	}{
		{"none: the same members", destination(3), v1alpha1.MembershipSpec{ExternalMembers: externals()}, nil},
		{"none: no druid field", etcd(v1alpha1.MembershipSpec{}, nil), v1alpha1.MembershipSpec{ExternalMembers: other}, nil},
		{"other peer URLs", destination(3), v1alpha1.MembershipSpec{ExternalMembers: other}, []string{"spec.externalMembers[1].peerURLs"}},
		{"a member left out", destination(3), v1alpha1.MembershipSpec{ExternalMembers: externals()[:2]}, []string{"spec.externalMembers: Required value", "names etcd-main-2"}},
		{"a member the source does not have", destination(3), v1alpha1.MembershipSpec{ExternalMembers: append(externals(), v1alpha1.ExternalMember{Name: "x", PeerURLs: []string{"https://x:2380"}})}, []string{"spec.externalMembers[3].name"}},
		{"Retire while the spec field keeps them", destination(3), v1alpha1.MembershipSpec{ExternalMembersPolicy: retire}, []string{"spec.externalMembersPolicy", "keeps the source's members"}},
		{"Keep once the spec field is unset", joined(destination(3)), v1alpha1.MembershipSpec{ExternalMembersPolicy: keep}, []string{"spec.externalMembersPolicy", "retires the source's members"}},
		{"source members named like the Etcd's own", prefixless, v1alpha1.MembershipSpec{}, []string{"spec.etcd.bootstrapWithExistingCluster.members[0].name", "spec.memberNamePrefix"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			errs := stretchv1alpha1.Conflicts(tc.e, &tc.s)
			if tc.want == nil {
				g.Expect(errs).To(BeEmpty())
				return
			}
			g.Expect(errs).NotTo(BeEmpty())
			for _, w := range tc.want {
				g.Expect(errs.ToAggregate().Error()).To(ContainSubstring(w))
			}
		})
	}
}

// gardenlet's EtcdMigrationComplete through a View: the caller unsets the
// bootstrap field on a View that still shows what the field derived (the
// source kept, a learner). Nothing of that lands in the EtcdMembership,
// where it would keep the source for good.
func TestOwnLeavesOutWhatTheOldFieldsDerived(t *testing.T) {
	g := NewWithT(t)
	stored := destination(3)
	stored.Status.BootstrapWithExistingCluster = joined(stored).Status.BootstrapWithExistingCluster
	v, _ := stretchv1alpha1.View(stored, nil)
	v.Spec.Etcd.BootstrapWithExistingCluster = nil
	g.Expect(stretchv1alpha1.Own(v, stored)).To(BeZero())
	g.Expect(stretchv1alpha1.Own(v)).NotTo(BeZero(), "without the Etcd it was viewed from, the old derivation is not known")
}
