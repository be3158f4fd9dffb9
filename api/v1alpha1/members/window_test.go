package members_test

import (
	"testing"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/members"
)

func TestPodWindow(t *testing.T) {
	etcd := func(start *int32, replicas int32, observed ...string) *v1alpha1.Etcd {
		e := &v1alpha1.Etcd{ObjectMeta: metav1.ObjectMeta{Name: "etcd-main", Namespace: "shoot"}}
		e.Spec.Replicas = replicas
		e.Spec.OrdinalStart = start
		prefix := "seed-b"
		e.Spec.MemberNamePrefix = &prefix
		if observed != nil {
			e.Status.Membership = &v1alpha1.MembershipStatus{}
			for _, n := range observed {
				e.Status.Membership.Members = append(e.Status.Membership.Members, v1alpha1.ObservedMember{ID: n, Name: n})
			}
		}
		return e
	}
	three := int32(3)
	inMove := func(e *v1alpha1.Etcd) *v1alpha1.Etcd {
		e.Spec.ExternalMembers = []v1alpha1.ExternalMember{{Name: "seed-a-etcd-main-0"}}
		return e
	}
	for _, c := range []struct {
		name string
		e    *v1alpha1.Etcd
		want members.Ordinals
	}{
		{"no status: the range", etcd(&three, 3), members.Ordinals{Start: 3, End: 6}},
		{"members in the range", etcd(nil, 3, "seed-b-etcd-main-0", "seed-b-etcd-main-1", "seed-b-etcd-main-2"), members.Ordinals{Start: 0, End: 3}},
		{"a move half done keeps the departing pods", etcd(&three, 3, "seed-b-etcd-main-1", "seed-b-etcd-main-2", "seed-b-etcd-main-3"), members.Ordinals{Start: 1, End: 6}},
		{"external and unmanaged names do not count", etcd(&three, 3, "seed-a-etcd-main-0", "stranger", "etcd-main-9", ""), members.Ordinals{Start: 3, End: 6}},
		{"a member above the range", etcd(nil, 2, "seed-b-etcd-main-0", "seed-b-etcd-main-4"), members.Ordinals{Start: 0, End: 5}},
		{"no replicas, no members: empty", etcd(&three, 0), members.Ordinals{}},
		{"no replicas in a move (an aborted destination): only the members", inMove(etcd(&three, 0, "seed-b-etcd-main-7")), members.Ordinals{Start: 7, End: 8}},
		{"hibernated (no replicas, no move): no pod, whatever the membership", etcd(nil, 0, "seed-b-etcd-main-0", "seed-b-etcd-main-1"), members.Ordinals{}},
		{"a non-canonical ordinal is not a pod", etcd(nil, 1, "seed-b-etcd-main-01"), members.Ordinals{Start: 0, End: 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			NewWithT(t).Expect(members.PodWindow(c.e)).To(Equal(c.want))
		})
	}
}

func TestOrdinalsString(t *testing.T) {
	g := NewWithT(t)
	g.Expect(members.Ordinals{Start: 3, End: 6}.String()).To(Equal("[3, 6)"))
	g.Expect(members.Ordinals{}.String()).To(Equal("[]"))
	g.Expect(members.Ordinals{Start: 5, End: 2}.String()).To(Equal("[]"), "an inverted range is empty")
}

func TestHibernated(t *testing.T) {
	g := NewWithT(t)
	e := &v1alpha1.Etcd{}
	g.Expect(members.Hibernated(e)).To(BeTrue(), "replicas 0, no external member")
	e.Spec.ExternalMembers = []v1alpha1.ExternalMember{{Name: "seed-a-etcd-main-0"}}
	g.Expect(members.Hibernated(e)).To(BeFalse(), "the destination of an aborted move is not hibernated")
	e.Spec.ExternalMembers, e.Spec.Replicas = nil, 3
	g.Expect(members.Hibernated(e)).To(BeFalse())
}
