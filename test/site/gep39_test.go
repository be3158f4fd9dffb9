package site

import (
	"fmt"
	"strings"
	"testing"
	"time"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	. "github.com/onsi/gomega"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/controllers/webhook"
	"github.com/druid-stretch/druid-stretch/internal/etcdview"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
)

// TestGEP39MoveBetweenRealSites is the live move as GEP-39 makes it:
// the adapter writes druid's own fields only, stage by stage
// (SourceEtcdPreparedForPeerJoin on a running source that advertised no
// additional peer URLs, so druid rolls its pods under the shoot's traffic
// and etcd learns their new URLs; DestinationEtcdPeersJoined with replicas
// 2 then 3, the clients switched, EtcdMigrationComplete,
// SourceSeedCleanup). B's Etcd has the same name and namespace as A's,
// spec.memberNamePrefix site-b and ordinals from 0, so druid gives B's
// pods the in-cluster peer URLs of A's pods; spec.etcd.bootstrapWithExistingCluster
// names A's members. druid-stretch carries the membership from those
// fields alone, with druid v0.38.1, backup-restore v0.44.1, druid's
// compaction and druid's CRDs written as gardenlet writes them.
func TestGEP39MoveBetweenRealSites(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	ctx := testContext(t, siteTestDeadline)
	root := moveRoot(t, "druid-stretch-gep39-")
	sites := startSites(t, MoveSiteOptions(root)...)
	a, b := sites[0], sites[1]
	mv, err := NewLiveMove(ctx, a, b, LiveMoveOptions{RTT: DefaultMoveRTT, GEP39: true, DeltaSnapshotAfterJoin: true, Out: testWriter{t}, ReadyzExclude: testReadyzExclude})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(mv.CreateSource(ctx)).To(Succeed())
	run, err := mv.Run(ctx)
	logTemplateChanges(t, b, moveNamespace, MoveEtcdName)
	g.Expect(err).NotTo(HaveOccurred())
	t.Logf("the move took %s", run.MoveTook.Round(100*time.Millisecond))

	// B's Etcd is druid's alone, as gardenlet wrote it; its EtcdMembership,
	// which the controller created to hold the status, carries no spec.
	dst, err := etcdview.Get(ctx, b.Client, mv.Key())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(dst.Etcd.Spec.MembershipSpec).To(BeZero())
	g.Expect(dst.Membership).NotTo(BeNil())
	g.Expect(dst.Membership.Spec.MembershipSpec).To(BeZero(), "gardenlet wrote no druid-stretch field")
	g.Expect(dst.Etcd.Spec.MemberNamePrefix).To(HaveValue(Equal(DestinationIdentity)))
	g.Expect(dst.Etcd.Spec.Etcd.BootstrapWithExistingCluster).To(BeNil(), "unset at EtcdMigrationComplete")
	g.Expect(dst.Etcd.Status.BootstrapWithExistingCluster).NotTo(BeNil(), "druid recorded the join")
	g.Expect(dst.Etcd.Status.Conditions).To(ContainElement(And(
		HaveField("Type", druidv1alpha1.ConditionTypeBootstrappedWithExistingCluster),
		HaveField("Status", druidv1alpha1.ConditionTrue))), "druid reports B BootstrappedWithExistingCluster: %s", Conditions(dst.Etcd.Status.Conditions))
	g.Expect(dst.Etcd.Spec.Etcd.AdditionalAdvertisePeerURLs).To(HaveExactElements(
		HaveField("MemberName", "site-b-etcd-main-0"), HaveField("MemberName", "site-b-etcd-main-1"), HaveField("MemberName", "site-b-etcd-main-2")),
		"B's peer URLs in druid's own field, by member name")
	t.Logf("druid's own CRDs were written %d times into the two sites", run.DruidCRDWrites)
	g.Expect(run.DruidCRDWrites).To(BeNumerically(">=", 4))

	expectDestinationReadyAndOwnHistory(t, run)
	expectKubeAPIServersSawNothing(t, run.API, a)

	// Only the planner's changes: three learners added, each promoted, the
	// source's three members removed; the last destination member promoted
	// in the call that removed the first source member (the one tie).
	history := run.Membership
	steps := history.TransitionsInApplyOrder(appliedConfChanges(t, b, moveNamespace, "etcd-main-0"))
	t.Logf("membership steps: %s", strings.Join(steps, "; "))
	var adds, promotes, removes []string
	for _, s := range steps {
		for _, part := range strings.Split(s, " + ") {
			switch {
			case part == "add learner (unnamed)":
				adds = append(adds, part)
			case strings.HasPrefix(part, "promote "):
				promotes = append(promotes, strings.TrimPrefix(part, "promote "))
			case strings.HasPrefix(part, "remove "):
				removes = append(removes, strings.TrimPrefix(part, "remove "))
			default:
				t.Errorf("a membership change druid-stretch does not make: %q", part)
			}
		}
	}
	g.Expect(adds).To(HaveLen(3))
	g.Expect(promotes).To(ConsistOf("site-b-etcd-main-0", "site-b-etcd-main-1", "site-b-etcd-main-2"), "each promoted once: no promotion by backup-restore")
	g.Expect(removes).To(ConsistOf("etcd-main-0", "etcd-main-1", "etcd-main-2"))
	g.Expect(history.Last()).To(ConsistOf(
		HaveField("Name", "site-b-etcd-main-0"), HaveField("Name", "site-b-etcd-main-1"), HaveField("Name", "site-b-etcd-main-2")))
	onB := func(name string) bool { return strings.HasPrefix(name, DestinationIdentity+"-") }
	tie, ties := history.LongestTie(onB)
	t.Logf("polls saw the voters tied %d time(s), the longest for %s; the controllers measured %d tie(s), %.3f s in all", ties, tie, run.Ties, run.TieSeconds)
	g.Expect(ties).To(BeNumerically("<=", 1), "one tie at most")
	g.Expect(run.Ties).To(BeNumerically(">=", 1), "the controllers measured the tie the promotion with the first removal makes")
	logTieLength(t, tie, run.Ties, run.TiesUnderOneSecond)
	g.Expect(run.EtcdCrashes).To(BeEmpty(), "etcd panics or fatal exits")
	expectCompactionDuringMove(t, run, a)
	// The source's roll at SourceEtcdPreparedForPeerJoin: each pod ran
	// again; its sidecar gave etcd the new peer URLs before etcd started,
	// so backup-restore had nothing to update (and restarted no etcd under
	// a gate); no stopped etcd had leadership left to hand over by itself
	// (a leader's sidecar handed it over, gates held, first).
	for i := range MoveReplicas {
		pod := fmt.Sprintf("%s-%d", MoveEtcdName, i)
		etcdLog, runs, err := a.ContainerLogs(moveNamespace, pod, "etcd")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(runs).To(BeNumerically(">=", 2), "druid rolled pod %s", pod)
		g.Expect(strings.Count(etcdLog, "skipped leadership transfer; local server is not leader")).To(BeNumerically(">=", runs-1),
			"every stop of %s's etcd found it a follower", pod)
		sidecarLog, _, err := a.ContainerLogs(moveNamespace, pod, webhook.SidecarContainerName)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(sidecarLog).To(ContainSubstring("etcd knows this member by the peer URLs it advertises now"), "the sidecar of %s updated its peer URLs", pod)
		brLog, _, err := a.ContainerLogs(moveNamespace, pod, "backup-restore")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(brLog).NotTo(ContainSubstring("Etcd member peerURLs found to be changed"), "backup-restore of %s found nothing to update", pod)
	}
	dstEtcd := &v1alpha1.Etcd{}
	dstEtcd.Namespace, dstEtcd.Name = moveNamespace, MoveEtcdName
	for _, p := range etcdPods(t, b, dstEtcd) {
		log := containerLogs(t, b, p, "backup-restore")
		g.Expect(log).NotTo(ContainSubstring("Attempting to promote member"), "backup-restore of %s promoted", p.Name)
		g.Expect(log).NotTo(ContainSubstring("Adding member"), "backup-restore of %s added a member", p.Name)
	}
}
