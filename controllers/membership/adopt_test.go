package membership

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// TestAdoptRecordedStep shows which step record of an earlier process of
// the controller replaces the lastStep it left in status: one that status
// does not report yet, and never the report of the same attempt.
func TestAdoptRecordedStep(t *testing.T) {
	started := time.Date(2026, 12, 2, 6, 9, 25, 0, time.UTC) // this process
	refusedAt := started.Add(-19 * time.Second)
	recordedAt := started.Add(-2 * time.Second)
	refused := &v1alpha1.MembershipStep{Kind: v1alpha1.StepRemoveMember, Member: "etcd-main-1", MemberID: "e956",
		Time: metav1.NewTime(refusedAt), Outcome: v1alpha1.StepFailed, Reason: "QuorumAtRisk", Message: "Remove etcd-main-1: refused"}
	reported := &v1alpha1.MembershipStep{Kind: v1alpha1.StepRemoveMember, Member: "etcd-main-1", MemberID: "e956",
		Time: metav1.NewTime(recordedAt.Add(-time.Second)), Outcome: v1alpha1.StepSucceeded, Message: "Remove etcd-main-1: departing"}
	removal := func(state sidecar.StepState, at time.Time) *sidecar.StepRecord {
		return &sidecar.StepRecord{Kind: sidecar.StepRemove, Target: "etcd-main-1", Holder: "cluster-b", Token: "old",
			State: state, Revision: 42, Time: at.Format(time.RFC3339Nano)}
	}
	for _, tc := range []struct {
		name    string
		last    *v1alpha1.MembershipStep
		rec     *sidecar.StepRecord
		adopted bool
	}{
		// The case a killed controller left: its removal was refused by the
		// sidecar's quorum check (no record), a later attempt went through,
		// and the process died before it reported that.
		{"a refusal, then the removal that went through", refused, removal(sidecar.StepSucceeded, recordedAt), true},
		{"the removal reported already", reported, removal(sidecar.StepSucceeded, recordedAt), false},
		{"a refusal after the record", refused, removal(sidecar.StepSucceeded, refusedAt.Add(-time.Second)), false},
		{"a failed record of a reported failure", refused, removal(sidecar.StepFailed, recordedAt), false},
		{"nothing reported", nil, removal(sidecar.StepSucceeded, recordedAt), true},
		{"another step reported", &v1alpha1.MembershipStep{Kind: v1alpha1.StepPromoteLearner, Member: "etcd-main-4",
			Time: metav1.NewTime(refusedAt), Outcome: v1alpha1.StepSucceeded}, removal(sidecar.StepSucceeded, recordedAt), true},
		{"this process's own record", refused, func() *sidecar.StepRecord {
			r := removal(sidecar.StepSucceeded, recordedAt)
			r.Token = "new"
			return r
		}(), false},
		{"a record still in flight", refused, removal(sidecar.StepInFlight, recordedAt), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			st := &v1alpha1.MembershipStatus{LastStep: tc.last}
			s := &scope{st: st, now: started.Add(time.Second)}
			s.adoptRecordedStep(tc.rec, "cluster-b", "new", started)
			if !tc.adopted {
				g.Expect(st.LastStep).To(Equal(tc.last), "lastStep unchanged")
				return
			}
			g.Expect(st.LastStep).NotTo(BeNil())
			g.Expect(st.LastStep.Kind).To(Equal(v1alpha1.StepRemoveMember))
			g.Expect(st.LastStep.Member).To(Equal("etcd-main-1"))
			g.Expect(st.LastStep.Outcome).To(Equal(v1alpha1.StepSucceeded))
			g.Expect(st.LastStep.Time.Time).To(BeTemporally("==", recordedAt))
			g.Expect(st.LastStep.Message).To(ContainSubstring("sent by an earlier process"))
		})
	}
}
