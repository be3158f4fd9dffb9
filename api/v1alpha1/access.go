package v1alpha1

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

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
// lists, as ParseAllowedClients reads them; none when the annotation is
// absent or does not parse (the webhooks refuse such an Etcd).
func (e *Etcd) SidecarAllowedClients() []string {
	ids, err := ParseAllowedClients(e.Annotations[SidecarAllowedClientsAnnotation])
	if err != nil {
		return nil
	}
	return ids
}

// MaxClientIdentityLen bounds one client certificate identity.
const MaxClientIdentityLen = 253

// ParseAllowedClients reads a comma-separated list of client certificate
// identities (common name or SAN). It is the one reader of such a list:
// the webhooks judge SidecarAllowedClientsAnnotation and
// --sidecar-allowed-clients with it, and the sidecar parses its
// --allowed-client with it (AllowedClients), so an identity the webhooks
// admit never stops a sidecar at its start. Blanks around an entry are
// dropped; an empty entry, a blank or an invisible character inside one
// (newline, tab, no-break space, zero-width space), bytes that are not
// UTF-8 and an entry longer than MaxClientIdentityLen are errors naming
// the entry. Any other character, quotes and '=' included, is part of the
// identity, which the sidecar compares byte for byte with the
// certificate's.
func ParseAllowedClients(list string) ([]string, error) {
	if strings.TrimSpace(list) == "" {
		return nil, errors.New("no identity: want comma-separated client certificate identities (common name or SAN)")
	}
	var ids []string
	for i, id := range strings.Split(list, ",") {
		id = strings.TrimSpace(id)
		switch {
		case id == "":
			return nil, fmt.Errorf("entry %d is empty: want comma-separated client certificate identities (common name or SAN)", i)
		case !utf8.ValidString(id):
			return nil, fmt.Errorf("entry %d %q is not UTF-8: a certificate identity is text", i, id)
		case len(id) > MaxClientIdentityLen:
			return nil, fmt.Errorf("entry %d (%d bytes) is longer than %d bytes, the most a certificate identity may have here", i, len(id), MaxClientIdentityLen)
		case strings.ContainsFunc(id, func(r rune) bool { return unicode.IsSpace(r) || !unicode.IsGraphic(r) }):
			return nil, fmt.Errorf("entry %d %q has a blank or an invisible character inside: a certificate identity here has neither", i, id)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// AllowedClients is a list of client certificate identities as a command
// line flag (pflag's Value): each occurrence is read with
// ParseAllowedClients and appended, so the flag may be repeated or
// comma-separated. It is no API type: no deep copy is generated for it.
//
// +kubebuilder:object:generate=false
type AllowedClients []string

// Set appends the identities of one occurrence of the flag.
func (a *AllowedClients) Set(list string) error {
	ids, err := ParseAllowedClients(list)
	if err != nil {
		return err
	}
	*a = append(*a, ids...)
	return nil
}

// String is the list as the flag takes it.
func (a *AllowedClients) String() string { return strings.Join(*a, ",") }

// Type names the flag's value in help texts.
func (a *AllowedClients) Type() string { return "identities" }
