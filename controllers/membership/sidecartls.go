package membership

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
)

// reasonSidecarCA: the CA that verifies an Etcd's sidecars could not be
// read from the Etcd's own Secret.
const reasonSidecarCA = "SidecarCAUnavailable"

// defaultCAKey is druid's data key of a CA Secret when the reference names
// none.
const defaultCAKey = "ca.crt"

// sidecarCAs keeps, per CA Secret, the client TLS made from its last
// version seen: an unchanged Secret gives the same *tls.Config, so that
// the sidecars' clients (and their connections) are kept.
type sidecarCAs struct {
	mu    sync.Mutex
	bySec map[types.NamespacedName]sidecarCA
}

type sidecarCA struct {
	resourceVersion, key string
	tls                  *tls.Config
}

// sidecarTLS is the client TLS towards e's sidecars. With
// Options.SidecarCAFromEtcd, its roots are the CA of e's
// spec.backup.tls.tlsCASecretRef (the sidecar serves with
// spec.backup.tls.serverTLSSecretRef), read uncached on each call so that
// a renewed CA is used at the next reconcile; otherwise nil (the Cluster's
// Config.TLS, Options.SidecarTLS, serves every Etcd). An Etcd whose
// Secret is missing or holds no CA certificate is an error that names the
// Secret: its sidecars are not called with a guess.
func (r *Reconciler) sidecarTLS(ctx context.Context, e *v1alpha1.Etcd) (*tls.Config, error) {
	if !r.opts.SidecarCAFromEtcd {
		return nil, nil
	}
	t := e.Spec.Backup.TLS
	if t == nil {
		// Plain HTTP sidecars (the insecure opt-in for tests): no CA.
		return nil, nil
	}
	key := types.NamespacedName{Namespace: t.TLSCASecretRef.Namespace, Name: t.TLSCASecretRef.Name}
	if key.Namespace == "" {
		key.Namespace = e.Namespace
	}
	dataKey := ptr.Deref(t.TLSCASecretRef.DataKey, defaultCAKey)
	fail := func(format string, args ...any) error {
		return fmt.Errorf("the CA of Etcd %s/%s's sidecars, Secret %s key %q (spec.backup.tls.tlsCASecretRef): %s",
			e.Namespace, e.Name, key, dataKey, fmt.Sprintf(format, args...))
	}
	var sec corev1.Secret
	if err := r.reader.Get(ctx, key, &sec); apierrors.IsNotFound(err) {
		return nil, fail("the Secret does not exist")
	} else if err != nil {
		return nil, fail("%v", err)
	}
	r.cas.mu.Lock()
	defer r.cas.mu.Unlock()
	if c, ok := r.cas.bySec[key]; ok && c.resourceVersion == sec.ResourceVersion && c.key == dataKey {
		return c.tls, nil
	}
	pem, ok := sec.Data[dataKey]
	if !ok {
		return nil, fail("the Secret has no such key")
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fail("no PEM certificate in it")
	}
	base := r.opts.SidecarTLS
	if base == nil {
		base = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	cfg := base.Clone()
	cfg.RootCAs = pool
	if r.cas.bySec == nil {
		r.cas.bySec = map[types.NamespacedName]sidecarCA{}
	}
	r.cas.bySec[key] = sidecarCA{resourceVersion: sec.ResourceVersion, key: dataKey, tls: cfg}
	return cfg, nil
}
