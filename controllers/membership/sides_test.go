package membership

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"k8s.io/utils/ptr"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/members"
	"github.com/druid-stretch/druid-stretch/internal/planner"
	"github.com/druid-stretch/druid-stretch/internal/sidecarcluster"
	"github.com/druid-stretch/druid-stretch/sidecar"
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
		g.Expect(side(e, members.Ordinals{}, name)).To(Equal(want), name)
	}
	g.Expect(origin(e, members.Ordinals{}, sidecarcluster.Target{}, "etcd-main-0", nil)).To(Equal(v1alpha1.MemberOriginLocal), "a leaving member is still one of ours")
	g.Expect(origin(e, members.Ordinals{}, sidecarcluster.Target{}, "etcd-main-4", nil)).To(Equal(v1alpha1.MemberOriginLocal))
	g.Expect(origin(e, members.Ordinals{}, sidecarcluster.Target{}, "seed-a-etcd-main-0", nil)).To(Equal(v1alpha1.MemberOriginExternal))
}

// TestSidesWithoutStatus: druid's compaction controller replaces the whole
// status, so status.membership can vanish mid-move. The members whose pods
// the StatefulSet runs stay the Etcd's own (leaving, so removed in the
// move's order, and their pods kept); names of its form that it does not
// run stay unmanaged.
func TestSidesWithoutStatus(t *testing.T) {
	g := NewWithT(t)
	e := &v1alpha1.Etcd{}
	e.Name, e.Spec.Replicas = "etcd-main", 3
	e.Spec.OrdinalStart = ptr.To[int32](3)
	running := members.Ordinals{Start: 0, End: 6}
	for name, want := range map[string]string{
		"etcd-main-3": sideLocal, "etcd-main-5": sideLocal,
		"etcd-main-0": sideLeaving, "etcd-main-2": sideLeaving,
		"etcd-main-6": sideUnmanaged, "other-0": sideUnmanaged,
	} {
		g.Expect(side(e, running, name)).To(Equal(want), name)
		g.Expect(side(e, members.Ordinals{}, name)).To(Equal(map[bool]string{true: sideUnmanaged, false: want}[want == sideLeaving]),
			"%s: without the running pods and the status, a name of the Etcd's form outside its range is no proof", name)
	}
	g.Expect(origin(e, running, sidecarcluster.Target{}, "etcd-main-1", nil)).To(Equal(v1alpha1.MemberOriginLocal))
	e.Status.Membership = &v1alpha1.MembershipStatus{Members: []v1alpha1.ObservedMember{
		{Name: "etcd-main-0", Origin: v1alpha1.MemberOriginLocal}, {Name: "etcd-main-3", Origin: v1alpha1.MemberOriginLocal},
	}}
	g.Expect(members.PodWindow(e)).To(Equal(members.Ordinals{Start: 0, End: 6}), "a status written from what runs keeps those pods")
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

// TestConvergedPoll: a converged Etcd whose external members the other
// cluster's controller is still adding (absent, a learner not yet
// published, a learner) is looked at again at the progress interval, so
// that their in-cluster names are published here within a second; one
// whose external members all vote, or that retires them, at the converged
// interval. An unpublished learner is recognised by its peer URL.
func TestConvergedPoll(t *testing.T) {
	g := NewWithT(t)
	r := &Reconciler{opts: Options{ProgressInterval: time.Second, ConvergedInterval: 30 * time.Second}}
	e := &v1alpha1.Etcd{}
	e.Spec.ExternalMembers = []v1alpha1.ExternalMember{
		{Name: "etcd-main-3", PeerURLs: []string{"https://etcd-main-3.seed-b:2380"}},
	}
	local := sidecar.Member{ID: "1", Name: "etcd-main-0", PeerURLs: []string{"https://etcd-main-0.seed-a:2380"}, ClientURLs: []string{"https://etcd-main-0.seed-a:2379"}}
	ext := sidecar.Member{ID: "3", PeerURLs: []string{"https://etcd-main-3.etcd-main-peer.ns.svc:2380", "https://etcd-main-3.seed-b:2380"}, IsLearner: true}
	obs := func(ms ...sidecar.Member) *sidecarcluster.Observation {
		return &sidecarcluster.Observation{List: &sidecar.MemberList{Members: ms}}
	}
	g.Expect(r.convergedPoll(e, obs(local))).To(Equal(time.Second), "absent")
	g.Expect(externalMember(obs(local, ext), e.Spec.ExternalMembers[0])).To(HaveField("ID", "3"), "an unpublished learner, by its peer URL")
	g.Expect(r.convergedPoll(e, obs(local, ext))).To(Equal(time.Second), "an unpublished learner")
	ext.Name, ext.ClientURLs = "etcd-main-3", []string{"https://etcd-main-3.seed-b:2379"}
	g.Expect(r.convergedPoll(e, obs(local, ext))).To(Equal(time.Second), "a learner")
	ext.IsLearner = false
	g.Expect(r.convergedPoll(e, obs(local, ext))).To(Equal(30*time.Second), "a voter that serves")
	g.Expect(r.convergedPoll(e, nil)).To(Equal(30*time.Second), "no observation")
	e.Spec.ExternalMembersPolicy = ptr.To(v1alpha1.ExternalMembersPolicyRetire)
	g.Expect(r.convergedPoll(e, obs(local))).To(Equal(30*time.Second), "retired: absent is their end")
}
