package webhook

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
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
// voters left on the other side may lose their quorum for good. Where
// nothing has observed the members yet, it refuses as well when the
// Etcd's spec says it could be stretched (unobservedDeletion). An Etcd
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
	view := etcdview.Of(e, m).View
	if msg := stretchedDeletion("Etcd", view); msg != "" {
		return admission.Denied(msg)
	}
	if e.DeletionTimestamp != nil {
		return admission.Allowed(fmt.Sprintf("the Etcd %s/%s is being deleted", e.Namespace, e.Name))
	}
	msg, err := judgeUnobserved(ctx, v.Reader, "Etcd", e, view)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	if msg != "" {
		return admission.Denied(msg)
	}
	return admission.Allowed("")
}

// handleDelete judges the deletion of an EtcdMembership: it drops
// druid-stretch's fields and status from its Etcd, so it is refused where
// deleting the Etcd would be (stretchedDeletion, unobservedDeletion), and where the Etcd's
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
	msg, err := judgeUnobserved(ctx, v.Reader, "EtcdMembership", e, before)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	if msg != "" {
		reasons = append(reasons, msg)
	}
	msg, err = judgeLostFields(ctx, v.Reader, "deleting the EtcdMembership "+key.String(), e, before, etcdview.Of(e, nil).View)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	if msg != "" {
		// The override works here too, and a refusal says how to mean it.
		reasons = append(reasons, msg+fmt.Sprintf("; to delete the EtcdMembership on purpose all the same, set the annotation %s: \"true\" on it first", DeleteStretchedAnnotation))
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

// unobservedDeletion is why deleting kind (the Etcd, or its
// EtcdMembership) of the view v is refused when nothing has observed the
// etcd cluster's members yet (status.membership missing, or listing no
// member) while v's durable spec says its members may vote beside others'
// (stretchSigns; sts is its StatefulSet as stored, nil when none):
// stretchedDeletion cannot tell, and a guess could take voters' pods away
// (a destination created with external members before its controller's
// first observation, a source whose EtcdMembership was recreated without
// status). "" when it was observed or nothing says it is stretched.
func unobservedDeletion(kind string, v *v1alpha1.Etcd, sts *appsv1.StatefulSet) string {
	st := v.Status.Membership
	if st != nil && len(st.Members) > 0 {
		return ""
	}
	signs := stretchSigns(v, sts)
	if len(signs) == 0 {
		return ""
	}
	outcome := "druid would delete their pods, and the others may lose their quorum"
	switch {
	case kind == "EtcdMembership":
		outcome = "the Etcd would lose druid-stretch's fields its members run by, and the others may lose their quorum"
	case v.Spec.Replicas == 0:
		outcome = "druid would delete the volumes their data is on, and the others may lose their quorum for good"
	}
	unknown := "status.membership is missing"
	if st != nil {
		unknown = fmt.Sprintf("status.membership lists no member (phase %q)", st.Phase)
	}
	return fmt.Sprintf("deleting the %s %s/%s is refused: %s: no observation of the etcd cluster's members, while Etcd %s's spec says its members may vote beside others' (%s); "+
		"%s. "+
		"Wait until the controller's first observation appears in the EtcdMembership's status "+
		"(kubectl get etcdmembership %s -n %s -o yaml shows status.membership.members), then delete again; "+
		"to delete on purpose, set the annotation %s: \"true\" on the %s first",
		kind, v.Namespace, v.Name, unknown, v.Name, strings.Join(signs, "; "), outcome, v.Name, v.Namespace, DeleteStretchedAnnotation, kind)
}

// stretchSigns are what in v's durable spec (and its StatefulSet sts, nil
// when none) says that its members may vote beside members it does not
// own: the notion of a live Etcd lostFields judges by (an Etcd that uses
// druid-stretch's fields, on a foreign pod window or mid-move), and what
// only a stretch needs: ordinals not from 0, names apart from another
// side's, druid's fields for joining another cluster, peer URLs another
// side reaches. None for an Etcd that is druid's alone, or one opted in on
// druid's own ordinals with none of these.
func stretchSigns(v *v1alpha1.Etcd, sts *appsv1.StatefulSet) []string {
	if !v.UsesExtension() {
		return nil
	}
	var why []string
	if m := moveUnderWay(v); m != "" {
		why = append(why, m)
	} else if n := len(v.Spec.ExternalMembers); n > 0 {
		why = append(why, fmt.Sprintf("it lists %d external member(s)", n))
	}
	if s := v.Spec.GetOrdinalStart(); s != 0 {
		why = append(why, fmt.Sprintf("its members are on ordinals from %d (spec.ordinalStart), not druid's own from 0", s))
	}
	if w, ok := foreignWindow(sts, v); ok {
		why = append(why, fmt.Sprintf("its StatefulSet %s runs on the pod window %s from ordinal %d", sts.Name, w, ordinalStart(sts)))
	}
	if p := v.Spec.MemberNamePrefix; p != nil && *p != "" {
		why = append(why, fmt.Sprintf("its member names carry the prefix %q (spec.memberNamePrefix), which keeps them apart from another side's", *p))
	}
	if b := v.Spec.Etcd.BootstrapWithExistingCluster; b != nil {
		why = append(why, fmt.Sprintf("it joins an existing etcd cluster (spec.etcd.bootstrapWithExistingCluster names %d member(s))", len(b.Members)))
	} else if b := v.Status.BootstrapWithExistingCluster; b != nil && len(b.Members) > 0 {
		why = append(why, fmt.Sprintf("druid recorded its join of an existing etcd cluster of %d member(s) (status.bootstrapWithExistingCluster)", len(b.Members)))
	}
	for _, urls := range []struct {
		field string
		n     int
	}{{"spec.etcd.additionalAdvertisePeerURLs", len(v.Spec.Etcd.AdditionalAdvertisePeerURLs)}, {"spec.additionalAdvertisePeerURLs", len(v.Spec.AdditionalAdvertisePeerURLs)}} {
		if urls.n > 0 {
			why = append(why, fmt.Sprintf("it gives %d member(s) further peer URLs (%s), by which another side reaches them", urls.n, urls.field))
		}
	}
	return why
}

// judgeUnobserved is unobservedDeletion for the stored Etcd e and its view
// v, reading e's StatefulSet only when nothing observed the members.
func judgeUnobserved(ctx context.Context, r client.Reader, kind string, e, v *v1alpha1.Etcd) (string, error) {
	if st := v.Status.Membership; (st != nil && len(st.Members) > 0) || !v.UsesExtension() {
		return "", nil
	}
	sts, err := storedStatefulSet(ctx, r, e)
	if err != nil {
		return "", err
	}
	return unobservedDeletion(kind, v, sts), nil
}
