package membership_test

import (
	"context"
	"maps"
	"testing"
	"time"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	membershipctrl "github.com/druid-stretch/druid-stretch/controllers/membership"
	"github.com/druid-stretch/druid-stretch/internal/testing/pki"
)

// The Secrets of the Etcds of these tests, as a seed's druid lays them
// out: the shoot's CA bundle and the certificates it signs.
const (
	caSecret         = "ca-etcd-bundle"
	serverSecret     = "etcd-server"
	clientSecret     = "etcd-client"
	peerCASecret     = "ca-etcd-peer"
	peerServerSecret = "etcd-peer-server"
)

// tlsSecrets are the Secrets of one shoot's etcd in ns, by name, issued
// by ca (etcdObject's peer TLS and withBackupTLS's backup TLS name them).
func tlsSecrets(g Gomega, ns string, ca *pki.CA) map[string]map[string][]byte {
	issue := func(cn string, hosts ...string) map[string][]byte {
		p, err := ca.Issue(cn, hosts...)
		g.Expect(err).NotTo(HaveOccurred())
		return map[string][]byte{"tls.crt": p.CertPEM, "tls.key": p.KeyPEM}
	}
	peers := "*.etcd-main-peer." + ns + ".svc"
	return map[string]map[string][]byte{
		caSecret:         {"bundle.crt": ca.CertPEM()},
		serverSecret:     issue("etcd-server", "etcd-main-local", "etcd-main-client", peers),
		clientSecret:     issue("etcd-client"),
		peerCASecret:     {"ca.crt": ca.CertPEM()},
		peerServerSecret: issue("etcd-server", peers),
	}
}

// writeSecrets creates or updates each Secret of secrets in ns.
func writeSecrets(g Gomega, ns string, secrets map[string]map[string][]byte) {
	for name, data := range secrets {
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: data}
		err := k8s.Create(context.Background(), sec)
		if apierrors.IsAlreadyExists(err) {
			err = k8s.Update(context.Background(), sec)
		}
		g.Expect(err).NotTo(HaveOccurred(), "writing Secret %s", name)
	}
}

// withBackupTLS gives the Etcd spec.backup.tls from the Secrets above.
func withBackupTLS(etcd *v1alpha1.Etcd) {
	etcd.Spec.Backup.TLS = &druidv1alpha1.TLSConfig{
		TLSCASecretRef:     druidv1alpha1.SecretReference{SecretReference: corev1.SecretReference{Name: caSecret}, DataKey: ptr.To("bundle.crt")},
		ServerTLSSecretRef: corev1.SecretReference{Name: serverSecret},
		ClientTLSSecretRef: corev1.SecretReference{Name: clientSecret},
	}
}

// startWithEtcdsCA starts the controller with the client certificate
// alone, no CA to verify any sidecar with but each Etcd's, and a short
// backoff, so that a blocked Etcd is looked at again soon.
func startWithEtcdsCA(e *env) {
	clientOnly := e.clientTLS.Clone()
	clientOnly.RootCAs = nil
	e.startController(func(o *membershipctrl.ManagerOptions) {
		o.Reconciler.SidecarTLS, o.Reconciler.SidecarCAFromEtcd = clientOnly, true
		o.Reconciler.MaxBackoff = 2 * time.Second
	})
}

// blockedBy waits until the Etcd's MembershipDegraded condition has reason
// and a message with each of contains, and checks that no call reached a
// sidecar and nothing was bootstrapped.
func blockedBy(t *testing.T, e *env, etcd *v1alpha1.Etcd, reason string, contains ...string) {
	t.Helper()
	g := NewWithT(t)
	g.Eventually(func(g Gomega) {
		c := condition(g, etcd, v1alpha1.ConditionMembershipDegraded)
		g.Expect(c).NotTo(BeNil(), "a Degraded condition")
		g.Expect(c.Reason).To(Equal(reason))
		for _, s := range contains {
			g.Expect(c.Message).To(ContainSubstring(s))
		}
	}).WithTimeout(30 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())
	g.Expect(e.calls.snapshot()).To(BeEmpty(), "no call reaches a sidecar")
	g.Expect(reasons(events(g, etcd))).NotTo(HaveKey(v1alpha1.ReasonBootstrapping), "nothing bootstrapped")
}

// TestSidecarsVerifiedWithTheirEtcdsCA: with SidecarCAFromEtcd, the
// controller trusts an Etcd's sidecars only through the CA of the Etcd's
// own spec.backup.tls.tlsCASecretRef (one CA per shoot). While that Secret
// is missing, or holds another shoot's CA, no sidecar call reaches a pod,
// nothing is bootstrapped, and the status names the cause; once the Secret
// holds the CA that signed the sidecars, the cluster starts and converges.
func TestSidecarsVerifiedWithTheirEtcdsCA(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t)
	startWithEtcdsCA(e)
	etcd := e.newEtcd("ca", 3, withBackupTLS)

	blockedBy(t, e, etcd, "SidecarCAUnavailable", e.ns+"/"+caSecret, `"bundle.crt"`, "does not exist", "no member is changed")

	writeSecrets(g, e.ns, map[string]map[string][]byte{caSecret: {"ca.crt": e.ca.CertPEM()}})
	blockedBy(t, e, etcd, "SidecarCAUnavailable", `"bundle.crt"`, "no such key")

	// Another shoot's Secrets, each consistent with its CA: the sidecars,
	// whose certificates the Etcd's own CA did not sign, are refused.
	other, err := pki.NewCA("another-shoot")
	g.Expect(err).NotTo(HaveOccurred())
	secrets := tlsSecrets(g, e.ns, other)
	writeSecrets(g, e.ns, secrets)
	blockedBy(t, e, etcd, v1alpha1.ReasonClusterUnreachable, "certificate signed by unknown authority")

	// The shoot's CA bundle, as during a CA rotation: old and new.
	secrets[caSecret] = map[string][]byte{"bundle.crt": append(other.CertPEM(), e.ca.CertPEM()...)}
	writeSecrets(g, e.ns, secrets)
	converged(g, etcd, current, 90*time.Second, names("ca", 0, 1, 2)...)
}

// TestBrokenTLSSecretsChangeNothing: with SidecarCAFromEtcd, an Etcd whose
// TLS Secrets would not let its pods serve or reach each other (an expired
// certificate, one another CA signed, one that does not name what it
// serves, a certificate that does not match its key, a missing Secret) is
// blocked with a condition naming the Secret and the fault: no sidecar is
// called, nothing bootstrapped, no member added. Fixed, the cluster starts.
func TestBrokenTLSSecretsChangeNothing(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t)
	startWithEtcdsCA(e)
	other, err := pki.NewCA("another-shoot")
	g.Expect(err).NotTo(HaveOccurred())
	good := tlsSecrets(g, e.ns, e.ca)
	pair := func(ca *pki.CA, notBefore, notAfter time.Time, hosts ...string) map[string][]byte {
		p, err := ca.IssueValid(notBefore, notAfter, "etcd-server", hosts...)
		g.Expect(err).NotTo(HaveOccurred())
		return map[string][]byte{"tls.crt": p.CertPEM, "tls.key": p.KeyPEM}
	}
	now := time.Now()
	valid := []time.Time{now.Add(-time.Hour), now.Add(time.Hour)}
	peers := "*.etcd-main-peer." + e.ns + ".svc"
	etcd := e.newEtcd("tls", 3, withBackupTLS)
	blockedBy(t, e, etcd, "SidecarCAUnavailable", e.ns+"/"+caSecret, "does not exist")
	for _, tc := range []struct {
		name   string
		secret string
		data   map[string][]byte
		want   []string
	}{
		{"an expired server certificate", serverSecret, pair(e.ca, now.Add(-48*time.Hour), now.Add(-time.Hour), "etcd-main-local", "etcd-main-client", peers),
			[]string{e.ns + "/" + serverSecret, "spec.backup.tls.serverTLSSecretRef", "expired at"}},
		{"a server certificate of another CA", serverSecret, pair(other, valid[0], valid[1], "etcd-main-local", "etcd-main-client", peers),
			[]string{e.ns + "/" + serverSecret, "does not verify against the CA"}},
		{"a server certificate without <etcd>-local", serverSecret, pair(e.ca, valid[0], valid[1], "etcd-main-client", peers),
			[]string{e.ns + "/" + serverSecret, "does not name etcd-main-local"}},
		{"a peer certificate without the pods' peer names", peerServerSecret, pair(e.ca, valid[0], valid[1], "etcd-main-peer"),
			[]string{e.ns + "/" + peerServerSecret, "spec.etcd.peerUrlTls.serverTLSSecretRef", "does not name etcd-main-0.etcd-main-peer." + e.ns + ".svc"}},
		{"a client certificate whose key is another's", clientSecret, map[string][]byte{"tls.crt": good[clientSecret]["tls.crt"], "tls.key": good[serverSecret]["tls.key"]},
			[]string{e.ns + "/" + clientSecret, "tls.crt and tls.key"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			secrets := maps.Clone(good)
			secrets[tc.secret] = tc.data
			writeSecrets(NewWithT(t), e.ns, secrets)
			blockedBy(t, e, etcd, "TLSSecretInvalid", append(tc.want, "no member is added, started or changed")...)
		})
	}
	g.Expect(k8s.Delete(context.Background(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: clientSecret}})).To(Succeed())
	blockedBy(t, e, etcd, "TLSSecretInvalid", e.ns+"/"+clientSecret, "spec.backup.tls.clientTLSSecretRef", "does not exist")

	writeSecrets(g, e.ns, good)
	converged(g, etcd, current, 90*time.Second, names("tls", 0, 1, 2)...)
}
