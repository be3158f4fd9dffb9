package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/validation"
	"github.com/druid-stretch/druid-stretch/internal/etcdview"
)

// EtcdScaleValidator is the validating webhook on the scale subresource of
// Etcds (kubectl scale etcd/x): druid's Etcd CRD maps it to spec.replicas,
// and no other webhook sees such a write. For an Etcd that uses
// druid-stretch's fields (inline, or in its EtcdMembership) the new
// replicas are judged with ValidateEtcdUpdate on the pair's view, as a
// change of spec.replicas written to the Etcd itself is: the bounds on
// replicas and on the ordinal range, learnerReplicas below replicas, and
// Retire with at least one replica. Other Etcds scale as druid lets them.
type EtcdScaleValidator struct {
	// Reader reads the Etcd and its EtcdMembership (the manager's API
	// reader: a cached pair could be older than the write judged).
	Reader client.Reader
}

// Handle admits one update of an Etcd's scale subresource.
func (v *EtcdScaleValidator) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Update || req.SubResource != "scale" {
		return admission.Allowed("only updates of the scale subresource are judged here")
	}
	scale := &autoscalingv1.Scale{}
	if err := json.Unmarshal(req.Object.Raw, scale); err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding the Scale: %w", err))
	}
	key := types.NamespacedName{Namespace: req.Namespace, Name: req.Name}
	p, err := etcdview.Get(ctx, v.Reader, key)
	if err != nil {
		if apierrors.IsNotFound(err) {
			return admission.Allowed(fmt.Sprintf("there is no Etcd %s", key))
		}
		// Failing closed: replicas judged without the pair could break
		// the bounds the pair sets.
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("reading the Etcd %s and its EtcdMembership to judge its scale: %w", key, err))
	}
	old := p.View
	if !old.UsesExtension() {
		return admission.Allowed(fmt.Sprintf("Etcd %s uses no druid-stretch extension field", key))
	}
	scaled := old.DeepCopy()
	scaled.Spec.Replicas = scale.Spec.Replicas
	errs := validation.ValidateEtcdUpdate(scaled, old)
	if len(errs) == 0 {
		return admission.Allowed("")
	}
	for _, err := range errs {
		err.Detail = fmt.Sprintf("%s (the scale subresource sets spec.replicas of Etcd %s to %d, judged with its druid-stretch fields)", err.Detail, key, scale.Spec.Replicas)
	}
	status := apierrors.NewInvalid(v1alpha1.GroupVersion.WithKind("Etcd").GroupKind(), req.Name, errs).ErrStatus
	return admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{Allowed: false, Result: &status}}
}
