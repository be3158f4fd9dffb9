package site

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/druid-stretch/druid-stretch/internal/testing/freeport"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
)

// startControlPlane starts etcd and kube-apiserver (envtest, with druid's
// CRDs), then kube-controller-manager and kube-scheduler, each under the
// user its bootstrap RBAC role is made for.
func (s *Site) startControlPlane(ctx context.Context) error {
	env, err := testbin.Environment()
	if err != nil {
		return err
	}
	crds, err := druidCRDs()
	if err != nil {
		return err
	}
	// druid's own CRDs, as its chart installs them; druid-stretch's chart
	// replaces the Etcd CRD later, as on a real seed.
	env.CRDDirectoryPaths = []string{crds}
	if env.ControlPlane.APIServer == nil {
		env.ControlPlane.APIServer = &envtest.APIServer{}
	}
	// envtest turns the ServiceAccount admission plugin off; real clusters
	// have it, and druid's pods rely on it for their API token
	// (backup-restore renews the member leases with it).
	env.ControlPlane.APIServer.Configure().Disable("disable-admission-plugins")
	// A scheme of the site's own: envtest adds the CRD types to the scheme
	// it installs CRDs with (client-go's global one by default), and sites
	// start concurrently.
	env.Scheme = runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(env.Scheme); err != nil {
		return err
	}
	cfg, err := env.Start()
	if err != nil {
		return fmt.Errorf("starting etcd and kube-apiserver: %w", err)
	}
	s.env = env
	s.onStop(env.Stop)
	s.Config = cfg
	if err := s.newClients(); err != nil {
		return err
	}

	pki := filepath.Join(s.Dir, "pki")
	if err := os.MkdirAll(pki, 0o700); err != nil {
		return err
	}
	rootCA := filepath.Join(pki, "ca.crt")
	if err := os.WriteFile(rootCA, cfg.CAData, 0o644); err != nil {
		return err
	}
	certDir := env.ControlPlane.APIServer.CertDir
	if s.AdminKubeconfig, err = s.kubeconfig("site-admin", "system:masters"); err != nil {
		return err
	}

	err = s.startComponent(ctx, "kube-controller-manager", testbin.KubeControllerManager,
		// Each controller acts under its own ServiceAccount, as kubeadm
		// sets it up: the bootstrap RBAC roles are made for that.
		"--use-service-account-credentials=true",
		"--service-account-private-key-file="+filepath.Join(certDir, "sa-signer.key"),
		// The root CA publisher writes kube-root-ca.crt into every
		// namespace: projected ServiceAccount volumes read it.
		"--root-ca-file="+rootCA,
		"--cluster-name=site",
		"--controllers=*",
	)
	if err != nil {
		return err
	}
	return s.startComponent(ctx, "kube-scheduler", testbin.KubeScheduler)
}

// startComponent runs kube-controller-manager or kube-scheduler as the user
// system:<name>, whose bootstrap RBAC role is made for it, with leader
// election off (one replica), serving /healthz on a free 127.0.0.1 port,
// and waits until it is healthy.
func (s *Site) startComponent(ctx context.Context, name string, find func() (string, error), extra ...string) error {
	kubeconfig, err := s.kubeconfig("system:" + name)
	if err != nil {
		return err
	}
	bin, err := find()
	if err != nil {
		return err
	}
	port, err := freeport.Pick()
	if err != nil {
		return err
	}
	p, err := s.start(name, bin, append([]string{
		"--kubeconfig=" + kubeconfig,
		"--authentication-kubeconfig=" + kubeconfig,
		"--authorization-kubeconfig=" + kubeconfig,
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--cert-dir=" + filepath.Join(s.Dir, name),
	}, extra...), nil)
	if err != nil {
		return err
	}
	return waitHealthy(ctx, p, fmt.Sprintf("https://127.0.0.1:%d/healthz", port))
}

// kubeconfig writes a kubeconfig of the site's API server for user (a
// client certificate issued by envtest) and returns its path.
func (s *Site) kubeconfig(user string, groups ...string) (string, error) {
	u, err := s.env.ControlPlane.AddUser(envtest.User{Name: user, Groups: groups}, nil)
	if err != nil {
		return "", fmt.Errorf("a client certificate for %s: %w", user, err)
	}
	raw, err := u.KubeConfig()
	if err != nil {
		return "", err
	}
	path := filepath.Join(s.Dir, "pki", filepath.Base(user)+".kubeconfig")
	return path, os.WriteFile(path, raw, 0o600)
}
