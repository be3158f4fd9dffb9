// Package peerurls reads the peer URLs that an Etcd's local members
// advertise besides druid's in-cluster one, from whichever of druid's
// fields carries them, into one form: per local member name, its URLs and
// whether they replace the in-cluster URL. Every reader in druid-stretch
// (the controller, the webhook, validation) goes through it, so that a
// change of druid's API changes this package only.
//
// druid has two shapes of the field:
//
//   - spec.etcd.additionalAdvertisePeerURLs: [{memberName, urls}], druid
//     v0.38.1 (the API this module pins). The URLs come after the in-cluster
//     URL.
//   - spec.etcd.additionalAdvertisedURLs.peerURLs: {overrideDefaultURL,
//     members: [{name, urls}]}, druid#1438 (druid's master, not released),
//     which removes the first. With overrideDefaultURL the members listed
//     advertise their URLs only.
//
// In both an entry names the etcd member, [<memberNamePrefix>-]<pod name>,
// as druid's CEL rules demand. (druid v0.38.1 looks the entries up by pod
// name, so with a prefix it never finds them; druid-stretch's sidecar
// advertises them anyway. druid#1438 looks them up by member name.)
//
// druid admits an entry only for the ordinals 0..spec.replicas-1 (a CEL
// rule on its Etcd), so the members of a range that starts later (a move's
// destination with spec.ordinalStart in the source's shoot namespace) list
// theirs in druid-stretch's own spec.additionalAdvertisePeerURLs, an
// EtcdMembership's field of druid v0.38.1's shape. Its URLs come after the
// in-cluster URL too; a member has one entry across all fields.
package peerurls

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/members"
)

// Member is what one local member advertises besides druid's default.
type Member struct {
	// Name is the etcd member name.
	Name string
	// URLs are the member's additional peer URLs, in spec order.
	URLs []string
	// ReplacesDefault says the member advertises URLs only, without druid's
	// in-cluster peer URL (druid#1438's overrideDefaultURL).
	ReplacesDefault bool
}

// Advertised are an Etcd's additional peer URLs by local member name. The
// zero value lists none: every member advertises druid's in-cluster URL
// only.
type Advertised struct {
	members []Member // in ordinal order
}

// Members are the local members with additional peer URLs, in ordinal order.
func (a Advertised) Members() []Member { return slices.Clone(a.members) }

// Member is the entry of the local member name, if it has one.
func (a Advertised) Member(name string) (Member, bool) {
	i := slices.IndexFunc(a.members, func(m Member) bool { return m.Name == name })
	if i < 0 {
		return Member{}, false
	}
	return a.members[i], true
}

// PeerURLs are the peer URLs druid makes e's local member memberName, in
// pod podName, advertise: its in-cluster peer URL unless its entry replaces
// it, then the entry's URLs.
func (a Advertised) PeerURLs(e *v1alpha1.Etcd, memberName, podName string) []string {
	m, ok := a.Member(memberName)
	if !ok {
		return []string{members.InClusterPeerURL(e, podName)}
	}
	if m.ReplacesDefault {
		return slices.Clone(m.URLs)
	}
	return append([]string{members.InClusterPeerURL(e, podName)}, m.URLs...)
}

// LocalPeerURLs is PeerURLs for e, in the form package members renders
// peers and initial clusters with.
func (a Advertised) LocalPeerURLs(e *v1alpha1.Etcd) members.LocalPeerURLs {
	return func(memberName, podName string) []string { return a.PeerURLs(e, memberName, podName) }
}

// Paths of the two shapes and of druid-stretch's own field, for the errors.
var (
	v0381Path = field.NewPath("spec", "etcd", "additionalAdvertisePeerURLs")
	pr1438    = field.NewPath("spec", "etcd", "additionalAdvertisedURLs")
	ownPath   = field.NewPath("spec", "additionalAdvertisePeerURLs")
)

// Read reads the field e's Go type carries, druid v0.38.1's
// spec.etcd.additionalAdvertisePeerURLs, with druid-stretch's own
// spec.additionalAdvertisePeerURLs (an EtcdMembership's) for the members
// druid's field cannot hold. Errors name the offending field; the entries
// that have none are still returned.
func Read(e *v1alpha1.Etcd) (Advertised, field.ErrorList) {
	entries := make([]entry, 0, len(e.Spec.Etcd.AdditionalAdvertisePeerURLs))
	for i, a := range e.Spec.Etcd.AdditionalAdvertisePeerURLs {
		p := v0381Path.Index(i)
		entries = append(entries, entry{name: a.MemberName, urls: a.URLs, namePath: p.Child("memberName"), urlsPath: p.Child("urls")})
	}
	return convert(e, append(entries, own(e)...), false)
}

// own are the entries of druid-stretch's spec.additionalAdvertisePeerURLs.
// Each must name a member at an ordinal from spec.replicas on: druid
// admits the others in its own field, and renders them into the
// configuration its pods start with, where an entry here would not reach.
func own(e *v1alpha1.Etcd) []entry {
	out := make([]entry, 0, len(e.Spec.AdditionalAdvertisePeerURLs))
	for i, a := range e.Spec.AdditionalAdvertisePeerURLs {
		p := ownPath.Index(i)
		out = append(out, entry{name: a.MemberName, urls: a.URLs, namePath: p.Child("memberName"), urlsPath: p.Child("urls"), own: true})
	}
	return out
}

// ReadJSON reads the peer URLs of the Etcd whose JSON, as stored, is
// etcdJSON (an admission request's object, an unstructured read), and
// which decodes to e: druid#1438's spec.etcd.additionalAdvertisedURLs,
// which e's Go type drops, or, when the JSON has none, what Read reads. The
// names, ordinals, prefix and peer TLS it checks against are e's.
func ReadJSON(e *v1alpha1.Etcd, etcdJSON []byte) (Advertised, field.ErrorList) {
	var stored struct {
		Spec struct {
			Etcd struct {
				AdditionalAdvertisedURLs *AdditionalAdvertiseURLsSpec `json:"additionalAdvertisedURLs"`
			} `json:"etcd"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(etcdJSON, &stored); err != nil {
		return Advertised{}, field.ErrorList{field.Invalid(pr1438, "", fmt.Sprintf("the Etcd's JSON does not decode as druid#1438's shape: %v", err))}
	}
	spec := stored.Spec.Etcd.AdditionalAdvertisedURLs
	if spec == nil {
		return Read(e)
	}
	if len(e.Spec.Etcd.AdditionalAdvertisePeerURLs) > 0 {
		return Advertised{}, field.ErrorList{field.Forbidden(pr1438,
			"is set together with spec.etcd.additionalAdvertisePeerURLs: druid#1438 replaces that field, so the peer URLs would depend on which druid reads the Etcd; set one of them")}
	}
	entries, replaces, errs := entriesOf1438(spec)
	if errs != nil {
		return Advertised{}, errs
	}
	return convert(e, append(entries, own(e)...), replaces)
}

// FromAdditionalAdvertisedURLs reads druid#1438's field as given: the peer
// URLs of e's local members; the client URLs are not read.
func FromAdditionalAdvertisedURLs(e *v1alpha1.Etcd, spec *AdditionalAdvertiseURLsSpec) (Advertised, field.ErrorList) {
	entries, replaces, errs := entriesOf1438(spec)
	if errs != nil || entries == nil {
		return Advertised{}, errs
	}
	return convert(e, entries, replaces)
}

// entriesOf1438 are the entries of druid#1438's field, and whether they
// replace druid's in-cluster URL.
func entriesOf1438(spec *AdditionalAdvertiseURLsSpec) ([]entry, bool, field.ErrorList) {
	if spec == nil || spec.PeerURLs == nil {
		return nil, false, nil
	}
	peers := spec.PeerURLs
	path := pr1438.Child("peerURLs")
	replaces := peers.OverrideDefaultURL != nil && *peers.OverrideDefaultURL
	if len(peers.Members) == 0 {
		// druid's CEL rules ask for one member at least (MinItems=1).
		return nil, false, field.ErrorList{field.Required(path.Child("members"), "at least one member: druid#1438 requires one when peerURLs is set")}
	}
	entries := make([]entry, 0, len(peers.Members))
	for i, m := range peers.Members {
		p := path.Child("members").Index(i)
		entries = append(entries, entry{name: m.Name, urls: m.URLs, namePath: p.Child("name"), urlsPath: p.Child("urls")})
	}
	return entries, replaces, nil
}

// entry is one member's entry in any of the fields, with where it is.
type entry struct {
	name               string
	urls               []string
	namePath, urlsPath *field.Path
	// own: the entry is druid-stretch's (spec.additionalAdvertisePeerURLs),
	// not druid's.
	own bool
}

// convert checks the entries against e and keeps those without errors:
// each names a local member (one of the ordinal range), once across all
// fields, druid-stretch's own entries only members from spec.replicas on,
// and lists at least one URL of the scheme of e's peer TLS. replaces is
// druid#1438's overrideDefaultURL, for druid's entries.
func convert(e *v1alpha1.Etcd, entries []entry, replaces bool) (Advertised, field.ErrorList) {
	wantScheme, tlsState := members.PeerScheme(e)+"://", "is not set"
	if e.Spec.Etcd.PeerUrlTLS != nil {
		tlsState = "is set"
	}
	local := members.LocalOrdinals(e)
	first := map[string]*field.Path{}
	var errs field.ErrorList
	var out []Member
	for _, en := range entries {
		var bad field.ErrorList
		if o, ok := members.NameOrdinal(e, en.name); en.name == "" {
			bad = append(bad, field.Required(en.namePath, "the etcd member name, [<memberNamePrefix>-]<etcd name>-<ordinal>"))
		} else if !ok || !local.Contains(o) {
			bad = append(bad, field.Invalid(en.namePath, en.name, noLocalMember(e, en.name)))
		} else if en.own && o < int64(e.Spec.Replicas) {
			bad = append(bad, field.Invalid(en.namePath, en.name, fmt.Sprintf(
				"names a member at ordinal %d, below spec.replicas (%d): its entry belongs in druid's %s, which druid renders into the configuration its pod starts with", o, e.Spec.Replicas, v0381Path)))
		}
		if p, dup := first[en.name]; dup && en.name != "" {
			d := field.Duplicate(en.namePath, en.name)
			d.Detail = fmt.Sprintf("also %s: a member has one entry, and druid would take the first silently", p)
			bad = append(bad, d)
		} else {
			first[en.name] = en.namePath
		}
		if len(en.urls) == 0 {
			bad = append(bad, field.Required(en.urlsPath, "at least one URL: an entry without URLs advertises nothing"))
		}
		for j, u := range en.urls {
			if !strings.HasPrefix(u, wantScheme) {
				bad = append(bad, field.Invalid(en.urlsPath.Index(j), u, fmt.Sprintf(
					"must use %s because spec.etcd.peerUrlTls %s: every member of one etcd cluster speaks the same peer protocol", wantScheme, tlsState)))
			} else if _, _, err := ParseFlagEntry(FlagEntry(en.name, u)); err != nil && en.name != "" {
				// The sidecar parses its --additional-peer-urls so.
				bad = append(bad, field.Invalid(en.urlsPath.Index(j), u, err.Error()))
			}
		}
		if len(bad) > 0 {
			errs = append(errs, bad...)
			continue
		}
		out = append(out, Member{Name: en.name, URLs: slices.Clone(en.urls), ReplacesDefault: replaces && !en.own})
	}
	slices.SortFunc(out, func(a, b Member) int {
		oa, _ := members.NameOrdinal(e, a.Name)
		ob, _ := members.NameOrdinal(e, b.Name)
		return cmp.Compare(oa, ob)
	})
	return Advertised{members: out}, errs
}

// noLocalMember words why name is not a local member's, with the names
// that are.
func noLocalMember(e *v1alpha1.Etcd, name string) string {
	r := members.LocalOrdinals(e)
	if r.Empty() {
		return "names no local member: spec.replicas is 0, so the Etcd runs none"
	}
	names := fmt.Sprintf("the local members are %s..%s (ordinals %s)", members.MemberName(e, r.Start), members.MemberName(e, r.End-1), r)
	if o, ok := members.PodOrdinal(e, name); ok && r.Contains(o) && members.MemberName(e, o) != name {
		return fmt.Sprintf("is the pod name of local member %s: an entry names the etcd member, <memberNamePrefix>-<pod name>; %s", members.MemberName(e, o), names)
	}
	return "names no local member: " + names
}
