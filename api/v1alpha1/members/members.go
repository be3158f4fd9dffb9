// Package members derives etcd member names, peer URLs and the etcd
// --initial-cluster of an extended Etcd, and the StatefulSet change that puts
// its pods on the Etcd's ordinal range. The functions are pure: gardenlet, the
// controller, the webhook and the tests compute the same names from the same
// object.
package members

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
)

// Ordinals is the half-open range [Start, End) of a StatefulSet's pod
// ordinals. End is int64 so that Start+replicas cannot overflow.
type Ordinals struct {
	Start int64
	End   int64
}

// String is the half-open range, "[3, 6)", or "[]" when empty.
func (o Ordinals) String() string {
	if o.End <= o.Start {
		return "[]"
	}
	return fmt.Sprintf("[%d, %d)", o.Start, o.End)
}

// Contains says whether ordinal is in the range.
func (o Ordinals) Contains(ordinal int64) bool { return ordinal >= o.Start && ordinal < o.End }

// Empty says whether the range holds no ordinal.
func (o Ordinals) Empty() bool { return o.End <= o.Start }

// Union is the smallest range that covers both o and p: a StatefulSet runs
// one contiguous range. An empty range adds nothing.
func (o Ordinals) Union(p Ordinals) Ordinals {
	switch {
	case p.Empty():
		if o.Empty() {
			return Ordinals{}
		}
		return o
	case o.Empty():
		return p
	}
	return Ordinals{Start: min(o.Start, p.Start), End: max(o.End, p.End)}
}

// ParseOrdinals reads a range as String writes it: "[3, 6)" or "[]".
func ParseOrdinals(s string) (Ordinals, error) {
	if s == "[]" {
		return Ordinals{}, nil
	}
	var o Ordinals
	if n, err := fmt.Sscanf(s, "[%d, %d)", &o.Start, &o.End); err != nil || n != 2 || o.Start < 0 || o.End <= o.Start || o.String() != s {
		return Ordinals{}, fmt.Errorf("%q is not an ordinal range: want \"[start, end)\" with 0 <= start < end, or \"[]\"", s)
	}
	return o, nil
}

// LocalOrdinals is the ordinal range of e's pods:
// [ordinalStart, ordinalStart+replicas).
func LocalOrdinals(e *v1alpha1.Etcd) Ordinals {
	start := int64(e.Spec.GetOrdinalStart())
	return Ordinals{Start: start, End: start + int64(e.Spec.Replicas)}
}

// PodName is the name of e's pod with the given ordinal, <etcd name>-<ordinal>
// as druid and the StatefulSet name it.
func PodName(e *v1alpha1.Etcd, ordinal int64) string {
	return e.Name + "-" + strconv.FormatInt(ordinal, 10)
}

// MemberName is the etcd member name of e's pod with the given ordinal,
// druid's GetMemberName: [<memberNamePrefix>-]<pod name>.
func MemberName(e *v1alpha1.Etcd, ordinal int64) string {
	return druidv1alpha1.GetMemberName(e.Spec.MemberNamePrefix, PodName(e, ordinal))
}

// PodNames are the names of e's pods, in ordinal order.
func PodNames(e *v1alpha1.Etcd) []string {
	r := LocalOrdinals(e)
	names := make([]string, 0, r.End-r.Start)
	for o := r.Start; o < r.End; o++ {
		names = append(names, PodName(e, o))
	}
	return names
}

// LocalMemberNames are the etcd member names of e's pods, in ordinal order.
func LocalMemberNames(e *v1alpha1.Etcd) []string {
	r := LocalOrdinals(e)
	names := make([]string, 0, r.End-r.Start)
	for o := r.Start; o < r.End; o++ {
		names = append(names, MemberName(e, o))
	}
	return names
}

// memberNameStem is what every member name of e's pods starts with, whatever
// the ordinal.
func memberNameStem(e *v1alpha1.Etcd) string {
	return druidv1alpha1.GetMemberName(e.Spec.MemberNamePrefix, e.Name+"-")
}

// Ordinal is the ordinal of the pod that a member name of e belongs to, for
// any ordinal, in range or not: ok is false when the name is not
// [<memberNamePrefix>-]<etcd name>-<ordinal> with a canonical decimal ordinal
// (no sign, no leading zero), which is how pods are named, and false for a
// name listed in spec.externalMembers: the two Etcds of a live move share
// their name, so the other cluster's members (etcd-main-3 beside
// etcd-main-0) have names of e's form, and the list says they are not e's.
func Ordinal(e *v1alpha1.Etcd, memberName string) (ordinal int64, ok bool) {
	if _, external := e.Spec.ExternalMember(memberName); external {
		return 0, false
	}
	return NameOrdinal(e, memberName)
}

// NameOrdinal is the ordinal in a member name of e's form, whether or not
// spec.externalMembers lists the name: validation uses it to refuse an
// external member that takes the name of a local one.
func NameOrdinal(e *v1alpha1.Etcd, memberName string) (ordinal int64, ok bool) {
	return ordinalAfter(memberName, memberNameStem(e))
}

// PodOrdinal is the ordinal of one of e's pod names, <etcd name>-<ordinal>,
// in range or not.
func PodOrdinal(e *v1alpha1.Etcd, podName string) (ordinal int64, ok bool) {
	return ordinalAfter(podName, e.Name+"-")
}

func ordinalAfter(name, stem string) (int64, bool) {
	digits, found := strings.CutPrefix(name, stem)
	if !found || !isCanonicalOrdinal(digits) {
		return 0, false
	}
	n, err := strconv.ParseInt(digits, 10, 64)
	if err != nil {
		return 0, false
	}
	return n, true
}

// maxOrdinalDigits bounds the digits of an ordinal: an int32 start plus an
// int32 replica count stays below 10^10. The CRD's CEL rule uses the same
// bound, so both agree on which names are local.
const maxOrdinalDigits = 10

func isCanonicalOrdinal(s string) bool {
	if s == "" || len(s) > maxOrdinalDigits || (len(s) > 1 && s[0] == '0') {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// IsLocal says whether memberName is the name of one of e's pods in its
// current ordinal range.
func IsLocal(e *v1alpha1.Etcd, memberName string) bool {
	o, ok := Ordinal(e, memberName)
	return ok && LocalOrdinals(e).Contains(o)
}

// IsOwn says whether a member of e's status is e's own: a pod of its current
// ordinal range, or a member the controller observed as Local, such as a pod
// that has left the range while its member still serves. The two Etcds of a
// live move see the same members; this is how each tells its own from the
// other's.
func IsOwn(e *v1alpha1.Etcd, m v1alpha1.ObservedMember) bool {
	return IsLocal(e, m.Name) || m.Origin == v1alpha1.MemberOriginLocal
}

// Peer is one member as etcd's --initial-cluster lists it.
type Peer struct {
	// Name is the etcd member name.
	Name string
	// PeerURLs are the member's advertised peer URLs.
	PeerURLs []string
}

// LocalPeerURLs gives the advertised peer URLs of the local member with the
// given member and pod name. The URL pattern depends on where the member runs
// (druid's peer service, or a test runner's addresses); package peerurls
// gives druid's (Advertised.LocalPeerURLs).
type LocalPeerURLs func(memberName, podName string) []string

// Peers are e's local members (in ordinal order) followed by its external
// members (in spec order), with their peer URLs.
func Peers(e *v1alpha1.Etcd, local LocalPeerURLs) []Peer {
	r := LocalOrdinals(e)
	peers := make([]Peer, 0, int(r.End-r.Start)+len(e.Spec.ExternalMembers))
	for o := r.Start; o < r.End; o++ {
		pod := PodName(e, o)
		name := MemberName(e, o)
		peers = append(peers, Peer{Name: name, PeerURLs: local(name, pod)})
	}
	for _, m := range e.Spec.ExternalMembers {
		peers = append(peers, Peer{Name: m.Name, PeerURLs: m.PeerURLs})
	}
	return peers
}

// InitialCluster is etcd's --initial-cluster for e: every local member of the
// ordinal range and every external member, name=url for each peer URL, as
// druid writes it. It is the right value to bootstrap a new stretched cluster.
// A member joining a running cluster (--initial-cluster-state=existing) must
// list exactly the cluster's current members plus itself, as etcd checks:
// build that with FormatInitialCluster from the observed members.
func InitialCluster(e *v1alpha1.Etcd, local LocalPeerURLs) string {
	return FormatInitialCluster(Peers(e, local))
}

// FormatInitialCluster renders peers as etcd's --initial-cluster.
func FormatInitialCluster(peers []Peer) string {
	var b strings.Builder
	for _, p := range peers {
		for _, u := range p.PeerURLs {
			if b.Len() > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, "%s=%s", p.Name, u)
		}
	}
	return b.String()
}

// Druid's default ports when spec.etcd.serverPort / clientPort are unset.
const (
	DefaultPeerPort   int32 = 2380
	DefaultClientPort int32 = 2379
)

// PeerScheme is the scheme of e's peer URLs: https with spec.etcd.peerUrlTls,
// http without.
func PeerScheme(e *v1alpha1.Etcd) string {
	if e.Spec.Etcd.PeerUrlTLS != nil {
		return "https"
	}
	return "http"
}

// PeerPort is spec.etcd.serverPort, druid's default 2380 when unset.
func PeerPort(e *v1alpha1.Etcd) int32 {
	if e.Spec.Etcd.ServerPort != nil {
		return *e.Spec.Etcd.ServerPort
	}
	return DefaultPeerPort
}

// PeerServiceDomain is the DNS domain of druid's headless peer service,
// <etcd>-peer.<namespace>.svc; a pod is <pod>.<domain> behind it.
func PeerServiceDomain(e *v1alpha1.Etcd) string {
	return fmt.Sprintf("%s.%s.svc", druidv1alpha1.GetPeerServiceName(e.ObjectMeta), e.Namespace)
}

// InClusterPeerURL is the peer URL druid gives e's pod inside its cluster:
// <scheme>://<pod>.<etcd>-peer.<namespace>.svc:<serverPort>.
func InClusterPeerURL(e *v1alpha1.Etcd, podName string) string {
	return fmt.Sprintf("%s://%s.%s:%d", PeerScheme(e), podName, PeerServiceDomain(e), PeerPort(e))
}

// SameURLs reports whether a and b list the same URLs, in any order: how
// etcd tells a member by its peer URLs, and how the API server's CEL
// compares two lists of x-kubernetes-list-type=set (self == oldSelf).
func SameURLs(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
