package sidecar

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The membership lock lets one controller at a time change the membership of
// an etcd cluster that spans two Kubernetes clusters. It lives in that etcd
// cluster (the one store both sides share) as a key that names the holder
// and the token of the holder's process, attached to a lease: a holder that
// dies loses the lock when the lease runs out. Every write is a transaction
// on the key's create or mod revision, so two acquirers never both win.
//
// The lock is a fence, not only advice: every membership change is recorded
// (fence.go) by a transaction that compares the lock key with the caller's
// holder and token, so a caller whose lock expired or was taken over
// changes nothing. Two rules make the check before the change as good as a
// check at the change itself:
//   - the lease must outlive any request: a lock is granted for longer than
//     the sidecar's request timeout, and a change is refused (LockExpiring)
//     when the lease has less left than that timeout; the change's etcd
//     calls end within the timeout, before the lock can pass to anyone else;
//   - a change in flight blocks the next holder: its record stays open
//     until the call ended (or, if the sidecar died, until the record's
//     lease runs out), and neither a takeover nor another token's change
//     passes an open record.

const (
	maxLockTTL = 3600
	// lockAttempts bounds the retries when the key changes between our read
	// and our transaction.
	lockAttempts = 3
	// maxLockHeldRetry caps the retry hint of LockHeld: a holder that is
	// done releases the lock long before its lease would run out.
	maxLockHeldRetry = 5 * time.Second
)

// lockValue is the lock key's value: who holds the lock, in which process.
type lockValue struct {
	Holder string `json:"holder"`
	Token  string `json:"token,omitempty"`
}

func (l lockValue) encode() string {
	b, _ := json.Marshal(l)
	return string(b)
}

// parseLock reads the lock key's value; nil for no lock. A plain string
// (written before tokens existed) is a holder without a token.
func parseLock(kv *mvccpb.KeyValue) *lockValue {
	if kv == nil {
		return nil
	}
	var l lockValue
	if strings.HasPrefix(string(kv.Value), "{") && json.Unmarshal(kv.Value, &l) == nil {
		return &l
	}
	return &lockValue{Holder: string(kv.Value)}
}

// callerLock is the holder and token a request names in its headers.
func callerLock(r *http.Request) lockValue {
	return lockValue{Holder: r.Header.Get(HeaderLockHolder), Token: r.Header.Get(HeaderLockToken)}
}

// minLockTTL is the shortest lease a lock is granted: longer than the
// sidecar's request timeout, so that a change checked under the lock ends
// before the lock can pass to another holder.
func (s *Server) minLockTTL() int64 {
	return int64(math.Ceil(s.cfg.RequestTimeout.Seconds())) + 1
}

// acquireLock answers POST /v1/lock: take the lock, renew it when the
// caller's process holds it already, or take it over from an earlier
// process of the same holder (a restarted controller: its token names an
// earlier start than the caller's, see token.go) once no change of that process is in flight.
func (s *Server) acquireLock(r *http.Request) (int, any, *Error) {
	var req LockRequest
	if e := decodeJSON(r, &req); e != nil {
		return 0, nil, e
	}
	if e := validateName("holder", req.Holder); e != nil {
		return 0, nil, e
	}
	if _, e := lockTokenStart("token", req.Token, time.Now()); e != nil {
		return 0, nil, e
	}
	setTarget(r, req.Holder)
	if minTTL := s.minLockTTL(); req.TTLSeconds < minTTL || req.TTLSeconds > maxLockTTL {
		return 0, nil, badRequest(ReasonInvalidArgument, "ttlSeconds is %d; want %d to %d (longer than this sidecar's request timeout of %s, so that a change made under the lock ends before the lock can pass to another holder)",
			req.TTLSeconds, minTTL, maxLockTTL, s.cfg.RequestTimeout)
	}
	want := lockValue{Holder: req.Holder, Token: req.Token}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
	defer cancel()
	for range lockAttempts {
		kv, step, err := s.readLockAndStep(ctx)
		if err != nil {
			return 0, nil, etcdError("reading the membership lock", err)
		}
		held := parseLock(kv)
		if held != nil && held.Holder != req.Holder {
			return 0, nil, s.lockHeldError(ctx, kv)
		}
		takeover := held != nil && held.Token != req.Token
		if takeover && !newerToken(req.Token, held.Token, time.Now()) {
			// Tokens name their process's start time: only a newer
			// process takes the lock over, so an old one that lives on
			// (a controller replaced but not yet gone) cannot take it back.
			return 0, nil, staleToken(lockValue{Holder: req.Holder, Token: req.Token}, *held)
		}
		if takeover {
			// The earlier process may have a change on the wire: the new
			// one must not plan around it until it ended.
			if rec := parseStep(step); rec != nil && rec.State == StepInFlight && rec.Token == held.Token {
				return 0, nil, changeInFlight(rec)
			}
		}
		cond := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(lockKey), "=", 0)}
		if kv != nil {
			cond = []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(lockKey), "=", kv.ModRevision)}
		}
		if takeover {
			cond = append(cond, clientv3.Compare(clientv3.ModRevision(stepKey), "=", modRevision(step)))
		}
		// A renewal moves the key to a fresh lease with the requested TTL
		// instead of keeping the old one alive, so the TTL can change.
		var (
			lease *clientv3.LeaseGrantResponse
			txn   *clientv3.TxnResponse
		)
		err = s.withCluster(ctx, func(c *clientv3.Client) (err error) {
			if lease, err = c.Grant(ctx, req.TTLSeconds); err != nil {
				return err
			}
			// The records are read in the lock's transaction, so that they
			// are the state at the moment the lock became the caller's.
			txn, err = c.Txn(ctx).If(cond...).Then(clientv3.OpPut(lockKey, want.encode(), clientv3.WithLease(lease.ID)),
				clientv3.OpGet(stepKey), clientv3.OpGet(retiredPrefix, clientv3.WithPrefix())).Commit()
			return err
		})
		if err != nil {
			return 0, nil, etcdError("writing the membership lock", err)
		}
		if !txn.Succeeded {
			s.revokeLease(ctx, lease.ID)
			continue
		}
		if kv != nil && kv.Lease != 0 {
			s.revokeLease(ctx, clientv3.LeaseID(kv.Lease))
		}
		if takeover {
			s.log.Info("membership lock taken over from an earlier process of the same holder; changes with its token are refused from now on",
				"holder", req.Holder, "token", req.Token, "staleToken", held.Token)
		}
		return http.StatusOK, LockGrant{
			LockStatus: LockStatus{Holder: req.Holder, Token: req.Token, ExpiresInSeconds: lease.TTL},
			Step:       parseStep(firstKV(txn.Responses[1])),
			Retired:    retiredRecords(txn.Responses[2].GetResponseRange().GetKvs()),
		}, nil
	}
	return 0, nil, &Error{StatusCode: http.StatusServiceUnavailable, Reason: ReasonEtcdUnavailable, RetryAfter: time.Second,
		Message: fmt.Sprintf("the membership lock changed %d times while %q tried to take it; retry", lockAttempts, req.Holder)}
}

// releaseLock answers DELETE /v1/lock. Releasing a lock nobody holds is a
// success (the caller's goal holds); releasing another holder's lock, or
// the lock of another process of the same holder, is not.
func (s *Server) releaseLock(r *http.Request) (int, any, *Error) {
	caller := callerLock(r)
	if caller.Holder == "" {
		return 0, nil, badRequest(ReasonInvalidArgument, "the header %s naming the holder is missing", HeaderLockHolder)
	}
	if e := validateName(HeaderLockHolder, caller.Holder); e != nil {
		return 0, nil, e
	}
	if _, e := lockTokenStart(HeaderLockToken, caller.Token, time.Now()); e != nil {
		return 0, nil, e
	}
	setTarget(r, caller.Holder)
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
	defer cancel()
	for range lockAttempts {
		kv, err := s.readLock(ctx)
		if err != nil {
			return 0, nil, etcdError("reading the membership lock", err)
		}
		if kv == nil {
			return http.StatusOK, map[string]bool{"released": false}, nil
		}
		if e := s.lockRefusal(ctx, caller, kv); e != nil {
			return 0, nil, e
		}
		var txn *clientv3.TxnResponse
		err = s.withCluster(ctx, func(c *clientv3.Client) (err error) {
			txn, err = c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(lockKey), "=", kv.ModRevision)).
				Then(clientv3.OpDelete(lockKey)).Commit()
			return err
		})
		if err != nil {
			return 0, nil, etcdError("deleting the membership lock", err)
		}
		if txn.Succeeded {
			if kv.Lease != 0 {
				s.revokeLease(ctx, clientv3.LeaseID(kv.Lease))
			}
			return http.StatusOK, map[string]bool{"released": true}, nil
		}
	}
	return 0, nil, &Error{StatusCode: http.StatusServiceUnavailable, Reason: ReasonEtcdUnavailable, RetryAfter: time.Second,
		Message: fmt.Sprintf("the membership lock changed %d times while %q tried to release it; retry", lockAttempts, caller.Holder)}
}

// checkLock refuses a membership change whose caller names itself as lock
// holder but does not hold the lock in the observation v, under its own
// token. Without the header nothing is checked (an operator with curl). The
// check here gives an early, clear answer; the fence (fence.go) repeats it
// in the transaction that records the change.
func (s *Server) checkLock(ctx context.Context, r *http.Request, v *view) *Error {
	caller := callerLock(r)
	if caller.Holder == "" {
		return nil
	}
	if e := validateName(HeaderLockHolder, caller.Holder); e != nil {
		return e
	}
	if _, e := lockTokenStart(HeaderLockToken, caller.Token, time.Now()); e != nil {
		return e
	}
	if v.lock == nil {
		return &Error{StatusCode: http.StatusConflict, Reason: ReasonLockNotHeld,
			Message: fmt.Sprintf("%q does not hold the membership lock (nobody does; it may have expired); acquire it first", caller.Holder)}
	}
	return s.lockRefusal(ctx, caller, v.lock)
}

// lockRefusal says why caller does not hold the lock kv; nil when it does.
func (s *Server) lockRefusal(ctx context.Context, caller lockValue, kv *mvccpb.KeyValue) *Error {
	held := parseLock(kv)
	switch {
	case held.Holder != caller.Holder:
		return s.lockHeldError(ctx, kv)
	case held.Token != caller.Token:
		return staleToken(caller, *held)
	}
	return nil
}

func staleToken(caller, held lockValue) *Error {
	return &Error{StatusCode: http.StatusConflict, Reason: ReasonStaleToken,
		Message: fmt.Sprintf("the membership lock of %q is held by its process with token %q; this caller's token %q is stale (a newer process took the lock over), so it changes nothing",
			held.Holder, held.Token, caller.Token)}
}

func (s *Server) readLock(ctx context.Context) (*mvccpb.KeyValue, error) {
	kv, _, err := s.readLockAndStep(ctx)
	return kv, err
}

// readLockAndStep reads the lock key and the step record in one
// linearizable transaction.
func (s *Server) readLockAndStep(ctx context.Context) (lock, step *mvccpb.KeyValue, err error) {
	err = s.readCluster(ctx, func(c *clientv3.Client) (err error) {
		lock, step, err = readLockAndStepWith(ctx, c)
		return err
	})
	return lock, step, err
}

// readLockAndStepWith reads the lock and the step record through c in one
// transaction, with the read options opts (clientv3.WithSerializable for
// a read the member answers alone: etcd serves a transaction of
// serializable reads without a read index).
func readLockAndStepWith(ctx context.Context, c *clientv3.Client, opts ...clientv3.OpOption) (lock, step *mvccpb.KeyValue, err error) {
	resp, err := c.Txn(ctx).Then(clientv3.OpGet(lockKey, opts...), clientv3.OpGet(stepKey, opts...)).Commit()
	if err != nil {
		return nil, nil, err
	}
	return firstKV(resp.Responses[0]), firstKV(resp.Responses[1]), nil
}

func (s *Server) lockHeldError(ctx context.Context, kv *mvccpb.KeyValue) *Error {
	held := parseLock(kv)
	e := &Error{StatusCode: http.StatusConflict, Reason: ReasonLockHeld, RetryAfter: time.Second,
		Message: fmt.Sprintf("the membership lock is held by %q", held.Holder)}
	if st := s.lockStatus(ctx, kv); st != nil && st.ExpiresInSeconds > 0 {
		e.Message += fmt.Sprintf(" for %d more seconds unless released or renewed", st.ExpiresInSeconds)
		e.RetryAfter = min(time.Duration(st.ExpiresInSeconds)*time.Second, maxLockHeldRetry)
	}
	return e
}

// lockStatus reads the remaining lease time of the lock key; nil when the
// lease has run out meanwhile.
func (s *Server) lockStatus(ctx context.Context, kv *mvccpb.KeyValue) *LockStatus {
	held := parseLock(kv)
	st := &LockStatus{Holder: held.Holder, Token: held.Token}
	if kv.Lease == 0 {
		return st
	}
	var ttl *clientv3.LeaseTimeToLiveResponse
	err := s.readCluster(ctx, func(c *clientv3.Client) (err error) {
		ttl, err = c.TimeToLive(ctx, clientv3.LeaseID(kv.Lease))
		return err
	})
	if err != nil {
		return st
	}
	if ttl.TTL <= 0 {
		return nil
	}
	st.ExpiresInSeconds = ttl.TTL
	return st
}

// revokeLease is best effort: a lease left behind expires on its own.
func (s *Server) revokeLease(ctx context.Context, id clientv3.LeaseID) {
	err := s.withCluster(ctx, func(c *clientv3.Client) error {
		_, err := c.Revoke(ctx, id)
		return err
	})
	if err != nil {
		s.log.V(1).Info("revoking a lease failed; it will expire on its own", "lease", fmt.Sprintf("%x", int64(id)), "error", err.Error())
	}
}

// firstKV is the first key of a range response in a transaction; nil for
// none.
func firstKV(r *pb.ResponseOp) *mvccpb.KeyValue {
	if kvs := r.GetResponseRange().GetKvs(); len(kvs) > 0 {
		return kvs[0]
	}
	return nil
}
