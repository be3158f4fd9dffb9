package membership_test

import (
	"testing"
	"time"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	membershipctrl "github.com/druid-stretch/druid-stretch/controllers/membership"
	"github.com/druid-stretch/druid-stretch/internal/pki"
)

// TestSidecarsVerifiedWithTheirEtcdsCA: with SidecarCAFromEtcd, the
// controller trusts an Etcd's sidecars only through the CA of the Etcd's
// own spec.backup.tls.tlsCASecretRef (one CA per shoot). While that Secret
// is missing, or holds another shoot's CA, no sidecar call reaches a pod,
// nothing is bootstrapped, and the status names the cause; once the Secret
// holds the CA that signed the sidecars, the cluster starts and converges.
func TestSidecarsVerifiedWithTheirEtcdsCA(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t)
	// The client certificate alone: no CA to verify any sidecar with but
	// the Etcd's.
	clientOnly := e.clientTLS.Clone()
	clientOnly.RootCAs = nil
	e.startController(func(o *membershipctrl.ManagerOptions) {
		o.Reconciler.SidecarTLS, o.Reconciler.SidecarCAFromEtcd = clientOnly, true
	})

	const caSecret = "ca-etcd-bundle"
	etcd := e.newEtcd("ca", 3, func(etcd *v1alpha1.Etcd) {
		etcd.Spec.Backup.TLS = &druidv1alpha1.TLSConfig{
			TLSCASecretRef:     druidv1alpha1.SecretReference{SecretReference: corev1.SecretReference{Name: caSecret}, DataKey: ptr.To("bundle.crt")},
			ServerTLSSecretRef: corev1.SecretReference{Name: "etcd-server"},
		}
	})
	blockedBy := func(reason string, contains ...string) {
		t.Helper()
		g.Eventually(func(g Gomega) {
			c := condition(g, etcd, v1alpha1.ConditionMembershipDegraded)
			g.Expect(c).NotTo(BeNil(), "a Degraded condition")
			g.Expect(c.Reason).To(Equal(reason))
			for _, s := range contains {
				g.Expect(c.Message).To(ContainSubstring(s))
			}
		}).WithTimeout(30 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())
		g.Expect(e.calls.snapshot()).To(BeEmpty(), "no call reaches a sidecar the controller cannot verify")
	}

	blockedBy("SidecarCAUnavailable", e.ns+"/"+caSecret, `"bundle.crt"`, "does not exist", "no member is changed")

	other, err := pki.NewCA("another-shoot")
	g.Expect(err).NotTo(HaveOccurred())
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: caSecret}, Data: map[string][]byte{"ca.crt": e.ca.CertPEM()}}
	g.Expect(k8s.Create(t.Context(), sec)).To(Succeed())
	blockedBy("SidecarCAUnavailable", `"bundle.crt"`, "no such key")

	sec.Data = map[string][]byte{"bundle.crt": other.CertPEM()}
	g.Expect(k8s.Update(t.Context(), sec)).To(Succeed())
	blockedBy(v1alpha1.ReasonClusterUnreachable, "certificate signed by unknown authority")
	g.Expect(reasons(events(g, etcd))).NotTo(HaveKey(v1alpha1.ReasonBootstrapping), "nothing bootstrapped through sidecars it cannot verify")

	// The shoot's CA bundle, as during a CA rotation: old and new.
	sec.Data = map[string][]byte{"bundle.crt": append(other.CertPEM(), e.ca.CertPEM()...)}
	g.Expect(k8s.Update(t.Context(), sec)).To(Succeed())
	converged(g, etcd, current, 90*time.Second, names("ca", 0, 1, 2)...)
}
