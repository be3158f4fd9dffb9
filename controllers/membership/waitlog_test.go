package membership

import (
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/types"

	"github.com/druid-stretch/druid-stretch/internal/planner"
	"github.com/druid-stretch/druid-stretch/internal/sidecarcluster"
)

// TestLogWaitOncePerCause shows that a wait is logged when it begins and when
// its cause changes, not on every poll whose figures moved on.
func TestLogWaitOncePerCause(t *testing.T) {
	g := NewWithT(t)
	var lines []string
	ctx := logr.NewContext(t.Context(), funcr.New(func(_, args string) { lines = append(lines, args) }, funcr.Options{}))
	r := &Reconciler{waiting: map[types.NamespacedName]string{}}
	key := types.NamespacedName{Namespace: "shoot--p--s", Name: "etcd-main"}
	members := []planner.Member{
		{ID: "a0", Name: "etcd-main-0", Side: "external", Leader: true, Healthy: true, HealthyFor: time.Minute},
		{ID: "b4", Name: "etcd-main-4", Side: "local", Learner: true, Unstarted: true, ConnectedFor: 2 * time.Second, Replicating: true},
	}
	wait := func(reason string) sidecarcluster.Plan {
		return sidecarcluster.Plan{Step: planner.Step{Kind: planner.Wait, Rule: planner.RuleReadyLearner, Reason: reason}, Input: planner.Observed{Members: members}}
	}

	r.logWait(ctx, key, wait("WaitingForLearner: etcd-main-4 healthy or connected for 2.6439629s of 5s"))
	r.logWait(ctx, key, wait("WaitingForLearner: etcd-main-4 healthy or connected for 3.1s of 5s"))
	g.Expect(lines).To(HaveLen(1), "the same wait with later figures")
	g.Expect(lines[0]).To(ContainSubstring("connected for 2.6439629s of 5s"))
	g.Expect(lines[0]).To(ContainSubstring("etcd-main-0 side external voter leader healthy 1m0s; etcd-main-4 side local learner unstarted connected 2s replicating"), "the members as the planner saw them")

	r.logWait(ctx, key, wait("WaitingForLearner: etcd-main-5 is not answering yet"))
	g.Expect(lines).To(HaveLen(2), "another cause")

	r.logWait(ctx, key, sidecarcluster.Plan{Step: planner.Step{Kind: planner.Promote, Member: "etcd-main-4"}})
	r.logWait(ctx, key, wait("WaitingForLearner: etcd-main-5 is not answering yet"))
	g.Expect(lines).To(HaveLen(3), "a step in between: the wait after it is logged again")

	other := types.NamespacedName{Namespace: "shoot--p--t", Name: "etcd-main"}
	r.logWait(ctx, other, wait("WaitingForLearner: etcd-main-5 is not answering yet"))
	g.Expect(lines).To(HaveLen(4), "each Etcd has its own")
}
