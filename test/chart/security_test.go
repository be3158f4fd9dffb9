package chart

import (
	"fmt"
	"net/netip"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
)

// TestRenderedNetworkPolicy renders the chart with two Etcd namespaces and
// a peer site, and evaluates each rendered NetworkPolicy on the connections
// that matter: the sidecar port admits this release's controller pods and
// the peer site only, every other port of druid's etcd pods stays open.
func TestRenderedNetworkPolicy(t *testing.T) {
	g := NewWithT(t)
	shootA, shootB := newNamespace(t, "shoot--a"), newNamespace(t, "shoot--b")
	r, err := Render(Options{ReleaseName: "stretch", Namespace: "druid-stretch-system", Values: values(t, fmt.Sprintf(`
sidecar:
  port: 8091
networkPolicy:
  etcdNamespaces: [%s, %s]
  peerCIDRs: [10.1.0.0/16]
`, shootA, shootB))})
	g.Expect(err).NotTo(HaveOccurred())
	policies := r.OfKind("NetworkPolicy")
	g.Expect(policies).To(HaveLen(2))
	dep := deployment(g, r)
	controllerPod := dep.Spec.Template.Labels
	etcdPod := map[string]string{"app.kubernetes.io/managed-by": "etcd-druid", "app.kubernetes.io/component": "etcd-statefulset", "instance": "etcd-main"}

	var namespaces []string
	for _, u := range policies {
		var np networkingv1.NetworkPolicy
		g.Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &np)).To(Succeed())
		namespaces = append(namespaces, np.Namespace)
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(sel.Matches(labels.Set(etcdPod))).To(BeTrue(), "the policy selects druid's etcd pods")
		g.Expect(sel.Matches(labels.Set(controllerPod))).To(BeFalse())
		g.Expect(np.Spec.PolicyTypes).To(ConsistOf(networkingv1.PolicyTypeIngress))

		for _, tc := range []struct {
			what string
			from peer
			port int32
			want bool
		}{
			{"the controller to the sidecar", peer{namespace: "druid-stretch-system", labels: controllerPod, ip: "10.0.0.5"}, 8091, true},
			{"the peer site to the sidecar", peer{namespace: "elsewhere", ip: "10.1.2.3"}, 8091, true},
			{"another pod of the controller's namespace to the sidecar", peer{namespace: "druid-stretch-system", labels: map[string]string{"app": "other"}, ip: "10.0.0.6"}, 8091, false},
			{"a pod of the Etcd's namespace to the sidecar", peer{namespace: np.Namespace, labels: etcdPod, ip: "10.0.0.7"}, 8091, false},
			{"an outside address to the sidecar", peer{ip: "192.0.2.1"}, 8091, false},
			{"a client to etcd", peer{namespace: "garden", ip: "192.0.2.1"}, 2379, true},
			{"a peer to etcd", peer{ip: "192.0.2.1"}, 2380, true},
			{"backup-restore's port", peer{ip: "192.0.2.1"}, 8080, true},
			{"the port just above the sidecar's", peer{ip: "192.0.2.1"}, 8092, true},
		} {
			g.Expect(admits(g, &np, tc.from, tc.port)).To(Equal(tc.want), "%s in %s (port %d)", tc.what, np.Namespace, tc.port)
		}
	}
	g.Expect(namespaces).To(ConsistOf(shootA, shootB))
	// The API server takes them as rendered (port ranges included).
	g.Expect(Create(t.Context(), admin, policies)).To(Succeed())

	none, err := Render(Options{ReleaseName: "stretch", Namespace: "druid-stretch-system", Values: values(t, ``)})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(none.OfKind("NetworkPolicy")).To(BeEmpty(), "no Etcd namespace, no policy")
}

// TestRenderedSecurityContext checks the controller pod the chart renders
// against Pod Security's restricted profile, with a read-only root
// filesystem. (The sidecar the webhook injects is checked on the stored
// StatefulSet in TestChartWebhooks.)
func TestRenderedSecurityContext(t *testing.T) {
	g := NewWithT(t)
	r, err := Render(Options{ReleaseName: "stretch", Namespace: "druid-stretch-system", Values: values(t, ``)})
	g.Expect(err).NotTo(HaveOccurred())
	pod := deployment(g, r).Spec.Template.Spec
	g.Expect(pod.SecurityContext.RunAsNonRoot).To(Equal(ptr.To(true)))
	g.Expect(*pod.SecurityContext.RunAsUser).NotTo(BeZero())
	g.Expect(pod.SecurityContext.SeccompProfile.Type).To(Equal(corev1.SeccompProfileTypeRuntimeDefault))
	g.Expect(pod.HostNetwork || pod.HostPID || pod.HostIPC).To(BeFalse())
	for _, c := range append(pod.InitContainers, pod.Containers...) {
		expectRestricted(g, c.SecurityContext, c.Name)
	}
}

// expectRestricted checks a container's securityContext against Pod
// Security's restricted profile, with a read-only root filesystem.
func expectRestricted(g *WithT, sc *corev1.SecurityContext, container string) {
	g.ExpectWithOffset(1, sc).NotTo(BeNil(), container)
	g.ExpectWithOffset(1, sc.RunAsNonRoot).To(Equal(ptr.To(true)), container)
	g.ExpectWithOffset(1, sc.AllowPrivilegeEscalation).To(Equal(ptr.To(false)), container)
	g.ExpectWithOffset(1, sc.ReadOnlyRootFilesystem).To(Equal(ptr.To(true)), container)
	g.ExpectWithOffset(1, sc.Privileged).To(Or(BeNil(), Equal(ptr.To(false))), container)
	g.ExpectWithOffset(1, sc.Capabilities.Drop).To(ConsistOf(corev1.Capability("ALL")), container)
	g.ExpectWithOffset(1, sc.Capabilities.Add).To(BeEmpty(), container)
	g.ExpectWithOffset(1, sc.SeccompProfile.Type).To(Equal(corev1.SeccompProfileTypeRuntimeDefault), container)
}

// peer is the source of a connection: a pod (namespace and labels) or an
// address outside the cluster's pods (namespace empty).
type peer struct {
	namespace string
	labels    map[string]string
	ip        string
}

// admits evaluates np's ingress rules as the API documents them: a rule
// admits when one of its ports matches (none: every port) and one of its
// peers matches (none: every source).
func admits(g *WithT, np *networkingv1.NetworkPolicy, from peer, port int32) bool {
	for _, rule := range np.Spec.Ingress {
		if portMatches(rule.Ports, port) && peerMatches(g, np.Namespace, rule.From, from) {
			return true
		}
	}
	return false
}

func portMatches(ports []networkingv1.NetworkPolicyPort, port int32) bool {
	if len(ports) == 0 {
		return true
	}
	for _, p := range ports {
		if p.Protocol != nil && *p.Protocol != corev1.ProtocolTCP {
			continue
		}
		if p.Port == nil {
			return true
		}
		first := p.Port.IntVal
		if port >= first && port <= ptr.Deref(p.EndPort, first) {
			return true
		}
	}
	return false
}

func peerMatches(g *WithT, policyNamespace string, peers []networkingv1.NetworkPolicyPeer, from peer) bool {
	if len(peers) == 0 {
		return true
	}
	for _, p := range peers {
		if p.IPBlock != nil {
			prefix, err := netip.ParsePrefix(p.IPBlock.CIDR)
			g.Expect(err).NotTo(HaveOccurred())
			if prefix.Contains(netip.MustParseAddr(from.ip)) {
				return true
			}
			continue
		}
		if from.namespace == "" {
			continue // not a pod: only ipBlocks match it
		}
		nsOK := from.namespace == policyNamespace
		if p.NamespaceSelector != nil {
			sel, err := metav1.LabelSelectorAsSelector(p.NamespaceSelector)
			g.Expect(err).NotTo(HaveOccurred())
			nsOK = sel.Matches(labels.Set{"kubernetes.io/metadata.name": from.namespace})
		}
		podOK := true
		if p.PodSelector != nil {
			sel, err := metav1.LabelSelectorAsSelector(p.PodSelector)
			g.Expect(err).NotTo(HaveOccurred())
			podOK = sel.Matches(labels.Set(from.labels))
		}
		if nsOK && podOK {
			return true
		}
	}
	return false
}
