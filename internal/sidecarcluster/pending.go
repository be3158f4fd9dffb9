package sidecarcluster

import (
	"strings"
	"time"

	"github.com/druid-stretch/druid-stretch/internal/peerurl"
	"github.com/druid-stretch/druid-stretch/internal/planner"
)

// Pending is a step whose call failed so that its effect is unknown: the
// sidecar answered 5xx, or the answer never came. The caller keeps it (the
// controller in status.membership.lastStep) and passes it to Plan until it
// settles, so that nothing else is done from a view that may not show it yet.
type Pending struct {
	Step planner.Step
	// At is when the call ended.
	At time.Time
}

// Settled reports whether an observation settles u: it shows the step's
// effect (applied is then true), or it was made at least Settle after the
// call, long enough for etcd to have applied or dropped the proposal.
func (c *Cluster) Settled(u Pending, obs *Observation) (settled, applied bool) {
	if effectVisible(u.Step, obs) {
		return true, true
	}
	return obs.At.Sub(u.At) >= c.cfg.Settle, false
}

// effectVisible reports whether the observation shows what the step does.
func effectVisible(s planner.Step, obs *Observation) bool {
	find := func() bool {
		for _, m := range obs.List.Members {
			if (s.ID != "" && strings.EqualFold(m.ID, s.ID)) || (s.ID == "" && s.Member != "" && m.Name == s.Member) {
				return true
			}
		}
		return false
	}
	switch s.Kind {
	case planner.AddLearner:
		for _, m := range obs.List.Members {
			if peerurl.Shares(m.PeerURLs, s.PeerURLs) {
				return true
			}
		}
		return false
	case planner.Remove:
		return !find()
	case planner.Promote, planner.MoveLeader:
		for _, m := range obs.List.Members {
			if (s.ID != "" && strings.EqualFold(m.ID, s.ID)) || (s.ID == "" && m.Name == s.Member) {
				if s.Kind == planner.Promote {
					return !m.IsLearner
				}
				return m.IsLeader
			}
		}
		// A member that is gone cannot be promoted or lead any more: the
		// step is moot, and the next plan starts from what is there.
		return true
	}
	return true
}
