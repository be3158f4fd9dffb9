package membership

import (
	"context"
	"errors"
	"testing"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/internal/sidecarcluster"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// TestPeerNamesFollowTheExternalMembers: the destination of a live move
// publishes the source members' in-cluster peer names with the addresses of
// their external hosts, never a name of its own pods, and withdraws the
// slice when the move forgets the external members.
func TestPeerNamesFollowTheExternalMembers(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	lookups := map[string][]string{
		"etcd-main-0.shoot.seed-a.example": {"10.2.0.10"},
		"etcd-main-1.shoot.seed-a.example": {"10.2.0.11", "fd00::11"},
	}
	r, c := peerNamesReconciler(g, func(host string) ([]string, error) {
		if a, ok := lookups[host]; ok {
			return a, nil
		}
		return nil, errors.New("no such host " + host)
	})

	e := &v1alpha1.Etcd{ObjectMeta: metav1.ObjectMeta{Namespace: "shoot", Name: "etcd-main", UID: "uid-b"}}
	e.Spec.Replicas, e.Spec.OrdinalStart = 1, ptr.To[int32](3)
	external := func(n string) v1alpha1.ExternalMember {
		return v1alpha1.ExternalMember{Name: n, PeerURLs: []string{"https://" + n + ".shoot.seed-a.example:2380"}}
	}
	e.Spec.ExternalMembers = []v1alpha1.ExternalMember{external("etcd-main-0"), external("etcd-main-1"), external("etcd-main-2")}
	member := func(n string, urls ...string) sidecar.Member { return sidecar.Member{Name: n, PeerURLs: urls} }
	obs := &sidecarcluster.Observation{List: &sidecar.MemberList{Members: []sidecar.Member{
		member("etcd-main-0", "https://etcd-main-0.etcd-main-peer.shoot.svc:2380", "https://etcd-main-0.shoot.seed-a.example:2380"),
		member("etcd-main-1", "https://etcd-main-1.etcd-main-peer.shoot.svc.cluster.local:2380", "https://etcd-main-1.shoot.seed-a.example:2380"),
		// Its external host does not resolve here: it keeps etcd's wait.
		member("etcd-main-2", "https://etcd-main-2.etcd-main-peer.shoot.svc:2380", "https://etcd-main-2.shoot.seed-a.example:2380"),
		// This Etcd's own member: the EndpointSlice controller publishes it.
		member("etcd-main-3", "https://etcd-main-3.etcd-main-peer.shoot.svc:2380", "https://etcd-main-3.shoot.seed-b.example:2380"),
	}}}

	r.syncPeerNames(ctx, e, obs)
	slice := &discoveryv1.EndpointSlice{}
	key := client.ObjectKey{Namespace: "shoot", Name: "etcd-main-peer-external"}
	g.Expect(c.Get(ctx, key, slice)).To(Succeed())
	g.Expect(slice.Labels).To(Equal(map[string]string{discoveryv1.LabelServiceName: "etcd-main-peer", discoveryv1.LabelManagedBy: PeerNamesManagedBy}))
	g.Expect(slice.OwnerReferences).To(ConsistOf(HaveField("UID", e.UID)))
	g.Expect(slice.AddressType).To(Equal(discoveryv1.AddressTypeIPv4))
	g.Expect(slice.Endpoints).To(Equal([]discoveryv1.Endpoint{
		{Addresses: []string{"10.2.0.10"}, Hostname: ptr.To("etcd-main-0"), Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}},
		{Addresses: []string{"10.2.0.11"}, Hostname: ptr.To("etcd-main-1"), Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}},
	}))

	// Unchanged input writes nothing.
	rv := slice.ResourceVersion
	r.syncPeerNames(ctx, e, obs)
	g.Expect(c.Get(ctx, key, slice)).To(Succeed())
	g.Expect(slice.ResourceVersion).To(Equal(rv))

	// The source's host moved: the slice follows.
	lookups["etcd-main-0.shoot.seed-a.example"] = []string{"10.2.0.20"}
	r.syncPeerNames(ctx, e, obs)
	g.Expect(c.Get(ctx, key, slice)).To(Succeed())
	g.Expect(slice.Endpoints[0].Addresses).To(Equal([]string{"10.2.0.20"}))

	// The move forgot the external members: the slice goes.
	e.Spec.ExternalMembers = nil
	r.syncPeerNames(ctx, e, obs)
	g.Expect(apierrors.IsNotFound(c.Get(ctx, key, slice))).To(BeTrue(), "the slice is deleted")

	// A source scaled to zero after its move is reconciled without an
	// observation: its slice goes too.
	e.Spec.ExternalMembers = []v1alpha1.ExternalMember{external("etcd-main-0")}
	r.syncPeerNames(ctx, e, obs)
	g.Expect(c.Get(ctx, key, slice)).To(Succeed())
	e.Spec.ExternalMembers, e.Spec.Replicas = nil, 0
	r.syncPeerNames(ctx, e, nil)
	g.Expect(apierrors.IsNotFound(c.Get(ctx, key, slice))).To(BeTrue(), "the hibernated Etcd's slice is deleted")
}

func TestInClusterHostname(t *testing.T) {
	g := NewWithT(t)
	const domain = "etcd-main-peer.shoot.svc"
	for raw, want := range map[string]string{
		"https://etcd-main-0.etcd-main-peer.shoot.svc:2380":               "etcd-main-0",
		"http://etcd-main-0.etcd-main-peer.shoot.svc.cluster.local.:2380": "etcd-main-0",
		"https://etcd-main-0.etcd-main-peer.other.svc:2380":               "",
		"https://etcd-main-0.etcd-main-peer.shoot.svcx:2380":              "",
		"https://etcd-main-peer.shoot.svc:2380":                           "",
		"https://10.0.0.1:2380":                                           "",
		"https://etcd-main-0.shoot.seed-a.example:2380":                   "",
		"://bad": "",
	} {
		got, ok := inClusterHostname(raw, domain)
		g.Expect(got).To(Equal(want), raw)
		g.Expect(ok).To(Equal(want != ""), raw)
	}
}

func mustMetrics(g Gomega) *Metrics {
	m, err := NewMetrics(prometheus.NewRegistry())
	g.Expect(err).NotTo(HaveOccurred())
	return m
}

// TestPeerNamesOfAGEP39DestinationLeaveItsPodsNames: a GEP-39 destination
// counts its ordinals from 0 like its source and is created with one
// replica fewer, then scaled up. The source's pod names are all names of
// its own pods, now or after the scale-up, so none is published for the
// source: a published etcd-main-2 would still lead to the source's pod when
// the destination's etcd-main-2 is created, and the controller would ask the
// source member's sidecar for that pod's admission. Without the bootstrap
// field (a move with its own ordinals) the name is published.
func TestPeerNamesOfAGEP39DestinationLeaveItsPodsNames(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	r, c := peerNamesReconciler(g, func(string) ([]string, error) { return []string{"10.2.0.12"}, nil })

	source := func(i string) (druidv1alpha1.BootstrapExistingMember, sidecar.Member) {
		urls := []string{"https://etcd-main-" + i + ".etcd-main-peer.shoot.svc:2380", "https://etcd-main-" + i + ".shoot.seed-a.example:2380"}
		return druidv1alpha1.BootstrapExistingMember{Name: "etcd-main-" + i, PeerURLs: urls}, sidecar.Member{Name: "etcd-main-" + i, PeerURLs: urls}
	}
	e := &v1alpha1.Etcd{ObjectMeta: metav1.ObjectMeta{Namespace: "shoot", Name: "etcd-main", UID: "uid-b"}}
	e.Spec.Replicas, e.Spec.MemberNamePrefix = 2, ptr.To("seed-b")
	e.Spec.Etcd.BootstrapWithExistingCluster = &druidv1alpha1.BootstrapWithExistingCluster{ClientEndpoints: []string{"https://etcd-main-client.shoot.seed-a.example:2379"}}
	obs := &sidecarcluster.Observation{List: &sidecar.MemberList{}}
	for _, i := range []string{"0", "1", "2"} {
		b, m := source(i)
		e.Spec.Etcd.BootstrapWithExistingCluster.Members = append(e.Spec.Etcd.BootstrapWithExistingCluster.Members, b)
		// As the View derives them from the bootstrap field.
		e.Spec.ExternalMembers = append(e.Spec.ExternalMembers, v1alpha1.ExternalMember{Name: b.Name, PeerURLs: b.PeerURLs})
		obs.List.Members = append(obs.List.Members, m)
	}
	key := client.ObjectKey{Namespace: "shoot", Name: "etcd-main-peer-external"}

	r.syncPeerNames(ctx, e, obs)
	g.Expect(apierrors.IsNotFound(c.Get(ctx, key, &discoveryv1.EndpointSlice{}))).To(BeTrue(), "no source name is published: etcd-main-2 is the name of the pod the scale-up creates")

	e.Spec.Etcd.BootstrapWithExistingCluster = nil
	r.syncPeerNames(ctx, e, obs)
	slice := &discoveryv1.EndpointSlice{}
	g.Expect(c.Get(ctx, key, slice)).To(Succeed())
	g.Expect(slice.Endpoints).To(ConsistOf(HaveField("Hostname", ptr.To("etcd-main-2"))))
}

// peerNamesReconciler is a Reconciler of cluster seed-b on a fake API
// server (returned too), resolving external peer hosts with lookup.
func peerNamesReconciler(g Gomega, lookup func(host string) ([]string, error)) (*Reconciler, client.Client) {
	scheme, err := Scheme()
	g.Expect(err).NotTo(HaveOccurred())
	c := fake.NewClientBuilder().WithScheme(scheme).Build()
	r, err := NewReconciler(Dependencies{
		Client: c, APIReader: c, Resolver: DNSResolver{}, Recorder: events.NewFakeRecorder(10),
		Metrics: mustMetrics(g),
	}, Options{ClusterIdentity: "seed-b", LookupHost: func(_ context.Context, host string) ([]string, error) { return lookup(host) }})
	g.Expect(err).NotTo(HaveOccurred())
	return r, c
}
