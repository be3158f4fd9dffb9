package sidecar

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
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
// for its leader: a Status call on the member's own host, cheap beside
// the transfer it waits for.
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
		lease = time.Duration(req.Seconds * float64(time.Second))
		if lease <= 0 || lease > MaxClientDrain {
			return 0, nil, &Error{StatusCode: http.StatusBadRequest, Reason: ReasonInvalidArgument,
				Message: fmt.Sprintf("seconds %v: a drain's lease lasts more than 0 and at most %s", req.Seconds, MaxClientDrain)}
		}
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
	defer cancel()
	s.drainCalls.Lock()
	defer s.drainCalls.Unlock()
	s.mu.Lock()
	renewal := s.drain != nil
	s.mu.Unlock()
	if req.Renew && !renewal {
		return 0, nil, &Error{StatusCode: http.StatusConflict, Reason: ReasonNotDrained,
			Message: "no drain is in force to renew: the sidecar ended it (its lease ran out, or the local member leads)"}
	}
	if renewal {
		// A renewal keeps a member from its clients past the lease its
		// drain was given: only the lock's holder decides that. (The
		// first drain is not checked: it comes right before the fenced
		// removal, on the step's path, and ends by itself.)
		if e := s.checkDrainCaller(ctx, r); e != nil {
			return 0, nil, e
		}
	}
	// The lease first: a drain that fails half-way leaves the gate
	// drained, and the lease is what reopens it.
	s.renewDrain(lease)
	if err := g.Drain(ctx); err != nil {
		return 0, nil, &Error{StatusCode: http.StatusServiceUnavailable, Reason: ReasonEtcdUnavailable, RetryAfter: time.Second,
			Message: fmt.Sprintf("draining the clients of the local member (the drain stays until its lease ends): %v", err)}
	}
	return http.StatusOK, s.gateStatus(), nil
}

// undrainClients answers DELETE /v1/clients/drain: the drain is undone
// (the removal it prepared did not happen) and the gate takes clients
// again, unless the member's removal is under way or done.
func (s *Server) undrainClients(r *http.Request) (int, any, *Error) {
	g := s.cfg.ClientGate
	if g == nil {
		return 0, nil, s.noGate()
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
	defer cancel()
	s.drainCalls.Lock()
	defer s.drainCalls.Unlock()
	// Sending the clients back to a member that another controller may be
	// about to remove would fail their calls: only the lock's holder.
	if e := s.checkDrainCaller(ctx, r); e != nil {
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
	s.endDrain(d, "undone by "+cmp.Or(callerLock(r).Holder, "a caller without the lock headers"))
	g.Undrain()
	return http.StatusOK, s.gateStatus(), nil
}

// checkDrainCaller refuses a caller that names itself as lock holder but
// does not hold the lock. Without the lock headers nothing is checked (an
// operator with curl), as for membership changes. The lock is read from
// the other voters when known: the local member may be applying its own
// removal, and etcd 3.6 crashes on a request then (etcd issue 21966).
func (s *Server) checkDrainCaller(ctx context.Context, r *http.Request) *Error {
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
	s.mu.Lock()
	c := s.peers
	s.mu.Unlock()
	var (
		kv  *mvccpb.KeyValue
		err error
	)
	if c != nil {
		kv, _, err = readLockAndStepWith(ctx, c)
	} else {
		kv, err = s.readLock(ctx)
	}
	if err != nil {
		return etcdError("reading the membership lock", err)
	}
	if kv == nil {
		return &Error{StatusCode: http.StatusConflict, Reason: ReasonLockNotHeld,
			Message: fmt.Sprintf("%q does not hold the membership lock (nobody does); a drain is renewed or undone only by the lock's holder", caller.Holder)}
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

// holdClients makes the local member's new reads and proposals wait (see
// clientgate.Gate.Hold) and answers once the proposals forwarded before
// have been answered. The hold ends at DELETE /v1/clients/hold or by itself.
func (s *Server) holdClients(r *http.Request) (int, any, *Error) {
	g := s.cfg.ClientGate
	if g == nil {
		return 0, nil, s.noGate()
	}
	var h ClientHold
	if err := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 1<<10)).Decode(&h); err != nil {
		return 0, nil, &Error{StatusCode: http.StatusBadRequest, Reason: ReasonMalformedRequest, Message: "the body must be {\"seconds\": N, \"untilLeader\": \"<member ID>\"}: " + err.Error()}
	}
	d := time.Duration(h.Seconds * float64(time.Second))
	if d <= 0 || d > MaxClientHold {
		return 0, nil, &Error{StatusCode: http.StatusBadRequest, Reason: ReasonInvalidArgument,
			Message: fmt.Sprintf("seconds %v: a hold lasts more than 0 and at most %s", h.Seconds, MaxClientHold)}
	}
	var leader uint64
	if h.UntilLeader != "" {
		var err error
		if leader, err = strconv.ParseUint(h.UntilLeader, 16, 64); err != nil || leader == 0 {
			return 0, nil, &Error{StatusCode: http.StatusBadRequest, Reason: ReasonInvalidArgument,
				Message: fmt.Sprintf("untilLeader %q: want a member ID in hex, as the member list shows it", h.UntilLeader)}
		}
	}
	release, err := g.Hold(r.Context(), d)
	s.mu.Lock()
	s.releaseHold = release
	s.mu.Unlock()
	if leader != 0 {
		go s.releaseOnLeader(release, leader, d)
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
	for {
		st, err := pb.NewMaintenanceClient(s.local.ActiveConnection()).Status(ctx, &pb.StatusRequest{})
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
func (s *Server) releaseClients(*http.Request) (int, any, *Error) {
	g := s.cfg.ClientGate
	if g == nil {
		return 0, nil, s.noGate()
	}
	s.mu.Lock()
	release := s.releaseHold
	s.releaseHold = nil
	s.mu.Unlock()
	if release != nil {
		release()
	}
	return http.StatusOK, ClientGateStatus{Ready: g.Ready(), InFlight: g.InFlight()}, nil
}
