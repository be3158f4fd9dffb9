package sidecar

import "strings"

// SetFenceHooks makes s run before and after around the fence's
// transaction of every change (either may be nil): a test changes the lock
// between the sidecar's check and the fence, or holds a recorded change in
// flight.
func SetFenceHooks(s *Server, before, after func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fenceHooks.before, s.fenceHooks.after = before, after
}

// PeerState is peerState for tests: whether a peer is active in the local
// member's transport and how often it was disconnected.
type PeerState struct {
	Active      bool
	Disconnects float64
}

// ParseTransport is parseTransport on a metrics text.
func ParseTransport(text string, local uint64) (map[uint64]PeerState, error) {
	got, err := parseTransport(strings.NewReader(text), local)
	if err != nil {
		return nil, err
	}
	out := map[uint64]PeerState{}
	for id, p := range got {
		out[id] = PeerState{Active: p.active, Disconnects: p.disconnects}
	}
	return out, nil
}

// LockKey is the etcd key of the membership lock, for tests that read the
// lock directly from etcd.
const LockKey = lockKey
