package site

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/druid-stretch/druid-stretch/internal/testing/pki"
)

// The Secrets of a shoot's etcd-main in its namespace, named and keyed as
// a Gardener seed's (gardenlet's etcd component and secrets manager):
// CA bundles under bundle.crt, certificates under tls.crt and tls.key.
const (
	// SecretEtcdCA is the shoot's etcd CA: it signs etcd's server and
	// client certificates, and backup-restore's.
	SecretEtcdCA = "ca-etcd-bundle"
	// SecretEtcdPeerCA is the shoot's etcd peer CA.
	SecretEtcdPeerCA = "ca-etcd-peer-bundle"
	// SecretEtcdServer is etcd's server certificate (client URLs), which
	// backup-restore and the druid-stretch sidecar serve with too.
	SecretEtcdServer = "etcd-server-main"
	// SecretEtcdPeerServer is etcd's peer certificate.
	SecretEtcdPeerServer = "etcd-peer-server-main"
	// SecretEtcdClient is the client certificate of etcd's clients: the
	// shoot's kube-apiserver, backup-restore, the sidecar.
	SecretEtcdClient = "etcd-client"
	// SecretSidecarClientCA holds druid-stretch's client CA (key ca.crt),
	// with which the sidecars verify the controllers (the chart's
	// sidecar.clientCASecretName): one druid-stretch CA per landscape,
	// copied next to each Etcd.
	SecretSidecarClientCA = "druid-stretch-sidecar-client-ca"
	// caBundleKey is the data key of a CA bundle.
	caBundleKey = "bundle.crt"
)

// RestoredEtcdName names the Etcd the tests restore from a backup store,
// beside etcd-main in a shoot's namespace and with its Secrets.
const RestoredEtcdName = "etcd-restored"

// ShootTLS is the TLS of one shoot's etcd-main, issued as a Gardener seed
// issues it: the shoot's own etcd CA and peer CA, and from them etcd's
// server, peer and client certificates, with the names gardenlet gives
// them (<etcd>-local, the client Service's, the peer Service's wildcard)
// and the members' names under the sites' external zones, by which the
// other site's members, sidecars and backup-restore reach them during a
// move. Both sites of a move hold the same Secrets, as GEP-39 gives the
// destination seed the shoot's secrets. The certificates name etcd-main
// and RestoredEtcdName.
type ShootTLS struct {
	etcdCA, peerCA     *pki.CA
	serverNames, peers []string

	mu      sync.Mutex
	secrets []*corev1.Secret
	client  tls.Certificate
	// serverSerial is the serial number of the server certificate issued
	// last.
	serverSerial *big.Int
}

// NewShootTLS issues the Secrets of one shoot's etcd cluster whose Etcds
// run in namespaces (one, or the namespaces of Etcds that stretch one
// cluster), its members also named <pod>.<namespace>.<domain> for each
// domain.
func NewShootTLS(namespaces []string, domains ...string) (*ShootTLS, error) {
	if len(namespaces) == 0 {
		return nil, errors.New("a shoot's TLS needs the namespace of its Etcds")
	}
	etcdCA, err := pki.NewCA("ca-etcd " + namespaces[0])
	if err != nil {
		return nil, err
	}
	peerCA, err := pki.NewCA("ca-etcd-peer " + namespaces[0])
	if err != nil {
		return nil, err
	}
	var server, peer []string
	for _, ns := range namespaces {
		svcNames := func(svc string) []string {
			return []string{svc, svc + "." + ns, svc + "." + ns + ".svc", svc + "." + ns + ".svc." + ClusterDomain}
		}
		for _, name := range []string{MoveEtcdName, RestoredEtcdName} {
			server = slices.Concat(server, []string{name + "-local"}, svcNames(name+"-client"), svcNames("*."+name+"-peer"))
			peer = slices.Concat(peer, svcNames(name+"-peer"), svcNames("*."+name+"-peer"))
		}
		for _, d := range domains {
			server = append(server, "*."+ns+"."+d)
			peer = append(peer, "*."+ns+"."+d)
		}
	}
	slices.Sort(server)
	slices.Sort(peer)
	t := &ShootTLS{etcdCA: etcdCA, peerCA: peerCA, serverNames: slices.Compact(server), peers: slices.Compact(peer)}
	if err := t.issue(); err != nil {
		return nil, err
	}
	return t, nil
}

// issue issues the server, peer and client certificates from the shoot's
// CAs, and makes t's Secrets hold them.
func (t *ShootTLS) issue() error {
	serverPair, err := t.etcdCA.Issue("etcd-server", t.serverNames...)
	if err != nil {
		return err
	}
	peerPair, err := t.peerCA.Issue("etcd-server", t.peers...)
	if err != nil {
		return err
	}
	// A client certificate has no name: etcd checks a client's address
	// against the names of its certificate when it has any.
	client, err := t.etcdCA.Issue("etcd-client")
	if err != nil {
		return err
	}
	clientCert, err := tls.X509KeyPair(client.CertPEM, client.KeyPEM)
	if err != nil {
		return err
	}
	serverCert, err := tls.X509KeyPair(serverPair.CertPEM, serverPair.KeyPEM)
	if err != nil {
		return err
	}
	leaf, err := x509.ParseCertificate(serverCert.Certificate[0])
	if err != nil {
		return err
	}
	pair := func(p pki.Pair) map[string][]byte {
		return map[string][]byte{corev1.TLSCertKey: p.CertPEM, corev1.TLSPrivateKeyKey: p.KeyPEM}
	}
	secret := func(name string, data map[string][]byte) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: data}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.client, t.serverSerial = clientCert, leaf.SerialNumber
	t.secrets = []*corev1.Secret{
		secret(SecretEtcdCA, map[string][]byte{caBundleKey: t.etcdCA.CertPEM()}),
		secret(SecretEtcdPeerCA, map[string][]byte{caBundleKey: t.peerCA.CertPEM()}),
		secret(SecretEtcdServer, pair(serverPair)),
		secret(SecretEtcdPeerServer, pair(peerPair)),
		secret(SecretEtcdClient, pair(client)),
	}
	return nil
}

// ServerSerial is the serial number of the server certificate issued last.
func (t *ShootTLS) ServerSerial() *big.Int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.serverSerial
}

// Renew issues new server, peer and client certificates from the same CAs
// and writes them into the shoot's Secrets of namespace in each site, as
// gardenlet's secrets manager renews them in place: the pods see them
// through their Secret volumes (the node stand-in swaps them in), and
// what watches its files (etcd per handshake, the client gate and the
// sidecars) uses them from then on without a restart.
func (t *ShootTLS) Renew(ctx context.Context, namespace string, sites ...*Site) error {
	if err := t.issue(); err != nil {
		return err
	}
	t.mu.Lock()
	secrets := slices.Clone(t.secrets)
	t.mu.Unlock()
	for _, s := range sites {
		for _, sec := range secrets {
			// druid writes its finalizer onto the Secrets an Etcd names:
			// the data goes onto the Secret as it is now.
			err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
				cur, err := s.Kube.CoreV1().Secrets(namespace).Get(ctx, sec.Name, metav1.GetOptions{})
				if err != nil {
					return err
				}
				cur.Data = sec.Data
				_, err = s.Kube.CoreV1().Secrets(namespace).Update(ctx, cur, metav1.UpdateOptions{})
				return err
			})
			if err != nil {
				return fmt.Errorf("renewing the shoot's Secret %s/%s in %s: %w", namespace, sec.Name, s.opts.ClusterIdentity, err)
			}
		}
	}
	return nil
}

// InstallShootTLS creates t's Secrets in s's namespace, and the Secret of
// s's druid-stretch client CA beside them, and makes s's etcd clients
// (EtcdClientTLS) trust the shoot's etcd CA and present its client
// certificate.
func (s *Site) InstallShootTLS(ctx context.Context, t *ShootTLS, namespace string) error {
	t.mu.Lock()
	secrets := slices.Clone(t.secrets)
	t.mu.Unlock()
	secrets = append(secrets, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: SecretSidecarClientCA},
		Data:       map[string][]byte{"ca.crt": s.stretchCA.CertPEM()},
	})
	for _, sec := range secrets {
		sec = sec.DeepCopy()
		sec.Namespace = namespace
		if _, err := s.Kube.CoreV1().Secrets(namespace).Create(ctx, sec, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating the shoot's Secret %s/%s: %w", namespace, sec.Name, err)
		}
	}
	s.shoots.add(t, namespace)
	return nil
}

// shootTrust is what a site's own etcd clients use for the shoots
// installed in it: every shoot's etcd CA, and every shoot's client
// certificate, of which TLS presents the one whose CA the server asks for.
type shootTrust struct {
	mu     sync.Mutex
	shoots []*ShootTLS
	byNS   map[string]*ShootTLS
}

func (st *shootTrust) add(t *ShootTLS, namespace string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if !slices.Contains(st.shoots, t) {
		st.shoots = append(st.shoots, t)
	}
	if st.byNS == nil {
		st.byNS = map[string]*ShootTLS{}
	}
	st.byNS[namespace] = t
}

// ShootTLSOf is the shoot's TLS installed in namespace, nil if none.
func (s *Site) ShootTLSOf(namespace string) *ShootTLS {
	s.shoots.mu.Lock()
	defer s.shoots.mu.Unlock()
	return s.shoots.byNS[namespace]
}

// EtcdClientTLS is the TLS of the site's own etcd clients (tests, loads):
// it trusts the etcd CA of each shoot installed in the site and presents
// the client certificate that CA signed (etcd names its client CA in the
// handshake). An error when no shoot is installed.
func (s *Site) EtcdClientTLS() (*tls.Config, error) {
	s.shoots.mu.Lock()
	defer s.shoots.mu.Unlock()
	if len(s.shoots.shoots) == 0 {
		return nil, errors.New("no shoot's TLS is installed in the site: its etcd clients have no CA to trust")
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	cfg.RootCAs = s.shoots.shoots[0].etcdCA.Pool()
	for i, t := range s.shoots.shoots {
		if i > 0 {
			cfg.RootCAs.AppendCertsFromPEM(t.etcdCA.CertPEM())
		}
		t.mu.Lock()
		cfg.Certificates = append(cfg.Certificates, t.client)
		t.mu.Unlock()
	}
	return cfg, nil
}
