package members_test

import (
	"testing"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/members"
)

// The two Etcds of a live move share their name: the destination's members
// (ordinals 3-5) have names of the source's form, and only the external
// member list (and, once forgotten, the observed origin) tells them apart.
func TestSharedNameStemOfALiveMove(t *testing.T) {
	g := NewWithT(t)
	src := &v1alpha1.Etcd{ObjectMeta: metav1.ObjectMeta{Name: "etcd-main", Namespace: "shoot"}}
	src.Spec.Replicas = 3
	src.Spec.ExternalMembers = []v1alpha1.ExternalMember{{Name: "etcd-main-3", PeerURLs: []string{"https://b-3.example:2380"}}}

	_, ok := members.Ordinal(src, "etcd-main-3")
	g.Expect(ok).To(BeFalse(), "a listed external member is not one of the source's pods")
	o, ok := members.Ordinal(src, "etcd-main-4")
	g.Expect(ok).To(BeTrue())
	g.Expect(o).To(Equal(int64(4)))
	g.Expect(members.IsLocal(src, "etcd-main-0")).To(BeTrue())

	src.Status.Membership = &v1alpha1.MembershipStatus{Members: []v1alpha1.ObservedMember{
		{ID: "1", Name: "etcd-main-2", Origin: v1alpha1.MemberOriginLocal},
		{ID: "2", Name: "etcd-main-3", Origin: v1alpha1.MemberOriginExternal},
	}}
	g.Expect(members.PodWindow(src)).To(Equal(members.Ordinals{Start: 0, End: 3}))

	// After the move the source forgot the destination's members and has no
	// replicas; its last observation lists them, as external.
	src.Spec.Replicas, src.Spec.ExternalMembers = 0, nil
	src.Status.Membership.Members = []v1alpha1.ObservedMember{
		{ID: "2", Name: "etcd-main-3", Origin: v1alpha1.MemberOriginExternal},
		{ID: "3", Name: "etcd-main-4", Origin: v1alpha1.MemberOriginExternal},
	}
	g.Expect(members.PodWindow(src)).To(Equal(members.Ordinals{}), "no pod of the source may start for the destination's members")
}
