package members_test

import (
	"testing"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

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

// TestKeptWindow: where nobody has just observed etcd's members, the window
// keeps every pod the StatefulSet runs, whatever the status says; a
// hibernated Etcd runs none.
func TestKeptWindow(t *testing.T) {
	e := &v1alpha1.Etcd{ObjectMeta: metav1.ObjectMeta{Name: "etcd-main"}}
	e.Spec.Replicas, e.Spec.OrdinalStart = 3, ptr.To[int32](3)
	for _, c := range []struct {
		name    string
		running members.Ordinals
		want    members.Ordinals
	}{
		{"a dropped status mid-move: the old pods stay", members.Ordinals{Start: 0, End: 4}, members.Ordinals{Start: 0, End: 6}},
		{"nothing runs yet: the range", members.Ordinals{}, members.Ordinals{Start: 3, End: 6}},
		{"a gap is filled: a StatefulSet runs one range", members.Ordinals{Start: 8, End: 9}, members.Ordinals{Start: 3, End: 9}},
	} {
		t.Run(c.name, func(t *testing.T) {
			NewWithT(t).Expect(members.KeptWindow(e, c.running)).To(Equal(c.want))
		})
	}
	hibernated := e.DeepCopy()
	hibernated.Spec.Replicas = 0
	NewWithT(t).Expect(members.KeptWindow(hibernated, members.Ordinals{Start: 0, End: 3})).To(Equal(members.Ordinals{}))
}

func TestRunningOrdinals(t *testing.T) {
	g := NewWithT(t)
	sts := &appsv1.StatefulSet{}
	g.Expect(members.RunningOrdinals(nil)).To(Equal(members.Ordinals{}))
	g.Expect(members.RunningOrdinals(sts)).To(Equal(members.Ordinals{}), "no replicas set")
	sts.Spec.Replicas = ptr.To[int32](3)
	g.Expect(members.RunningOrdinals(sts)).To(Equal(members.Ordinals{Start: 0, End: 3}))
	sts.Spec.Ordinals = &appsv1.StatefulSetOrdinals{Start: 4}
	g.Expect(members.RunningOrdinals(sts)).To(Equal(members.Ordinals{Start: 4, End: 7}))
	sts.Spec.Replicas = ptr.To[int32](0)
	g.Expect(members.RunningOrdinals(sts)).To(Equal(members.Ordinals{}))
}

func TestParseOrdinals(t *testing.T) {
	g := NewWithT(t)
	for _, o := range []members.Ordinals{{}, {Start: 0, End: 3}, {Start: 3, End: 6}, {Start: 1 << 40, End: 1<<40 + 1}} {
		got, err := members.ParseOrdinals(o.String())
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(got).To(Equal(o))
	}
	for _, bad := range []string{"", "[3,6)", "[6, 3)", "[3, 3)", "[-1, 2)", "[0, 3) ", "[01, 3)", "[0, x)", "3-6"} {
		_, err := members.ParseOrdinals(bad)
		g.Expect(err).To(MatchError(ContainSubstring("is not an ordinal range")), bad)
	}
}

func TestOrdinalsUnion(t *testing.T) {
	g := NewWithT(t)
	a, b := members.Ordinals{Start: 0, End: 3}, members.Ordinals{Start: 5, End: 6}
	g.Expect(a.Union(b)).To(Equal(members.Ordinals{Start: 0, End: 6}))
	g.Expect(b.Union(a)).To(Equal(members.Ordinals{Start: 0, End: 6}))
	g.Expect(a.Union(members.Ordinals{})).To(Equal(a))
	g.Expect(members.Ordinals{Start: 4, End: 2}.Union(b)).To(Equal(b), "an inverted range is empty")
	g.Expect(members.Ordinals{Start: 4, End: 2}.Union(members.Ordinals{})).To(Equal(members.Ordinals{}))
}
