package webhook

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	stretchv1alpha1 "github.com/druid-stretch/druid-stretch/api/stretch/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/members"
	"github.com/druid-stretch/druid-stretch/internal/etcdview"
)

// DeleteStretchedAnnotation, set to "true" on an Etcd (or on its
// EtcdMembership) before it is deleted, admits the deletion although the
// Etcd's members still vote beside members it does not own: the deliberate
// way out for disaster recovery, when the other side's members are to be
// given up or restored from a backup anyway.
const DeleteStretchedAnnotation = "druid-stretch.druid.gardener.cloud/delete-stretched"

// EtcdDeletionValidator is the validating webhook on Etcd deletions. It
// refuses to delete an Etcd whose members vote in an etcd cluster beside
// voters it does not own (one side of a stretched cluster, a move half
// done): druid deletes its StatefulSet, the members' pods go, and the
// voters left on the other side may lose their quorum for good. An Etcd
// that is not stretched, or whose members left the cluster, is deleted as
// before.
//
// It is registered without the Etcd validator's matchConditions: under
// druid's own Etcd CRD a stored Etcd carries none of druid-stretch's
// fields, so only its EtcdMembership says whether it is stretched.
type EtcdDeletionValidator struct {
	// Reader reads the Etcd's EtcdMembership (the manager's API reader).
	Reader client.Reader
	// Decoder decodes the Etcd being deleted.
	Decoder admission.Decoder
}

// Handle admits one Etcd deletion.
func (v *EtcdDeletionValidator) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Delete {
		return admission.Allowed("only deletions are judged here")
	}
	e := &v1alpha1.Etcd{}
	if err := v.Decoder.DecodeRaw(req.OldObject, e); err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding the Etcd being deleted: %w", err))
	}
	if e.Annotations[DeleteStretchedAnnotation] == "true" {
		return admission.Allowed(DeleteStretchedAnnotation + " is set: deleted on purpose")
	}
	m, err := etcdview.GetMembership(ctx, v.Reader, client.ObjectKeyFromObject(e))
	if err != nil {
		// Failing closed: without its EtcdMembership nothing says whether
		// the Etcd's members hold votes others depend on.
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("reading the EtcdMembership of Etcd %s/%s to judge its deletion: %w", e.Namespace, e.Name, err))
	}
	if msg := stretchedDeletion("Etcd", etcdview.Of(e, m).View); msg != "" {
		return admission.Denied(msg)
	}
	return admission.Allowed("")
}

// handleDelete judges the deletion of an EtcdMembership: it drops
// druid-stretch's fields and status from its Etcd, so it is refused where
// deleting the Etcd would be (stretchedDeletion), and where the Etcd's
// pods depend on the fields (lostFields). Once the Etcd is gone or going
// (the garbage collector deleting its dependents), nothing is judged: the
// Etcd's own deletion was.
func (v *EtcdMembershipValidator) handleDelete(ctx context.Context, req admission.Request) admission.Response {
	m := &stretchv1alpha1.EtcdMembership{}
	if err := v.Decoder.DecodeRaw(req.OldObject, m); err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding the EtcdMembership being deleted: %w", err))
	}
	if m.Annotations[DeleteStretchedAnnotation] == "true" {
		return admission.Allowed(DeleteStretchedAnnotation + " is set: deleted on purpose")
	}
	key := client.ObjectKeyFromObject(m)
	e := &v1alpha1.Etcd{}
	if err := v.Reader.Get(ctx, key, e); err != nil {
		if apierrors.IsNotFound(err) {
			return admission.Allowed(fmt.Sprintf("there is no Etcd %s: nothing depends on this EtcdMembership", key))
		}
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("reading the Etcd %s to judge the deletion of its EtcdMembership: %w", key, err))
	}
	if e.DeletionTimestamp != nil {
		return admission.Allowed(fmt.Sprintf("the Etcd %s is being deleted", key))
	}
	before := etcdview.Of(e, m).View
	var reasons []string
	if msg := stretchedDeletion("EtcdMembership", before); msg != "" {
		reasons = append(reasons, msg)
	}
	msg, err := judgeLostFields(ctx, v.Reader, "deleting the EtcdMembership "+key.String(), e, before, etcdview.Of(e, nil).View)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	if msg != "" {
		reasons = append(reasons, msg)
	}
	if len(reasons) > 0 {
		return admission.Denied(strings.Join(reasons, "; also, "))
	}
	return admission.Allowed("")
}

// stretchedDeletion is why deleting kind (the Etcd, or the EtcdMembership
// that carries its fields) of the view v is refused: v's last observation
// (status.membership) shows members of its own voting beside voters it
// does not own. "" when it is not stretched.
//
// An Etcd already scaled to zero no longer runs those members; deleting it
// takes their volumes away for good. That is refused only while they are
// at least as many as the others, which alone then have no quorum and
// need them back; with fewer, the others keep the quorum and remove the
// dead members themselves. This also admits the source of a finished
// move, whose last observation may predate its last member's removal: its
// controller loses sight of the cluster when its own members are removed.
func stretchedDeletion(kind string, v *v1alpha1.Etcd) string {
	st := v.Status.Membership
	if st == nil {
		return ""
	}
	var own, others []string
	for _, m := range st.Members {
		if !m.Votes() {
			continue
		}
		name := m.Name
		if name == "" {
			name = "unnamed member " + m.ID
		}
		if members.IsOwn(v, m) {
			own = append(own, name)
		} else {
			others = append(others, name)
		}
	}
	if len(own) == 0 || len(others) == 0 {
		return ""
	}
	if v.Spec.Replicas == 0 && len(others) > len(own) {
		return ""
	}
	outcome := fmt.Sprintf("the %d other voters, %d of %d, would lose their quorum for good", len(others), len(others), len(own)+len(others))
	if 2*len(others) > len(own)+len(others) {
		outcome = fmt.Sprintf("the cluster would keep %d dead voter(s) that nobody runs, fewer failures away from losing its quorum", len(own))
	}
	return fmt.Sprintf("deleting the %s %s/%s is refused: Etcd %s's members %s vote in an etcd cluster beside voters it does not own (%s), as status.membership last observed; "+
		"druid would delete their pods and %s. "+
		"Retire its members first: finish the move (the other side's externalMembersPolicy Retire takes their votes over, then scale this Etcd to 0) or abort it, "+
		"and delete once status.membership shows no member of this Etcd voting; "+
		"to give its members up on purpose (disaster recovery), set the annotation %s: \"true\" on the %s first",
		kind, v.Namespace, v.Name, v.Name, strings.Join(own, ", "), strings.Join(others, ", "), outcome, DeleteStretchedAnnotation, kind)
}
