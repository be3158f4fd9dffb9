package membership

import (
	"testing"

	. "github.com/onsi/gomega"

	"github.com/druid-stretch/druid-stretch/internal/planner"
	"github.com/druid-stretch/druid-stretch/internal/sidecarcluster"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// TestNoPodWaitsBeforeTheStatefulSetExists shows the pod gate before druid
// created the Etcd's StatefulSet: where this process's webhook interposes
// the sidecar, a member the cluster lacks waits (WaitingForPod) and one it
// has is left alone; without the webhook nothing is held.
func TestNoPodWaitsBeforeTheStatefulSetExists(t *testing.T) {
	obs := &sidecarcluster.Observation{List: &sidecar.MemberList{Members: []sidecar.Member{
		{ID: "a0", Name: "etcd-main-0", PeerURLs: []string{"https://etcd-main-0.a.example:2380"}},
	}}}
	target := func() sidecarcluster.Target {
		return sidecarcluster.Target{Add: []planner.Want{
			{Name: "etcd-main-0", PeerURLs: []string{"https://etcd-main-0.a.example:2380"}},
			{Name: "etcd-main-3", PeerURLs: []string{"https://etcd-main-3.b.example:2380"}},
		}}
	}
	for _, tc := range []struct {
		name    string
		webhook bool
		want    []string
	}{
		{"the webhook interposes the sidecar", true, []string{"", "the Etcd's StatefulSet does not exist yet (druid creates it)"}},
		{"no webhook in this process", false, []string{"", ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			r := &Reconciler{opts: Options{PodsStartThroughSidecar: tc.webhook}}
			tg := target()
			g.Expect(r.notePodsWaiting(t.Context(), nil, &scope{}, obs, &tg, nil)).To(Succeed())
			g.Expect([]string{tg.Add[0].PodNotWaiting, tg.Add[1].PodNotWaiting}).To(Equal(tc.want))
		})
	}
}
