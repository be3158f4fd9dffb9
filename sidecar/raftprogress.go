package sidecar

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
)

// raftProgress is the local member's raft status as etcd publishes it on
// its client port (/debug/vars, "raft.status"): on a leader, how far each
// member's log matches its own and in which state its raft sends to it.
// A member's poll tells whether it serves clients; only the leader's
// progress tells whether its raft runs while it does not (a voter promoted
// right after a snapshot join serves clients only once etcd retried its
// publish, several seconds after it votes).
type raftProgress struct {
	id, lead uint64
	state    string // raft's StateLeader, StateFollower, ...
	commit   uint64
	members  map[uint64]memberProgress
}

// memberProgress is the leader's progress of one member.
type memberProgress struct {
	match uint64
	state string // raft's StateProbe, StateReplicate, StateSnapshot
}

// leads tells whether the status is that of a leader, as raft itself says.
func (p *raftProgress) leads() bool {
	return p != nil && p.state == "StateLeader" && p.id != 0 && p.lead == p.id
}

// replicating tells whether the leader's raft sends member id the log
// entry by entry (StateReplicate: it acknowledged what it was sent, and
// raft falls back to probing a member that rejects an append or that its
// transport reports unreachable), with its log matching at least 90 % of
// the leader's commit (the share etcd's own promotion check asks of a
// learner).
func (p *raftProgress) replicating(id uint64) bool {
	if !p.leads() {
		return false
	}
	pr, ok := p.members[id]
	return ok && pr.state == "StateReplicate" && pr.match*10 >= p.commit*9
}

// behind tells whether the leader's raft has member id's log below 90 % of
// its own: etcd's own test before it promotes a learner (its leader's
// isLearnerReady compares the two match indexes), which refuses the
// promotion meanwhile. False when this is no leader's status or the member
// is not in it: that is not known here.
func (p *raftProgress) behind(id uint64) bool {
	if !p.leads() {
		return false
	}
	pr, ok := p.members[id]
	own := p.members[p.id]
	return ok && own.match > 0 && pr.match*10 < own.match*9
}

// readRaftProgress reads the local member's raft status from its
// /debug/vars. It asks the member's HTTP handler for a published variable
// only: no etcd request that could meet the member's own removal.
func (s *Server) readRaftProgress(ctx context.Context) (*raftProgress, error) {
	body, err := s.getLocal(ctx, "/debug/vars", "the local member's raft status")
	if err != nil {
		return nil, err
	}
	defer func() { _ = body.Close() }()
	return parseRaftProgress(io.LimitReader(body, 4<<20))
}

// parseRaftProgress reads etcd's /debug/vars document and returns its
// "raft.status" (raft's Status.MarshalJSON: member IDs in hex).
func parseRaftProgress(r io.Reader) (*raftProgress, error) {
	var vars struct {
		Raft *struct {
			ID        string `json:"id"`
			Lead      string `json:"lead"`
			RaftState string `json:"raftState"`
			Commit    uint64 `json:"commit"`
			Progress  map[string]struct {
				Match uint64 `json:"match"`
				State string `json:"state"`
			} `json:"progress"`
		} `json:"raft.status"`
	}
	if err := json.NewDecoder(r).Decode(&vars); err != nil {
		return nil, fmt.Errorf("parsing the local member's raft status: %w", err)
	}
	if vars.Raft == nil {
		return nil, fmt.Errorf("parsing the local member's raft status: /debug/vars has no raft.status (the member's raft has not started)")
	}
	hex := func(what, s string) (uint64, error) {
		id, err := strconv.ParseUint(s, 16, 64)
		if err != nil {
			return 0, fmt.Errorf("parsing the local member's raft status: %s %q is not a hex member ID", what, s)
		}
		return id, nil
	}
	out := &raftProgress{state: vars.Raft.RaftState, commit: vars.Raft.Commit, members: map[uint64]memberProgress{}}
	var err error
	if out.id, err = hex("id", vars.Raft.ID); err != nil {
		return nil, err
	}
	if out.lead, err = hex("lead", vars.Raft.Lead); err != nil {
		return nil, err
	}
	for k, v := range vars.Raft.Progress {
		id, err := hex("progress", k)
		if err != nil {
			return nil, err
		}
		out.members[id] = memberProgress{match: v.Match, state: v.State}
	}
	return out, nil
}
