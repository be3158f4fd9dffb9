package sidecar

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The membership lock lets one controller at a time change the membership of
// an etcd cluster that spans two Kubernetes clusters. It lives in that etcd
// cluster (the one store both sides share) as a key whose value names the
// holder, attached to a lease: a holder that dies loses the lock when the
// lease runs out. Every write is a transaction on the key's create or mod
// revision, so two acquirers never both win.

const (
	minLockTTL = 1
	maxLockTTL = 3600
	// lockAttempts bounds the retries when the key changes between our read
	// and our transaction.
	lockAttempts = 3
)

// acquireLock answers POST /v1/lock: take the lock, or renew it when the
// caller holds it already.
func (s *Server) acquireLock(r *http.Request) (int, any, *Error) {
	var req LockRequest
	if e := decodeJSON(r, &req); e != nil {
		return 0, nil, e
	}
	if e := validateName("holder", req.Holder); e != nil {
		return 0, nil, e
	}
	setTarget(r, req.Holder)
	if req.TTLSeconds < minLockTTL || req.TTLSeconds > maxLockTTL {
		return 0, nil, badRequest(ReasonInvalidArgument, "ttlSeconds is %d; want %d to %d", req.TTLSeconds, minLockTTL, maxLockTTL)
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
	defer cancel()
	for range lockAttempts {
		kv, err := s.readLock(ctx)
		if err != nil {
			return 0, nil, etcdError("reading the membership lock", err)
		}
		if kv != nil && string(kv.Value) != req.Holder {
			return 0, nil, s.lockHeldError(ctx, kv)
		}
		var cond clientv3.Cmp
		if kv == nil {
			cond = clientv3.Compare(clientv3.CreateRevision(lockKey), "=", 0)
		} else {
			cond = clientv3.Compare(clientv3.ModRevision(lockKey), "=", kv.ModRevision)
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
			txn, err = c.Txn(ctx).If(cond).Then(clientv3.OpPut(lockKey, req.Holder, clientv3.WithLease(lease.ID))).Commit()
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
		return http.StatusOK, LockStatus{Holder: req.Holder, ExpiresInSeconds: lease.TTL}, nil
	}
	return 0, nil, &Error{StatusCode: http.StatusServiceUnavailable, Reason: ReasonEtcdUnavailable, RetryAfter: time.Second,
		Message: fmt.Sprintf("the membership lock changed %d times while %q tried to take it; retry", lockAttempts, req.Holder)}
}

// releaseLock answers DELETE /v1/lock. Releasing a lock nobody holds is a
// success (the caller's goal holds); releasing another holder's lock is not.
func (s *Server) releaseLock(r *http.Request) (int, any, *Error) {
	holder := r.Header.Get(HeaderLockHolder)
	if holder == "" {
		return 0, nil, badRequest(ReasonInvalidArgument, "the header %s naming the holder is missing", HeaderLockHolder)
	}
	if e := validateName(HeaderLockHolder, holder); e != nil {
		return 0, nil, e
	}
	setTarget(r, holder)
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
		if string(kv.Value) != holder {
			return 0, nil, s.lockHeldError(ctx, kv)
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
		Message: fmt.Sprintf("the membership lock changed %d times while %q tried to release it; retry", lockAttempts, holder)}
}

// checkLock refuses a membership change whose caller names itself as lock
// holder but does not hold the lock in the observation v. Without the header
// nothing is checked (an operator with curl). The check and the change are
// two etcd calls, so the lock guards against a second controller, not
// against a lock that expires during the change itself.
func (s *Server) checkLock(ctx context.Context, r *http.Request, v *view) *Error {
	holder := r.Header.Get(HeaderLockHolder)
	if holder == "" {
		return nil
	}
	if e := validateName(HeaderLockHolder, holder); e != nil {
		return e
	}
	if v.lock == nil {
		return &Error{StatusCode: http.StatusConflict, Reason: ReasonLockNotHeld,
			Message: fmt.Sprintf("%q does not hold the membership lock (nobody does; it may have expired); acquire it first", holder)}
	}
	if string(v.lock.Value) != holder {
		return s.lockHeldError(ctx, v.lock)
	}
	return nil
}

func (s *Server) readLock(ctx context.Context) (*mvccpb.KeyValue, error) {
	var resp *clientv3.GetResponse
	err := s.readCluster(ctx, func(c *clientv3.Client) (err error) {
		resp, err = c.Get(ctx, lockKey)
		return err
	})
	if err != nil {
		return nil, err
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	return resp.Kvs[0], nil
}

func (s *Server) lockHeldError(ctx context.Context, kv *mvccpb.KeyValue) *Error {
	e := &Error{StatusCode: http.StatusConflict, Reason: ReasonLockHeld,
		Message: fmt.Sprintf("the membership lock is held by %q", kv.Value)}
	if st := s.lockStatus(ctx, kv); st != nil && st.ExpiresInSeconds > 0 {
		e.Message += fmt.Sprintf(" for %d more seconds unless renewed", st.ExpiresInSeconds)
		e.RetryAfter = time.Duration(st.ExpiresInSeconds) * time.Second
	}
	return e
}

// lockStatus reads the remaining lease time of the lock key; nil when the
// lease has run out meanwhile.
func (s *Server) lockStatus(ctx context.Context, kv *mvccpb.KeyValue) *LockStatus {
	st := &LockStatus{Holder: string(kv.Value)}
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
