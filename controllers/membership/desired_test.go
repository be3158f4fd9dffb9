package membership_test

import (
	"testing"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	membershipctrl "github.com/druid-stretch/druid-stretch/controllers/membership"
)

// TestDNSResolver checks the production resolver against druid's DNS
// conventions.
func TestDNSResolver(t *testing.T) {
	etcd := func(mutate func(e *v1alpha1.Etcd)) *v1alpha1.Etcd {
		e := &v1alpha1.Etcd{ObjectMeta: metav1.ObjectMeta{Name: "etcd-main", Namespace: "shoot--p--s"}}
		e.Spec.MemberNamePrefix = ptr.To("seed-b")
		e.Spec.Replicas, e.Spec.OrdinalStart = 3, ptr.To[int32](3)
		if mutate != nil {
			mutate(e)
		}
		return e
	}
	tlsOn := func(e *v1alpha1.Etcd) {
		e.Spec.Etcd.PeerUrlTLS = &druidv1alpha1.PeerTLSConfig{TLSConfig: druidv1alpha1.TLSConfig{
			TLSCASecretRef: druidv1alpha1.SecretReference{SecretReference: corev1.SecretReference{Name: "ca"}}}}
	}
	for _, c := range []struct {
		name     string
		resolver membershipctrl.DNSResolver
		e        *v1alpha1.Etcd
		peers    []string
		sidecar  string
		err      string
	}{
		{"defaults, no peer TLS", membershipctrl.DNSResolver{}, etcd(nil),
			[]string{"http://etcd-main-3.etcd-main-peer.shoot--p--s.svc:2380"}, "https://etcd-main-3.etcd-main-peer.shoot--p--s.svc:8090", ""},
		{"peer TLS and a server port", membershipctrl.DNSResolver{SidecarPort: 9000}, etcd(func(e *v1alpha1.Etcd) {
			tlsOn(e)
			e.Spec.Etcd.ServerPort = ptr.To[int32](2390)
		}), []string{"https://etcd-main-3.etcd-main-peer.shoot--p--s.svc:2390"}, "https://etcd-main-3.etcd-main-peer.shoot--p--s.svc:9000", ""},
		{"an additional advertised peer URL", membershipctrl.DNSResolver{SidecarScheme: "http"}, etcd(func(e *v1alpha1.Etcd) {
			tlsOn(e)
			e.Spec.Etcd.AdditionalAdvertisePeerURLs = []druidv1alpha1.MemberPeerURLs{{MemberName: "seed-b-etcd-main-3", URLs: []string{"https://etcd-main-3.seed-b.example:2380"}}}
		}), []string{"https://etcd-main-3.etcd-main-peer.shoot--p--s.svc:2380", "https://etcd-main-3.seed-b.example:2380"}, "http://etcd-main-3.etcd-main-peer.shoot--p--s.svc:8090", ""},
		{"an additional peer URL of the wrong scheme", membershipctrl.DNSResolver{}, etcd(func(e *v1alpha1.Etcd) {
			tlsOn(e)
			e.Spec.Etcd.AdditionalAdvertisePeerURLs = []druidv1alpha1.MemberPeerURLs{{MemberName: "seed-b-etcd-main-3", URLs: []string{"http://etcd-main-3.seed-b.example:2380"}}}
		}), nil, "", "spec.etcd.additionalAdvertisePeerURLs[0].urls[0]: Invalid value"},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := NewWithT(t)
			peers, err := c.resolver.PeerURLs(c.e, "seed-b-etcd-main-3", "etcd-main-3")
			if c.err != "" {
				g.Expect(err).To(MatchError(ContainSubstring(c.err)))
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(peers).To(Equal(c.peers))
			url, err := c.resolver.SidecarURL(c.e, "seed-b-etcd-main-3", "etcd-main-3")
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(url).To(Equal(c.sidecar))
		})
	}
}

// TestSourceSidecarURL finds a GEP-39 source member's sidecar beside the
// peer URL the destination reaches it by, never beside its in-cluster
// URL, which names the destination's own pod of the same name.
func TestSourceSidecarURL(t *testing.T) {
	g := NewWithT(t)
	e := &v1alpha1.Etcd{ObjectMeta: metav1.ObjectMeta{Name: "etcd-main", Namespace: "shoot--p--s"}}
	m := v1alpha1.ExternalMember{Name: "etcd-main-0", PeerURLs: []string{
		"https://etcd-main-0.etcd-main-peer.shoot--p--s.svc:2380",
		"https://etcd-main-0.etcd-main-peer.shoot--p--s.svc.cluster.local:2380",
		"https://etcd-main-0.shoot--p--s.seed-a.example:2380",
	}}
	u, err := membershipctrl.DNSResolver{}.SourceSidecarURL(e, m)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(u).To(Equal("https://etcd-main-0.shoot--p--s.seed-a.example:8090"))
	u, err = membershipctrl.DNSResolver{SidecarPort: 9443, SidecarScheme: "http"}.SourceSidecarURL(e, m)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(u).To(Equal("http://etcd-main-0.shoot--p--s.seed-a.example:9443"))
	m.PeerURLs = m.PeerURLs[:2]
	_, err = membershipctrl.DNSResolver{}.SourceSidecarURL(e, m)
	g.Expect(err).To(MatchError(ContainSubstring("no peer URL outside this cluster's peer Service")))
}
