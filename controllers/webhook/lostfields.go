package webhook

import (
	"context"
	"fmt"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/members"
)

// lostFields is why write, which leaves the pair's view after without
// druid-stretch's fields where before had them, is refused: the Etcd's
// StatefulSet (sts, as stored; nil when there is none) runs on a pod
// window other than druid's own [0, replicas), or a move is under way.
// Without the fields, druid's next write of the StatefulSet would put the
// pods on ordinals from 0 without the sidecar: the StatefulSet webhook
// refuses that write (and druid stalls), and a StatefulSet druid creates
// anew would stop the members' pods. "" when nothing depends on the
// fields.
func lostFields(write string, before, after *v1alpha1.Etcd, sts *appsv1.StatefulSet) string {
	if !before.UsesExtension() || after.UsesExtension() {
		return ""
	}
	var why []string
	if w, ok := foreignWindow(sts, before); ok {
		why = append(why, fmt.Sprintf("its StatefulSet %s runs druid-stretch's sidecar on the pod window %s from ordinal %d, not on druid's own ordinals [0, %d)",
			sts.Name, w, ordinalStart(sts), before.Spec.Replicas))
	}
	if m := moveUnderWay(before); m != "" {
		why = append(why, m)
	}
	if len(why) == 0 {
		return ""
	}
	return fmt.Sprintf("%s would leave Etcd %s/%s without druid-stretch's fields (spec.ordinalStart, spec.externalMembers, spec.externalMembersPolicy) while %s: "+
		"druid's next write of the StatefulSet would put its pods on ordinals from 0 without the sidecar, stopping the members' pods. "+
		"Keep the fields; to hand the Etcd back to druid, finish or abort the move and move its members to ordinals from 0 first "+
		"(spec.ordinalStart 0, by at most spec.replicas at a time)",
		write, before.Namespace, before.Name, strings.Join(why, ", and "))
}

// foreignWindow is the pod window druid-stretch put sts on
// (PodWindowAnnotation), and whether it differs from druid's own: ordinals
// [0, replicas) of e, from ordinal 0. A StatefulSet without the annotation
// runs as druid wrote it (or was handed back to druid on purpose).
func foreignWindow(sts *appsv1.StatefulSet, e *v1alpha1.Etcd) (string, bool) {
	if sts == nil {
		return "", false
	}
	a, ok := sts.Annotations[PodWindowAnnotation]
	if !ok {
		return "", false
	}
	w, err := members.ParseOrdinals(a)
	own := members.Ordinals{End: int64(e.Spec.Replicas)}.Union(members.Ordinals{})
	return a, err != nil || w != own || ordinalStart(sts) != 0
}

// moveUnderWay says why e is in the middle of a move or a stretch: it
// lists external members while it runs members of its own, or its
// controller is taking steps. "" when it is not.
func moveUnderWay(e *v1alpha1.Etcd) string {
	if n := len(e.Spec.ExternalMembers); n > 0 && e.Spec.Replicas > 0 {
		return fmt.Sprintf("it lists %d external member(s) beside its %d replicas (a stretch or a move under way)", n, e.Spec.Replicas)
	}
	if ms := e.Status.Membership; ms != nil && (ms.Phase == v1alpha1.MembershipPhaseReconfiguring || ms.Phase == v1alpha1.MembershipPhaseBlocked) {
		return fmt.Sprintf("its controller is changing the membership (status.membership.phase %s)", ms.Phase)
	}
	return ""
}

// storedStatefulSet reads druid's StatefulSet of e through r: nil when
// there is none or e does not control the one of its name.
func storedStatefulSet(ctx context.Context, r client.Reader, e *v1alpha1.Etcd) (*appsv1.StatefulSet, error) {
	sts := &appsv1.StatefulSet{}
	if err := r.Get(ctx, client.ObjectKeyFromObject(e), sts); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading the StatefulSet of Etcd %s/%s: %w", e.Namespace, e.Name, err)
	}
	if !metav1.IsControlledBy(sts, e) {
		return nil, nil
	}
	return sts, nil
}

// judgeLostFields is lostFields for a write that changes the pair of the
// stored Etcd e from before to after (views), reading e's StatefulSet
// only when the write drops the fields.
func judgeLostFields(ctx context.Context, r client.Reader, write string, e, before, after *v1alpha1.Etcd) (string, error) {
	if !before.UsesExtension() || after.UsesExtension() {
		return "", nil
	}
	sts, err := storedStatefulSet(ctx, r, e)
	if err != nil {
		return "", err
	}
	return lostFields(write, before, after, sts), nil
}
