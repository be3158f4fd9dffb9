package v1alpha1

import "strings"

// SidecarAllowedClientsAnnotation lists, comma-separated, the client
// certificate identities (common name or SAN) that may change the
// membership through this Etcd's sidecars, beside the ones the webhook is
// configured with (--sidecar-allowed-clients): during a live move, the
// other cluster's controller.
const SidecarAllowedClientsAnnotation = "druid-stretch.druid.gardener.cloud/sidecar-allowed-clients"

// InsecurePlainHTTPSidecarAnnotation, set to "true", lets an Etcd without
// spec.backup.tls through the webhooks: its sidecars then serve plain HTTP
// and let every caller that reaches them change the membership. For tests
// on one machine only; no production Etcd may carry it.
const InsecurePlainHTTPSidecarAnnotation = "druid-stretch.druid.gardener.cloud/insecure-plain-http-sidecar-for-tests-only"

// InsecurePlainHTTPSidecar reports whether e opted into plain-HTTP sidecars
// (InsecurePlainHTTPSidecarAnnotation).
func (e *Etcd) InsecurePlainHTTPSidecar() bool {
	return e.Annotations[InsecurePlainHTTPSidecarAnnotation] == "true"
}

// SidecarAllowedClients are the identities SidecarAllowedClientsAnnotation
// lists, blanks dropped.
func (e *Etcd) SidecarAllowedClients() []string {
	var out []string
	for _, c := range strings.Split(e.Annotations[SidecarAllowedClientsAnnotation], ",") {
		if c = strings.TrimSpace(c); c != "" {
			out = append(out, c)
		}
	}
	return out
}
