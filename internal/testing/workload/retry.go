package workload

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// transientMessages are etcd answers that say "not now" rather than "no":
// the request is retried like kube-apiserver's client would. "raft proposal
// dropped" comes back as codes.Unknown, so codes alone are not enough.
var transientMessages = []string{
	"raft proposal dropped",            // leader transfer in progress, leader-side
	"rpc not supported for learner",    // routed to a member that is still a learner
	"leader changed",                   // applied index moved under a new leader
	"no leader",                        // election in progress
	"request timed out",                // every etcdserver timeout flavour
	"server stopped",                   // member shutting down or just removed
	"raft: stopped",                    // member stopped by its own removal mid-proposal (ambiguous: the CAS retry settles it)
	"too many requests",                // apply backlog
	"unhealthy cluster",                // strict reconfig check on a member API call
	"no available endpoints",           // caller emptied the list for a moment
	"there is no address available",    // gRPC balancer has no ready connection
	"the client connection is closing", // endpoint swapped under the call
	"error reading from server",        // connection reset by a killed member
	"connection refused",               // member down
	"context deadline exceeded",        // our own attempt timeout
}

// isTransient reports whether err is worth another attempt within the
// request's deadline.
func isTransient(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return true
	}
	if errors.Is(err, rpctypes.ErrNoSpace) {
		return false
	}
	if s, ok := status.FromError(err); ok {
		switch s.Code() {
		case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Aborted:
			return true
		}
	}
	msg := err.Error()
	for _, m := range transientMessages {
		if strings.Contains(msg, m) {
			return true
		}
	}
	return false
}

// Retry bounds: short attempts so that a proposal silently dropped during a
// leader transfer costs one attempt timeout, not a whole request timeout.
const (
	// DefaultAttemptTimeout bounds one RPC attempt.
	DefaultAttemptTimeout = time.Second
	// DefaultRequestDeadline bounds a request with all its retries; a request
	// still without an answer then is a failed request.
	DefaultRequestDeadline = 30 * time.Second
	firstBackoff           = 20 * time.Millisecond
	maxBackoff             = 250 * time.Millisecond
)

// retrier runs attempts of one request until one gives a definite answer,
// the error is not transient, or the request deadline passes.
type retrier struct {
	attemptTimeout time.Duration
	deadline       time.Time
	backoff        time.Duration
	attempts       int
	lastErr        error
}

func newRetrier(o Options) *retrier {
	return &retrier{attemptTimeout: o.AttemptTimeout, deadline: time.Now().Add(o.RequestDeadline), backoff: firstBackoff}
}

// attempt runs f under a per-attempt timeout and reports whether the caller
// should try again after the error it returned.
func (r *retrier) attempt(f func(ctx context.Context) error) (err error, again bool) {
	remaining := time.Until(r.deadline)
	if remaining <= 0 {
		return fmt.Errorf("request deadline passed after %d attempts: %w", r.attempts, r.lastErr), false
	}
	ctx, cancel := context.WithTimeout(context.Background(), min(r.attemptTimeout, remaining))
	defer cancel()
	r.attempts++
	err = f(ctx)
	if err == nil {
		return nil, false
	}
	r.lastErr = err
	if !isTransient(err) {
		return err, false
	}
	// Full jitter keeps the writers from retrying in lock step against the
	// new leader.
	sleep := min(time.Duration(rand.Int64N(int64(r.backoff)))+r.backoff/2, time.Until(r.deadline))
	if sleep <= 0 {
		return err, false
	}
	time.Sleep(sleep)
	r.backoff = min(2*r.backoff, maxBackoff)
	return err, true
}

// clientErr keeps only the message of an etcd client error: gRPC status
// strings are long and repeat the code.
func clientErr(err error) string {
	if err == nil {
		return ""
	}
	if s, ok := status.FromError(err); ok {
		return s.Message()
	}
	return err.Error()
}
