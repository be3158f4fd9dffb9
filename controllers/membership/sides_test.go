package membership

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"k8s.io/utils/ptr"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/internal/membership"
	"github.com/druid-stretch/druid-stretch/internal/planner"
)

// TestSidesOfAnOrdinalMove: in a move of the pod window the members of the
// old ordinals are a side of their own, so the planner sees the one tie
// between the two ranges (and moves leadership right after it); they stay
// local by origin.
func TestSidesOfAnOrdinalMove(t *testing.T) {
	g := NewWithT(t)
	e := &v1alpha1.Etcd{}
	e.Name, e.Spec.Replicas = "etcd-main", 3
	e.Spec.OrdinalStart = ptr.To[int32](3)
	e.Spec.ExternalMembers = []v1alpha1.ExternalMember{{Name: "seed-a-etcd-main-0"}}
	// The status of the Etcd before its window moved: 0-2 were its members.
	e.Status.Membership = &v1alpha1.MembershipStatus{Members: []v1alpha1.ObservedMember{
		{Name: "etcd-main-0", Origin: v1alpha1.MemberOriginLocal},
		{Name: "etcd-main-2", Origin: v1alpha1.MemberOriginLocal},
		{Name: "etcd-main-6", Origin: v1alpha1.MemberOriginLocal},
		{Name: "etcd-main-7", Origin: v1alpha1.MemberOriginUnmanaged},
	}}
	for name, want := range map[string]string{
		"etcd-main-3": sideLocal, "etcd-main-5": sideLocal,
		"etcd-main-0": sideLeaving, "etcd-main-2": sideLeaving, "etcd-main-6": sideLeaving,
		"seed-a-etcd-main-0": sideExternal,
		"other-0":            sideUnmanaged,
		// Names of the Etcd's form it never owned: another's, or an
		// operator's; never removed for their name alone.
		"etcd-main-1": sideUnmanaged, "etcd-main-7": sideUnmanaged,
	} {
		g.Expect(side(e, name)).To(Equal(want), name)
	}
	g.Expect(origin(e, membership.Target{}, "etcd-main-0", nil)).To(Equal(v1alpha1.MemberOriginLocal), "a leaving member is still one of ours")
	g.Expect(origin(e, membership.Target{}, "etcd-main-4", nil)).To(Equal(v1alpha1.MemberOriginLocal))
	g.Expect(origin(e, membership.Target{}, "seed-a-etcd-main-0", nil)).To(Equal(v1alpha1.MemberOriginExternal))
}

// TestPollAfter: a wait whose end the planner knows is looked at again just
// after it, never later than the progress interval; one whose end is not
// known, at the progress interval.
func TestPollAfter(t *testing.T) {
	g := NewWithT(t)
	r := &Reconciler{opts: Options{ProgressInterval: time.Second}}
	g.Expect(r.pollAfter(planner.Step{Kind: planner.Wait, ReadyIn: 300 * time.Millisecond})).To(Equal(300*time.Millisecond + readyMargin))
	g.Expect(r.pollAfter(planner.Step{Kind: planner.Wait, ReadyIn: 3 * time.Second})).To(Equal(time.Second))
	g.Expect(r.pollAfter(planner.Step{Kind: planner.Wait})).To(Equal(time.Second))
}
