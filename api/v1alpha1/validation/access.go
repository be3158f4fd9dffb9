package validation

import (
	"fmt"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
)

// MaxAllowedClients bounds the identities SidecarAllowedClientsAnnotation
// lists: the controllers of the clusters one etcd cluster spans, and an
// operator's tool.
const MaxAllowedClients = 16

// ValidateSidecarAccess checks what the membership sidecars of e are
// served with. The sidecar changes membership only over mutual TLS, and
// serves with spec.backup.tls (druid's TLS for backup-restore, which the
// sidecar sits beside): an Etcd that uses the extension without it is
// refused, unless it carries InsecurePlainHTTPSidecarAnnotation (tests
// only). The admission webhooks apply it; it is no part of ValidateEtcd,
// because druid's own examples and the controller's checks are about the
// spec, not about how the sidecar is reached.
func ValidateSidecarAccess(e *v1alpha1.Etcd) field.ErrorList {
	annotations := field.NewPath("metadata", "annotations")
	var errs field.ErrorList
	insecure, set := e.Annotations[v1alpha1.InsecurePlainHTTPSidecarAnnotation]
	if set && insecure != "true" {
		errs = append(errs, field.NotSupported(annotations.Key(v1alpha1.InsecurePlainHTTPSidecarAnnotation), insecure, []string{"true"}))
	}
	if e.Spec.Backup.TLS == nil && insecure != "true" {
		errs = append(errs, field.Required(field.NewPath("spec", "backup", "tls"), fmt.Sprintf(
			"the membership sidecar serves with spec.backup.tls and changes membership only over mutual TLS; set it (or, for tests on one machine only, the annotation %s: \"true\")",
			v1alpha1.InsecurePlainHTTPSidecarAnnotation)))
	}
	if raw, ok := e.Annotations[v1alpha1.SidecarAllowedClientsAnnotation]; ok {
		// The sidecar parses its --allowed-client with the same function:
		// what is admitted here starts every sidecar.
		path := annotations.Key(v1alpha1.SidecarAllowedClientsAnnotation)
		ids, err := v1alpha1.ParseAllowedClients(raw)
		switch {
		case err != nil:
			errs = append(errs, field.Invalid(path, raw, err.Error()))
		case len(ids) > MaxAllowedClients:
			errs = append(errs, field.TooMany(path, len(ids), MaxAllowedClients))
		}
	}
	return errs
}
