package membership

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"

	stretchv1alpha1 "github.com/druid-stretch/druid-stretch/api/stretch/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/members"
	"github.com/druid-stretch/druid-stretch/internal/sidecarcluster"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// PeerNamesManagedBy is the EndpointSlice managed-by label value of the
// slices the controller keeps (PeerNamesSliceName); its cache holds only
// those.
const PeerNamesManagedBy = "druid-stretch.druid.gardener.cloud"

// PeerNamesSliceName names the EndpointSlice that makes the in-cluster peer
// names of e's external members resolve in this cluster.
func PeerNamesSliceName(e *v1alpha1.Etcd) string {
	return druidv1alpha1.GetPeerServiceName(e.ObjectMeta) + "-external"
}

// peerNamesTimeout bounds the lookups and API calls of one syncPeerNames.
const peerNamesTimeout = 3 * time.Second

// peerNamesSelector selects the slices the controller keeps.
func peerNamesSelector() labels.Selector {
	return labels.SelectorFromSet(labels.Set{discoveryv1.LabelManagedBy: PeerNamesManagedBy})
}

// syncPeerNames publishes, in this cluster's DNS, the in-cluster peer names
// the external members still advertise.
//
// A member joins by matching its configured members to the cluster's by
// their peer URLs (etcd's ValidateClusterAndAssignIDs). Where two lists
// differ as strings, etcd resolves every host name in both and compares the
// addresses; a name that does not resolve is retried every second for the
// check's whole 30 s. An external member advertises the in-cluster name its
// own cluster gave it (<pod>.<etcd>-peer.<namespace>.svc) besides the name
// it is reached by from here, and this cluster's DNS has no such pod: every
// member that joined here waited 30 s. Cluster DNS (CoreDNS) answers
// <hostname>.<service>.<namespace>.svc from the EndpointSlices of a headless
// Service, whoever wrote them; so the controller keeps one slice on the
// Etcd's peer Service with an endpoint per such name, with the addresses of
// the member's external peer host. etcd then also reaches the member under
// that name, at the same address as under its external one.
//
// A failure costs only that wait, so it is logged and the reconcile goes on;
// the calls are bounded (peerNamesTimeout), so that a cache that cannot
// sync (the ClusterRole lacks endpointslices) does not stall the membership
// steps.
func (r *Reconciler) syncPeerNames(ctx context.Context, e *v1alpha1.Etcd, obs *sidecarcluster.Observation) {
	log := logf.FromContext(ctx)
	ctx, cancel := context.WithTimeout(ctx, peerNamesTimeout)
	defer cancel()
	eps, family, unresolved := r.peerNameEndpoints(ctx, e, obs)
	if len(unresolved) > 0 {
		log.V(1).Info("external members whose in-cluster peer names stay unresolvable here: none of their peer hosts resolves", "members", unresolved)
	}
	key := client.ObjectKey{Namespace: e.Namespace, Name: PeerNamesSliceName(e)}
	have := &discoveryv1.EndpointSlice{}
	err := r.client.Get(ctx, key, have)
	switch {
	case apierrors.IsNotFound(err):
		have = nil
	case err != nil:
		log.Info("reading the EndpointSlice of the external members' peer names failed; retried on the next reconcile", "error", err.Error())
		return
	}
	if len(eps) == 0 {
		if have == nil {
			return
		}
		if err := r.client.Delete(ctx, have); client.IgnoreNotFound(err) != nil {
			log.Info("deleting the EndpointSlice of the external members' peer names failed; retried on the next reconcile", "error", err.Error())
		}
		return
	}
	want := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name, Labels: map[string]string{
			discoveryv1.LabelServiceName: druidv1alpha1.GetPeerServiceName(e.ObjectMeta),
			discoveryv1.LabelManagedBy:   PeerNamesManagedBy,
		}},
		AddressType: family,
		Endpoints:   eps,
	}
	if have != nil && have.AddressType == family && equality.Semantic.DeepEqual(have.Endpoints, eps) && equality.Semantic.DeepEqual(have.Labels, want.Labels) {
		return
	}
	if err := controllerutil.SetOwnerReference(e, want, r.client.Scheme()); err != nil {
		log.Info("owning the EndpointSlice of the external members' peer names failed", "error", err.Error())
		return
	}
	switch {
	case have == nil:
		err = r.client.Create(ctx, want)
	case have.AddressType != family:
		// The address type of a slice is immutable.
		if err = r.client.Delete(ctx, have); err == nil {
			err = r.client.Create(ctx, want)
		}
	default:
		want.ResourceVersion = have.ResourceVersion
		err = r.client.Update(ctx, want)
	}
	if err != nil {
		log.Info("writing the EndpointSlice of the external members' peer names failed; retried on the next reconcile", "error", err.Error())
		return
	}
	names := make([]string, 0, len(eps))
	for _, ep := range eps {
		names = append(names, fmt.Sprintf("%s.%s=%s", *ep.Hostname, members.PeerServiceDomain(e), strings.Join(ep.Addresses, ",")))
	}
	r.event(ctx, e, corev1.EventTypeNormal, "PeerNamesPublished", "SyncPeerNames", "the external members' in-cluster peer names resolve here (EndpointSlice %s): %s", key.Name, strings.Join(names, " "))
}

// peerNameEndpoints are the endpoints of the slice: one per in-cluster peer
// name (under e's peer Service domain) of an observed external member, with
// the addresses its spec's peer hosts resolve to here. A slice holds one
// address family: IPv4 when any address is, else IPv6. unresolved names the
// members none of whose hosts resolved. Without an observation (nil) there
// are none.
func (r *Reconciler) peerNameEndpoints(ctx context.Context, e *v1alpha1.Etcd, obs *sidecarcluster.Observation) (eps []discoveryv1.Endpoint, family discoveryv1.AddressType, unresolved []string) {
	if obs == nil {
		return nil, "", nil
	}
	domain := members.PeerServiceDomain(e)
	byHost := map[string][]net.IP{}
	for _, ext := range e.Spec.ExternalMembers {
		m := externalMember(obs, ext)
		if m == nil {
			continue
		}
		var hosts []string
		for _, u := range m.PeerURLs {
			if h, ok := inClusterHostname(u, domain); ok && !r.ownPod(e, h) {
				hosts = append(hosts, h)
			}
		}
		if len(hosts) == 0 {
			continue
		}
		ips := r.lookupPeerHosts(ctx, ext.PeerURLs, domain)
		if len(ips) == 0 {
			unresolved = append(unresolved, ext.Name)
			continue
		}
		for _, h := range hosts {
			byHost[h] = ips
		}
	}
	family = discoveryv1.AddressTypeIPv6
	for _, ips := range byHost {
		if slices.ContainsFunc(ips, func(ip net.IP) bool { return ip.To4() != nil }) {
			family = discoveryv1.AddressTypeIPv4
		}
	}
	for _, h := range slices.Sorted(maps.Keys(byHost)) {
		var addrs []string
		for _, ip := range byHost[h] {
			if (ip.To4() != nil) == (family == discoveryv1.AddressTypeIPv4) {
				addrs = append(addrs, ip.String())
			}
		}
		if len(addrs) == 0 {
			continue
		}
		slices.Sort(addrs)
		eps = append(eps, discoveryv1.Endpoint{
			Addresses:  slices.Compact(addrs),
			Hostname:   ptr.To(h),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
		})
	}
	return eps, family, unresolved
}

// externalMember is the member of obs that ext names: by its name, or by a
// peer URL in common while it has not published its name (a learner just
// added by the other cluster's controller, whose in-cluster name is then
// published here before its etcd starts).
func externalMember(obs *sidecarcluster.Observation, ext v1alpha1.ExternalMember) *sidecar.Member {
	if m := obs.Member(ext.Name); m != nil {
		return m
	}
	for i := range obs.List.Members {
		m := &obs.List.Members[i]
		if m.Name == "" && slices.ContainsFunc(m.PeerURLs, func(u string) bool { return slices.Contains(ext.PeerURLs, u) }) {
			return m
		}
	}
	return nil
}

// joiningExternal tells whether an external member of e is not a voter that
// serves clients yet, as obs shows it: absent, a learner, or unpublished.
// The other cluster's controller is adding it, and this one's observations
// (which publish its in-cluster name here, and so let this cluster's
// sidecars poll it) should follow within a second, not at the converged
// interval.
func joiningExternal(e *v1alpha1.Etcd, obs *sidecarcluster.Observation) bool {
	if e.Spec.GetExternalMembersPolicy() == v1alpha1.ExternalMembersPolicyRetire {
		return false // this controller removes them; absent is their end
	}
	for _, ext := range e.Spec.ExternalMembers {
		m := externalMember(obs, ext)
		if m == nil || m.IsLearner || len(m.ClientURLs) == 0 {
			return true
		}
	}
	return false
}

// convergedPoll is when a converged e is looked at again: at the progress
// interval while an external member joins (joiningExternal), else at the
// converged interval.
func (r *Reconciler) convergedPoll(e *v1alpha1.Etcd, obs *sidecarcluster.Observation) time.Duration {
	if obs != nil && joiningExternal(e, obs) {
		return r.opts.ProgressInterval
	}
	return r.opts.ConvergedInterval
}

// lookupPeerHosts resolves the hosts of peerURLs that are not under this
// cluster's peer Service domain (those are what is being published).
func (r *Reconciler) lookupPeerHosts(ctx context.Context, peerURLs []string, domain string) []net.IP {
	var ips []net.IP
	for _, raw := range peerURLs {
		if _, ok := inClusterHostname(raw, domain); ok {
			continue
		}
		u, err := url.Parse(raw)
		if err != nil || u.Hostname() == "" {
			continue
		}
		if ip := net.ParseIP(u.Hostname()); ip != nil {
			ips = append(ips, ip)
			continue
		}
		addrs, err := r.opts.LookupHost(ctx, u.Hostname())
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if ip := net.ParseIP(a); ip != nil {
				ips = append(ips, ip)
			}
		}
	}
	return ips
}

// ownPod reports whether hostname is a pod this Etcd runs or may run: its
// name is published by the EndpointSlice controller, never here.
func (r *Reconciler) ownPod(e *v1alpha1.Etcd, hostname string) bool {
	o, ok := members.PodOrdinal(e, hostname)
	if !ok {
		return false
	}
	if _, joins := stretchv1alpha1.FromBootstrap(e); joins && o >= int64(e.Spec.GetOrdinalStart()) {
		// A GEP-39 destination counts its ordinals from 0 like its source
		// and grows to the source's size: created with one replica fewer,
		// scaled up once its first members joined. Every source pod name
		// is one of its own pods' names, now or after that scale-up.
		// Published for the source's pod, the name would still lead there
		// when the destination's pod of that name is created, and the
		// controller, asking that pod's sidecar for its admission, would
		// ask the source's member instead.
		return true
	}
	return members.LocalOrdinals(e).Contains(o) || members.PodWindow(e).Contains(o)
}

// inClusterHostname returns the first label of rawURL's host when the host
// is <label>.<domain>, with or without the cluster domain after it.
func inClusterHostname(rawURL, domain string) (string, bool) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", false
	}
	label, rest, ok := strings.Cut(strings.TrimSuffix(u.Hostname(), "."), ".")
	if !ok || label == "" || (rest != domain && !strings.HasPrefix(rest, domain+".")) {
		return "", false
	}
	return label, true
}
