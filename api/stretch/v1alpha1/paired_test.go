package v1alpha1_test

import (
	"testing"

	. "github.com/onsi/gomega"

	stretchv1alpha1 "github.com/druid-stretch/druid-stretch/api/stretch/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
)

func TestPairedWrites(t *testing.T) {
	g := NewWithT(t)
	stored := etcd(v1alpha1.MembershipSpec{}, nil)
	stored.ResourceVersion = "41"

	same := stored.DeepCopy()
	g.Expect(stretchv1alpha1.PairedReplicasFor(stored, same)).To(BeEmpty(), "the Etcd's replicas do not change")
	g.Expect(stretchv1alpha1.WriteEtcdFirst(stored, same)).To(BeFalse())

	warm := stored.DeepCopy()
	warm.Spec.Replicas = 5
	a := stretchv1alpha1.PairedReplicasFor(stored, warm)
	g.Expect(a).To(Equal("5/41"))
	g.Expect(stretchv1alpha1.ParsePairedReplicas(a)).To(BeNumerically("==", 5))
	g.Expect(stretchv1alpha1.WriteEtcdFirst(stored, warm)).To(BeFalse(), "the EtcdMembership goes first")

	abort := stored.DeepCopy()
	abort.Spec.Replicas = 0
	g.Expect(stretchv1alpha1.WriteEtcdFirst(stored, abort)).To(BeTrue(), "scaled to zero: the Etcd goes first")
	g.Expect(stretchv1alpha1.PairedReplicasFor(stored, abort)).To(Equal("0/41"))

	for _, bad := range []string{"5", "x/41", "-1/41", ""} {
		_, err := stretchv1alpha1.ParsePairedReplicas(bad)
		g.Expect(err).To(MatchError(ContainSubstring(stretchv1alpha1.PairedReplicasAnnotation)), bad)
	}
}
