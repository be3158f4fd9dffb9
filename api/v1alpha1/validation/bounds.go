package validation

import (
	"fmt"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/members"
)

// Bounds on the size of what an Etcd makes run. The StatefulSet's replicas
// follow the Etcd's pod window, which spans the ordinal range of the spec
// and of the members status.membership observed: without bounds, one typo
// in spec.ordinalStart would ask for millions of pods.
const (
	// MaxReplicas bounds spec.replicas of an Etcd that uses the extension:
	// etcd advises at most 7 voters, and a stretch or a move adds a few.
	MaxReplicas = 9
	// MaxOrdinal bounds ordinalStart+replicas: member and pod names stay
	// short, and the window of any move stays small.
	MaxOrdinal = 1000
	// MaxPodWindow bounds the pods the webhook puts an Etcd's StatefulSet
	// on: the old and the new ordinal range of a move, each at most
	// MaxReplicas.
	MaxPodWindow = 2 * MaxReplicas
)

// validateBounds bounds spec.replicas and the ordinal range.
func validateBounds(e *v1alpha1.Etcd) field.ErrorList {
	if !e.UsesExtension() {
		return nil
	}
	spec := field.NewPath("spec")
	var errs field.ErrorList
	if e.Spec.Replicas > MaxReplicas {
		errs = append(errs, field.Invalid(spec.Child("replicas"), e.Spec.Replicas, fmt.Sprintf(
			"must be between 0 and %d for an Etcd that uses druid-stretch: etcd advises at most 7 voters, and a move runs the old and the new range side by side", MaxReplicas)))
	}
	if end := int64(e.Spec.GetOrdinalStart()) + int64(e.Spec.Replicas); end > MaxOrdinal {
		errs = append(errs, field.Invalid(spec.Child("ordinalStart"), e.Spec.GetOrdinalStart(), fmt.Sprintf(
			"ordinalStart+replicas is %d; must be at most %d, so that the StatefulSet's ordinals stay in [0, %d)", end, MaxOrdinal, MaxOrdinal)))
	}
	return errs
}

// validateTransitions refuses the changes that would make the running
// cluster unsafe or the StatefulSet huge:
//
//   - spec.ordinalStart moving farther than spec.replicas: the pod window
//     spans the old and the new range until the move is done, so a jump
//     would start every pod in between. A longer move goes in steps.
//   - spec.externalMembersPolicy Retire to Keep while the controller is
//     retiring (status.membership.phase Reconfiguring or Blocked): some
//     external members are gone already, and Keep would leave the cluster
//     between the two sites with neither side owning the rest of the move.
//     Aborting (spec.replicas 0) and finishing (no external member left)
//     stay possible, and Keep once the phase is Converged.
func validateTransitions(newE, oldE *v1alpha1.Etcd) field.ErrorList {
	if !newE.UsesExtension() {
		return nil
	}
	spec := field.NewPath("spec")
	var errs field.ErrorList
	oldStart, newStart := int64(oldE.Spec.GetOrdinalStart()), int64(newE.Spec.GetOrdinalStart())
	if oldStart != newStart && oldE.Spec.Replicas > 0 && newE.Spec.Replicas > 0 {
		if d := max(newStart-oldStart, oldStart-newStart); d > int64(newE.Spec.Replicas) {
			errs = append(errs, field.Invalid(spec.Child("ordinalStart"), newStart, fmt.Sprintf(
				"may move by at most spec.replicas (%d) at a time, from %d to a value in [%d, %d]: the StatefulSet runs the old and the new range side by side until the move is done",
				newE.Spec.Replicas, oldStart, max(0, oldStart-int64(newE.Spec.Replicas)), oldStart+int64(newE.Spec.Replicas))))
		}
	}
	retiring := oldE.Spec.GetExternalMembersPolicy() == v1alpha1.ExternalMembersPolicyRetire &&
		newE.Spec.GetExternalMembersPolicy() == v1alpha1.ExternalMembersPolicyKeep
	if retiring && newE.Spec.Replicas > 0 && len(newE.Spec.ExternalMembers) > 0 && midMove(oldE) {
		errs = append(errs, field.Invalid(spec.Child("externalMembersPolicy"), newE.Spec.GetExternalMembersPolicy(), fmt.Sprintf(
			"may change from Retire to Keep only once status.membership.phase is %s (it is %s: the controller is retiring external members); allowed now: Retire, or Keep together with spec.replicas 0 (abort) or with no external member listed (finish)",
			v1alpha1.MembershipPhaseConverged, oldE.Status.Membership.Phase)))
	}
	return errs
}

// midMove reports whether e's controller is still taking steps.
func midMove(e *v1alpha1.Etcd) bool {
	ms := e.Status.Membership
	return ms != nil && (ms.Phase == v1alpha1.MembershipPhaseReconfiguring || ms.Phase == v1alpha1.MembershipPhaseBlocked)
}

// ValidatePodWindow refuses a pod window (spec and status together) larger
// than MaxPodWindow. The StatefulSet webhook applies it before it sets the
// StatefulSet's replicas from the window.
func ValidatePodWindow(e *v1alpha1.Etcd) error {
	w := members.PodWindow(e)
	if w.End-w.Start <= MaxPodWindow {
		return nil
	}
	return fmt.Errorf("the pod window %s of Etcd %s spans %d pods, more than %d (twice the most replicas): status.membership lists a local member far outside spec.ordinalStart's range; remove that member first",
		w, e.Name, w.End-w.Start, MaxPodWindow)
}
