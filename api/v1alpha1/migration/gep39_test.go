package migration_test

import (
	"testing"
	"time"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	stretchv1alpha1 "github.com/druid-stretch/druid-stretch/api/stretch/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/migration"
)

// observedSource is the source as its converged controller reports it,
// with the peer URLs etcd knows its members by.
func observedSource() *v1alpha1.Etcd {
	src := source()
	observe(src, true, time.Now(), map[string]v1alpha1.MemberRole{
		"etcd-main-0": v1alpha1.MemberRoleLeader, "etcd-main-1": v1alpha1.MemberRoleVoter, "etcd-main-2": v1alpha1.MemberRoleVoter,
	})
	for i := range src.Status.Membership.Members {
		m := &src.Status.Membership.Members[i]
		m.PeerURLs = []string{"http://" + m.Name + ".etcd-main-peer.shoot.svc:2380", "http://" + m.Name + ".shoot.example:2380"}
	}
	return src
}

// The stages write druid's own fields only: the View of the destination
// they build derives the move from them, and nothing of druid-stretch's is
// left to write.
func TestGEP39StagesWriteDruidsFieldsOnly(t *testing.T) {
	g := NewWithT(t)
	src := observedSource()
	g.Expect(migration.PrepareSourceForPeerJoin(src, addresses)).To(Succeed())
	g.Expect(src.Spec.Etcd.AdditionalAdvertisePeerURLs).To(HaveLen(3))
	g.Expect(migration.SourcePreparedForPeerJoin(src)).To(BeTrue(), "etcd knows every source member by its additional URL")
	src.Status.Membership.Members[1].PeerURLs = src.Status.Membership.Members[1].PeerURLs[:1]
	g.Expect(migration.SourcePreparedForPeerJoin(src)).To(BeFalse(), "a member etcd does not know by its additional URL yet")
	src = observedSource()

	dst := migration.NewJoiningDestination(src, "seed-b")
	g.Expect(migration.JoinDestinationPeers(dst, src, 2, []string{"http://etcd-main-client.shoot.example:2379"}, addresses)).To(Succeed())
	g.Expect(dst.Spec.MembershipSpec).To(BeZero(), "no druid-stretch field")
	g.Expect(dst.Spec.Replicas).To(Equal(int32(2)))
	g.Expect(dst.Spec.Etcd.AdditionalAdvertisePeerURLs).To(HaveExactElements(
		HaveField("MemberName", "seed-b-etcd-main-0"), HaveField("MemberName", "seed-b-etcd-main-1")))
	b := dst.Spec.Etcd.BootstrapWithExistingCluster
	g.Expect(b).NotTo(BeNil())
	g.Expect(b.Members).To(HaveExactElements(
		druidv1alpha1.BootstrapExistingMember{Name: "etcd-main-0", PeerURLs: []string{"http://etcd-main-0.etcd-main-peer.shoot.svc:2380", "http://etcd-main-0.shoot.example:2380"}},
		druidv1alpha1.BootstrapExistingMember{Name: "etcd-main-1", PeerURLs: []string{"http://etcd-main-1.etcd-main-peer.shoot.svc:2380", "http://etcd-main-1.shoot.example:2380"}},
		druidv1alpha1.BootstrapExistingMember{Name: "etcd-main-2", PeerURLs: []string{"http://etcd-main-2.etcd-main-peer.shoot.svc:2380", "http://etcd-main-2.shoot.example:2380"}},
	), "as etcd knows the source's members")

	// Created, then scaled to 3: the bootstrap stays as created.
	dst.CreationTimestamp = metav1.Now()
	before := b.DeepCopy()
	g.Expect(migration.JoinDestinationPeers(dst, observedSource(), 3, []string{"http://other:2379"}, addresses)).To(Succeed())
	g.Expect(dst.Spec.Etcd.BootstrapWithExistingCluster).To(Equal(before))
	g.Expect(dst.Spec.Etcd.AdditionalAdvertisePeerURLs).To(HaveLen(3))
	v, src2 := stretchv1alpha1.View(dst, nil)
	g.Expect(src2).To(Equal(stretchv1alpha1.SpecFromBootstrap))
	g.Expect(v.Spec.LearnerReplicas).To(HaveValue(Equal(int32(1))))

	// EtcdMigrationComplete waits for druid's record of the join.
	err := migration.CompleteEtcdMigration(dst)
	g.Expect(err).To(MatchError(ContainSubstring("druid has not recorded the join yet")))
	g.Expect(dst.Spec.Etcd.BootstrapWithExistingCluster).NotTo(BeNil(), "nothing changed")
	dst.Status.BootstrapWithExistingCluster = &druidv1alpha1.BootstrapWithExistingClusterStatus{JoinedAt: metav1.Now()}
	for _, m := range before.Members {
		dst.Status.BootstrapWithExistingCluster.Members = append(dst.Status.BootstrapWithExistingCluster.Members, druidv1alpha1.BootstrapJoinedMember(m))
	}
	g.Expect(migration.CompleteEtcdMigration(dst)).To(Succeed())
	g.Expect(dst.Spec.Etcd.BootstrapWithExistingCluster).To(BeNil())
	v, _ = stretchv1alpha1.View(dst, nil)
	g.Expect(v.Spec.GetExternalMembersPolicy()).To(Equal(v1alpha1.ExternalMembersPolicyRetire))

	migration.CleanupSource(src)
	g.Expect(src.Spec.Replicas).To(BeZero())
	g.Expect(src.Spec.Etcd.AdditionalAdvertisePeerURLs).To(BeEmpty())
}

func TestGEP39RefusesWhatWouldCollide(t *testing.T) {
	g := NewWithT(t)
	src := observedSource()
	noPrefix := migration.NewJoiningDestination(src, "")
	g.Expect(migration.JoinDestinationPeers(noPrefix, src, 2, []string{"http://c:2379"}, addresses)).To(MatchError(ContainSubstring("spec.memberNamePrefix")))
	g.Expect(noPrefix.Spec.Etcd.BootstrapWithExistingCluster).To(BeNil(), "nothing set")

	dst := migration.NewJoiningDestination(src, "seed-b")
	g.Expect(migration.JoinDestinationPeers(dst, src, 2, nil, addresses)).To(MatchError(ContainSubstring("client endpoints")))
	unseen := source()
	g.Expect(migration.JoinDestinationPeers(dst, unseen, 2, []string{"http://c:2379"}, addresses)).To(MatchError(ContainSubstring("observed 0 of its 3 members")))
	g.Expect(dst.Spec.Etcd.BootstrapWithExistingCluster).To(BeNil())
	g.Expect(dst.Spec.Replicas).To(Equal(int32(3)), "the template's replicas, unchanged")
}

// DestinationPeersJoined and EtcdMigrationCompleted read the destination's
// converged status.
func TestGEP39Waits(t *testing.T) {
	g := NewWithT(t)
	src := observedSource()
	dst := migration.NewJoiningDestination(src, "seed-b")
	g.Expect(migration.JoinDestinationPeers(dst, src, 3, []string{"http://c:2379"}, addresses)).To(Succeed())
	dst.Generation = 1
	v, _ := stretchv1alpha1.View(dst, nil)
	observe(v, true, time.Now(), map[string]v1alpha1.MemberRole{
		"etcd-main-0": v1alpha1.MemberRoleLeader, "etcd-main-1": v1alpha1.MemberRoleVoter, "etcd-main-2": v1alpha1.MemberRoleVoter,
		"seed-b-etcd-main-0": v1alpha1.MemberRoleVoter, "seed-b-etcd-main-1": v1alpha1.MemberRoleVoter,
	})
	g.Expect(migration.DestinationPeersJoined(v)).To(BeFalse(), "two of three")
	observe(v, true, time.Now(), map[string]v1alpha1.MemberRole{
		"etcd-main-0": v1alpha1.MemberRoleLeader, "etcd-main-1": v1alpha1.MemberRoleVoter, "etcd-main-2": v1alpha1.MemberRoleVoter,
		"seed-b-etcd-main-0": v1alpha1.MemberRoleVoter, "seed-b-etcd-main-1": v1alpha1.MemberRoleVoter, "seed-b-etcd-main-2": v1alpha1.MemberRoleLearner,
	})
	g.Expect(migration.DestinationPeersJoined(v)).To(BeTrue())
	g.Expect(migration.EtcdMigrationCompleted(v)).To(BeFalse(), "the field is still set")

	dst.Spec.Etcd.BootstrapWithExistingCluster = nil
	dst.Status.BootstrapWithExistingCluster = &druidv1alpha1.BootstrapWithExistingClusterStatus{Members: []druidv1alpha1.BootstrapJoinedMember{
		{Name: "etcd-main-0"}, {Name: "etcd-main-1"}, {Name: "etcd-main-2"}}}
	v, _ = stretchv1alpha1.View(dst, nil)
	observe(v, true, time.Now(), map[string]v1alpha1.MemberRole{
		"etcd-main-2":        v1alpha1.MemberRoleVoter,
		"seed-b-etcd-main-0": v1alpha1.MemberRoleLeader, "seed-b-etcd-main-1": v1alpha1.MemberRoleVoter, "seed-b-etcd-main-2": v1alpha1.MemberRoleVoter,
	})
	g.Expect(migration.EtcdMigrationCompleted(v)).To(BeFalse(), "a source member is left")
	observe(v, true, time.Now(), map[string]v1alpha1.MemberRole{
		"seed-b-etcd-main-0": v1alpha1.MemberRoleLeader, "seed-b-etcd-main-1": v1alpha1.MemberRoleVoter, "seed-b-etcd-main-2": v1alpha1.MemberRoleVoter,
	})
	g.Expect(migration.EtcdMigrationCompleted(v)).To(BeTrue())
}

// StageOf names the stage under way from the two objects alone.
func TestGEP39StageOf(t *testing.T) {
	g := NewWithT(t)
	src := observedSource()
	stage, why := migration.StageOf(src, nil)
	g.Expect(stage).To(Equal(migration.StageSourceEtcdPreparedForPeerJoin), why)
	g.Expect(migration.PrepareSourceForPeerJoin(src, addresses)).To(Succeed())
	stage, why = migration.StageOf(src, nil)
	g.Expect(stage).To(Equal(migration.StageDestinationEtcdPeersJoined), why)

	dst := migration.NewJoiningDestination(src, "seed-b")
	g.Expect(migration.JoinDestinationPeers(dst, src, 3, []string{"http://c:2379"}, addresses)).To(Succeed())
	v, _ := stretchv1alpha1.View(dst, nil)
	stage, why = migration.StageOf(src, v)
	g.Expect(stage).To(Equal(migration.StageDestinationEtcdPeersJoined))
	g.Expect(why).To(ContainSubstring("0 of the destination's 3 members"))
	observe(v, true, time.Now(), map[string]v1alpha1.MemberRole{
		"etcd-main-0": v1alpha1.MemberRoleLeader, "etcd-main-1": v1alpha1.MemberRoleVoter, "etcd-main-2": v1alpha1.MemberRoleVoter,
		"seed-b-etcd-main-0": v1alpha1.MemberRoleVoter, "seed-b-etcd-main-1": v1alpha1.MemberRoleVoter, "seed-b-etcd-main-2": v1alpha1.MemberRoleLearner,
	})
	stage, why = migration.StageOf(src, v)
	g.Expect(stage).To(Equal(migration.StageEtcdMigrationComplete))
	g.Expect(why).To(ContainSubstring("druid has not recorded the join"))

	src.Spec.Replicas = 0
	dst.Spec.Etcd.BootstrapWithExistingCluster = nil
	dst.Status.BootstrapWithExistingCluster = &druidv1alpha1.BootstrapWithExistingClusterStatus{Members: []druidv1alpha1.BootstrapJoinedMember{{Name: "etcd-main-0"}}}
	v, _ = stretchv1alpha1.View(dst, nil)
	observe(v, true, time.Now(), map[string]v1alpha1.MemberRole{
		"seed-b-etcd-main-0": v1alpha1.MemberRoleLeader, "seed-b-etcd-main-1": v1alpha1.MemberRoleVoter, "seed-b-etcd-main-2": v1alpha1.MemberRoleVoter,
	})
	stage, why = migration.StageOf(src, v)
	g.Expect(stage).To(BeEmpty(), why)
}
