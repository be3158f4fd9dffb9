package site

import (
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	move "github.com/druid-stretch/druid-stretch/api/v1alpha1/migration"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
)

// TestAbortedLiveMoveWithDroppedStatus aborts a live move between two real
// sites once the destination's first member votes, while both sites'
// status.membership is dropped after every step their controllers record,
// the abort's own included (as druid's compaction controller drops it from
// the Etcd, and as nothing but a fault would from the EtcdMembership). An
// abort decides from etcd's member list and the sidecars' step records:
// the destination's member leaves, no voter of the source loses its pod,
// no new cluster starts, and the source ends with its three members, with
// no request failed at either kube-apiserver and every write kept.
func TestAbortedLiveMoveWithDroppedStatus(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	ctx := testContext(t, siteTestDeadline)
	root := moveRoot(t, "druid-stretch-abort-")
	sites := startSites(t, MoveSiteOptions(root)...)
	a, b := sites[0], sites[1]
	mv, err := NewLiveMove(ctx, a, b, LiveMoveOptions{RTT: DefaultMoveRTT, AbortAfter: move.StepJoinDestination, Out: testWriter{t}, ReadyzExclude: testReadyzExclude})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(mv.CreateSource(ctx)).To(Succeed())
	wiper := wipeStatusAfterEveryStep(ctx, t, mv.Key(), a, b)
	run, err := mv.Run(ctx)
	wipes := wiper.stop()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(run.Aborted).To(BeTrue(), "the move was aborted")
	t.Logf("the move and its abort took %s", run.MoveTook.Round(100*time.Millisecond))
	t.Logf("status.membership was dropped %d times: %v", len(wipes), wipes)
	var abortRemovals []wipe
	for _, w := range wipes {
		if w.step.Kind == v1alpha1.StepRemoveMember && memberOrdinal(w.step.Member) >= MoveReplicas {
			abortRemovals = append(abortRemovals, w)
		}
	}
	g.Expect(abortRemovals).NotTo(BeEmpty(), "status.membership was dropped after the abort removed a destination member")

	history := run.Membership
	expectTLSMembers(t, history)
	fewest, at, lasted := history.FewestVoters()
	t.Logf("the fewest voters: %d, from %s for %s", fewest, at.Format(time.RFC3339Nano), lasted)
	g.Expect(fewest).To(BeNumerically(">=", MoveReplicas), "no voter was lost to a dropped status")
	expectOneCluster(g, history)
	g.Expect(history.Last()).To(ConsistOf(
		HaveField("Name", "etcd-main-0"), HaveField("Name", "etcd-main-1"), HaveField("Name", "etcd-main-2")),
		"the source's three members, and only they, after the abort")
	for i := range MoveReplicas {
		runs, err := a.PodRuns(MoveNamespace, fmt.Sprintf("%s-%d", MoveEtcdName, i))
		g.Expect(err).NotTo(HaveOccurred())
		t.Logf("%s's pod %s-%d ran %d time(s)", a.opts.ClusterIdentity, MoveEtcdName, i, runs)
	}

	g.Expect(run.OwnLost.Lost).To(BeEmpty(), "no acknowledged write lost")
	g.Expect(run.Own.Linearizable).To(BeTrue(), "the own client's history is linearizable: %s", run.Own.LinearizabilityResult)
	expectKubeAPIServersSawNothing(t, run.API, a)
	g.Expect(run.EtcdCrashes).To(BeEmpty(), "etcd panics or fatal exits")
}
