package sidecar

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"
)

// Reasons name why a call was refused. They are the "reason" field of every
// error answer and the outcome label of the request metrics, so a controller
// can branch on them and an operator can grep for them.
const (
	// ReasonOK is the outcome label of a successful call; it never appears
	// in an error answer.
	ReasonOK = "OK"
	// ReasonMalformedRequest: the body is not one JSON object of the
	// expected shape (bad JSON, an unknown field, trailing data).
	ReasonMalformedRequest = "MalformedRequest"
	// ReasonInvalidName: a member name or lock holder is empty or has
	// characters outside [A-Za-z0-9._-].
	ReasonInvalidName = "InvalidName"
	// ReasonInvalidURL: a peer URL does not parse or is not http(s)://host:port.
	ReasonInvalidURL = "InvalidURL"
	// ReasonInvalidArgument: a field has a value the sidecar does not
	// accept (a voter add, a lock TTL out of range, a missing header).
	ReasonInvalidArgument = "InvalidArgument"
	// ReasonUnauthorized: a mutating call came without a verified client
	// certificate.
	ReasonUnauthorized = "Unauthorized"
	// ReasonNotFound: no such endpoint.
	ReasonNotFound = "NotFound"
	// ReasonMemberNotFound: the named member is not in the cluster.
	ReasonMemberNotFound = "MemberNotFound"
	// ReasonTooManyLearners: etcd refuses another learner (its
	// --max-learners, 1 by default).
	ReasonTooManyLearners = "TooManyLearners"
	// ReasonPeerURLConflict: a requested peer URL belongs to another member.
	ReasonPeerURLConflict = "PeerURLConflict"
	// ReasonNameConflict: the requested name belongs to a member with other
	// peer URLs.
	ReasonNameConflict = "NameConflict"
	// ReasonLearnerNotReady: the learner is behind the leader or has not
	// been healthy long enough; retry after RetryAfter.
	ReasonLearnerNotReady = "LearnerNotReady"
	// ReasonQuorumAtRisk: after the change the healthy voters would be
	// fewer than a quorum of the voters.
	ReasonQuorumAtRisk = "QuorumAtRisk"
	// ReasonIsLeader: the member to remove leads the cluster; move
	// leadership first.
	ReasonIsLeader = "IsLeader"
	// ReasonNotVoter: leadership cannot move to a learner.
	ReasonNotVoter = "NotVoter"
	// ReasonMemberUnhealthy: the target member does not answer or is being
	// removed, so leadership cannot move to it.
	ReasonMemberUnhealthy = "MemberUnhealthy"
	// ReasonUnhealthyCluster: etcd refused the reconfiguration (its strict
	// reconfiguration check) or has no leader; retry after RetryAfter.
	ReasonUnhealthyCluster = "UnhealthyCluster"
	// ReasonMembershipChanged: the membership the caller planned from (its
	// fingerprint) is not etcd's current membership.
	ReasonMembershipChanged = "MembershipChanged"
	// ReasonLockHeld: the membership lock is held by another holder.
	ReasonLockHeld = "LockHeld"
	// ReasonLockNotHeld: the caller named itself as lock holder but holds no
	// lock (it expired or was never taken); acquire it again first.
	ReasonLockNotHeld = "LockNotHeld"
	// ReasonStaleToken: the caller's holder holds the lock, but under
	// another process's token: a newer process of the same holder took the
	// lock over, and this caller is fenced off.
	ReasonStaleToken = "StaleToken"
	// ReasonInvalidToken: a lock token is not one the controller makes
	// (see NewLockToken), or names a process started in the future.
	ReasonInvalidToken = "InvalidToken"
	// ReasonLockExpiring: the caller holds the lock, but its lease runs out
	// sooner than a change could finish; renew it first.
	ReasonLockExpiring = "LockExpiring"
	// ReasonChangeInFlight: another process's membership change is in
	// flight (its step record is open); retry once it ended.
	ReasonChangeInFlight = "ChangeInFlight"
	// ReasonNoSpace: etcd's NOSPACE alarm is raised (a member's backend
	// outgrew its --quota-backend-bytes), so etcd refuses the writes a
	// change needs (the lock, its record); retry once an operator has
	// compacted, defragmented and disarmed the alarm.
	ReasonNoSpace = "NoSpace"
	// ReasonEtcdUnavailable: etcd did not answer in time or failed in a way
	// that has no more specific reason.
	ReasonEtcdUnavailable = "EtcdUnavailable"
	// ReasonNotReady: the local etcd member does not answer (readyz).
	ReasonNotReady = "NotReady"
	// ReasonHoldInForce: a hold of the member's clients is in force
	// already; a hold is not renewed, so it must end first.
	ReasonHoldInForce = "HoldInForce"
	// ReasonNotDrained: a renewal of a drain the sidecar has ended (its
	// lease ran out, or its member leads): the gate stays open.
	ReasonNotDrained = "NotDrained"
)

// Headers a mutating call may carry.
const (
	// HeaderMembership carries the fingerprint of the membership a change
	// was planned from; the sidecar refuses the change when it differs.
	HeaderMembership = "X-Druid-Stretch-Membership"
	// HeaderLockHolder names the caller as membership lock holder; the
	// sidecar refuses the change unless that holder holds the lock.
	HeaderLockHolder = "X-Druid-Stretch-Lock-Holder"
	// HeaderLockToken carries the lock token of the caller's process (see
	// LockRequest.Token); with HeaderLockHolder it fences the change.
	HeaderLockToken = "X-Druid-Stretch-Lock-Token"
)

// MemberList is the answer of GET /v1/members: etcd's membership as seen
// through this sidecar, with each member's health as polled by it.
type MemberList struct {
	ClusterID   string   `json:"clusterID"`
	LeaderID    string   `json:"leaderID"`
	Fingerprint string   `json:"fingerprint"`
	Members     []Member `json:"members"`
	// TransportOf is the hex ID of the member whose raft transport the
	// members' ConnectedForSeconds describe: this sidecar's own. Empty
	// while the sidecar has not learned its member's ID or cannot read its
	// metrics (TransportError says why).
	TransportOf    string      `json:"transportOf,omitempty"`
	TransportError string      `json:"transportError,omitempty"`
	Lock           *LockStatus `json:"lock,omitempty"`
	// Step is the record of the latest membership change sent through any
	// sidecar of the cluster (fence.go); nil before the first.
	Step *StepRecord `json:"step,omitempty"`
	// Retired are the retirement records (PUT /v1/retired/{name}).
	Retired []RetiredMember `json:"retired"`
}

// Member is one etcd member. ID is etcd's member ID in hex, as etcdctl
// prints it. A learner that has not started yet has no name and no client
// URLs: match it by peer URL.
type Member struct {
	ID         string   `json:"id"`
	Name       string   `json:"name"`
	PeerURLs   []string `json:"peerURLs"`
	ClientURLs []string `json:"clientURLs"`
	IsLearner  bool     `json:"isLearner"`
	IsLeader   bool     `json:"isLeader"`
	Healthy    bool     `json:"healthy"`
	// Error says why the member is not healthy.
	Error string `json:"error,omitempty"`
	// Unanswered means the status poll got no answer at all (a dial
	// error, a timeout): unlike an answer with errors (an alarm such as
	// NOSPACE, no leader), it says nothing of the member's raft, which
	// ConnectedForSeconds may show running (a voter that published itself
	// moments ago, before its client port serves).
	Unanswered       bool   `json:"unanswered,omitempty"`
	RaftIndex        uint64 `json:"raftIndex"`
	RaftAppliedIndex uint64 `json:"raftAppliedIndex"`
	// BehindLeader is the leader's raft index minus this member's; for a
	// member that does not answer it is the leader's whole index.
	BehindLeader uint64 `json:"behindLeader"`
	// HealthyForSeconds is how long this sidecar has seen the member
	// healthy without interruption.
	HealthyForSeconds float64 `json:"healthyForSeconds"`
	// ConnectedForSeconds is how long the raft transport of this
	// sidecar's own member (MemberList.TransportOf) has had an active
	// connection to the member, as its etcd_network_active_peers gauge
	// showed it to the sidecar's polls; for the own member, how long it
	// has been healthy. It is the time etcd's strict reconfiguration check
	// counts on that member, and a learner has it before it serves
	// clients. 0 when not known.
	ConnectedForSeconds float64 `json:"connectedForSeconds"`
	// Replicating means this sidecar's member leads, its raft sends the
	// member the log entry by entry (raft's StateReplicate, with the
	// member's log at 90 % of the leader's commit or more) and its
	// transport has the member connected: the member's raft runs and
	// votes, whether or not it serves clients yet (a voter promoted right
	// after a snapshot join serves clients only once etcd retried its
	// publish). Only the leader's sidecar sets it.
	Replicating bool `json:"replicating,omitempty"`
	// BehindAtLeader means this sidecar's member leads and its raft has
	// the member's log below 90 % of its own: etcd's own test before it
	// promotes a learner, which it refuses meanwhile (its snapshot, or the
	// entries after it, are on their way). Only the leader's sidecar sets
	// it, from its raft status; false where that is not known.
	BehindAtLeader bool `json:"behindAtLeader,omitempty"`
}

// LockStatus names the membership lock holder, the token of the process
// that holds it, and when its lease runs out.
type LockStatus struct {
	Holder           string `json:"holder"`
	Token            string `json:"token,omitempty"`
	ExpiresInSeconds int64  `json:"expiresInSeconds"`
}

// LockGrant answers POST /v1/lock: the lock as granted, and the records
// of the cluster's changes (the step record and the retirement records) as
// the transaction that wrote the lock read them. Every change through a
// sidecar, by any holder, writes one of them under the lock, so a caller
// that planned from an earlier observation with the lock free can tell
// whether anyone acted between that observation and its lock: when both
// equal the observation's, the plan stands (a membership change made
// around the sidecars is caught by the change's fingerprint). Retired is
// never nil from a sidecar that reads them: a nil Retired (an older
// sidecar) tells nothing.
type LockGrant struct {
	LockStatus
	Step    *StepRecord     `json:"step,omitempty"`
	Retired []RetiredMember `json:"retired"`
}

// AddMemberRequest is the body of POST /v1/members. Learner must be true:
// voters join as learners and are promoted once caught up.
type AddMemberRequest struct {
	Name     string   `json:"name"`
	PeerURLs []string `json:"peerURLs"`
	Learner  bool     `json:"learner"`
}

// LeaderRequest is the body of POST /v1/leader.
type LeaderRequest struct {
	Name string `json:"name"`
}

// LockRequest is the body of POST /v1/lock. Holder names the controller
// (one per Kubernetes cluster, the same across restarts); Token names the
// process that holds the lock for it, and is new with every process start
// (NewLockToken: the start time, then randomness): a process whose token
// names a later start time takes its holder's lock over, and every change
// sent with the older token is refused from then on (StaleToken). A token
// of another form, or one that names a start beyond LockTokenSkew ahead of
// the sidecar's clock, is refused (InvalidToken).
type LockRequest struct {
	Holder     string `json:"holder"`
	Token      string `json:"token,omitempty"`
	TTLSeconds int64  `json:"ttlSeconds"`
}

// ChangeResult answers a successful mutating membership call. Changed is
// false when the call found its effect already in place (an idempotent
// repeat) and changed nothing.
type ChangeResult struct {
	Member  Member `json:"member"`
	Changed bool   `json:"changed"`
	// Removed is the member that a promotion with thenRemove removed right
	// after it; nil when it did not (RemoveError says why: the promotion
	// stands, and the removal is planned again).
	Removed     *Member `json:"removed,omitempty"`
	RemoveError string  `json:"removeError,omitempty"`
	// GapSeconds is, for a promotion with thenRemove, the time from etcd's
	// answer to the promotion to its answer to the removal: how long the
	// membership stood between the two changes.
	GapSeconds float64 `json:"gapSeconds,omitempty"`
}

// Error is a refusal or failure answered by the sidecar; on the wire it is
// {"reason","message","retryAfterSeconds"}. The client returns it as is, so
// callers use errors.As or IsReason.
type Error struct {
	StatusCode int
	Reason     string
	Message    string
	// RetryAfter is the sidecar's hint when the call may succeed later.
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	s := fmt.Sprintf("sidecar answered %d %s: %s", e.StatusCode, e.Reason, e.Message)
	if e.RetryAfter > 0 {
		s += fmt.Sprintf(" (retry after %s)", e.RetryAfter)
	}
	return s
}

// IsReason reports whether err is (or wraps) a sidecar *Error with the given
// reason.
func IsReason(err error, reason string) bool {
	var e *Error
	return errors.As(err, &e) && e.Reason == reason
}

// errorBody is the wire form of Error.
type errorBody struct {
	Reason            string `json:"reason"`
	Message           string `json:"message"`
	RetryAfterSeconds int64  `json:"retryAfterSeconds,omitempty"`
}

// Fingerprint identifies a membership by its member IDs and their learner
// flags (not names, URLs or health, which change without a
// reconfiguration): the first 16 hex characters of the SHA-256 of the sorted
// lines "<id>:<voter|learner>" joined by newlines.
func Fingerprint(members []Member) string {
	lines := make([]string, 0, len(members))
	for _, m := range members {
		role := "voter"
		if m.IsLearner {
			role = "learner"
		}
		lines = append(lines, strings.ToLower(m.ID)+":"+role)
	}
	sort.Strings(lines)
	sum := sha256.Sum256([]byte(strings.Join(lines, "\n")))
	return hex.EncodeToString(sum[:])[:16]
}
