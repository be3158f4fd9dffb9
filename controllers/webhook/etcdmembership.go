package webhook

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	stretchv1alpha1 "github.com/druid-stretch/druid-stretch/api/stretch/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/validation"
	"github.com/druid-stretch/druid-stretch/internal/etcdview"
)

// EtcdMembershipValidator is the validating webhook on EtcdMemberships. It
// judges the EtcdMembership together with the Etcd of its name, as the
// controller will plan the pair, with the rules the Etcd validator applies
// to an Etcd that carries the same fields inline: ValidateEtcd on create,
// ValidateEtcdUpdate against the stored EtcdMembership on update (the
// ordinal range moves by at most spec.replicas, Retire turns back to Keep
// only once converged, no external member that still votes is dropped),
// and ValidateSidecarAccess. Under druid's own Etcd CRD the Etcd validator
// never sees druid-stretch's fields, so this is where a bad change of them
// is refused before anything is planned.
//
// Its deletion is judged as the Etcd's would be (EtcdDeletionValidator):
// it drops the Etcd's fields and status. Neither its deletion nor an update
// may leave a live Etcd without druid-stretch's fields while its pods run
// on a pod window only those fields explain, or mid-move (lostFields).
//
// An EtcdMembership written before its Etcd exists (the order in which a
// move creates the pair, so that druid's first StatefulSet already gets the
// ordinal range) is judged by its CRD's rules alone; the StatefulSet
// webhook and the controller judge the pair once the Etcd exists.
//
// Those transitions read status.membership (Retire to Keep once Converged,
// dropping an external member once it no longer votes), so a status a user
// wrote would unlock them: status.membership is the controller's alone. A
// write of the status subresource that changes it is admitted only from
// StatusWriters, the identity the webhook's own process runs as (the
// controller's) and the ones configured (--membership-status-writers).
type EtcdMembershipValidator struct {
	// Reader reads the Etcd of the EtcdMembership's name (the manager's
	// API reader: a cached Etcd could be older than the write judged).
	Reader client.Reader
	// Decoder decodes the admitted EtcdMembership.
	Decoder admission.Decoder
	// StatusWriters are the user names that may change status.membership.
	StatusWriters []string
}

// Handle admits one EtcdMembership create, update or deletion.
func (v *EtcdMembershipValidator) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.Operation == admissionv1.Delete {
		return v.handleDelete(ctx, req)
	}
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return admission.Allowed("only creates, updates and deletions are validated")
	}
	if req.SubResource == "status" {
		return v.judgeStatus(req)
	}
	m := &stretchv1alpha1.EtcdMembership{}
	if err := v.Decoder.Decode(req, m); err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding the EtcdMembership: %w", err))
	}
	e := &v1alpha1.Etcd{}
	if err := v.Reader.Get(ctx, client.ObjectKey{Namespace: req.Namespace, Name: req.Name}, e); err != nil {
		if apierrors.IsNotFound(err) {
			return admission.Allowed(fmt.Sprintf("there is no Etcd %s/%s yet: the pair is judged once it exists", req.Namespace, req.Name))
		}
		// Failing closed: a change judged without its Etcd could be one
		// the rules refuse.
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("reading the Etcd %s/%s to judge its EtcdMembership with: %w", req.Namespace, req.Name, err))
	}
	stored := e.DeepCopy()
	// The EtcdMembership's fields are judged, not an inline copy on an Etcd
	// of an earlier release (which the controller copies over them).
	e.Spec.MembershipSpec = v1alpha1.MembershipSpec{}
	old := &stretchv1alpha1.EtcdMembership{}
	var lost string
	if req.Operation == admissionv1.Update {
		if err := v.Decoder.DecodeRaw(req.OldObject, old); err != nil {
			return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding the stored EtcdMembership: %w", err))
		}
		var err error
		lost, err = judgeLostFields(ctx, v.Reader, "this write of the EtcdMembership", stored, etcdview.Of(stored, old).View, etcdview.Of(stored, m).View)
		if err != nil {
			return admission.Errored(http.StatusInternalServerError, err)
		}
	}
	oldView, _ := stretchv1alpha1.View(e, old)
	// A write paired with a new spec.replicas of the Etcd, written right
	// after it, is judged with those replicas: the pair as it is about to
	// be (a warm destination gets its learners and its replicas at once).
	paired := e.DeepCopy()
	if a := m.Annotations[stretchv1alpha1.PairedReplicasAnnotation]; a != "" && a != old.Annotations[stretchv1alpha1.PairedReplicasAnnotation] {
		r, err := stretchv1alpha1.ParsePairedReplicas(a)
		if err != nil {
			return admission.Denied(err.Error())
		}
		paired.Spec.Replicas = r
	}
	view, _ := stretchv1alpha1.View(paired, m)
	var errs field.ErrorList
	if req.Operation == admissionv1.Create {
		errs = validation.ValidateEtcd(view)
	} else {
		errs = validation.ValidateEtcdUpdate(view, oldView)
	}
	if view.UsesExtension() {
		errs = append(errs, validation.ValidateSidecarAccess(view)...)
	}
	// GEP-39's own fields on the Etcd and druid-stretch's here must say
	// the same of the source's members.
	errs = append(errs, stretchv1alpha1.Conflicts(paired, &m.Spec.MembershipSpec)...)
	if lost != "" {
		errs = append(errs, field.Forbidden(field.NewPath("spec"), lost))
	}
	if len(errs) == 0 {
		return admission.Allowed("")
	}
	for _, err := range errs {
		err.Detail = fmt.Sprintf("%s (judged with the Etcd %s/%s)", err.Detail, req.Namespace, req.Name)
	}
	status := apierrors.NewInvalid(stretchv1alpha1.GroupVersion.WithKind("EtcdMembership").GroupKind(), req.Name, errs).ErrStatus
	return admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{Allowed: false, Result: &status}}
}

// judgeStatus admits a write of the status subresource: any that leaves
// status.membership as it is (conditions, observed generation), and one
// that changes it only from StatusWriters.
func (v *EtcdMembershipValidator) judgeStatus(req admission.Request) admission.Response {
	m, old := &stretchv1alpha1.EtcdMembership{}, &stretchv1alpha1.EtcdMembership{}
	if err := v.Decoder.Decode(req, m); err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding the EtcdMembership: %w", err))
	}
	if err := v.Decoder.DecodeRaw(req.OldObject, old); err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding the stored EtcdMembership: %w", err))
	}
	if equality.Semantic.DeepEqual(m.Status.Membership, old.Status.Membership) {
		return admission.Allowed("status.membership is unchanged")
	}
	if slices.Contains(v.StatusWriters, req.UserInfo.Username) {
		return admission.Allowed("")
	}
	return admission.Denied(fmt.Sprintf("status.membership of EtcdMembership %s/%s is written by druid-stretch's controller only (%s), not by %q: "+
		"the webhooks let spec changes through by it (externalMembersPolicy Retire to Keep once Converged, dropping an external member once it no longer votes). "+
		"To let another identity write it, list it in the controller's --membership-status-writers (chart value webhook.membershipStatusWriters)",
		req.Namespace, req.Name, strings.Join(v.StatusWriters, ", "), req.UserInfo.Username))
}
