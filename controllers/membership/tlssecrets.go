package membership

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/members"
)

// reasonTLSSecretInvalid: a TLS Secret the Etcd's pods start with would
// not let them serve or reach each other.
const reasonTLSSecretInvalid = "TLSSecretInvalid"

// tlsChecks keeps each Etcd's last check of its TLS Secrets, which
// stands for Options.ConvergedInterval (or until the Etcd's spec changes):
// a reconciling Etcd is looked at several times a second, its Secrets
// change seldom.
type tlsChecks struct {
	mu   sync.Mutex
	last map[types.NamespacedName]tlsCheck
}

type tlsCheck struct {
	at  time.Time
	gen int64
	err error
}

// checkTLSSecrets checks, with Options.SidecarCAFromEtcd (the controller
// may read the Etcd's Secrets), the Secrets e's pods start with, as a
// seed's druid lays them out: each CA bundle holds a certificate; each
// server and client certificate matches its key, is within its validity
// and chains to its CA for its use; etcd's server certificate names
// <etcd>-local (the client gate's and the sidecar's way to etcd) and the
// client Service <etcd>-client; the backup-restore server certificate,
// which the sidecar serves with, names <etcd>-local (etcd-wrapper's way to
// the sidecar) and the first pod's peer name (the controller's); the peer
// certificate the first pod's peer name. A problem is an error that names
// each Secret and what is wrong with it: the controller then calls no
// sidecar, so no member is added or admitted to start with it, and no
// pod bootstraps.
func (r *Reconciler) checkTLSSecrets(ctx context.Context, e *v1alpha1.Etcd) error {
	if !r.opts.SidecarCAFromEtcd {
		return nil
	}
	key := types.NamespacedName{Namespace: e.Namespace, Name: e.Name}
	r.tlsChecks.mu.Lock()
	last, ok := r.tlsChecks.last[key]
	r.tlsChecks.mu.Unlock()
	if ok && last.gen == e.Generation && time.Since(last.at) < r.opts.ConvergedInterval {
		return last.err
	}
	err := r.readTLSSecrets(ctx, e)
	var unread *unreadSecret
	if errors.As(err, &unread) {
		// The API server did not answer: nothing is known of the
		// Secrets, and the next reconcile reads them again.
		return err
	}
	r.tlsChecks.mu.Lock()
	defer r.tlsChecks.mu.Unlock()
	if r.tlsChecks.last == nil {
		r.tlsChecks.last = map[types.NamespacedName]tlsCheck{}
	}
	r.tlsChecks.last[key] = tlsCheck{at: time.Now(), gen: e.Generation, err: err}
	return err
}

func (r *Reconciler) readTLSSecrets(ctx context.Context, e *v1alpha1.Etcd) error {
	podName := members.PodName(e, members.LocalOrdinals(e).Start)
	peerName := fmt.Sprintf("%s.%s.%s.svc", podName, druidv1alpha1.GetPeerServiceName(e.ObjectMeta), e.Namespace)
	local := e.Name + "-local"
	var errs []error
	check := func(field string, t *druidv1alpha1.TLSConfig, serverNames []string, withClient bool, serverUses ...x509.ExtKeyUsage) {
		if t == nil {
			return
		}
		roots, err := r.caBundle(ctx, e, field+".tlsCASecretRef", t.TLSCASecretRef)
		if err != nil {
			errs = append(errs, err)
			return
		}
		if err := r.leaf(ctx, e, field+".serverTLSSecretRef", t.ServerTLSSecretRef, roots, serverNames, serverUses...); err != nil {
			errs = append(errs, err)
		}
		if withClient && t.ClientTLSSecretRef.Name != "" {
			if err := r.leaf(ctx, e, field+".clientTLSSecretRef", t.ClientTLSSecretRef, roots, nil, x509.ExtKeyUsageClientAuth); err != nil {
				errs = append(errs, err)
			}
		}
	}
	check("spec.etcd.clientUrlTls", e.Spec.Etcd.ClientUrlTLS, []string{local, druidv1alpha1.GetClientServiceName(e.ObjectMeta)}, true, x509.ExtKeyUsageServerAuth)
	if p := e.Spec.Etcd.PeerUrlTLS; p != nil {
		// etcd presents its peer certificate as a client to the other
		// members too.
		check("spec.etcd.peerUrlTls", &p.TLSConfig, []string{peerName}, false, x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth)
	}
	check("spec.backup.tls", e.Spec.Backup.TLS, []string{local, peerName}, true, x509.ExtKeyUsageServerAuth)
	return errors.Join(errs...)
}

// secret reads the Secret ref names in e's namespace (or its own).
func (r *Reconciler) secret(ctx context.Context, e *v1alpha1.Etcd, field string, ref corev1.SecretReference) (*corev1.Secret, error) {
	key := types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}
	if key.Namespace == "" {
		key.Namespace = e.Namespace
	}
	var sec corev1.Secret
	if err := r.reader.Get(ctx, key, &sec); apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("the Secret %s (%s) does not exist", key, field)
	} else if err != nil {
		return nil, &unreadSecret{fmt.Errorf("the Secret %s (%s): %w", key, field, err)}
	}
	return &sec, nil
}

// unreadSecret is a Secret the API server did not give: its check is not
// kept.
type unreadSecret struct{ err error }

func (u *unreadSecret) Error() string { return u.err.Error() }
func (u *unreadSecret) Unwrap() error { return u.err }

// caBundle is the certificate pool of a CA Secret.
func (r *Reconciler) caBundle(ctx context.Context, e *v1alpha1.Etcd, field string, ref druidv1alpha1.SecretReference) (*x509.CertPool, error) {
	sec, err := r.secret(ctx, e, field, ref.SecretReference)
	if err != nil {
		return nil, err
	}
	dataKey := ptr.Deref(ref.DataKey, defaultCAKey)
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(sec.Data[dataKey]) {
		return nil, fmt.Errorf("the Secret %s/%s (%s): no PEM certificate under key %q", sec.Namespace, sec.Name, field, dataKey)
	}
	return pool, nil
}

// leaf checks a certificate Secret (tls.crt, tls.key) against its CA,
// each of its uses, its validity and the names it must cover.
func (r *Reconciler) leaf(ctx context.Context, e *v1alpha1.Etcd, field string, ref corev1.SecretReference, roots *x509.CertPool, names []string, uses ...x509.ExtKeyUsage) error {
	sec, err := r.secret(ctx, e, field, ref)
	if err != nil {
		return err
	}
	fail := func(format string, args ...any) error {
		return fmt.Errorf("the Secret %s/%s (%s): %s", sec.Namespace, sec.Name, field, fmt.Sprintf(format, args...))
	}
	pair, err := tls.X509KeyPair(sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return fail("tls.crt and tls.key: %v", err)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return fail("tls.crt: %v", err)
	}
	now := time.Now()
	switch {
	case now.After(cert.NotAfter):
		return fail("the certificate expired at %s", cert.NotAfter.UTC().Format(time.RFC3339))
	case now.Before(cert.NotBefore):
		return fail("the certificate is valid only from %s", cert.NotBefore.UTC().Format(time.RFC3339))
	}
	inter := x509.NewCertPool()
	for _, der := range pair.Certificate[1:] {
		if c, err := x509.ParseCertificate(der); err == nil {
			inter.AddCert(c)
		}
	}
	for _, use := range uses {
		if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{use}}); err != nil {
			return fail("the certificate does not verify against the CA of the same TLS configuration: %v", err)
		}
	}
	var missing []string
	for _, n := range names {
		if cert.VerifyHostname(n) != nil {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		return fail("the certificate does not name %s (it names %s)", strings.Join(missing, ", "), strings.Join(cert.DNSNames, ", "))
	}
	return nil
}
