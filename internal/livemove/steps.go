package livemove

import (
	move "github.com/druid-stretch/druid-stretch/api/v1alpha1/migration"
)

// ClientSwitch is when a move switches the source site's clients.
type ClientSwitch int

const (
	// NoClientSwitch: Options.SwitchClients is unset; retire-source follows
	// the join.
	NoClientSwitch ClientSwitch = iota
	// SwitchBeforeRetire: switch-clients comes before retire-source.
	SwitchBeforeRetire
	// SwitchWhenHeld (Options.HoldSource): retire-source comes first and
	// stops at the held source members; switch-clients then releases them.
	SwitchWhenHeld
)

// ClientSwitch is when this Mover switches the source site's clients.
func (m *Mover) ClientSwitch() ClientSwitch {
	switch {
	case m.o.SwitchClients == nil:
		return NoClientSwitch
	case m.o.HoldSource > 0:
		return SwitchWhenHeld
	}
	return SwitchBeforeRetire
}

// Remaining are the steps Move runs from phase p to the end of the move, in
// order: the one under way (or next), then the rest, with switch-clients
// where sw puts it while that is still ahead. Empty once the move
// completed; nil for a phase Move refuses to continue from (aborting,
// aborted, inconsistent).
func Remaining(p move.MovePhase, sw ClientSwitch) []move.Step {
	all := []move.Step{move.StepPrepareSource, move.StepJoinDestination}
	switch sw {
	case SwitchBeforeRetire:
		all = append(all, move.StepSwitchClients, move.StepRetireSource)
	case SwitchWhenHeld:
		all = append(all, move.StepRetireSource, move.StepSwitchClients)
	default:
		all = append(all, move.StepRetireSource)
	}
	all = append(all, move.StepFinish)
	from := func(s move.Step) []move.Step {
		for i, x := range all {
			if x == s {
				return all[i:]
			}
		}
		return nil
	}
	switch p {
	case move.PhaseNotStarted, move.PhasePreparingSource:
		return from(move.StepPrepareSource)
	case move.PhaseSourcePrepared, move.PhaseJoiningDestination:
		return from(move.StepJoinDestination)
	case move.PhaseDestinationJoined:
		if sw == SwitchBeforeRetire {
			return from(move.StepSwitchClients)
		}
		return from(move.StepRetireSource)
	case move.PhaseRetiringSource:
		return from(move.StepRetireSource)
	case move.PhaseSourceHeld:
		// The destination holds source members back for the clients still
		// in the source site; switching them releases those members.
		return []move.Step{move.StepSwitchClients, move.StepFinish}
	case move.PhaseSourceRetired, move.PhaseFinishing:
		return from(move.StepFinish)
	case move.PhaseCompleted:
		return []move.Step{}
	}
	return nil
}

// RemainingAbort are the steps Abort runs from phase p: abort, or none
// once the move is aborted.
func RemainingAbort(p move.MovePhase) []move.Step {
	if p == move.PhaseAborted {
		return []move.Step{}
	}
	return []move.Step{move.StepAbort}
}

// Describe says what a step changes and what it waits for.
func Describe(s move.Step) string {
	switch s {
	case move.StepPrepareSource:
		return "the source lists the destination's members as external members (policy Keep); waits for the source's controller to converge"
	case move.StepJoinDestination:
		return "creates the destination Etcd (or sets its replicas) with the source's members as external members (with --hold-source warm: its final replicas, all but its first member as learners); waits until its members joined as learners and vote"
	case move.StepSwitchClients:
		return "runs --switch-clients-command: the source site's clients move to the destination. By default before any source member goes: it first warms the destination (its final replicas, all but its first member as learners: spec.learnerReplicas), whose learners catch up meanwhile. With --hold-source once the destination holds the majority; the held source members go after it"
	case move.StepRetireSource:
		return "sets the destination's policy to Retire; waits until the votes moved and the source's members are removed (with --hold-source: all but the held ones)"
	case move.StepFinish:
		return "sets the source to replicas 0 and has both Etcds forget the external members"
	case move.StepAbort:
		return "sets the destination to replicas 0; waits until its members are removed and the source holds its members alone"
	}
	return ""
}

// RemainingSteps are the steps Move runs from phase p (Remaining with this
// Mover's ClientSwitch); for a GEP-39 move, its stages, with switch-clients
// before EtcdMigrationComplete when there is a switch. A GEP-39 move reads
// no phase: each stage that is done already ends at once.
func (m *Mover) RemainingSteps(p move.MovePhase) []move.Step {
	if m.o.GEP39 == nil {
		return Remaining(p, m.ClientSwitch())
	}
	steps := []move.Step{move.Step(move.StageSourceEtcdPreparedForPeerJoin), move.Step(move.StageDestinationEtcdPeersJoined)}
	if m.o.SwitchClients != nil {
		steps = append(steps, move.StepSwitchClients)
	}
	return append(steps, move.Step(move.StageEtcdMigrationComplete), move.Step(move.StageSourceSeedCleanup))
}
