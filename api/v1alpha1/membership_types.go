package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MembershipStatus is the etcd membership as the controller last observed it,
// and the state it keeps so that a controller that crashes mid-step resumes
// correctly: every reconcile plans anew from the observed members, so there is
// no step pointer here, only facts about the members.
type MembershipStatus struct {
	// ObservedGeneration is the generation of the spec the controller last
	// planned from: the Etcd's metadata.generation plus its
	// EtcdMembership's, which grows whenever either spec changes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Phase summarizes the membership.
	// +optional
	Phase MembershipPhase `json:"phase,omitempty"`

	// ObservedTime is when the members below were observed.
	// +optional
	ObservedTime *metav1.Time `json:"observedTime,omitempty"`

	// ObservedFingerprint is the fingerprint of the observed membership
	// (member IDs and learner flags) that the sidecar checks every change
	// against.
	// +optional
	ObservedFingerprint string `json:"observedFingerprint,omitempty"`

	// ClusterID is etcd's cluster ID, in hex.
	// +optional
	ClusterID string `json:"clusterID,omitempty"`

	// Members are the members of the etcd cluster as etcd reported them.
	// +optional
	// +listType=map
	// +listMapKey=id
	Members []ObservedMember `json:"members,omitempty"`

	// Learners is the catch-up progress of each learner: a learner is
	// promoted only when caught up and connected long enough, and removed
	// again when it stops advancing for too long.
	// +optional
	// +listType=map
	// +listMapKey=id
	Learners []LearnerProgress `json:"learners,omitempty"`

	// RetiredMembers are the names of members this controller removed from
	// the etcd cluster. A retired name never joins again: a member comes back
	// only under a new name (for local members, a new ordinal range).
	// +optional
	// +listType=set
	RetiredMembers []string `json:"retiredMembers,omitempty"`

	// LastStep is the last membership change the controller executed.
	// +optional
	LastStep *MembershipStep `json:"lastStep,omitempty"`

	// Conditions are MembershipConverged, MembershipProgressing and
	// MembershipDegraded.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// MembershipPhase summarizes the membership of an etcd cluster.
// +kubebuilder:validation:Enum=Pending;Converged;Reconfiguring;Blocked
type MembershipPhase string

const (
	// MembershipPhasePending means the membership has not been observed yet.
	MembershipPhasePending MembershipPhase = "Pending"
	// MembershipPhaseConverged means the members are the desired ones: no
	// step is needed.
	MembershipPhaseConverged MembershipPhase = "Converged"
	// MembershipPhaseReconfiguring means the controller is taking steps
	// towards the desired members.
	MembershipPhaseReconfiguring MembershipPhase = "Reconfiguring"
	// MembershipPhaseBlocked means a step is needed but cannot be taken
	// safely now; the conditions say why.
	MembershipPhaseBlocked MembershipPhase = "Blocked"
)

// ObservedMember is one member of the etcd cluster.
type ObservedMember struct {
	// ID is etcd's member ID, in hex as etcdctl prints it.
	// +required
	ID string `json:"id"`
	// Name is the member's name; empty for a member that was added but has
	// not started yet.
	// +optional
	Name string `json:"name,omitempty"`
	// PeerURLs are the member's peer URLs.
	// +optional
	// +listType=atomic
	PeerURLs []string `json:"peerURLs,omitempty"`
	// Role is Learner, Voter or Leader.
	// +optional
	Role MemberRole `json:"role,omitempty"`
	// Origin says who manages the member: Local (this Etcd's ordinal range),
	// External (listed in spec.externalMembers) or Unmanaged (neither; never
	// touched).
	// +optional
	Origin MemberOrigin `json:"origin,omitempty"`
	// Healthy is true when the member answered its health check.
	// +optional
	Healthy bool `json:"healthy"`
	// CaughtUp is true when the member's log is close enough to the leader's
	// to vote; always true for voters that are healthy.
	// +optional
	CaughtUp bool `json:"caughtUp"`
}

// MemberRole is a member's role in raft.
// +kubebuilder:validation:Enum=Learner;Voter;Leader
type MemberRole string

const (
	// MemberRoleLearner is a non-voting member catching up with the log.
	MemberRoleLearner MemberRole = "Learner"
	// MemberRoleVoter is a voting member that is not the leader.
	MemberRoleVoter MemberRole = "Voter"
	// MemberRoleLeader is the voting member that leads.
	MemberRoleLeader MemberRole = "Leader"
)

// MemberOrigin says who manages a member.
// +kubebuilder:validation:Enum=Local;External;Unmanaged
type MemberOrigin string

const (
	// MemberOriginLocal is a member of this Etcd's own ordinal range.
	MemberOriginLocal MemberOrigin = "Local"
	// MemberOriginExternal is a member listed in spec.externalMembers.
	MemberOriginExternal MemberOrigin = "External"
	// MemberOriginUnmanaged is a member nobody told the controller about; it
	// is reported and never touched.
	MemberOriginUnmanaged MemberOrigin = "Unmanaged"
)

// LearnerProgress is the catch-up progress of one learner.
type LearnerProgress struct {
	// ID is the learner's etcd member ID, in hex.
	// +required
	ID string `json:"id"`
	// Name is the learner's member name.
	// +optional
	Name string `json:"name,omitempty"`
	// FirstObservedTime is when the controller first saw the learner
	// started; a learner is promoted only after it was connected for a
	// while (etcd's strict reconfiguration check counts connected members).
	// +optional
	FirstObservedTime *metav1.Time `json:"firstObservedTime,omitempty"`
	// RaftIndex is the highest raft index the learner was seen to have.
	// +optional
	RaftIndex int64 `json:"raftIndex,omitempty"`
	// LastAdvanceTime is when RaftIndex last grew; a learner that stops
	// advancing for too long is removed again.
	// +optional
	LastAdvanceTime *metav1.Time `json:"lastAdvanceTime,omitempty"`
}

// MembershipStep is one membership change the controller executed.
type MembershipStep struct {
	// Kind is the change.
	// +required
	Kind StepKind `json:"kind"`
	// Member is the name of the member the step acted on.
	// +optional
	Member string `json:"member,omitempty"`
	// MemberID is that member's etcd ID, in hex, when known.
	// +optional
	MemberID string `json:"memberID,omitempty"`
	// Time is when the step was executed.
	// +required
	Time metav1.Time `json:"time"`
	// Outcome is Succeeded or Failed.
	// +required
	Outcome StepOutcome `json:"outcome"`
	// Reason is the machine-readable reason of a failed step, as the sidecar
	// answered it (for example QuorumAtRisk or MembershipChanged).
	// +optional
	Reason string `json:"reason,omitempty"`
	// Message is a human-readable description of the outcome.
	// +optional
	Message string `json:"message,omitempty"`
}

// StepKind is a kind of membership change.
// +kubebuilder:validation:Enum=AddLearner;PromoteLearner;MoveLeader;RemoveMember
type StepKind string

const (
	// StepAddLearner adds a member as a non-voting learner.
	StepAddLearner StepKind = "AddLearner"
	// StepPromoteLearner makes a caught-up learner a voter.
	StepPromoteLearner StepKind = "PromoteLearner"
	// StepMoveLeader moves leadership to another voter.
	StepMoveLeader StepKind = "MoveLeader"
	// StepRemoveMember removes a member from the etcd cluster.
	StepRemoveMember StepKind = "RemoveMember"
)

// StepOutcome is how a step ended.
// +kubebuilder:validation:Enum=Succeeded;Failed
type StepOutcome string

const (
	// StepSucceeded means etcd applied the change.
	StepSucceeded StepOutcome = "Succeeded"
	// StepFailed means the change was refused or failed; it changed nothing
	// or its effect is observed on the next reconcile.
	StepFailed StepOutcome = "Failed"
)

// Condition types of status.membership.conditions.
const (
	// ConditionMembershipConverged is True when etcd's members are the
	// desired ones.
	ConditionMembershipConverged = "MembershipConverged"
	// ConditionMembershipProgressing is True while the controller takes
	// steps towards the desired members.
	ConditionMembershipProgressing = "MembershipProgressing"
	// ConditionMembershipDegraded is True when the controller cannot make
	// progress (a stalled learner, a failing step, an unreachable cluster).
	ConditionMembershipDegraded = "MembershipDegraded"
)

// Condition reasons of status.membership.conditions.
const (
	// ReasonConverged means the members are the desired ones.
	ReasonConverged = "Converged"
	// ReasonScaledToZero: replicas 0 and no external member (a hibernated
	// Etcd, or the source after a live move), so no pod runs and nothing is
	// observed or changed; etcd's membership is left as it was.
	ReasonScaledToZero = "ScaledToZero"
	// ReasonAddingLearner means a member is being added as a learner.
	ReasonAddingLearner = "AddingLearner"
	// ReasonWaitingForLearner means a learner is catching up or has not been
	// connected long enough to be promoted.
	ReasonWaitingForLearner = "WaitingForLearner"
	// ReasonPromoting means a learner is being promoted to a voter.
	ReasonPromoting = "Promoting"
	// ReasonMovingLeader means leadership is being moved before a removal or at
	// the tie of a move.
	ReasonMovingLeader = "MovingLeader"
	// ReasonRemovingMember means a member is being removed.
	ReasonRemovingMember = "RemovingMember"
	// ReasonWaitingForHealthyCluster means the next step waits until every voter
	// is healthy again (one change in flight at a time).
	ReasonWaitingForHealthyCluster = "WaitingForHealthyCluster"
	// ReasonWaitingForMemberStart means the next step waits until a voter
	// serves clients: a learner promoted before etcd applied its publish
	// (it runs and votes, but answers no client yet), or a member whose
	// etcd is starting. It comes within seconds, so the controller polls
	// again at its progress interval; a voter connected for a minute
	// without serving clients is reported as WaitingForHealthyCluster.
	ReasonWaitingForMemberStart = "WaitingForMemberStart"
	// ReasonWaitingForPod means a member to add waits until its pod runs
	// (its sidecar answers), where the pods start their members only once
	// admitted: a learner added before could not start, and would hold a
	// learner slot and the next learner's start meanwhile. It comes by
	// itself once the pod runs, so the controller polls again at its
	// progress interval.
	ReasonWaitingForPod = "WaitingForPod"
	// ReasonWaitingForDownVoter means a departing voter is down and its
	// removal would leave fewer voters than the target, with no learner
	// ready to be promoted first: the controller waits for it (a pod being
	// recreated comes back) for the planner's DownVoterGrace, then removes
	// it. The Etcd is degraded meanwhile: one of its voters is down.
	ReasonWaitingForDownVoter = "WaitingForDownVoter"
	// ReasonWaitingForVoters means the next removal waits until voters
	// promoted moments ago have been connected for 5 s, which etcd's
	// strict reconfiguration check counts before a removal. It comes by
	// itself, and the controller polls again once the rest has passed.
	ReasonWaitingForVoters = "WaitingForVoters"
	// ReasonWaitingForLock means another controller holds the cluster's
	// membership lock.
	ReasonWaitingForLock = "WaitingForLock"
	// ReasonLearnerStalled means a learner made no progress for too long and is
	// removed again.
	ReasonLearnerStalled = "LearnerStalled"
	// ReasonStepFailed means the last step keeps failing; the message has the
	// sidecar's reason.
	ReasonStepFailed = "StepFailed"
	// ReasonQuorumAtRisk means the next removal would leave too few healthy
	// voters, so it waits.
	ReasonQuorumAtRisk = "QuorumAtRisk"
	// ReasonUnmanagedMembers means etcd has members that are neither local nor
	// external; they are left alone.
	ReasonUnmanagedMembers = "UnmanagedMembers"
	// ReasonRetiredMemberListed means a desired member carries the name of a
	// retired member and is not added again.
	ReasonRetiredMemberListed = "RetiredMemberListed"
	// ReasonClusterUnreachable means no sidecar of the cluster answered.
	ReasonClusterUnreachable = "ClusterUnreachable"
	// ReasonBootstrapping means a new Etcd's pods, all without data, were
	// admitted to start a new etcd cluster (no external member, no member
	// ever observed).
	ReasonBootstrapping = "Bootstrapping"
)
