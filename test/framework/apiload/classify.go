package apiload

import (
	"errors"
	"net/http"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// FailureClass says why a request failed, in the terms of a live move:
// which step of the move a user's failed request is charged to.
type FailureClass string

const (
	// MemberRemoved: the etcd member serving kube-apiserver's request was
	// removed from the cluster or stopped while it served it ("etcdserver:
	// server stopped", "raft: stopped", "etcdserver: member not found", "the
	// member has been permanently removed from the cluster"), or
	// kube-apiserver's connection to it broke (gRPC Unavailable, "transport
	// is closing", "connection refused" toward etcd).
	MemberRemoved FailureClass = "MemberRemoved"
	// ProposalDropped: the old leader dropped the proposal during a leader
	// transfer ("raft proposal dropped", C2a in the project's notes).
	ProposalDropped FailureClass = "ProposalDropped"
	// Timeout: no answer in time: etcd's "request timed out", a "context
	// deadline exceeded" inside kube-apiserver, HTTP 504, or the client's
	// own timeout (a proposal lost in a leader transfer hangs until one of
	// these, C2b).
	Timeout FailureClass = "Timeout"
	// LeaderChanged: etcd answered "leader changed" or "no leader" (an
	// election, or the leader removed without a transfer first).
	LeaderChanged FailureClass = "LeaderChanged"
	// Unavailable: the kube-apiserver itself could not be reached or
	// refused service: a transport error on the client's connection to it
	// (refused, reset, closed) or its HTTP 503.
	Unavailable FailureClass = "Unavailable"
	// Other is any other failure; its message is kept in the error counts.
	Other FailureClass = "Other"
)

// failureClasses lists the classes in the order reports print them.
var failureClasses = []FailureClass{MemberRemoved, ProposalDropped, Timeout, LeaderChanged, Unavailable, Other}

// etcdPatterns are the texts kube-apiserver passes through from its etcd
// client, most specific first: a gRPC "code = Unavailable" wraps several of
// the specific etcd errors, so it is tried last.
var etcdPatterns = []struct {
	class FailureClass
	texts []string
}{
	{ProposalDropped, []string{"proposal dropped"}},
	{LeaderChanged, []string{"leader changed", "no leader"}},
	{Timeout, []string{"request timed out", "deadline exceeded", "did not complete within"}},
	{MemberRemoved, []string{
		"server stopped", "raft: stopped", "member not found", "permanently removed",
		"code = unavailable", "transport is closing", "connection refused",
		"error reading from server", "connection reset",
	}},
}

// clientTimeoutPatterns mark a transport error that is the client giving up
// on an answer, not failing to reach the server. The request URL carries
// "?timeout=30s", so a bare "timeout" would match every transport error.
var clientTimeoutPatterns = []string{"deadline exceeded", "client.timeout", "timeout awaiting", "i/o timeout"}

// serverUnreachablePatterns mark a transport error in reaching the server,
// which wins over a timeout in the same message (a dial that timed out).
var serverUnreachablePatterns = []string{"dial tcp", "connection refused", "connection reset", "no route to host"}

// Classify names the class of a failed request from its HTTP status code
// (0 for a transport error: no answer from the kube-apiserver) and its
// error text. A 409 Conflict is not a failure and should not be passed in.
func Classify(code int, message string) FailureClass {
	msg := strings.ToLower(message)
	if code == 0 {
		switch {
		case containsAny(msg, serverUnreachablePatterns):
			return Unavailable
		case containsAny(msg, clientTimeoutPatterns):
			return Timeout
		}
		return Unavailable
	}
	for _, p := range etcdPatterns {
		if containsAny(msg, p.texts) {
			return p.class
		}
	}
	switch code {
	case http.StatusGatewayTimeout:
		return Timeout
	case http.StatusServiceUnavailable:
		return Unavailable
	}
	return Other
}

func containsAny(s string, subs []string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// statusCode is the HTTP status of a client-go error, or 0 when the request
// got no HTTP answer.
func statusCode(err error) int {
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		return int(status.Status().Code)
	}
	return 0
}
