package sidecar

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Every membership change is recorded in the etcd cluster before it is
// sent, by a transaction that holds only while the caller's lock (holder
// and token) and the previous record are as the sidecar observed them.
// That transaction is the fence: a caller whose lock expired or was taken
// over by a newer process records nothing and changes nothing. The record
// is the change's intent, kept where it survives a crash of either
// controller: while the call runs it is open ("InFlight", on a lease, so a
// record whose sidecar died mid-call closes itself when the lease ends);
// after the call it says how the call ended. GET /v1/members shows it, so a
// controller that restarts sees what its predecessor sent last.
//
// A leader transfer is the exception: it changes no membership, and one sent
// on a stale lock only hands leadership to a healthy voter, which loses
// nothing. It is checked against the lock as observed, not fenced, and
// recorded after it happened: the clients are held through the transfer,
// and a fence's transaction would add a commit across the sites to that
// hold (measured: the destination's longest write gap went from 0.87-0.91 s
// to 1.03 s).

// stepKey holds the record of the latest membership change sent through any
// sidecar of the cluster.
const stepKey = keyPrefix + "step"

// StepState is where a recorded change stands.
type StepState string

// The states of a step record.
const (
	// StepInFlight: recorded and sent; the call has not ended.
	StepInFlight StepState = "InFlight"
	// StepSucceeded: etcd applied the change (or found it in place).
	StepSucceeded StepState = "Succeeded"
	// StepFailed: the call failed; Message says how. A failure that may
	// have been applied (a timeout) shows in the next member list.
	StepFailed StepState = "Failed"
)

// The kinds of a step record; they are the API's step kinds.
const (
	StepAddLearner = "AddLearner"
	StepPromote    = "PromoteLearner"
	StepRemove     = "RemoveMember"
	StepMoveLeader = "MoveLeader"
)

// StepRecord is the record of one membership change (GET /v1/members,
// "step").
type StepRecord struct {
	// Kind is AddLearner, PromoteLearner, RemoveMember or MoveLeader.
	Kind string `json:"kind"`
	// Target is the member the change acts on (name or hex ID).
	Target string `json:"target"`
	// ThenRemove is the member a promotion removed right after it.
	ThenRemove string `json:"thenRemove,omitempty"`
	// Holder and Token name the lock holder and its process that sent it;
	// empty for a change sent without the lock headers.
	Holder string `json:"holder,omitempty"`
	Token  string `json:"token,omitempty"`
	// Sidecar is the hex member ID of the sidecar's member that sent it.
	Sidecar string    `json:"sidecar,omitempty"`
	State   StepState `json:"state"`
	// Changed is true when the change altered etcd's membership or
	// leadership (false for a repeat found in place).
	Changed bool `json:"changed,omitempty"`
	// Message is the failure, for a Failed record.
	Message string `json:"message,omitempty"`
	// Revision is etcd's revision at which the change was recorded: it
	// orders the changes of all controllers of the cluster.
	Revision int64 `json:"revision"`
	// Time is when the sidecar recorded it (its own clock), RFC 3339.
	Time string `json:"time"`
}

// parseStep reads the step record; nil for none (or one that does not
// parse, which only an operator's hand could write).
func parseStep(kv *mvccpb.KeyValue) *StepRecord {
	if kv == nil {
		return nil
	}
	var rec StepRecord
	if json.Unmarshal(kv.Value, &rec) != nil {
		return nil
	}
	if rec.State == StepInFlight || rec.Revision == 0 {
		// An open record, or a leader transfer recorded after the fact: the
		// key's revision is the change's.
		rec.Revision = kv.ModRevision
	}
	return &rec
}

// modRevision is kv's mod revision, 0 for a key that does not exist (what
// etcd compares a missing key's revision with).
func modRevision(kv *mvccpb.KeyValue) int64 {
	if kv == nil {
		return 0
	}
	return kv.ModRevision
}

func changeInFlight(rec *StepRecord) *Error {
	by := rec.Holder
	if by == "" {
		by = "a caller without the lock headers"
	} else if rec.Token != "" {
		by = fmt.Sprintf("%q (token %q)", rec.Holder, rec.Token)
	}
	return &Error{StatusCode: http.StatusConflict, Reason: ReasonChangeInFlight, RetryAfter: time.Second,
		Message: fmt.Sprintf("%s %s by %s is in flight since revision %d; it ends with its call, or when its record's lease runs out if its sidecar died",
			rec.Kind, rec.Target, by, rec.Revision)}
}

// fence records rec as in flight, in a transaction that holds only while
// the caller's lock and the step record are as observed in v, and returns
// the open record, which the caller closes with the call's outcome.
// Nothing is recorded, and the change must not be sent, when it refuses. v
// must have been observed with the lock's remaining time.
func (s *Server) fence(ctx context.Context, r *http.Request, v *view, rec StepRecord) (*openStep, *Error) {
	caller := callerLock(r)
	if prev := parseStep(v.step); prev != nil && prev.State == StepInFlight &&
		(caller.Holder == "" || prev.Holder != caller.Holder || prev.Token != caller.Token) {
		// The caller's own record may still read InFlight: its process sends
		// one change at a time, and closing a record is not waited for.
		return nil, changeInFlight(prev)
	}
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(stepKey), "=", modRevision(v.step))}
	if caller.Holder != "" {
		switch {
		case v.lock == nil || v.lockStatus == nil:
			return nil, &Error{StatusCode: http.StatusConflict, Reason: ReasonLockNotHeld,
				Message: fmt.Sprintf("%q does not hold the membership lock (its lease ran out); acquire it first", caller.Holder)}
		case time.Duration(v.lockStatus.ExpiresInSeconds)*time.Second < s.cfg.RequestTimeout:
			return nil, &Error{StatusCode: http.StatusConflict, Reason: ReasonLockExpiring,
				Message: fmt.Sprintf("the membership lock of %q runs out in %d s, sooner than a change may take (%s); renew it first",
					caller.Holder, v.lockStatus.ExpiresInSeconds, s.cfg.RequestTimeout)}
		}
		cmps = append(cmps, clientv3.Compare(clientv3.Value(lockKey), "=", string(v.lock.Value)))
	}
	rec.Holder, rec.Token, rec.State = caller.Holder, caller.Token, StepInFlight
	rec.Sidecar, rec.Time = formatID(s.localIDNow()), time.Now().UTC().Format(time.RFC3339Nano)
	body, err := json.Marshal(rec)
	if err != nil {
		return nil, etcdError("encoding the step record", err)
	}
	s.mu.Lock()
	hooks := s.fenceHooks
	s.mu.Unlock()
	if hooks.before != nil {
		hooks.before()
	}
	var txn *clientv3.TxnResponse
	for attempt := range 2 {
		var lease clientv3.LeaseID
		// The tombstones' lease: it has at least half of TombstoneTTL left,
		// far more than any call may take.
		if lease, err = s.tombstoneLease(ctx, attempt > 0); err != nil {
			break
		}
		err = s.withCluster(ctx, func(c *clientv3.Client) (err error) {
			txn, err = c.Txn(ctx).If(cmps...).Then(clientv3.OpPut(stepKey, string(body), clientv3.WithLease(lease))).
				Else(clientv3.OpGet(lockKey), clientv3.OpGet(stepKey)).Commit()
			return err
		})
		if !isEtcdError(err, rpctypes.ErrGRPCLeaseNotFound) {
			break
		}
	}
	if err != nil {
		return nil, etcdError("recording the change before sending it", err)
	}
	if !txn.Succeeded {
		return nil, s.fenced(ctx, caller, rec, txn)
	}
	rec.Revision = txn.Header.Revision
	if hooks.after != nil {
		hooks.after()
	}
	return &openStep{s: s, rec: rec}, nil
}

// openStep is a change recorded as in flight; close it once, with
// succeeded or failed.
type openStep struct {
	s   *Server
	rec StepRecord
}

// succeeded closes the record: the change was applied (changed) or found
// in place; note says what else the caller should know.
func (o *openStep) succeeded(changed bool, note string) {
	o.rec.State, o.rec.Changed, o.rec.Message = StepSucceeded, changed, note
	o.s.closeStep(o.rec)
}

// failed closes the record with the call's failure.
func (o *openStep) failed(e *Error) {
	o.rec.State, o.rec.Message = StepFailed, e.Error()
	o.s.closeStep(o.rec)
}

// fenced says why the fence's transaction failed, from what it read instead.
func (s *Server) fenced(ctx context.Context, caller lockValue, rec StepRecord, txn *clientv3.TxnResponse) *Error {
	var lock, step *mvccpb.KeyValue
	for i, r := range txn.Responses {
		if rr := r.GetResponseRange(); rr != nil && len(rr.Kvs) > 0 {
			if i == 0 {
				lock = rr.Kvs[0]
			} else {
				step = rr.Kvs[0]
			}
		}
	}
	var e *Error
	switch {
	case caller.Holder != "" && lock == nil:
		e = &Error{StatusCode: http.StatusConflict, Reason: ReasonLockNotHeld,
			Message: fmt.Sprintf("%q lost the membership lock before the change was recorded (its lease ran out); acquire it again", caller.Holder)}
	case caller.Holder != "":
		e = s.lockRefusal(ctx, caller, lock)
	}
	if e == nil {
		if prev := parseStep(step); prev != nil && prev.State == StepInFlight {
			e = changeInFlight(prev)
		} else {
			e = &Error{StatusCode: http.StatusConflict, Reason: ReasonMembershipChanged,
				Message: "another membership change was recorded since the observation; observe again and re-plan"}
		}
	}
	s.log.Info("membership change fenced off: nothing was sent", "kind", rec.Kind, "target", rec.Target,
		"holder", caller.Holder, "token", caller.Token, "reason", e.Reason, "why", e.Message)
	return e
}

// closeStep writes the outcome into the record of a change, unless a later
// change was recorded meanwhile. It runs in the background: the answer to
// the change does not wait for it (a MoveLeader's clients are held until
// the answer), and the caller's next change passes its own open record.
func (s *Server) closeStep(rec StepRecord) {
	body, err := json.Marshal(rec)
	if err != nil {
		return
	}
	s.recordsClosing.Add(1)
	go func() {
		defer s.recordsClosing.Done()
		ctx, cancel := context.WithTimeout(s.background, s.cfg.RequestTimeout)
		defer cancel()
		err := s.withCluster(ctx, func(c *clientv3.Client) error {
			_, err := c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(stepKey), "=", rec.Revision)).
				Then(clientv3.OpPut(stepKey, string(body))).Commit()
			return err
		})
		if err != nil {
			s.log.Info("closing the step record failed; it closes when its lease runs out", "kind", rec.Kind, "target", rec.Target, "error", err.Error())
		}
	}()
}

// recordLeaderMove records a leader transfer once it happened, as a closed
// record, unless another change was recorded since v was observed. It runs
// in the background, like closing a record.
func (s *Server) recordLeaderMove(r *http.Request, v *view, target string) {
	caller := callerLock(r)
	rec := StepRecord{Kind: StepMoveLeader, Target: target, Holder: caller.Holder, Token: caller.Token,
		Sidecar: formatID(s.localIDNow()), State: StepSucceeded, Changed: true, Time: time.Now().UTC().Format(time.RFC3339Nano)}
	since := modRevision(v.step)
	s.recordsClosing.Add(1)
	go func() {
		defer s.recordsClosing.Done()
		ctx, cancel := context.WithTimeout(s.background, s.cfg.RequestTimeout)
		defer cancel()
		// Revision stays 0 in the body: readers take the key's own.
		body, err := json.Marshal(rec)
		if err == nil {
			err = s.withCluster(ctx, func(c *clientv3.Client) error {
				_, err := c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(stepKey), "=", since)).Then(clientv3.OpPut(stepKey, string(body))).Commit()
				return err
			})
		}
		if err != nil {
			s.log.Info("recording the leader transfer failed", "target", target, "error", err.Error())
		}
	}()
}
