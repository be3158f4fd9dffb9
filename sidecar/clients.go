package sidecar

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ReasonNoClientGate: the sidecar runs no client gate (Config.ClientGate),
// so its member's clients cannot be drained or held; the caller goes on
// without (the member's clients then see what etcd gives them).
const ReasonNoClientGate = "NoClientGate"

// MaxClientHold bounds a hold of the member's clients: a hold covers one
// leader transfer (well under a second at 180 ms RTT), and a controller
// that dies holding it must not stall clients for longer.
const MaxClientHold = 5 * time.Second

// A drain is a lease: it keeps the member's clients away for a bounded
// time, which the controller renews (by draining again) until it sends the
// member's removal, and undoes (DELETE /v1/clients/drain) when the step
// fails. When nobody renews it (the step failed and the undo was lost, the
// controller restarted or vanished), the sidecar ends it by itself:
// nothing depends on the controller being alive to reopen the gate. A
// drained member whose removal does not come still votes; with its gate
// shut it serves no client, answers no poll through its client port, and
// once it became leader (the dying leader handed leadership to it) could
// never be led away from: the move deadlocked.
const (
	// MaxClientDrain bounds a drain's lease.
	MaxClientDrain = time.Minute
	// DefaultClientDrain is the lease of a drain that names none (an
	// operator with curl).
	DefaultClientDrain = 30 * time.Second
)

// ClientDrain asks the gate to drain (POST /v1/clients/drain; the body is
// optional).
type ClientDrain struct {
	// Seconds is the drain's lease: when it ends without the member's
	// removal under way (a tombstone) or done, the gate reopens. Draining
	// again renews it. 0 means DefaultClientDrain.
	Seconds float64 `json:"seconds,omitempty"`
	// Renew only renews the drain in force: without one (the sidecar
	// ended it because its lease ran out or its member leads) the call
	// is refused (NotDrained) and the gate stays open, instead of a
	// renewal draining the gate of a member that leads again and again.
	Renew bool `json:"renew,omitempty"`
}

// drainLease is the drain in force on the gate.
type drainLease struct {
	// since is when the drain began: an observation begun before it
	// cannot tell whether the member leads now.
	since, until time.Time
	timer        *time.Timer
	// final: the member left the cluster; the gate stays drained.
	final bool
}

// ClientHold asks the gate to hold new calls for at most Seconds.
type ClientHold struct {
	Seconds float64 `json:"seconds"`
	// UntilLeader, a member ID in hex, also ends the hold as soon as the
	// local member reports that member as its leader: for this member's
	// clients the leader transfer the hold covers is then over, and their
	// calls go on without waiting for the caller's release, a round trip
	// away across sites.
	UntilLeader string `json:"untilLeader,omitempty"`
}

// leaderPoll is how often a hold with UntilLeader asks the local member
// for its leader: a Status call on the member's own host (localPoll),
// cheap beside the transfer it waits for.
const leaderPoll = 5 * time.Millisecond

// ClientGateStatus is the gate's state after a drain or hold call.
type ClientGateStatus struct {
	// Ready is false once the gate drained: it takes no client.
	Ready bool `json:"ready"`
	// InFlight are the unary calls forwarded and not yet answered.
	InFlight int `json:"inFlight"`
	// HeldSeconds is the hold that was put in force, when one was.
	HeldSeconds float64 `json:"heldSeconds,omitempty"`
	// DrainSeconds is how long the drain in force lasts unless renewed
	// or undone; 0 without one, or once the member's removal made it
	// final.
	DrainSeconds float64 `json:"drainSeconds,omitempty"`
}

// clientRoutes serves the client gate's endpoints.
func (s *Server) clientRoutes(mux *http.ServeMux) {
	s.handle(mux, "POST /v1/clients/drain", "drain_clients", true, s.drainClients)
	s.handle(mux, "DELETE /v1/clients/drain", "undrain_clients", true, s.undrainClients)
	s.handle(mux, "POST /v1/clients/hold", "hold_clients", true, s.holdClients)
	s.handle(mux, "DELETE /v1/clients/hold", "release_clients", true, s.releaseClients)
}

func (s *Server) noGate() *Error {
	return &Error{StatusCode: http.StatusNotFound, Reason: ReasonNoClientGate,
		Message: "this sidecar runs no client gate in front of its etcd member (--client-gate-address)"}
}

// drainClients moves the local member's clients to other members (see
// clientgate.Gate.Drain) for the lease the body names, and answers once
// none is left: the member can be removed without failing a client's
// call. On a drained gate it renews the lease.
func (s *Server) drainClients(r *http.Request) (int, any, *Error) {
	g := s.cfg.ClientGate
	if g == nil {
		return 0, nil, s.noGate()
	}
	var req ClientDrain
	if e := decodeOptionalJSON(r, &req); e != nil {
		return 0, nil, e
	}
	lease := DefaultClientDrain
	if req.Seconds != 0 {
		// Checked as a number of seconds: a huge one would overflow the
		// conversion to a duration.
		if !(req.Seconds > 0 && req.Seconds <= MaxClientDrain.Seconds()) {
			return 0, nil, badRequest(ReasonInvalidArgument, "seconds %v: a drain's lease lasts more than 0 and at most %s (renew it by draining again)", req.Seconds, MaxClientDrain)
		}
		lease = time.Duration(req.Seconds * float64(time.Second))
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
	defer cancel()
	s.drainCalls.Lock()
	defer s.drainCalls.Unlock()
	// A drain keeps a member from its clients for up to its lease, and a
	// renewal past it: only the lock's holder decides that, the one that
	// removes the member next.
	if e := s.checkGateCaller(ctx, r, false); e != nil {
		return 0, nil, e
	}
	s.mu.Lock()
	renewal := s.drain != nil
	s.mu.Unlock()
	if req.Renew && !renewal {
		return 0, nil, &Error{StatusCode: http.StatusConflict, Reason: ReasonNotDrained,
			Message: "no drain is in force to renew: the sidecar ended it (its lease ran out, or the local member leads)"}
	}
	// The lease first: a drain that fails half-way leaves the gate
	// drained, and the lease is what reopens it.
	s.renewDrain(lease)
	// The mark goes out beside the drain, not after it: the drain's
	// answer waits for both, and the write costs a round trip to the
	// leader, which the drain's own wait for calls in flight covers.
	marked := make(chan struct{})
	go func() {
		defer close(marked)
		s.markDrained(ctx, lease)
	}()
	err := g.Drain(ctx)
	<-marked
	if err != nil {
		return 0, nil, &Error{StatusCode: http.StatusServiceUnavailable, Reason: ReasonEtcdUnavailable, RetryAfter: time.Second,
			Message: fmt.Sprintf("draining the clients of the local member (the drain stays until its lease ends): %v", err)}
	}
	return http.StatusOK, s.gateStatus(), nil
}

// drainMarkPrefix holds one key per member whose clients are drained, on
// a lease as long as the drain's: a leader that hands over at its pod's
// end (handoff.go) reads them and does not pass its leadership to a member
// that is about to be removed. Such a member would reopen its gate as
// leader, and its removal would then need a second transfer while the
// controller's step runs, failing the clients' writes forwarded meanwhile.
const drainMarkPrefix = keyPrefix + "drained/"

// markDrained writes the local member's drain mark for a drain of lease,
// replacing the one before (whose lease then expires on its own). A mark
// that cannot be written is logged, not an error: the drain itself holds,
// and only a handoff in the next seconds could choose this member.
func (s *Server) markDrained(ctx context.Context, lease time.Duration) {
	s.learnLocalID(ctx)
	s.mu.Lock()
	id := s.localID
	s.mu.Unlock()
	if id == 0 {
		s.log.Info("the drain is not marked in etcd: the local member's ID is not known yet")
		return
	}
	var granted clientv3.LeaseID
	err := s.withCluster(ctx, func(c *clientv3.Client) error {
		l, err := c.Grant(ctx, int64(math.Ceil(lease.Seconds()))+1)
		if err != nil {
			return err
		}
		granted = l.ID
		_, err = c.Put(ctx, drainMarkPrefix+formatID(id), time.Now().UTC().Format(time.RFC3339), clientv3.WithLease(l.ID))
		return err
	})
	if err != nil {
		s.log.Info("the drain is not marked in etcd; a leader's handoff could choose this member", "error", err.Error())
		return
	}
	s.mu.Lock()
	s.drainMark = granted
	s.mu.Unlock()
}

// unmarkDrained revokes the lease of the local member's drain mark, which
// deletes the mark unless a later drain replaced it (on a lease of its
// own). Its caller holds s.mu. It does not wait for the revoke: the
// mark's lease ends it anyway.
func (s *Server) unmarkDrained() {
	lease := s.drainMark
	s.drainMark = 0
	if lease == 0 {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(s.background, s.cfg.RequestTimeout)
		defer cancel()
		_ = s.withCluster(ctx, func(c *clientv3.Client) error {
			_, err := c.Revoke(ctx, lease)
			return err
		})
	}()
}

// drainMarks are the members whose clients are drained, as their marks in
// etcd show, read from the local member alone: the handoff reads them on
// the leader, which has every mark that committed.
func (s *Server) drainMarks(ctx context.Context) (map[uint64]bool, error) {
	resp, err := s.local.Get(ctx, drainMarkPrefix, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithSerializable())
	if err != nil {
		return nil, err
	}
	out := map[uint64]bool{}
	for _, kv := range resp.Kvs {
		if id, err := strconv.ParseUint(strings.TrimPrefix(string(kv.Key), drainMarkPrefix), 16, 64); err == nil {
			out[id] = true
		}
	}
	return out, nil
}

// undrainClients answers DELETE /v1/clients/drain: the drain is undone
// (the removal it prepared did not happen) and the gate takes clients
// again, unless the member's removal is under way or done.
func (s *Server) undrainClients(r *http.Request) (int, any, *Error) {
	g := s.cfg.ClientGate
	if g == nil {
		return 0, nil, s.noGate()
	}
	if e := noBody(r); e != nil {
		return 0, nil, e
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
	defer cancel()
	s.drainCalls.Lock()
	defer s.drainCalls.Unlock()
	// Sending the clients back to a member that another controller may be
	// about to remove would fail their calls: only the lock's holder.
	if e := s.checkGateCaller(ctx, r, false); e != nil {
		return 0, nil, e
	}
	s.mu.Lock()
	d, local := s.drain, s.localID
	s.mu.Unlock()
	if d != nil && d.final {
		return 0, nil, &Error{StatusCode: http.StatusConflict, Reason: ReasonMemberNotFound,
			Message: "the local member is no longer in the cluster: its gate stays drained"}
	}
	if local != 0 {
		tombstones, err := s.readTombstones(ctx)
		if err != nil {
			return 0, nil, etcdError("reading the removal tombstones", err)
		}
		if s.removingIDs(tombstones)[local] {
			return 0, nil, &Error{StatusCode: http.StatusConflict, Reason: ReasonChangeInFlight,
				Message: fmt.Sprintf("the removal of the local member %s is under way: its gate stays drained", formatID(local))}
		}
	}
	s.endDrain(d, "undone by "+callerLock(r).Holder)
	g.Undrain()
	return http.StatusOK, s.gateStatus(), nil
}

// checkGateCaller refuses a drain or hold call whose caller does not hold
// the membership lock, under its own token: only the lock's holder keeps a
// member's clients away or waiting. The lock headers are required (unlike
// for membership changes, which the step record fences anyway).
//
// local reads the lock from the local member alone (a serializable read):
// a hold is taken right before a leader transfer while the clients wait,
// and a read across sites would add a round trip to that wait; a hold that
// passes on a read a moment old still ends within MaxClientHold. Otherwise
// the lock is read from the other voters when known: the local member may
// be applying its own removal, and etcd 3.6 crashes on a request then (etcd
// issue 21966).
func (s *Server) checkGateCaller(ctx context.Context, r *http.Request, local bool) *Error {
	caller := callerLock(r)
	if caller.Holder == "" {
		return badRequest(ReasonInvalidArgument, "the header %s is missing: only the membership lock's holder drains or holds a member's clients; take the lock (POST /v1/lock) and send %s and %s with the call",
			HeaderLockHolder, HeaderLockHolder, HeaderLockToken)
	}
	if e := validateName(HeaderLockHolder, caller.Holder); e != nil {
		return e
	}
	if _, e := lockTokenStart(HeaderLockToken, caller.Token, time.Now()); e != nil {
		return e
	}
	s.mu.Lock()
	c := s.peers
	s.mu.Unlock()
	var (
		kv  *mvccpb.KeyValue
		err error
	)
	switch {
	case local:
		kv, _, err = readLockAndStepWith(ctx, s.local, clientv3.WithSerializable())
	case c != nil:
		kv, _, err = readLockAndStepWith(ctx, c)
	default:
		kv, err = s.readLock(ctx)
	}
	if err != nil {
		return etcdError("reading the membership lock", err)
	}
	if kv == nil {
		return &Error{StatusCode: http.StatusConflict, Reason: ReasonLockNotHeld,
			Message: fmt.Sprintf("%q does not hold the membership lock (nobody does); only the lock's holder drains or holds a member's clients", caller.Holder)}
	}
	return s.lockRefusal(ctx, caller, kv)
}

// renewDrain puts a drain lease of d in force, or extends the one in force.
func (s *Server) renewDrain(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if s.drain == nil {
		l := &drainLease{since: now}
		l.timer = time.AfterFunc(d, func() { s.drainLapsed(l) })
		s.drain = l
	} else if !s.drain.final {
		s.drain.timer.Reset(d)
	}
	s.drain.until = now.Add(d)
}

// drainLapsed ends a drain whose lease ran out, once an observation shows
// the local member still in the cluster and its removal not under way
// (settleDrain); until then it looks again every second.
func (s *Server) drainLapsed(l *drainLease) {
	if s.background.Err() != nil {
		return
	}
	ctx, cancel := context.WithTimeout(s.background, s.cfg.RequestTimeout)
	defer cancel()
	if _, err := s.observe(ctx, observeOptions{health: true}); err != nil {
		s.log.Info("a drain's lease ended; the membership could not be read to end it, trying again", "error", err.Error())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.drain == l && !l.final {
		l.timer.Reset(time.Second)
	}
}

// settleDrain ends the drain in force when the observation v (begun at
// began; removing are the members whose removal is under way) shows that
// the removal it prepared will not come: its lease ran out, or the local
// member leads (a leader is removed only after leadership moved away, and
// a drained leader only keeps the clients from the member that leads). A
// drain whose member left the cluster becomes final.
func (s *Server) settleDrain(v *view, removing map[uint64]bool, began time.Time) {
	if s.cfg.ClientGate == nil || !s.drainCalls.TryLock() {
		return // a drain call runs: the next observation settles it
	}
	defer s.drainCalls.Unlock()
	s.mu.Lock()
	d, local := s.drain, s.localID
	s.mu.Unlock()
	if d == nil || d.final || began.Before(d.since) {
		return
	}
	var listed bool
	for _, m := range v.members {
		listed = listed || m.pb.ID == local
	}
	var why string
	switch {
	case local != 0 && !listed:
		s.mu.Lock()
		d.final = true
		d.timer.Stop()
		s.mu.Unlock()
		s.log.Info("the local member left the cluster: its gate stays drained")
		return
	case local != 0 && removing[local]:
		return // the removal the drain was for is under way
	case local != 0 && v.leaderID == local:
		why = "the local member leads"
	case time.Now().After(d.until):
		why = "its lease ran out without the member's removal"
	default:
		return
	}
	s.endDrain(d, why)
	s.cfg.ClientGate.Undrain()
}

// endDrain forgets the drain lease d, if it is still the one in force.
func (s *Server) endDrain(d *drainLease, why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if d == nil || s.drain != d {
		return
	}
	d.timer.Stop()
	s.drain = nil
	s.log.Info("drain of the local member's clients ended: its gate takes clients again", "reason", why)
	s.unmarkDrained()
}

// gateStatus is the gate's state with the drain in force.
func (s *Server) gateStatus() ClientGateStatus {
	g := s.cfg.ClientGate
	st := ClientGateStatus{Ready: g.Ready(), InFlight: g.InFlight()}
	s.mu.Lock()
	defer s.mu.Unlock()
	if d := s.drain; d != nil && !d.final {
		st.DrainSeconds = max(time.Until(d.until), 0).Seconds()
	}
	return st
}

// apiHold is a hold of the client gate put in force through the API.
type apiHold struct {
	until time.Time
	// release ends the gate's hold; nil until the gate's Hold returned.
	release func()
	// ended: the hold was ended before its release was known.
	ended bool
}

// endHold ends the hold h and forgets it, if it is still the one in force.
func (s *Server) endHold(h *apiHold) {
	s.mu.Lock()
	release := h.release
	h.ended = true
	if s.hold == h {
		s.hold = nil
	}
	s.mu.Unlock()
	if release != nil {
		release()
	}
}

// holdClients makes the local member's new reads and proposals wait (see
// clientgate.Gate.Hold) and answers once the proposals forwarded before
// have been answered. The hold ends at DELETE /v1/clients/hold or by itself
// after its seconds; it is not renewed: a hold while one is in force is
// refused, so no caller keeps the clients waiting past MaxClientHold.
func (s *Server) holdClients(r *http.Request) (int, any, *Error) {
	g := s.cfg.ClientGate
	if g == nil {
		return 0, nil, s.noGate()
	}
	var h ClientHold
	if e := decodeJSON(r, &h); e != nil {
		return 0, nil, e
	}
	// Checked as a number of seconds: a huge one would overflow the
	// conversion to a duration.
	if !(h.Seconds > 0 && h.Seconds <= MaxClientHold.Seconds()) {
		return 0, nil, badRequest(ReasonInvalidArgument, "seconds %v: a hold lasts more than 0 and at most %s", h.Seconds, MaxClientHold)
	}
	d := time.Duration(h.Seconds * float64(time.Second))
	var leader uint64
	if h.UntilLeader != "" {
		var err error
		if leader, err = strconv.ParseUint(h.UntilLeader, 16, 64); err != nil || leader == 0 {
			return 0, nil, badRequest(ReasonInvalidArgument, "untilLeader %q: want a member ID in hex, as the member list shows it", h.UntilLeader)
		}
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
	defer cancel()
	if e := s.checkGateCaller(ctx, r, true); e != nil {
		return 0, nil, e
	}
	s.mu.Lock()
	if cur := s.hold; cur != nil && time.Now().Before(cur.until) {
		s.mu.Unlock()
		left := time.Until(cur.until)
		return 0, nil, &Error{StatusCode: http.StatusConflict, Reason: ReasonHoldInForce, RetryAfter: max(left, time.Second),
			Message: fmt.Sprintf("a hold of the local member's clients is in force for %s more; a hold is not renewed (release it first, DELETE /v1/clients/hold), so that clients wait at most %s", left.Round(time.Millisecond), MaxClientHold)}
	}
	held := &apiHold{until: time.Now().Add(d)}
	s.hold = held
	s.mu.Unlock()
	release, err := g.Hold(r.Context(), d)
	s.mu.Lock()
	held.release = release
	ended := held.ended
	s.mu.Unlock()
	if ended {
		release() // released while the gate waited for the proposals in flight
	}
	// The hold ends by itself in the gate; forget it then too.
	time.AfterFunc(time.Until(held.until), func() { s.endHold(held) })
	if leader != 0 {
		go s.releaseOnLeader(func() { s.endHold(held) }, leader, d)
	}
	if err != nil {
		return 0, nil, &Error{StatusCode: http.StatusServiceUnavailable, Reason: ReasonEtcdUnavailable,
			Message: fmt.Sprintf("holding the clients of the local member (the hold stays until it ends by itself): %v", err)}
	}
	return http.StatusOK, ClientGateStatus{Ready: g.Ready(), InFlight: g.InFlight(), HeldSeconds: d.Seconds()}, nil
}

// releaseOnLeader ends the hold once the local member reports leader as
// its leader, or gives up when the hold ends by itself or the sidecar
// closes.
func (s *Server) releaseOnLeader(release func(), leader uint64, max time.Duration) {
	ctx, cancel := context.WithTimeout(s.background, max)
	defer cancel()
	tick := time.NewTicker(leaderPoll)
	defer tick.Stop()
	poll := localPoll{s: s}
	for {
		st, err := poll.status(ctx)
		if errors.Is(err, errLocalRemoving) {
			// The member leaves: its clients stay held until the hold ends
			// by itself, and it is not asked again.
			s.log.V(1).Info("the local member's removal is under way: no longer waiting for it to see the new leader", "leader", fmt.Sprintf("%x", leader))
			return
		}
		if err == nil && st.Leader == leader {
			s.log.V(1).Info("leader transfer seen by the local member: hold released", "leader", fmt.Sprintf("%x", leader))
			release()
			return
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return
		}
	}
}

// releaseClients ends the hold early; without one it does nothing.
func (s *Server) releaseClients(r *http.Request) (int, any, *Error) {
	g := s.cfg.ClientGate
	if g == nil {
		return 0, nil, s.noGate()
	}
	if e := noBody(r); e != nil {
		return 0, nil, e
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
	defer cancel()
	if e := s.checkGateCaller(ctx, r, true); e != nil {
		return 0, nil, e
	}
	s.mu.Lock()
	h := s.hold
	s.mu.Unlock()
	if h != nil {
		s.endHold(h)
	}
	return http.StatusOK, ClientGateStatus{Ready: g.Ready(), InFlight: g.InFlight()}, nil
}
