package sidecar

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// ReasonNoClientGate: the sidecar runs no client gate (Config.ClientGate),
// so its member's clients cannot be drained or held; the caller goes on
// without (the member's clients then see what etcd gives them).
const ReasonNoClientGate = "NoClientGate"

// MaxClientHold bounds a hold of the member's clients: a hold covers one
// leader transfer (well under a second at 180 ms RTT), and a controller
// that dies holding it must not stall clients for longer.
const MaxClientHold = 5 * time.Second

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
}

// clientRoutes serves the client gate's endpoints.
func (s *Server) clientRoutes(mux *http.ServeMux) {
	s.handle(mux, "POST /v1/clients/drain", "drain_clients", true, s.drainClients)
	s.handle(mux, "POST /v1/clients/hold", "hold_clients", true, s.holdClients)
	s.handle(mux, "DELETE /v1/clients/hold", "release_clients", true, s.releaseClients)
}

func (s *Server) noGate() *Error {
	return &Error{StatusCode: http.StatusNotFound, Reason: ReasonNoClientGate,
		Message: "this sidecar runs no client gate in front of its etcd member (--client-gate-address)"}
}

// drainClients moves the local member's clients to other members (see
// clientgate.Gate.Drain) and answers once none is left: the member can be
// removed without failing a client's call.
func (s *Server) drainClients(r *http.Request) (int, any, *Error) {
	g := s.cfg.ClientGate
	if g == nil {
		return 0, nil, s.noGate()
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
	defer cancel()
	if err := g.Drain(ctx); err != nil {
		return 0, nil, &Error{StatusCode: http.StatusServiceUnavailable, Reason: ReasonEtcdUnavailable, RetryAfter: time.Second,
			Message: fmt.Sprintf("draining the clients of the local member: %v", err)}
	}
	return http.StatusOK, ClientGateStatus{Ready: g.Ready(), InFlight: g.InFlight()}, nil
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
