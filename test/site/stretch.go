package site

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"

	"github.com/druid-stretch/druid-stretch/controllers/membership"
	"github.com/druid-stretch/druid-stretch/controllers/webhook"
	"github.com/druid-stretch/druid-stretch/internal/testing/freeport"
	"github.com/druid-stretch/druid-stretch/internal/testing/pki"
	"github.com/druid-stretch/druid-stretch/test/chart"
)

// StretchNamespace is the release namespace of druid-stretch on a site.
const StretchNamespace = "druid-stretch-system"

// stretchValues are the chart values of the site's druid-stretch release.
const stretchValues = `
image:
  repository: registry.local/druid-stretch
  tag: site
clusterIdentity: %s
sidecarClientTLS:
  secretName: druid-stretch-sidecar-client
  caFromEtcd: true
sidecar:
  clientGateBackendPort: 12379
  clientCASecretName: druid-stretch-sidecar-client-ca
controller:
  manageEtcdsInNamespaces: gardener.cloud/role=shoot
`

// startDruidStretch installs druid-stretch from its chart: the chart's
// CRD (the EtcdMembership; druid's Etcd CRD stays druid's own), the
// chart's namespace and RBAC are created, and the controller runs in this process
// as the chart's ServiceAccount, with the flags the chart gives it, its
// webhook server on 127.0.0.1 and the chart's webhook configurations
// pointed there (the API server cannot reach a pod's Service here).
//
// The controller runs in this process, not in a pod, because it must reach
// the sidecars in the pod network: it dials them through Site.DialContext.
// As on a seed, it verifies each Etcd's sidecars with that shoot's etcd CA
// (sidecarClientTLS.caFromEtcd) and presents a client certificate of
// druid-stretch's own CA (Options.StretchCA), which InstallShootTLS puts
// beside each shoot's Secrets (sidecar.clientCASecretName).
func (s *Site) startDruidStretch(ctx context.Context) error {
	identity := s.opts.ClusterIdentity
	if identity == "" {
		identity = "site"
	}
	doc := fmt.Sprintf(stretchValues, identity)
	if s.opts.MaxLearners > 0 {
		// stretchValues ends inside the controller block.
		doc += fmt.Sprintf("  maxLearners: %d\n", s.opts.MaxLearners)
	}
	values, err := chart.ParseValues(doc)
	if err != nil {
		return err
	}
	r, err := chart.Render(chart.Options{ReleaseName: "druid-stretch", Namespace: StretchNamespace, Values: values})
	if err != nil {
		return err
	}
	if err := chart.InstallCRDs(ctx, s.Client, r.CRDs); err != nil {
		return err
	}
	if err := s.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: StretchNamespace}}); err != nil {
		return err
	}
	if err := chart.Create(ctx, s.Client, r.RBACObjects()); err != nil {
		return err
	}
	saNamespace, saName, err := r.ServiceAccount()
	if err != nil {
		return err
	}

	args, err := r.ControllerArgs()
	if err != nil {
		return err
	}
	mo := membership.ManagerOptions{
		MetricsBindAddress: "0",
		WebhookHost:        "127.0.0.1",
		SkipNameValidation: true,
		Logger:             s.log.WithName("druid-stretch"),
	}
	var wo webhook.Options
	var sidecarPort int32
	fs := pflag.NewFlagSet("controller", pflag.ContinueOnError)
	wo.AddFlags(fs)
	fs.Int32Var(&sidecarPort, "sidecar-port", webhook.DefaultSidecarPort, "")
	mo.Reconciler.AddFlags(fs)
	// The other flags place the controller in its pod (ports, certificate
	// files, leader election), which this process replaces.
	var known []string
	for _, a := range args[1:] {
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if fs.Lookup(name) != nil {
			known = append(known, a)
		}
	}
	if err := fs.Parse(known); err != nil {
		return fmt.Errorf("the chart's controller flags: %w", err)
	}
	wo.SidecarImage = SidecarImage
	// As the command sets it: this process's webhook starts the etcd pods
	// through the sidecar, so a member is added only once its pod waits.
	mo.Reconciler.PodsStartThroughSidecar = true
	wo.SidecarPort, wo.EtcdMaxLearners = sidecarPort, mo.Reconciler.MaxLearners
	wo.ManagedNamespaces = mo.Reconciler.ManagedNamespaces
	// The site's own client stands in for a lost status (statuswipe_test
	// drops status.membership), which the EtcdMembership webhook admits
	// from the controller and the writers listed only.
	admin, err := webhook.UserName(s.Config)
	if err != nil {
		return err
	}
	wo.MembershipStatusWriters = append(wo.MembershipStatusWriters, admin)
	// The identity the chart's sidecar.allowedClients lets change
	// membership.
	clientPair, err := s.stretchCA.Issue("druid-stretch-controller")
	if err != nil {
		return err
	}
	clientCert, err := tls.X509KeyPair(clientPair.CertPEM, clientPair.KeyPEM)
	if err != nil {
		return err
	}
	mo.Reconciler.SidecarTLS = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{clientCert}}
	mo.Resolver = membership.DNSResolver{SidecarPort: sidecarPort}
	mo.Reconciler.Membership.DialContext = s.DialContext
	mo.Reconciler.Membership.OnStep = s.opts.OnStep
	// The site's DNS, as the controller's pod would ask its cluster's.
	dns := net.JoinHostPort(s.Network.DNSServer().String(), "53")
	mo.Reconciler.LookupHost = (&net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return s.Network.DialContext(ctx, network, dns)
	}}).LookupHost

	ca, err := pki.NewCA("druid-stretch-site-webhook-ca")
	if err != nil {
		return err
	}
	pair, err := ca.Issue("127.0.0.1", "127.0.0.1")
	if err != nil {
		return err
	}
	certDir := filepath.Join(s.Dir, "druid-stretch", "webhook")
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(certDir, "tls.crt"), pair.CertPEM, 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(certDir, "tls.key"), pair.KeyPEM, 0o600); err != nil {
		return err
	}
	if mo.WebhookPort, err = freeport.Pick(); err != nil {
		return err
	}
	mo.WebhookCertDir = certDir
	probePort, err := freeport.Pick()
	if err != nil {
		return err
	}
	mo.HealthProbeBindAddress = "127.0.0.1:" + strconv.Itoa(probePort)

	s.stretch = &stretchController{config: chart.ImpersonateServiceAccount(s.Config, saNamespace, saName), manager: mo, webhooks: wo, probePort: probePort}
	if err := s.stretch.run(ctx); err != nil {
		return err
	}
	s.onStop(s.stretch.stop)

	var hooks []*unstructured.Unstructured
	for _, kind := range []string{"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"} {
		hooks = append(hooks, r.OfKind(kind)...)
	}
	if _, err := chart.PointWebhooksAt(hooks, "https://127.0.0.1:"+strconv.Itoa(mo.WebhookPort), ca.CertPEM()); err != nil {
		return err
	}
	return chart.Create(ctx, s.Client, hooks)
}

// stretchController is the site's in-process druid-stretch manager, kept
// so that a test can stop it and start a new one, as a pod restart does
// (RestartDruidStretch).
type stretchController struct {
	config    *rest.Config
	manager   membership.ManagerOptions
	webhooks  webhook.Options
	probePort int

	mu      sync.Mutex
	cancel  context.CancelFunc
	stopped chan struct{}
	err     error
}

// run starts a new manager with the controller's options and waits until
// its webhook server is ready.
func (c *stretchController) run(ctx context.Context) error {
	mgr, err := membership.NewManager(c.config, c.manager)
	if err != nil {
		return err
	}
	if err := webhook.SetupWithManager(mgr, c.webhooks); err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	c.mu.Lock()
	c.cancel, c.stopped, c.err = cancel, stopped, nil
	c.mu.Unlock()
	go func() {
		defer close(stopped)
		err := mgr.Start(runCtx)
		c.mu.Lock()
		c.err = err
		c.mu.Unlock()
	}()
	return waitReady(ctx, fmt.Sprintf("http://127.0.0.1:%d/readyz?verbose", c.probePort), stopped)
}

// stop ends the running manager and returns how it ended. Safe to call
// twice.
func (c *stretchController) stop() error {
	c.mu.Lock()
	cancel, stopped := c.cancel, c.stopped
	c.mu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	<-stopped
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// waitReady polls the in-process manager's /readyz until the webhook server
// is up, so that the API server is never sent to a server still starting.
func waitReady(ctx context.Context, url string, stopped <-chan struct{}) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		select {
		case <-stopped:
			return false, errors.New("the druid-stretch manager stopped")
		default:
		}
		resp, err := http.Get(url)
		if err != nil {
			last = err.Error()
			return false, nil
		}
		defer func() { _ = resp.Body.Close() }()
		body, _ := io.ReadAll(resp.Body)
		last = string(body)
		return resp.StatusCode == http.StatusOK && strings.Contains(last, "[+]webhook-server ok"), nil
	})
	if err != nil {
		return fmt.Errorf("the druid-stretch webhook server did not get ready: %w (last answer: %s)", err, last)
	}
	return nil
}
