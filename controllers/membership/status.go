package membership

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/members"
	"github.com/druid-stretch/druid-stretch/internal/planner"
	"github.com/druid-stretch/druid-stretch/internal/sidecarcluster"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// Condition reasons of this controller that the API has no constant for.
const (
	// reasonInvalidSpec: the Go validation refused the spec.
	reasonInvalidSpec = "InvalidSpec"
	// reasonResolverFailed: a local member's URLs could not be resolved.
	reasonResolverFailed = "ResolverFailed"
	// reasonRetirementRecords: the retirement records could not be updated.
	reasonRetirementRecords = "RetirementRecords"
	// reasonOutcomeUncertain marks lastStep while its outcome is unknown;
	// it is also the planner Wait word for the time being.
	reasonOutcomeUncertain = "OutcomeUncertain"
	// reasonNotApplied marks a once uncertain lastStep that did not happen.
	reasonNotApplied = "NotApplied"
	// reasonRecordedFailure marks a lastStep taken from the sidecar's step
	// record of a call that failed.
	reasonRecordedFailure = "RecordedFailure"
	// reasonNotDegraded is MembershipDegraded's reason when it is False.
	reasonNotDegraded = "NotDegraded"
	// reasonLearnerLimit is the event of etcd refusing a learner for its
	// --max-learners, below the controller's.
	reasonLearnerLimit = "LearnerLimit"
	// reasonExtensionLost is the Warning event of an Etcd whose
	// druid-stretch fields are gone while its StatefulSet runs the sidecar.
	reasonExtensionLost = "ExtensionLost"
)

// scope is one reconcile of one Etcd: the object as read (the View of the
// Etcd and its EtcdMembership), the status being written, and the verdict
// that becomes the conditions.
type scope struct {
	etcd   *v1alpha1.Etcd
	st     *v1alpha1.MembershipStatus
	holder string
	now    time.Time

	phase           v1alpha1.MembershipPhase
	reason, message string
	degradedReason  string
	degradedMessage string
	unmanaged       []string
	// sts is e's StatefulSet (nil if none), and running the ordinals it
	// runs: the pods a status that someone else dropped must not stop
	// (members.KeptWindow).
	sts     *appsv1.StatefulSet
	running members.Ordinals
	// sawMembers: this reconcile observed etcd's member list, so the status
	// it writes says which running pods still hold members.
	sawMembers bool
	// died: the reconcile ends as if its process died (Options.AfterStepSent);
	// nothing is written.
	died bool
	// invalid are errors in the pair that the View's own validation cannot
	// see: druid's bootstrap fields against the EtcdMembership.
	invalid field.ErrorList
}

func newScope(e *v1alpha1.Etcd, holder string) *scope {
	s := &scope{etcd: e, holder: holder, now: time.Now()}
	if e.Status.Membership == nil {
		e.Status.Membership = &v1alpha1.MembershipStatus{Phase: v1alpha1.MembershipPhasePending}
	}
	s.st = e.Status.Membership
	return s
}

// podWindow is the window the StatefulSet is to run once the status is
// written: from etcd's member list when this reconcile observed it, else
// every pod that runs stays.
func (s *scope) podWindow() members.Ordinals {
	if s.sawMembers {
		return members.PodWindow(s.etcd)
	}
	return members.KeptWindow(s.etcd, s.running)
}

// observed writes what the sidecar reported.
func (s *scope) observed(obs *sidecarcluster.Observation, t sidecarcluster.Target, progress *sidecarcluster.Progress, in planner.Observed) {
	s.sawMembers = true
	st := s.st
	at := metav1.NewTime(obs.At)
	st.ObservedGeneration = s.etcd.Generation
	st.ObservedTime = &at
	st.ObservedFingerprint = obs.List.Fingerprint
	st.ClusterID = obs.List.ClusterID
	// A new slice, not st.Members[:0]: origin reads the members as the
	// previous status listed them (which of them were this Etcd's own).
	observed := make([]v1alpha1.ObservedMember, 0, len(obs.List.Members))
	for _, m := range obs.List.Members {
		role := v1alpha1.MemberRoleVoter
		switch {
		case m.IsLearner:
			role = v1alpha1.MemberRoleLearner
		case m.IsLeader:
			role = v1alpha1.MemberRoleLeader
		}
		om := v1alpha1.ObservedMember{
			ID:       m.ID,
			Name:     m.Name,
			PeerURLs: slices.Clone(m.PeerURLs),
			Role:     role,
			Origin:   origin(s.etcd, s.running, t, m.Name, m.PeerURLs),
			Healthy:  m.Healthy,
			CaughtUp: caughtUp(in, m.ID),
		}
		if om.Origin == v1alpha1.MemberOriginUnmanaged {
			s.unmanaged = append(s.unmanaged, fmt.Sprintf("%s (%s)", orUnnamed(m.Name), m.ID))
		}
		observed = append(observed, om)
	}
	st.Members = observed
	sort.Slice(st.Members, func(i, j int) bool {
		a, b := st.Members[i], st.Members[j]
		if a.Name != b.Name {
			return a.Name < b.Name
		}
		return a.ID < b.ID
	})
	st.Learners = nil
	for _, l := range progress.Learners() {
		first, last := metav1.NewTime(l.FirstSeen), metav1.NewTime(l.LastAdvance)
		st.Learners = append(st.Learners, v1alpha1.LearnerProgress{
			ID: l.ID, Name: l.Name, FirstObservedTime: &first, RaftIndex: int64(l.RaftIndex), LastAdvanceTime: &last,
		})
	}
	st.RetiredMembers = nil
	for _, r := range obs.List.Retired {
		if r.By == s.holder {
			st.RetiredMembers = append(st.RetiredMembers, r.Name)
		}
	}
}

func caughtUp(in planner.Observed, id string) bool {
	for _, m := range in.Members {
		if m.ID == id {
			return m.CaughtUp
		}
	}
	return false
}

func orUnnamed(name string) string {
	if name == "" {
		return "unstarted member"
	}
	return name
}

// settle closes an uncertain lastStep once an observation shows whether it
// happened.
func (s *scope) settle(applied bool) {
	last := s.st.LastStep
	if applied {
		last.Outcome, last.Reason = v1alpha1.StepSucceeded, ""
		last.Message += "; a later observation showed it applied"
		return
	}
	last.Reason = reasonNotApplied
	last.Message += "; a later observation showed it did not happen"
}

func (s *scope) converged(msg string) {
	s.phase, s.reason, s.message = v1alpha1.MembershipPhaseConverged, v1alpha1.ReasonConverged, msg
}

// scaledToZero: replicas 0 and no move, so nothing is observed or changed.
func (s *scope) scaledToZero() {
	s.st.ObservedGeneration = s.etcd.Generation
	s.phase, s.reason = v1alpha1.MembershipPhaseConverged, v1alpha1.ReasonScaledToZero
	s.message = "spec.replicas is 0 and no external member is listed: no pod runs, and etcd's membership is left as it is " +
		"(a hibernated Etcd's members come back with their data when the replicas do; after a live move this Etcd has no member left). " +
		"status.membership.members is the last observation"
}

func (s *scope) reconfiguring(reason, msg string) {
	s.phase, s.reason, s.message = v1alpha1.MembershipPhaseReconfiguring, reason, msg
}

// blocked: a step is needed but cannot be taken now; that degrades.
func (s *scope) blocked(reason, msg string) {
	s.phase, s.reason, s.message = v1alpha1.MembershipPhaseBlocked, reason, msg
	s.degraded(reason, msg)
}

func (s *scope) degraded(reason, msg string) {
	s.degradedReason, s.degradedMessage = reason, msg
}

// unreachable reports that no sidecar answered, naming each and its cause.
func (s *scope) unreachable(err error) {
	var u *sidecarcluster.UnreachableError
	msg := err.Error()
	if errors.As(err, &u) {
		msg = u.Error()
	}
	s.blocked(v1alpha1.ReasonClusterUnreachable, msg)
	if len(s.st.Members) == 0 {
		s.phase = v1alpha1.MembershipPhasePending
	}
}

// stepDone records a step the sidecar carried out.
func (s *scope) stepDone(step planner.Step, res sidecarcluster.Result, stalled bool) {
	msg := fmt.Sprintf("%s %s: %s", step.Kind, stepLabel(step), step.Reason)
	if !res.Changed {
		msg += " (already in place)"
	}
	last := &v1alpha1.MembershipStep{Kind: apiKind(step.Kind), Member: step.Member, MemberID: step.ID,
		Time: metav1.NewTime(res.Start), Outcome: v1alpha1.StepSucceeded, Message: msg}
	if stalled {
		last.Reason = v1alpha1.ReasonLearnerStalled
		s.degraded(v1alpha1.ReasonLearnerStalled, msg)
	}
	s.st.LastStep = last
	s.reconfiguring(progressReason(step.Kind), msg)
}

// stepRefused records a step that was refused or not sent; nothing
// changed. A refusal that will not pass by itself, or a sidecar that failed,
// degrades.
func (s *scope) stepRefused(step planner.Step, res sidecarcluster.Result, refused bool) {
	msg := stepError(step, res)
	if pendingStep(s.st.LastStep, nil) == nil {
		s.st.LastStep = &v1alpha1.MembershipStep{Kind: apiKind(step.Kind), Member: step.Member, MemberID: step.ID,
			Time: metav1.NewTime(res.Start), Outcome: v1alpha1.StepFailed, Reason: res.Reason, Message: msg}
	}
	switch {
	case refused:
		s.blocked(v1alpha1.ReasonStepFailed, msg)
	case res.SidecarFailed:
		s.reconfiguring(progressReason(step.Kind), msg)
		s.degraded(v1alpha1.ReasonStepFailed, msg)
	default:
		s.reconfiguring(retryReason(step.Kind, res.Reason), msg)
	}
}

// stepError names the step, its member, the sidecar and the cause once.
func stepError(step planner.Step, res sidecarcluster.Result) string {
	msg := res.Err.Error()
	if strings.HasPrefix(msg, string(step.Kind)+" ") {
		return msg
	}
	return fmt.Sprintf("%s %s through the sidecar of %s: %s", step.Kind, stepLabel(step), res.Via, msg)
}

// stepUncertain records a step whose outcome is unknown: lastStep keeps it
// until an observation settles it, and nothing else is done meanwhile.
func (s *scope) stepUncertain(step planner.Step, res sidecarcluster.Result, end time.Time) {
	msg := "outcome unknown: " + stepError(step, res)
	s.st.LastStep = &v1alpha1.MembershipStep{Kind: apiKind(step.Kind), Member: step.Member, MemberID: step.ID,
		Time: metav1.NewTime(end), Outcome: v1alpha1.StepFailed, Reason: reasonOutcomeUncertain, Message: msg}
	s.reconfiguring(progressReason(step.Kind), msg)
	s.degraded(v1alpha1.ReasonStepFailed, msg)
}

// finish turns the verdict into the three conditions.
func (s *scope) finish() {
	st, gen := s.st, s.etcd.Generation
	if s.phase == "" {
		return
	}
	st.Phase = s.phase
	set := func(typ string, status metav1.ConditionStatus, reason, msg string) {
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: typ, Status: status, Reason: reason, Message: msg, ObservedGeneration: gen})
	}
	switch s.phase {
	case v1alpha1.MembershipPhaseConverged:
		set(v1alpha1.ConditionMembershipConverged, metav1.ConditionTrue, s.reason, s.message)
		set(v1alpha1.ConditionMembershipProgressing, metav1.ConditionFalse, s.reason, s.message)
	case v1alpha1.MembershipPhaseReconfiguring:
		set(v1alpha1.ConditionMembershipConverged, metav1.ConditionFalse, s.reason, s.message)
		set(v1alpha1.ConditionMembershipProgressing, metav1.ConditionTrue, s.reason, s.message)
	default:
		set(v1alpha1.ConditionMembershipConverged, metav1.ConditionFalse, s.reason, s.message)
		set(v1alpha1.ConditionMembershipProgressing, metav1.ConditionFalse, s.reason, s.message)
	}
	last := st.LastStep
	switch {
	case s.degradedReason != "":
		set(v1alpha1.ConditionMembershipDegraded, metav1.ConditionTrue, s.degradedReason, s.degradedMessage)
	case last != nil && last.Reason == v1alpha1.ReasonLearnerStalled && !isVoter(st, last.Member):
		set(v1alpha1.ConditionMembershipDegraded, metav1.ConditionTrue, v1alpha1.ReasonLearnerStalled, last.Message)
	case len(s.unmanaged) > 0:
		set(v1alpha1.ConditionMembershipDegraded, metav1.ConditionTrue, v1alpha1.ReasonUnmanagedMembers,
			"etcd has members that are neither local nor listed in spec.externalMembers; they are left alone: "+strings.Join(s.unmanaged, ", "))
	default:
		set(v1alpha1.ConditionMembershipDegraded, metav1.ConditionFalse, reasonNotDegraded, "no failure")
	}
}

func isVoter(st *v1alpha1.MembershipStatus, name string) bool {
	return slices.Contains(st.Voters(), name)
}

// pendingStep is lastStep while its outcome is unknown. Its peer URLs (an
// added learner is recognised by them) come from the target.
func pendingStep(last *v1alpha1.MembershipStep, t *sidecarcluster.Target) *sidecarcluster.Pending {
	if last == nil || last.Reason != reasonOutcomeUncertain {
		return nil
	}
	p := &sidecarcluster.Pending{Step: planner.Step{Kind: plannerKind(last.Kind), Member: last.Member, ID: last.MemberID}, At: last.Time.Time}
	if t != nil {
		for _, w := range t.Own() {
			if w.Name == last.Member {
				p.Step.PeerURLs = w.PeerURLs
			}
		}
	}
	return p
}

func learnersFromStatus(ls []v1alpha1.LearnerProgress) []sidecarcluster.LearnerProgress {
	out := make([]sidecarcluster.LearnerProgress, 0, len(ls))
	for _, l := range ls {
		p := sidecarcluster.LearnerProgress{ID: l.ID, Name: l.Name, RaftIndex: uint64(max(l.RaftIndex, 0))}
		if l.FirstObservedTime != nil {
			p.FirstSeen = l.FirstObservedTime.Time
		}
		if l.LastAdvanceTime != nil {
			p.LastAdvance = l.LastAdvanceTime.Time
		}
		out = append(out, p)
	}
	return out
}

// adoptRecordedStep reports in status the change that an earlier process of
// this controller recorded in etcd (the sidecar's step record) and did not
// report itself: it was killed between sending the change and writing
// status. Only a lastStep older than this process (since) gives way, so a
// step this process reported is never replaced by an older record.
//
// A lastStep of the same kind and member is the record's own report when
// their outcomes agree. When they do not, lastStep is another attempt: a
// refusal the sidecar answered before it wrote any record (the quorum
// check of a removal), followed by an attempt that went through and whose
// sender died. The record is then the newer word, unless lastStep began
// after it was written.
func (s *scope) adoptRecordedStep(rec *sidecar.StepRecord, holder, token string, since time.Time) {
	if rec == nil || rec.Holder != holder || rec.Token == token || rec.State == sidecar.StepInFlight {
		return
	}
	last := s.st.LastStep
	if last != nil && !last.Time.Time.Before(since) {
		return
	}
	at, err := time.Parse(time.RFC3339Nano, rec.Time)
	if err != nil {
		at = s.now
	}
	kind := v1alpha1.StepKind(rec.Kind)
	if last != nil && last.Kind == kind && (last.Member == rec.Target || last.MemberID == rec.Target) {
		sameOutcome := (last.Outcome == v1alpha1.StepFailed) == (rec.State == sidecar.StepFailed)
		if sameOutcome || !at.After(last.Time.Time) {
			return
		}
	}
	step := &v1alpha1.MembershipStep{Kind: kind, Member: rec.Target, Time: metav1.NewTime(at), Outcome: v1alpha1.StepSucceeded,
		Message: fmt.Sprintf("%s %s: sent by an earlier process of this controller (token %s) and recorded at etcd revision %d; that process stopped before reporting it",
			rec.Kind, rec.Target, rec.Token, rec.Revision)}
	if rec.State == sidecar.StepFailed {
		step.Outcome, step.Reason = v1alpha1.StepFailed, reasonRecordedFailure
		step.Message += ": " + rec.Message
	}
	s.st.LastStep = step
}

func apiKind(k planner.StepKind) v1alpha1.StepKind {
	switch k {
	case planner.AddLearner:
		return v1alpha1.StepAddLearner
	case planner.Promote:
		return v1alpha1.StepPromoteLearner
	case planner.MoveLeader:
		return v1alpha1.StepMoveLeader
	}
	return v1alpha1.StepRemoveMember
}

func plannerKind(k v1alpha1.StepKind) planner.StepKind {
	switch k {
	case v1alpha1.StepAddLearner:
		return planner.AddLearner
	case v1alpha1.StepPromoteLearner:
		return planner.Promote
	case v1alpha1.StepMoveLeader:
		return planner.MoveLeader
	}
	return planner.Remove
}

// progressReason is the MembershipProgressing reason of a step kind.
func progressReason(k planner.StepKind) string {
	switch k {
	case planner.AddLearner:
		return v1alpha1.ReasonAddingLearner
	case planner.Promote:
		return v1alpha1.ReasonPromoting
	case planner.MoveLeader:
		return v1alpha1.ReasonMovingLeader
	}
	return v1alpha1.ReasonRemovingMember
}

// retryReason is the Progressing reason while a refusal passes.
func retryReason(k planner.StepKind, sidecarReason string) string {
	switch sidecarReason {
	case sidecar.ReasonLearnerNotReady:
		return v1alpha1.ReasonWaitingForLearner
	case sidecar.ReasonUnhealthyCluster:
		return v1alpha1.ReasonWaitingForHealthyCluster
	case sidecar.ReasonLockHeld, sidecar.ReasonLockNotHeld:
		return v1alpha1.ReasonWaitingForLock
	}
	return progressReason(k)
}

// conditionReasonPattern is the API server's rule for condition reasons.
var conditionReasonPattern = regexp.MustCompile(`^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`)

// conditionReason maps a planner Wait word onto a condition reason.
func conditionReason(word string) string {
	switch word {
	case "WaitingForQuorum":
		return v1alpha1.ReasonQuorumAtRisk
	case "RetiredMember":
		return v1alpha1.ReasonRetiredMemberListed
	}
	if !conditionReasonPattern.MatchString(word) {
		return "Waiting"
	}
	return word
}
