package migration

import (
	"fmt"
	"strings"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
)

// MovePhase is where a live move stands, as read from the two Etcd objects.
type MovePhase string

// The phases of a move, in order, then those of an abort. A phase ending in
// -ing has its step's fields set and waits for the controllers; the others
// are the points between steps.
const (
	// PhaseNotStarted: the source lists no destination member.
	PhaseNotStarted MovePhase = "NotStarted"
	// PhasePreparingSource: the source lists the destination's members; its
	// controller has not converged on that yet.
	PhasePreparingSource MovePhase = "PreparingSource"
	// PhaseSourcePrepared: the source's controller converged; the
	// destination has not joined.
	PhaseSourcePrepared MovePhase = "SourcePrepared"
	// PhaseJoiningDestination: the destination has replicas and the
	// source's members as external members; its members do not all vote yet.
	PhaseJoiningDestination MovePhase = "JoiningDestination"
	// PhaseDestinationJoined: the destination's first member votes (3+1).
	PhaseDestinationJoined MovePhase = "DestinationJoined"
	// PhaseRetiringSource: the destination has policy Retire; its
	// controller is moving the votes over.
	PhaseRetiringSource MovePhase = "RetiringSource"
	// PhaseSourceHeld: the destination's members all vote beside the
	// source members it holds back (spec.retainedExternalMembers) for the
	// clients still in the source site, until they are switched.
	PhaseSourceHeld MovePhase = "SourceHeld"
	// PhaseSourceRetired: the destination's members all vote and no source
	// member is left.
	PhaseSourceRetired MovePhase = "SourceRetired"
	// PhaseFinishing: the source has replicas 0; the external members are
	// being forgotten.
	PhaseFinishing MovePhase = "Finishing"
	// PhaseCompleted: the destination is an ordinary Etcd that holds the
	// cluster; the source has no replicas and no external members.
	PhaseCompleted MovePhase = "Completed"
	// PhaseAborting: the destination has replicas 0; its members are being
	// removed and the source's members restored.
	PhaseAborting MovePhase = "Aborting"
	// PhaseAborted: the source holds its members again and lists no
	// destination member; the destination has replicas 0.
	PhaseAborted MovePhase = "Aborted"
	// PhaseInconsistent: the two objects describe no state a move passes
	// through (Explain says why); nothing should be changed automatically.
	PhaseInconsistent MovePhase = "Inconsistent"
)

// Step is the step that leads out of the phase: the one under way for a
// phase ending in -ing, the next one otherwise; "" when none does.
func (p MovePhase) Step() Step {
	switch p {
	case PhaseNotStarted, PhasePreparingSource:
		return StepPrepareSource
	case PhaseSourcePrepared, PhaseJoiningDestination:
		return StepJoinDestination
	case PhaseDestinationJoined, PhaseRetiringSource:
		return StepRetireSource
	case PhaseSourceHeld:
		return StepSwitchClients
	case PhaseSourceRetired, PhaseFinishing:
		return StepFinish
	case PhaseAborting:
		return StepAbort
	}
	return ""
}

// Phase reads the state of the move of src to dst from the two objects
// alone: which step's fields are set, and whether the controllers report
// that step done. dst is nil when the destination Etcd does not exist; src
// may be nil once a completed move's source was deleted.
func Phase(src, dst *v1alpha1.Etcd) MovePhase {
	p, _ := phase(src, dst)
	return p
}

// Explain says in a sentence why the objects are in their phase, with the
// voter counts when known.
func Explain(src, dst *v1alpha1.Etcd) string {
	p, why := phase(src, dst)
	if s, d, ok := Voters(src, dst); ok {
		why += fmt.Sprintf(" (voters: %d source, %d destination)", s, d)
	}
	return string(p) + ": " + why
}

func phase(src, dst *v1alpha1.Etcd) (MovePhase, string) {
	idle := dst == nil || (dst.Spec.Replicas == 0 && len(dst.Spec.ExternalMembers) == 0)
	if src == nil {
		if !idle && len(dst.Spec.ExternalMembers) == 0 && Converged(dst) {
			return PhaseCompleted, "the source Etcd is gone and the destination holds the cluster"
		}
		return PhaseInconsistent, "there is no source Etcd"
	}
	switch {
	case dst != nil && dst.Spec.Replicas == 0 && len(dst.Spec.ExternalMembers) > 0:
		if len(src.Spec.ExternalMembers) == 0 && SourceRestored(src) {
			return PhaseAborted, fmt.Sprintf("the source holds its %d members again and the destination has none", src.Spec.Replicas)
		}
		return PhaseAborting, "the destination has replicas 0: its members leave and the source's come back"

	case src.Spec.Replicas == 0:
		if idle {
			return PhaseInconsistent, "the source has replicas 0 and there is no destination to hold the cluster"
		}
		if len(src.Spec.ExternalMembers) == 0 && len(dst.Spec.ExternalMembers) == 0 &&
			dst.Spec.GetExternalMembersPolicy() == v1alpha1.ExternalMembersPolicyKeep && Converged(dst) {
			return PhaseCompleted, fmt.Sprintf("the destination holds the cluster with %d members", dst.Spec.Replicas)
		}
		return PhaseFinishing, "the source has replicas 0; the external members are being forgotten" + pending(src, dst)

	case idle:
		switch {
		case len(src.Spec.ExternalMembers) == 0:
			return PhaseNotStarted, "the source lists no external member"
		case Converged(src):
			return PhaseSourcePrepared, fmt.Sprintf("the source knows the %d destination members as external", len(src.Spec.ExternalMembers))
		}
		return PhasePreparingSource, "the source lists the destination's members; its controller has not converged yet" + pending(src, nil)

	case len(dst.Spec.ExternalMembers) == 0:
		return PhaseInconsistent, fmt.Sprintf("the destination Etcd has %d replicas and no external members: it is a separate etcd cluster, not a part of the source's", dst.Spec.Replicas)

	case len(src.Spec.ExternalMembers) == 0:
		return PhaseInconsistent, "the destination lists the source's members, but the source does not list the destination's"

	case dst.Spec.GetExternalMembersPolicy() == v1alpha1.ExternalMembersPolicyRetire:
		if SourceRetired(dst) {
			return PhaseSourceRetired, fmt.Sprintf("the destination's %d members vote and no source member is left", dst.Spec.Replicas)
		}
		if SourceHeld(dst) {
			return PhaseSourceHeld, fmt.Sprintf("the destination's %d members vote; %d source member(s) stay for the source's clients until they are switched",
				dst.Spec.Replicas, dst.Spec.GetRetainedExternalMembers())
		}
		return PhaseRetiringSource, "the destination's controller moves the votes over" + pending(nil, dst)
	}
	if DestinationJoined(dst) {
		if l := dst.Spec.GetLearnerReplicas(); l > 0 {
			return PhaseDestinationJoined, fmt.Sprintf("the destination's %d member(s) vote beside the source's; %d more wait as learners", dst.Spec.Replicas-l, l)
		}
		return PhaseDestinationJoined, fmt.Sprintf("the destination's %d member(s) vote beside the source's", dst.Spec.Replicas)
	}
	return PhaseJoiningDestination, "the destination's members join" + pending(nil, dst)
}

// pending names what the controllers last reported, for Explain.
func pending(src, dst *v1alpha1.Etcd) string {
	var parts []string
	for _, e := range []struct {
		side string
		e    *v1alpha1.Etcd
	}{{"source", src}, {"destination", dst}} {
		if e.e == nil {
			continue
		}
		if s := ConditionSummary(e.e); s != "" {
			parts = append(parts, e.side+" "+s)
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return "; " + strings.Join(parts, "; ")
}

// ConditionSummary is the membership phase and the reason and message of
// the condition that explains it, in one line; "" before any observation.
func ConditionSummary(e *v1alpha1.Etcd) string {
	ms := e.Status.Membership
	if ms == nil {
		return "not observed yet"
	}
	s := string(ms.Phase)
	if ms.ObservedGeneration != e.Generation {
		s += fmt.Sprintf(" (observed generation %d of %d)", ms.ObservedGeneration, e.Generation)
	}
	for _, t := range []string{v1alpha1.ConditionMembershipDegraded, v1alpha1.ConditionMembershipProgressing, v1alpha1.ConditionMembershipConverged} {
		for _, c := range ms.Conditions {
			if c.Type == t && (c.Status == "True" || t == v1alpha1.ConditionMembershipConverged) {
				return fmt.Sprintf("%s, %s %s: %s", s, c.Type, c.Reason, c.Message)
			}
		}
	}
	return s
}
