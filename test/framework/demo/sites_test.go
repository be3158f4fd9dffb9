package demo

import (
	"io"
	"os"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/druid-stretch/druid-stretch/test/framework/report"
	"github.com/druid-stretch/druid-stretch/test/site"
)

func TestTimelineMergesStepsAndAddsMembershipChangesCompactionsAndProgress(t *testing.T) {
	g := NewWithT(t)
	start := time.Date(2026, 11, 25, 20, 0, 0, 0, time.UTC)
	marks := []report.Step{
		{Name: "join-destination", AtSeconds: 6.5},
		{Name: "switch site-a -> site-b", AtSeconds: 115.4},
		{Name: "join-destination done", AtSeconds: 61.25},
		{Name: "retire-source", AtSeconds: 120.5},
		{Name: "finish done", AtSeconds: 240}, // no start seen: kept as it is
	}
	changes := []site.Transition{
		{At: start.Add(40 * time.Second), Change: "promote etcd-main-3"},
		{At: start.Add(7 * time.Second), Change: "add learner (unnamed)"},
	}
	jobs := []site.CompactionJob{
		{Site: "site-a", Created: start.Add(20 * time.Second), Ended: start.Add(32500 * time.Millisecond), Succeeded: true},
		{Site: "site-b", Created: start.Add(100 * time.Second)},
	}
	progress := []site.Progress{
		{Site: "site-b", Message: "WaitingForLearner: etcd-main-3 is catching up with the leader", Start: start.Add(8 * time.Second), End: start.Add(11 * time.Second)},
		{Site: "site-b", Message: "a report shorter than minProgress", Start: start.Add(12 * time.Second), End: start.Add(12200 * time.Millisecond)},
	}
	got := timeline(marks, start, changes, jobs, progress)
	g.Expect(got).To(Equal([]report.Step{
		{Name: "join-destination", AtSeconds: 6.5, DurationSeconds: 54.75},
		{Name: "etcd: add learner (unnamed)", AtSeconds: 7, At: start.Add(7 * time.Second)},
		{Name: "controller in site-b: WaitingForLearner: etcd-main-3 is catching up with the leader", AtSeconds: 8, At: start.Add(8 * time.Second), DurationSeconds: 3},
		{Name: "druid: compaction Job in site-a, completed", AtSeconds: 20, At: start.Add(20 * time.Second), DurationSeconds: 12.5},
		{Name: "etcd: promote etcd-main-3", AtSeconds: 40, At: start.Add(40 * time.Second)},
		{Name: "druid: compaction Job in site-b, not ended", AtSeconds: 100, At: start.Add(100 * time.Second)},
		{Name: "switch site-a -> site-b", AtSeconds: 115.4},
		{Name: "retire-source", AtSeconds: 120.5},
		{Name: "finish done", AtSeconds: 240},
	}), "a step without its end keeps no duration")
}

// TestMembershipPart: the membership part of a move runs from the first
// add the member list showed to the last removal, whatever else came
// between; without an add and a removal after it there is none.
func TestMembershipPart(t *testing.T) {
	g := NewWithT(t)
	start := time.Date(2026, 11, 30, 14, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return start.Add(time.Duration(s * float64(time.Second))) }
	add := site.MemberChange{Kind: site.ConfChangeAdd, Text: "add learner (unnamed)"}
	promote := site.MemberChange{Kind: site.ConfChangePromote, Text: "promote etcd-main-3"}
	remove := site.MemberChange{Kind: site.ConfChangeRemove, Text: "remove etcd-main-0"}
	move := []site.Transition{
		{At: at(3), Changes: []site.MemberChange{add}},
		{At: at(9.5), Changes: []site.MemberChange{promote}},
		{At: at(10), Changes: []site.MemberChange{add}},
		{At: at(14.25), Changes: []site.MemberChange{promote, remove}},
		{At: at(20), Changes: []site.MemberChange{remove}},
		{At: at(25), Changes: []site.MemberChange{promote}},
	}
	g.Expect(membershipPart(move)).To(Equal(17 * time.Second))
	g.Expect(membershipPart(move[:2])).To(BeZero(), "no removal yet")
	g.Expect(membershipPart([]site.Transition{{At: at(1), Changes: []site.MemberChange{remove}}, {At: at(2), Changes: []site.MemberChange{add}}})).To(BeZero(),
		"a removal before the first add is no move's part")
	g.Expect(membershipPart(nil)).To(BeZero())
}

func TestRunOnSitesRefusesANegativeRTTBeforeStartingAnything(t *testing.T) {
	g := NewWithT(t)
	dir := t.TempDir()
	_, err := RunOnSites(t.Context(), SiteOptions{RTT: -time.Second, Dir: dir, Out: io.Discard})
	g.Expect(err).To(MatchError(ContainSubstring("--rtt -1s: the round trip between the sites must be 0 or more")))
	g.Expect(os.ReadDir(dir)).To(BeEmpty(), "nothing was written: no binaries built, no site started")
}
