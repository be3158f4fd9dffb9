package site

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A report lasts while a site's controller says the same thing, its
// growing durations aside; another message, another reason or no
// Progressing condition ends it, and each site's reports are apart.
func TestProgressRecorderMergesOneReport(t *testing.T) {
	g := NewWithT(t)
	r := &ProgressRecorder{open: map[string]int{}}
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	progressing := func(reason, msg string) *metav1.Condition {
		return &metav1.Condition{Type: "MembershipProgressing", Status: metav1.ConditionTrue, Reason: reason, Message: msg}
	}
	quorum := func(d string) *metav1.Condition {
		return progressing("WaitingForQuorum", "WaitingForQuorum: removing etcd-main-1 would leave 2 of 3 voters healthy and connected for "+d+", below a quorum of 2")
	}

	r.see("site-b", quorum("1.2s"), at(0))
	r.see("site-a", progressing("WaitingForVoters", "the destination holds the majority"), at(100))
	r.see("site-b", quorum("3.96s"), at(2000))
	r.see("site-b", quorum("4.5s"), at(2600))
	r.see("site-b", progressing("WaitingForLearner", "WaitingForLearner: etcd-main-5 is catching up with the leader"), at(3000))
	r.see("site-b", &metav1.Condition{Type: "MembershipProgressing", Status: metav1.ConditionFalse, Reason: "Converged"}, at(4000))
	r.see("site-a", nil, at(4200))

	g.Expect(r.reports).To(Equal([]Progress{
		{Site: "site-b", Reason: "WaitingForQuorum", Message: quorum("1.2s").Message, Start: at(0), End: at(3000)},
		{Site: "site-a", Reason: "WaitingForVoters", Message: "the destination holds the majority", Start: at(100), End: at(4200)},
		{Site: "site-b", Reason: "WaitingForLearner", Message: "WaitingForLearner: etcd-main-5 is catching up with the leader", Start: at(3000), End: at(4000)},
	}))
	g.Expect(r.open).To(BeEmpty())
}

func TestSameProgress(t *testing.T) {
	g := NewWithT(t)
	g.Expect(sameProgress("connected for 185.998592ms of 5s", "connected for 4.2s of 5s")).To(BeTrue())
	g.Expect(sameProgress("connected for 1m0s", "connected for 59.1s")).To(BeTrue())
	g.Expect(sameProgress("etcd-main-4 is catching up", "etcd-main-5 is catching up")).To(BeFalse(), "another member is another wait")
}
