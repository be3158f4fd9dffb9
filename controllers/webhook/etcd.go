package webhook

import (
	"context"
	"fmt"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/validation"
	"github.com/druid-stretch/druid-stretch/internal/etcdview"
)

// EtcdValidator is the validating webhook on Etcds: the extension fields
// are checked with ValidateEtcd on create and ValidateEtcdUpdate on update,
// and how the sidecars are reached with ValidateSidecarAccess (mutual TLS
// unless the Etcd opted into plain HTTP for tests).
// A refusal is an Invalid status whose causes name each offending field, as
// the API server's own validation answers.
//
// An update that removes the inline fields while no EtcdMembership carries
// them is refused where the Etcd's pods depend on them (lostFields).
type EtcdValidator struct {
	// Reader reads the Etcd's EtcdMembership and StatefulSet (the
	// manager's API reader).
	Reader client.Reader
	// Decoder decodes the admitted Etcd.
	Decoder admission.Decoder
}

// Handle admits one Etcd create or update.
func (v *EtcdValidator) Handle(ctx context.Context, req admission.Request) admission.Response {
	var errs field.ErrorList
	e := &v1alpha1.Etcd{}
	switch req.Operation {
	case admissionv1.Create:
		if err := v.Decoder.Decode(req, e); err != nil {
			return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding the Etcd: %w", err))
		}
		errs = append(validation.ValidateEtcd(e), validation.ValidateSidecarAccess(e)...)
	case admissionv1.Update:
		old := &v1alpha1.Etcd{}
		if err := v.Decoder.Decode(req, e); err != nil {
			return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding the Etcd: %w", err))
		}
		if err := v.Decoder.DecodeRaw(req.OldObject, old); err != nil {
			return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding the stored Etcd: %w", err))
		}
		errs = append(validation.ValidateEtcdUpdate(e, old), validation.ValidateSidecarAccess(e)...)
		if old.UsesExtension() && !e.UsesExtension() {
			m, err := etcdview.GetMembership(ctx, v.Reader, client.ObjectKeyFromObject(old))
			if err != nil {
				return admission.Errored(http.StatusInternalServerError, err)
			}
			lost, err := judgeLostFields(ctx, v.Reader, "this write of the Etcd", old, etcdview.Of(old, m).View, etcdview.Of(e, m).View)
			if err != nil {
				return admission.Errored(http.StatusInternalServerError, err)
			}
			if lost != "" {
				errs = append(errs, field.Forbidden(field.NewPath("spec"), lost))
			}
		}
	default:
		return admission.Allowed("only creates and updates are validated")
	}
	if len(errs) == 0 {
		return admission.Allowed("")
	}
	status := apierrors.NewInvalid(v1alpha1.GroupVersion.WithKind("Etcd").GroupKind(), req.Name, errs).ErrStatus
	return admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{Allowed: false, Result: &status}}
}
