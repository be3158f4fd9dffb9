package migration_test

import (
	"fmt"
	"testing"
	"time"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/members"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/migration"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/peerurls"
)

// addresses are the URLs a test environment would give: one host per pod.
func addresses(e *v1alpha1.Etcd, memberName, podName string) (v1alpha1.ExternalMember, error) {
	host := fmt.Sprintf("%s.%s.example", podName, e.Namespace)
	return v1alpha1.ExternalMember{
		PeerURLs:   []string{"http://" + host + ":2380"},
		ClientURLs: []string{"http://" + host + ":2379"},
		SidecarURL: "https://" + host + ":8080",
	}, nil
}

func source() *v1alpha1.Etcd {
	e := &v1alpha1.Etcd{ObjectMeta: metav1.ObjectMeta{Name: "etcd-main", Namespace: "shoot", Generation: 1}}
	e.Spec.Replicas = 3
	return e
}

// observe writes what a controller would report for e: the members with
// their roles (local or external by name), converged or not, at e's
// current generation, observed at the given time.
func observe(e *v1alpha1.Etcd, converged bool, at time.Time, roles map[string]v1alpha1.MemberRole) {
	ms := &v1alpha1.MembershipStatus{ObservedGeneration: e.Generation, ObservedTime: &metav1.Time{Time: at}}
	for name, role := range roles {
		origin := v1alpha1.MemberOriginUnmanaged
		switch _, ext := e.Spec.ExternalMember(name); {
		case members.IsLocal(e, name):
			origin = v1alpha1.MemberOriginLocal
		case ext:
			origin = v1alpha1.MemberOriginExternal
		}
		ms.Members = append(ms.Members, v1alpha1.ObservedMember{ID: name, Name: name, Role: role, Origin: origin, Healthy: true})
	}
	status := metav1.ConditionFalse
	if converged {
		status = metav1.ConditionTrue
	}
	ms.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionMembershipConverged, Status: status, ObservedGeneration: e.Generation, Reason: "Test"}}
	e.Status.Membership = ms
}

// change applies a spec mutation as the apiserver would: a new generation.
func change(e *v1alpha1.Etcd, mutate func(*v1alpha1.Etcd)) {
	mutate(e)
	e.Generation++
}

const (
	V = v1alpha1.MemberRoleVoter
	L = v1alpha1.MemberRoleLeader
	N = v1alpha1.MemberRoleLearner
)

func TestPhaseFollowsAMoveAndItsSteps(t *testing.T) {
	g := NewWithT(t)
	t0 := time.Now()
	src := source()
	dst := migration.NewDestination(src, 3)
	g.Expect(migration.CheckNames(src, dst)).To(Succeed())
	// The destination Etcd does not exist until join-destination creates it.
	var created *v1alpha1.Etcd
	srcMembers, err := migration.ExternalMembers(src, addresses)
	g.Expect(err).NotTo(HaveOccurred())
	dstMembers, err := migration.ExternalMembers(dst, addresses)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(dstMembers).To(HaveLen(3))
	g.Expect(dstMembers[0].Name).To(Equal("etcd-main-3"))
	g.Expect(dstMembers[2].PeerURLs).To(Equal([]string{"http://etcd-main-5.shoot.example:2380"}))

	src3 := map[string]v1alpha1.MemberRole{"etcd-main-0": L, "etcd-main-1": V, "etcd-main-2": V}
	observe(src, true, t0, src3)
	steps := []struct {
		name string
		do   func()
		want migration.MovePhase
	}{
		{"untouched", func() {}, migration.PhaseNotStarted},
		{"prepare-source set", func() { change(src, func(e *v1alpha1.Etcd) { migration.PrepareSource(e, dstMembers) }) }, migration.PhasePreparingSource},
		{"source converged", func() { observe(src, true, t0.Add(1*time.Second), src3) }, migration.PhaseSourcePrepared},
		{"destination created and joining", func() {
			migration.JoinDestination(dst, srcMembers)
			dst.Generation = 1
			created = dst
		}, migration.PhaseJoiningDestination},
		{"destination learner", func() {
			observe(dst, false, t0.Add(2*time.Second), map[string]v1alpha1.MemberRole{"etcd-main-0": L, "etcd-main-1": V, "etcd-main-2": V, "etcd-main-3": N})
		}, migration.PhaseJoiningDestination},
		{"destination member votes", func() {
			observe(dst, true, t0.Add(3*time.Second), map[string]v1alpha1.MemberRole{"etcd-main-0": L, "etcd-main-1": V, "etcd-main-2": V, "etcd-main-3": V})
		}, migration.PhaseDestinationJoined},
		{"warmed: the further members join as learners", func() { change(dst, func(e *v1alpha1.Etcd) { migration.WarmDestination(e, 3) }) }, migration.PhaseJoiningDestination},
		{"one warm learner in, not converged", func() {
			observe(dst, false, t0.Add(3*time.Second), map[string]v1alpha1.MemberRole{"etcd-main-0": L, "etcd-main-1": V, "etcd-main-2": V, "etcd-main-3": V, "etcd-main-4": N})
		}, migration.PhaseJoiningDestination},
		{"warm learners in, converged", func() {
			observe(dst, true, t0.Add(3*time.Second), map[string]v1alpha1.MemberRole{"etcd-main-0": L, "etcd-main-1": V, "etcd-main-2": V, "etcd-main-3": V, "etcd-main-4": N, "etcd-main-5": N})
		}, migration.PhaseDestinationJoined},
		{"retire set", func() { change(dst, func(e *v1alpha1.Etcd) { migration.RetireSource(e, 3, 0) }) }, migration.PhaseRetiringSource},
		{"in the tie", func() {
			observe(dst, false, t0.Add(4*time.Second), map[string]v1alpha1.MemberRole{"etcd-main-1": V, "etcd-main-2": V, "etcd-main-3": L, "etcd-main-4": V})
		}, migration.PhaseRetiringSource},
		{"source retired", func() {
			observe(dst, true, t0.Add(5*time.Second), map[string]v1alpha1.MemberRole{"etcd-main-3": L, "etcd-main-4": V, "etcd-main-5": V})
		}, migration.PhaseSourceRetired},
		{"source scaled to zero", func() { change(src, migration.FinishSource) }, migration.PhaseFinishing},
		{"source forgets", func() { change(src, migration.ForgetExternalMembers) }, migration.PhaseFinishing},
		{"destination forgets, not yet converged", func() { change(dst, migration.FinishDestination) }, migration.PhaseFinishing},
		{"destination converged", func() {
			observe(dst, true, t0.Add(6*time.Second), map[string]v1alpha1.MemberRole{"etcd-main-3": L, "etcd-main-4": V, "etcd-main-5": V})
		}, migration.PhaseCompleted},
	}
	for _, s := range steps {
		s.do()
		g.Expect(migration.Phase(src, created)).To(Equal(s.want), "after %s: %s", s.name, migration.Explain(src, created))
		if s.name == "warm learners in, converged" {
			g.Expect(migration.Explain(src, created)).To(ContainSubstring("the destination's 1 member(s) vote beside the source's; 2 more wait as learners"))
			g.Expect(created.Spec.Replicas).To(BeNumerically("==", 3))
			before := created.DeepCopy()
			migration.JoinDestination(created, srcMembers)
			g.Expect(created).To(Equal(before), "joining again (a move run again) keeps the warm learners")
		}
	}
	g.Expect(created.Spec.LearnerReplicas).To(BeNil(), "RetireSource lets the learners vote")
	g.Expect(migration.Phase(nil, dst)).To(Equal(migration.PhaseCompleted), "the source Etcd may be deleted after the move")
}

// joined is a move after join-destination: the source lists the
// destination's members and the destination the source's.
func joined() (src, dst *v1alpha1.Etcd) {
	src, dst = source(), migration.NewDestination(source(), 3)
	srcMembers, _ := migration.ExternalMembers(src, addresses)
	dstMembers, _ := migration.ExternalMembers(dst, addresses)
	migration.PrepareSource(src, dstMembers)
	migration.JoinDestination(dst, srcMembers)
	return src, dst
}

// A move that holds a source member back for the source site's clients
// passes through SourceHeld, whose step is switch-clients; once released,
// running retire-source again holds nothing back.
func TestPhaseOfAHeldSourceMember(t *testing.T) {
	g := NewWithT(t)
	t0 := time.Now()
	src, dst := joined()
	dst.Generation = 1
	observe(dst, true, t0, map[string]v1alpha1.MemberRole{"etcd-main-0": L, "etcd-main-1": V, "etcd-main-2": V, "etcd-main-3": V})
	g.Expect(migration.Phase(src, dst)).To(Equal(migration.PhaseDestinationJoined))

	change(dst, func(e *v1alpha1.Etcd) { migration.RetireSource(e, 3, 1) })
	g.Expect(dst.Spec.GetRetainedExternalMembers()).To(Equal(1))
	g.Expect(migration.Phase(src, dst)).To(Equal(migration.PhaseRetiringSource))
	held := map[string]v1alpha1.MemberRole{"etcd-main-2": V, "etcd-main-3": L, "etcd-main-4": V, "etcd-main-5": V}
	observe(dst, true, t0.Add(time.Second), held)
	g.Expect(migration.Phase(src, dst)).To(Equal(migration.PhaseSourceHeld), migration.Explain(src, dst))
	g.Expect(migration.PhaseSourceHeld.Step()).To(Equal(migration.StepSwitchClients))
	g.Expect(migration.SourceRetired(dst)).To(BeFalse())
	g.Expect(migration.CanAbort(src, dst)).To(MatchError(ContainSubstring("the destination holds the majority")))
	g.Expect(migration.Explain(src, dst)).To(ContainSubstring("1 source member(s) stay for the source's clients"))

	change(dst, migration.ReleaseSource)
	g.Expect(dst.Spec.RetainedExternalMembers).To(BeNil())
	g.Expect(migration.Phase(src, dst)).To(Equal(migration.PhaseRetiringSource), "released; the controller has not seen it yet")
	change(dst, func(e *v1alpha1.Etcd) { migration.RetireSource(e, 3, 1) })
	g.Expect(dst.Spec.RetainedExternalMembers).To(BeNil(), "a resumed retire-source does not hold a released member back again")
	observe(dst, true, t0.Add(2*time.Second), map[string]v1alpha1.MemberRole{"etcd-main-3": L, "etcd-main-4": V, "etcd-main-5": V})
	g.Expect(migration.Phase(src, dst)).To(Equal(migration.PhaseSourceRetired))
}

func TestPhaseOfAnAbort(t *testing.T) {
	g := NewWithT(t)
	t0 := time.Now()
	src, dst := joined()
	migration.RetireSource(dst, 3, 0)
	// In the tie: two source voters, two destination voters.
	observe(dst, false, t0, map[string]v1alpha1.MemberRole{"etcd-main-1": V, "etcd-main-2": V, "etcd-main-3": L, "etcd-main-4": V})
	g.Expect(migration.CanAbort(src, dst)).To(Succeed(), "a tie is not a destination majority")

	change(dst, migration.AbortDestination)
	g.Expect(migration.Phase(src, dst)).To(Equal(migration.PhaseAborting))
	observe(src, true, t0.Add(time.Second), map[string]v1alpha1.MemberRole{"etcd-main-0": V, "etcd-main-1": L, "etcd-main-2": V})
	g.Expect(migration.SourceRestored(src)).To(BeTrue())
	g.Expect(migration.Phase(src, dst)).To(Equal(migration.PhaseAborting), "the source still lists the destination's members")
	change(src, migration.ForgetExternalMembers)
	g.Expect(migration.Phase(src, dst)).To(Equal(migration.PhaseAborting), "the source's controller has not seen its new generation")
	observe(src, true, t0.Add(2*time.Second), map[string]v1alpha1.MemberRole{"etcd-main-0": V, "etcd-main-1": L, "etcd-main-2": V})
	g.Expect(migration.Phase(src, dst)).To(Equal(migration.PhaseAborted))
}

func TestCanAbortRefusesOnceTheDestinationHoldsTheMajority(t *testing.T) {
	t0 := time.Now()
	cases := []struct {
		name      string
		roles     map[string]v1alpha1.MemberRole
		converged bool
		wantErr   string
	}{
		{"3+1", map[string]v1alpha1.MemberRole{"etcd-main-0": L, "etcd-main-1": V, "etcd-main-2": V, "etcd-main-3": V}, false, ""},
		{"2+1 and a learner", map[string]v1alpha1.MemberRole{"etcd-main-1": L, "etcd-main-2": V, "etcd-main-3": V, "etcd-main-4": N}, false, ""},
		{"1+2", map[string]v1alpha1.MemberRole{"etcd-main-2": V, "etcd-main-3": L, "etcd-main-4": V}, false, "the destination holds the majority (2 of 3 voters; the source has 1)"},
		{"0+3 converged", map[string]v1alpha1.MemberRole{"etcd-main-3": L, "etcd-main-4": V, "etcd-main-5": V}, true, "cannot abort in phase SourceRetired"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := NewWithT(t)
			src, dst := source(), migration.NewDestination(source(), 3)
			srcMembers, _ := migration.ExternalMembers(src, addresses)
			dstMembers, _ := migration.ExternalMembers(dst, addresses)
			migration.PrepareSource(src, dstMembers)
			migration.JoinDestination(dst, srcMembers)
			migration.RetireSource(dst, 3, 0)
			observe(dst, c.converged, t0, c.roles)
			err := migration.CanAbort(src, dst)
			if c.wantErr == "" {
				g.Expect(err).NotTo(HaveOccurred())
			} else {
				g.Expect(err).To(MatchError(ContainSubstring(c.wantErr)))
			}
		})
	}
}

func TestVotersReadsTheFresherObservation(t *testing.T) {
	g := NewWithT(t)
	t0 := time.Now()
	src, dst := source(), migration.NewDestination(source(), 3)
	srcMembers, _ := migration.ExternalMembers(src, addresses)
	dstMembers, _ := migration.ExternalMembers(dst, addresses)
	migration.PrepareSource(src, dstMembers)
	migration.JoinDestination(dst, srcMembers)
	_, _, ok := migration.Voters(src, dst)
	g.Expect(ok).To(BeFalse(), "nobody observed anything yet")

	observe(src, true, t0, map[string]v1alpha1.MemberRole{"etcd-main-0": L, "etcd-main-1": V, "etcd-main-2": V, "etcd-main-3": V})
	s, d, ok := migration.Voters(src, dst)
	g.Expect([]any{s, d, ok}).To(Equal([]any{3, 1, true}))

	// An unmanaged voter counts for neither side.
	migration.RetireSource(dst, 3, 0)
	observe(dst, false, t0.Add(time.Second), map[string]v1alpha1.MemberRole{"etcd-main-1": L, "etcd-main-2": V, "etcd-main-3": V, "etcd-main-4": V, "stranger": V})
	s, d, ok = migration.Voters(src, dst)
	g.Expect([]any{s, d, ok}).To(Equal([]any{2, 2, true}))
}

func TestInconsistentObjectsAreNamed(t *testing.T) {
	cases := []struct {
		name  string
		setup func(src, dst *v1alpha1.Etcd) (*v1alpha1.Etcd, *v1alpha1.Etcd)
		want  string
	}{
		{"destination is its own cluster", func(src, dst *v1alpha1.Etcd) (*v1alpha1.Etcd, *v1alpha1.Etcd) {
			dst.Spec.Replicas = 3
			return src, dst
		}, "it is a separate etcd cluster"},
		{"source does not list the destination", func(src, dst *v1alpha1.Etcd) (*v1alpha1.Etcd, *v1alpha1.Etcd) {
			members, _ := migration.ExternalMembers(src, addresses)
			migration.JoinDestination(dst, members)
			return src, dst
		}, "the source does not list the destination's"},
		{"no source", func(_, dst *v1alpha1.Etcd) (*v1alpha1.Etcd, *v1alpha1.Etcd) { return nil, dst }, "there is no source Etcd"},
		{"source at zero without destination", func(src, _ *v1alpha1.Etcd) (*v1alpha1.Etcd, *v1alpha1.Etcd) {
			src.Spec.Replicas = 0
			return src, nil
		}, "no destination to hold the cluster"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := NewWithT(t)
			src, dst := c.setup(source(), migration.NewDestination(source(), 3))
			g.Expect(migration.Phase(src, dst)).To(Equal(migration.PhaseInconsistent))
			g.Expect(migration.Explain(src, dst)).To(ContainSubstring(c.want))
			g.Expect(migration.CanAbort(src, dst)).To(MatchError(ContainSubstring(c.want)))
		})
	}
}

func TestAPreCreatedIdleDestinationIsNotAMove(t *testing.T) {
	g := NewWithT(t)
	src, dst := source(), migration.NewDestination(source(), 3)
	dst.Spec.Replicas = 0
	g.Expect(migration.Phase(src, dst)).To(Equal(migration.PhaseNotStarted))
}

func TestCheckNamesRefusesOverlappingRanges(t *testing.T) {
	g := NewWithT(t)
	src := source()
	g.Expect(migration.CheckNames(src, migration.NewDestination(src, 2))).To(MatchError(ContainSubstring("etcd-main-2 has the name of a source member")))
	prefixed := migration.NewDestination(src, 0)
	prefixed.Spec.MemberNamePrefix = new("seed-b")
	g.Expect(migration.CheckNames(src, prefixed)).To(Succeed())
}

func TestExternalMembersNamesTheFailingMember(t *testing.T) {
	g := NewWithT(t)
	_, err := migration.ExternalMembers(source(), func(e *v1alpha1.Etcd, name, pod string) (v1alpha1.ExternalMember, error) {
		if name == "etcd-main-1" {
			return v1alpha1.ExternalMember{}, fmt.Errorf("no load balancer yet")
		}
		return addresses(e, name, pod)
	})
	g.Expect(err).To(MatchError(ContainSubstring("member etcd-main-1 (pod shoot/etcd-main-1): no load balancer yet")))
	_, err = migration.ExternalMembers(source(), func(*v1alpha1.Etcd, string, string) (v1alpha1.ExternalMember, error) {
		return v1alpha1.ExternalMember{}, nil
	})
	g.Expect(err).To(MatchError(ContainSubstring("has no peer URL")))
}

// TestScalingToZeroDropsAdvertisedURLs: the finish scales the source to
// zero and an abort the destination; druid's validation refuses an
// additional peer URL for a member the Etcd does not run, so both drop
// them.
func TestScalingToZeroDropsAdvertisedURLs(t *testing.T) {
	g := NewWithT(t)
	src := &v1alpha1.Etcd{}
	src.Name = "etcd-main"
	src.Spec.Replicas = 3
	src.Spec.Etcd.AdditionalAdvertisePeerURLs = []druidv1alpha1.MemberPeerURLs{
		{MemberName: "etcd-main-0", URLs: []string{"http://etcd-main-0.seed-a.example:2380"}},
		{MemberName: "etcd-main-2", URLs: []string{"http://etcd-main-2.seed-a.example:2380"}},
	}
	dst := src.DeepCopy()
	dst.Spec.OrdinalStart = ptr.To[int32](3)

	migration.FinishSource(src)
	g.Expect(src.Spec.Replicas).To(BeZero())
	g.Expect(src.Spec.Etcd.AdditionalAdvertisePeerURLs).To(BeNil())

	dst.Spec.AdditionalAdvertisePeerURLs = []v1alpha1.MemberPeerURLs{
		{MemberName: "etcd-main-3", URLs: []string{"http://etcd-main-3.seed-b.example:2380"}},
	}
	dst.Spec.LearnerReplicas = ptr.To[int32](2)
	migration.AbortDestination(dst)
	g.Expect(dst.Spec.Etcd.AdditionalAdvertisePeerURLs).To(BeNil())
	g.Expect(dst.Spec.AdditionalAdvertisePeerURLs).To(BeNil(), "druid-stretch's entries go with druid's")
	g.Expect(dst.Spec.LearnerReplicas).To(BeNil(), "replicas 0 leaves no learner to keep (and the CRD refuses learnerReplicas without replicas)")
}

// TestAdvertise: the destination's members advertise the URLs the source
// reaches them by, for exactly its ordinal range, without druid's
// in-cluster URL twice; each entry in the field that admits it at the
// Etcd's spec.replicas (druid's for the ordinals 0..replicas-1, the
// EtcdMembership's for the others).
func TestAdvertise(t *testing.T) {
	g := NewWithT(t)
	dst := &v1alpha1.Etcd{}
	dst.Name, dst.Namespace = "etcd-main", "shoot"
	dst.Spec.Replicas = 1
	dst.Spec.OrdinalStart = ptr.To[int32](3)
	addr := func(e *v1alpha1.Etcd, member, pod string) (v1alpha1.ExternalMember, error) {
		return v1alpha1.ExternalMember{PeerURLs: []string{
			"http://" + pod + ".etcd-main-peer.shoot.svc:2380", // druid's own: not repeated
			"http://" + pod + ".shoot.seed-b.example:2380",
		}}, nil
	}
	g.Expect(migration.Advertise(dst, addr)).To(Succeed())
	g.Expect(dst.Spec.Etcd.AdditionalAdvertisePeerURLs).To(BeNil(), "druid admits no entry for ordinal 3 of a 1-replica Etcd")
	g.Expect(dst.Spec.AdditionalAdvertisePeerURLs).To(Equal([]v1alpha1.MemberPeerURLs{
		{MemberName: "etcd-main-3", URLs: []string{"http://etcd-main-3.shoot.seed-b.example:2380"}},
	}))
	dst.Spec.Replicas = 3
	g.Expect(migration.Advertise(dst, addr)).To(Succeed())
	g.Expect(dst.Spec.Etcd.AdditionalAdvertisePeerURLs).To(BeNil())
	g.Expect(dst.Spec.AdditionalAdvertisePeerURLs).To(HaveLen(3))
	g.Expect(dst.Spec.AdditionalAdvertisePeerURLs[2].MemberName).To(Equal("etcd-main-5"))
	g.Expect(migration.Advertise(dst, nil)).To(MatchError(ContainSubstring("no Addresses function")))

	// A range across druid's bound: ordinals 1 and 2 in druid's field, 3
	// in druid-stretch's; all of it druid's once the range starts at 0.
	dst.Spec.OrdinalStart = ptr.To[int32](1)
	g.Expect(migration.Advertise(dst, addr)).To(Succeed())
	g.Expect(dst.Spec.Etcd.AdditionalAdvertisePeerURLs).To(HaveExactElements(
		HaveField("MemberName", "etcd-main-1"), HaveField("MemberName", "etcd-main-2")))
	g.Expect(dst.Spec.AdditionalAdvertisePeerURLs).To(HaveExactElements(HaveField("MemberName", "etcd-main-3")))
	dst.Spec.OrdinalStart = nil
	g.Expect(migration.Advertise(dst, addr)).To(Succeed())
	g.Expect(dst.Spec.Etcd.AdditionalAdvertisePeerURLs).To(HaveLen(3))
	g.Expect(dst.Spec.AdditionalAdvertisePeerURLs).To(BeNil())
	advertised, errs := peerurls.Read(dst)
	g.Expect(errs).To(BeEmpty())
	g.Expect(advertised.Members()).To(HaveLen(3))
}
