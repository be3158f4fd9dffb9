package membership

import (
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"

	stretchv1alpha1 "github.com/druid-stretch/druid-stretch/api/stretch/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/members"
	"github.com/druid-stretch/druid-stretch/controllers/webhook"
	"github.com/druid-stretch/druid-stretch/internal/etcdview"
	"github.com/druid-stretch/druid-stretch/internal/sidecarcluster"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// SourceSidecarResolver is implemented by a Resolver that also knows where
// the sidecars of the members named in druid's
// spec.etcd.bootstrapWithExistingCluster are reached. GEP-39 names a source
// member by its peer URLs only; the controller needs its sidecar to move
// leadership off it and to drain its clients before removing it.
type SourceSidecarResolver interface {
	SourceSidecarURL(e *v1alpha1.Etcd, m v1alpha1.ExternalMember) (string, error)
}

// SourceSidecarURL is the sidecar beside the member's first peer URL that
// names no pod of e's own peer Service: the same host (the name under
// which the destination reaches the member's peer port, across the seeds a
// load balancer's), at the sidecar port, https when the peer URL is (http
// only with the sidecars' insecure opt-in). The source's in-cluster URL,
// <pod>.<etcd>-peer.<namespace>.svc, names e's own pod of the same name
// here, since both seeds run the Etcd in one namespace.
func (d DNSResolver) SourceSidecarURL(e *v1alpha1.Etcd, m v1alpha1.ExternalMember) (string, error) {
	var u *url.URL
	for _, raw := range m.PeerURLs {
		p, err := url.Parse(raw)
		if err != nil || p.Hostname() == "" {
			return "", fmt.Errorf("source member %s: peer URL %q is not a URL with a host", m.Name, raw)
		}
		if !inPeerService(e, p.Hostname()) {
			u = p
			break
		}
	}
	if u == nil {
		return "", fmt.Errorf("source member %s has no peer URL outside this cluster's peer Service (%s): list the name the destination reaches it by in spec.etcd.bootstrapWithExistingCluster.members", m.Name, strings.Join(m.PeerURLs, ", "))
	}
	port := d.SidecarPort
	if port == 0 {
		port = webhook.DefaultSidecarPort
	}
	scheme := d.SidecarScheme
	if scheme == "" {
		scheme = u.Scheme
	}
	return (&url.URL{Scheme: scheme, Host: net.JoinHostPort(u.Hostname(), fmt.Sprint(port))}).String(), nil
}

// inPeerService reports whether host is a name under e's peer Service,
// <etcd>-peer.<namespace>.svc[.<cluster domain>].
func inPeerService(e *v1alpha1.Etcd, host string) bool {
	d := "." + members.PeerServiceDomain(e)
	return strings.HasSuffix(host, d) || strings.Contains(host, d+".")
}

// completeBootstrap gives the external members the View derived from
// druid's bootstrap fields their sidecar URLs, when the Resolver knows them.
func (r *Reconciler) completeBootstrap(e *v1alpha1.Etcd) error {
	b, ok := stretchv1alpha1.FromBootstrap(e)
	sr, can := r.resolver.(SourceSidecarResolver)
	if !ok || !can {
		return nil
	}
	for i := range e.Spec.ExternalMembers {
		x := &e.Spec.ExternalMembers[i]
		if x.SidecarURL != "" || !slices.ContainsFunc(b.Members, func(m v1alpha1.ExternalMember) bool { return m.Name == x.Name }) {
			continue
		}
		u, err := sr.SourceSidecarURL(e, *x)
		if err != nil {
			return fmt.Errorf("the sidecar of source member %s: %w", x.Name, err)
		}
		x.SidecarURL = u
	}
	return nil
}

// bootstrapConflicts are the contradictions between the Etcd's bootstrap
// fields and its EtcdMembership (stretchv1alpha1.Conflicts).
func bootstrapConflicts(p *etcdview.Pair) field.ErrorList {
	if p.Membership == nil {
		return stretchv1alpha1.Conflicts(p.Etcd, &v1alpha1.MembershipSpec{})
	}
	return stretchv1alpha1.Conflicts(p.Etcd, &p.Membership.Spec.MembershipSpec)
}

// unknownSourceMembers names the members of spec.etcd.bootstrapWithExistingCluster
// that the observed cluster does not have, by name or peer URL: the Etcd
// would join some other cluster than the one named, so nothing is added.
// Once the spec field is unset, the recorded members leave one by one, and
// a missing one is not an error.
func unknownSourceMembers(e *v1alpha1.Etcd, obs *sidecarcluster.Observation) []string {
	bw := e.Spec.Etcd.BootstrapWithExistingCluster
	if bw == nil {
		return nil
	}
	var out []string
	for i, m := range bw.Members {
		if !slices.ContainsFunc(obs.List.Members, func(o sidecar.Member) bool {
			return o.Name == m.Name || slices.ContainsFunc(o.PeerURLs, func(u string) bool { return slices.Contains(m.PeerURLs, u) })
		}) {
			out = append(out, fmt.Sprintf("spec.etcd.bootstrapWithExistingCluster.members[%d] (%s, %s)", i, m.Name, strings.Join(m.PeerURLs, ",")))
		}
	}
	return out
}

// apart drops from a local member's peer URLs those another member already
// has: the source's members of a GEP-39 move (and any member etcd lists
// under another name). Both seeds run the Etcd under the same name and
// namespace, so druid gives a destination pod the very in-cluster peer URL
// of the source pod at the same ordinal, and etcd refuses to add a member
// with a peer URL another member has. The member is added with the URLs it
// is reached by across the seeds (its additional peer URLs), which is what
// its sidecar advertises too (etcdconfig.File.Resolve). None left is an
// error naming the field to set.
func apart(e *v1alpha1.Etcd, name string, urls []string, obs *sidecarcluster.Observation) ([]string, error) {
	taken := func(u string) bool {
		for _, x := range e.Spec.ExternalMembers {
			if x.Name != name && slices.Contains(x.PeerURLs, u) {
				return true
			}
		}
		return slices.ContainsFunc(obs.List.Members, func(m sidecar.Member) bool {
			return m.Name != "" && m.Name != name && slices.Contains(m.PeerURLs, u)
		})
	}
	kept := slices.DeleteFunc(slices.Clone(urls), taken)
	if len(kept) == 0 {
		return nil, fmt.Errorf("every peer URL of %s (%s) is another member's: set an additional peer URL for %s (spec.etcd.additionalAdvertisePeerURLs), the address the other cluster reaches it by", name, strings.Join(urls, ","), name)
	}
	return kept, nil
}
