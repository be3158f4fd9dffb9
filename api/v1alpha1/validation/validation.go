// Package validation checks the druid-stretch extension of an Etcd in Go:
// the same rules the CRD enforces with OpenAPI and CEL, with a message per
// offending list element. It backs the validating webhook and lets gardenlet
// check an Etcd before it writes it. druid's own fields are left to druid's
// CRD rules, but for the additional peer URLs, which the controller and the
// webhook act on (package peerurls).
package validation

import (
	"fmt"
	"regexp"
	"strings"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/members"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/peerurls"
)

// The patterns are the CRD's, character for character (a test checks the
// generated CRD contains them): Go and the apiserver both use RE2.
const (
	// MemberNamePattern is an RFC 1123 subdomain, the form of druid's member
	// and lease names.
	MemberNamePattern = `^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	// MemberURLPattern is an etcd member URL as etcd accepts it:
	// http(s)://host:port, no path. Hosts must be lowercase so that two
	// spellings of one URL cannot both pass the duplicate checks.
	MemberURLPattern = `^https?://` + hostPattern + `:` + portPattern + `$`
	// SidecarURLPattern is a base URL with an optional port and path.
	SidecarURLPattern = `^https?://` + hostPattern + `(:` + portPattern + `)?(/[-a-zA-Z0-9._~/]*)?$`

	hostPattern = `([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*|\[[0-9a-f:.]+\])`
	portPattern = `([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])`
)

// Limits, the CRD's maxItems and maxLength.
const (
	MaxExternalMembers = 10
	MaxMemberURLs      = 5
	MaxMemberNameLen   = 253
	MaxURLLen          = 256
)

var (
	memberNameRE = regexp.MustCompile(MemberNamePattern)
	memberURLRE  = regexp.MustCompile(MemberURLPattern)
	sidecarURLRE = regexp.MustCompile(SidecarURLPattern)
)

// ValidateEtcd checks the extension fields of e and how they fit druid's
// fields (replicas, memberNamePrefix, peerUrlTls, additionalAdvertisePeerURLs).
// It is the CRD's rules plus three the CRD does not express: an external
// peer URL must not be the in-cluster peer URL of a local pod, which depends
// on the namespace (CEL sees only metadata.name); the bounds on replicas and
// the ordinal range (bounds.go), which apply only to Etcds that use the
// extension (druid's own Etcds keep druid's rules); and the additional peer
// URLs as package peerurls reads them, one entry per member.
func ValidateEtcd(e *v1alpha1.Etcd) field.ErrorList {
	errs := append(ValidateCRDRules(e), validateInClusterPeerURLs(e)...)
	errs = append(errs, validateAdvertisedPeerURLs(e)...)
	return append(errs, validateBounds(e)...)
}

// validateAdvertisedPeerURLs checks druid's additional peer URLs as the
// controller and the webhook read them (package peerurls): each entry
// names a local member, once, with URLs of the peer TLS scheme. druid's CEL
// rules refuse the first and the last too; a duplicate entry only this
// rule refuses (druid would take the first silently).
func validateAdvertisedPeerURLs(e *v1alpha1.Etcd) field.ErrorList {
	_, errs := peerurls.Read(e)
	return errs
}

// ValidateCRDRules are the rules of ValidateEtcd that the CRD enforces too
// (all but the namespace-dependent peer URL rule). They are exported for the
// CRD tests in the root module, which check that Go and the CRD agree.
func ValidateCRDRules(e *v1alpha1.Etcd) field.ErrorList {
	spec := field.NewPath("spec")
	var errs field.ErrorList

	if e.Spec.OrdinalStart != nil && *e.Spec.OrdinalStart < 0 {
		errs = append(errs, field.Invalid(spec.Child("ordinalStart"), *e.Spec.OrdinalStart,
			"must be greater than or equal to 0: it is the StatefulSet's spec.ordinals.start"))
	}
	if r := e.Spec.RetainedExternalMembers; r != nil && (*r < 0 || *r > MaxExternalMembers) {
		errs = append(errs, field.Invalid(spec.Child("retainedExternalMembers"), *r,
			fmt.Sprintf("must be between 0 and %d (the most external members an Etcd lists): it is how many external members the Retire policy leaves voting", MaxExternalMembers)))
	}
	if l := e.Spec.LearnerReplicas; l != nil && *l < 0 {
		errs = append(errs, field.Invalid(spec.Child("learnerReplicas"), *l,
			"must be greater than or equal to 0: it is how many local members stay learners"))
	} else if l != nil && *l > 0 && *l >= e.Spec.Replicas {
		errs = append(errs, field.Invalid(spec.Child("learnerReplicas"), *l,
			fmt.Sprintf("must be less than spec.replicas (%d): at least one local member votes, the others may wait as learners", e.Spec.Replicas)))
	}
	errs = append(errs, validatePolicy(e, spec.Child("externalMembersPolicy"))...)
	errs = append(errs, validateExternalMembers(e, spec.Child("externalMembers"))...)
	return errs
}

func validatePolicy(e *v1alpha1.Etcd, path *field.Path) field.ErrorList {
	p := e.Spec.ExternalMembersPolicy
	if p == nil {
		return nil
	}
	switch *p {
	case v1alpha1.ExternalMembersPolicyKeep:
		return nil
	case v1alpha1.ExternalMembersPolicyRetire:
		if e.Spec.Replicas < 1 {
			return field.ErrorList{field.Invalid(path, *p,
				"Retire moves every vote to the local members, so spec.replicas must be at least 1")}
		}
		return nil
	default:
		return field.ErrorList{field.NotSupported(path, *p,
			[]string{string(v1alpha1.ExternalMembersPolicyKeep), string(v1alpha1.ExternalMembersPolicyRetire)})}
	}
}

func validateExternalMembers(e *v1alpha1.Etcd, path *field.Path) field.ErrorList {
	ext := e.Spec.ExternalMembers
	var errs field.ErrorList
	if len(ext) > MaxExternalMembers {
		errs = append(errs, field.TooMany(path, len(ext), MaxExternalMembers))
	}

	wantScheme, tlsState := "http://", "is not set"
	if e.Spec.Etcd.PeerUrlTLS != nil {
		wantScheme, tlsState = "https://", "is set"
	}
	localURLs := map[string]string{}  // peer URL -> local member advertising it
	advertised, _ := peerurls.Read(e) // its errors are ValidateEtcd's
	for _, m := range advertised.Members() {
		for _, u := range m.URLs {
			localURLs[u] = m.Name
		}
	}
	names := map[string]int{}
	peerOwner := map[string]string{} // peer URL -> first external member listing it
	local := members.LocalOrdinals(e)

	for i, m := range ext {
		mp := path.Index(i)
		errs = append(errs, validateMemberName(m.Name, mp.Child("name"))...)
		if first, dup := names[m.Name]; dup {
			errs = append(errs, duplicate(mp.Child("name"), m.Name,
				fmt.Sprintf("also the name of spec.externalMembers[%d]", first)))
		} else {
			names[m.Name] = i
		}
		if o, ok := members.NameOrdinal(e, m.Name); ok && local.Contains(o) {
			errs = append(errs, duplicate(mp.Child("name"), m.Name, fmt.Sprintf(
				"the name of the local member of ordinal %d (local ordinals are [%d, %d)): an external member must not take a local member's name",
				o, local.Start, local.End)))
		}

		pp := mp.Child("peerURLs")
		errs = append(errs, validateURLList(m.PeerURLs, pp, true)...)
		for j, u := range m.PeerURLs {
			up := pp.Index(j)
			if !strings.HasPrefix(u, wantScheme) {
				errs = append(errs, field.Invalid(up, u, fmt.Sprintf(
					"must use %s because spec.etcd.peerUrlTls %s: every member of one etcd cluster speaks the same peer protocol", wantScheme, tlsState)))
			}
			if owner, taken := peerOwner[u]; taken && owner != m.Name {
				errs = append(errs, duplicate(up, u, fmt.Sprintf(
					"also a peer URL of external member %s: a peer URL must belong to one member only", owner)))
			} else if !taken {
				peerOwner[u] = m.Name
			}
			if lm, taken := localURLs[u]; taken {
				errs = append(errs, duplicate(up, u, fmt.Sprintf(
					"advertised by local member %s in spec.etcd.additionalAdvertisePeerURLs: a peer URL must belong to one member only", lm)))
			}
		}
		errs = append(errs, validateURLList(m.ClientURLs, mp.Child("clientURLs"), false)...)
		if m.SidecarURL != "" {
			errs = append(errs, validateURL(m.SidecarURL, mp.Child("sidecarURL"), sidecarURLRE,
				"must be an http:// or https:// URL with a lowercase host, an optional port in 1-65535, an optional path and no query or fragment")...)
		}
	}
	return errs
}

// validateInClusterPeerURLs refuses an external peer URL that is the
// address druid gives one of the local pods behind its peer service,
// <scheme>://<pod>.<etcd>-peer.<namespace>.svc:<port>, unless that pod's
// member has additional peer URLs. Two clusters that run the same Etcd in
// the same namespace (a Gardener shoot namespace is named alike in every
// seed) give pods with the same name the same in-cluster URL, and etcd
// refuses a member whose peer URL another member has. A local member with
// additional peer URLs is added with those alone and advertises those alone
// (the controller and the sidecar leave the taken URL out), as GEP-39's
// destination does with its member name prefix and ordinals from 0; without
// them, only different ordinal ranges (spec.ordinalStart) keep the URLs
// apart.
func validateInClusterPeerURLs(e *v1alpha1.Etcd) field.ErrorList {
	if e.Namespace == "" {
		return nil
	}
	advertised, _ := peerurls.Read(e) // its errors are ValidateEtcd's
	local := members.LocalOrdinals(e)
	prefix := members.PeerScheme(e) + "://"
	suffix := fmt.Sprintf(".%s:%d", members.PeerServiceDomain(e), members.PeerPort(e))
	var errs field.ErrorList
	for i, m := range e.Spec.ExternalMembers {
		for j, u := range m.PeerURLs {
			host, ok := strings.CutPrefix(u, prefix)
			if !ok {
				continue
			}
			pod, ok := strings.CutSuffix(host, suffix)
			if !ok {
				continue
			}
			o, ok := members.PodOrdinal(e, pod)
			if !ok || !local.Contains(o) {
				continue
			}
			name := members.MemberName(e, o)
			if a, ok := advertised.Member(name); ok && len(a.URLs) > 0 {
				continue
			}
			errs = append(errs, duplicate(field.NewPath("spec", "externalMembers").Index(i).Child("peerURLs").Index(j), u, fmt.Sprintf(
				"the in-cluster peer URL of local pod %s, and etcd refuses a peer URL that another member has: give member %s an additional peer URL (spec.etcd.additionalAdvertisePeerURLs), which it then advertises instead, or give the two clusters different ordinal ranges (spec.ordinalStart)", pod, name)))
		}
	}
	return errs
}

// duplicate is field.Duplicate with the reason, which field.Duplicate alone
// does not carry.
func duplicate(path *field.Path, value any, detail string) *field.Error {
	err := field.Duplicate(path, value)
	err.Detail = detail
	return err
}

func validateMemberName(name string, path *field.Path) field.ErrorList {
	switch {
	case name == "":
		return field.ErrorList{field.Required(path, "the etcd member name of the external member")}
	case len(name) > MaxMemberNameLen:
		return field.ErrorList{field.TooLong(path, name, MaxMemberNameLen)}
	case !memberNameRE.MatchString(name):
		return field.ErrorList{field.Invalid(path, name, "must be a lowercase RFC 1123 subdomain, as etcd-druid's member and lease names are")}
	}
	return nil
}

const memberURLReason = "must be an http:// or https:// URL scheme://host:port with a lowercase host, a port in 1-65535 and no path, as etcd takes member URLs"

func validateURLList(urls []string, path *field.Path, required bool) field.ErrorList {
	var errs field.ErrorList
	if required && len(urls) == 0 {
		errs = append(errs, field.Required(path, "at least one URL: etcd reaches a member at its peer URLs"))
	}
	if len(urls) > MaxMemberURLs {
		errs = append(errs, field.TooMany(path, len(urls), MaxMemberURLs))
	}
	seen := map[string]bool{}
	for j, u := range urls {
		errs = append(errs, validateURL(u, path.Index(j), memberURLRE, memberURLReason)...)
		if seen[u] {
			errs = append(errs, duplicate(path.Index(j), u, "listed twice"))
		}
		seen[u] = true
	}
	return errs
}

func validateURL(u string, path *field.Path, re *regexp.Regexp, reason string) field.ErrorList {
	if len(u) > MaxURLLen {
		return field.ErrorList{field.TooLong(path, u, MaxURLLen)}
	}
	if !re.MatchString(u) {
		return field.ErrorList{field.Invalid(path, u, reason)}
	}
	return nil
}

// ValidateEtcdUpdate checks newE as ValidateEtcd does, plus the changes that
// would break the running cluster:
//
//   - spec.externalMembers[].peerURLs of a member listed before under the
//     same name: etcd knows a member by its peer URLs and the planner matches
//     observed members to listed ones by name and peer URL, so a changed URL
//     would make the controller treat a different member as the listed one.
//     A member's URLs change by removing it and adding it under a new name.
//   - spec.memberNamePrefix (druid's rule, repeated here because local
//     member names derive from it): renaming would orphan every running
//     local member.
//   - dropping an external member that status shows as a voter while the
//     Etcd has replicas (ownership.go).
//
// Mutable on purpose, within the bounds of validateTransitions (bounds.go):
// spec.ordinalStart (a live move of the local members to a new ordinal
// range, by at most spec.replicas at a time), spec.externalMembersPolicy
// (Keep to Retire finishes a move, Retire to Keep stops retiring once the
// controller converged; removed members stay removed), and adding or
// removing external members. Toggling spec.etcd.peerUrlTls while
// external members are listed is refused by the scheme rule together with
// the peer URL rule above.
func ValidateEtcdUpdate(newE, oldE *v1alpha1.Etcd) field.ErrorList {
	errs := append(ValidateEtcd(newE), ValidateUpdateRules(newE, oldE)...)
	errs = append(errs, validateTransitions(newE, oldE)...)
	return append(errs, validateNoOrphanedVoter(newE, oldE)...)
}

// ValidateUpdateRules are the immutability rules of ValidateEtcdUpdate; the
// CRD enforces them too, and the CRD tests compare both.
func ValidateUpdateRules(newE, oldE *v1alpha1.Etcd) field.ErrorList {
	var errs field.ErrorList
	spec := field.NewPath("spec")

	if !apiequality.Semantic.DeepEqual(newE.Spec.MemberNamePrefix, oldE.Spec.MemberNamePrefix) {
		errs = append(errs, field.Invalid(spec.Child("memberNamePrefix"), newE.Spec.MemberNamePrefix,
			"is immutable: local member names derive from it, and renaming would orphan the running members"))
	}
	for i, m := range newE.Spec.ExternalMembers {
		old, ok := oldE.Spec.ExternalMember(m.Name)
		if !ok || members.SameURLs(m.PeerURLs, old.PeerURLs) {
			continue
		}
		errs = append(errs, field.Invalid(spec.Child("externalMembers").Index(i).Child("peerURLs"), m.PeerURLs, fmt.Sprintf(
			"peerURLs of listed external member %s cannot change (were %v): etcd knows a member by its peer URLs, so remove the member and add it again under a new name",
			m.Name, old.PeerURLs)))
	}
	return errs
}
