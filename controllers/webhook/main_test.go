package webhook_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	stretchv1alpha1 "github.com/druid-stretch/druid-stretch/api/stretch/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/controllers/webhook"
	"github.com/druid-stretch/druid-stretch/internal/etcdview"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
)

// One kube-apiserver and one webhook server for the package (and a second
// pair for the extended Etcd CRD, once a test asks for it): starting them
// takes seconds. Tests use namespaces of their own.
var (
	// k8s serves the CRDs of a seed: druid's own Etcd CRD, which prunes any
	// druid-stretch field written to an Etcd, and the chart's
	// EtcdMembership, which carries them.
	k8s client.Client
	// extended is a second kube-apiserver, started by the first test that
	// asks for it, with the extended Etcd CRD of earlier releases in place
	// of druid's: for the Etcds that carry druid-stretch's fields inline,
	// and the rules only the Etcd validator applies to them.
	extended lazyServer
	// k8sConfig is k8s's configuration: the identity the webhook's own
	// manager runs as, the controller's.
	k8sConfig *rest.Config
	// injected is what the tests' webhook injects.
	injected = webhook.Options{
		ManagedNamespaces:      mustOptIn(managedNamespaceLabel + "=true"),
		SidecarImage:           "registry.example/druid-stretch:test",
		SidecarImagePullPolicy: corev1.PullIfNotPresent,
		SidecarPort:            8090,
		SidecarAllowedClients:  []string{"druid-stretch-controller"},
		SidecarResources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("20m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")},
		},
	}
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	if testbin.Short() {
		fmt.Println("every test of this package runs real binaries: none runs under -short")
		return 0
	}
	level := zapcore.ErrorLevel
	if os.Getenv("WEBHOOK_TEST_VERBOSE") != "" {
		level = zapcore.DebugLevel
	}
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(level)))
	injected.MembershipStatusWriters = []string{statusWriter}
	srv, err := startServer()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer srv.stop()
	defer extended.stop()
	k8s, k8sConfig = srv.client, srv.cfg
	return m.Run()
}

// server is a kube-apiserver with the chart's webhook configurations
// (testdata/webhooks.yaml) and a manager serving druid-stretch's webhooks
// for it.
type server struct {
	client client.Client
	cfg    *rest.Config
	stop   func()
}

// startServer starts a server on testbin's environment with opts.
func startServer(opts ...testbin.EnvironmentOption) (_ *server, err error) {
	if _, err := testbin.KubeAPIServer(); err != nil {
		return nil, err
	}
	env, err := testbin.Environment(opts...)
	if err != nil {
		return nil, err
	}
	env.WebhookInstallOptions = envtest.WebhookInstallOptions{Paths: []string{filepath.Join("testdata", "webhooks.yaml")}}
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("starting envtest (kube-apiserver from %s): %w", env.BinaryAssetsDirectory, err)
	}
	var stops []func()
	stop := func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	stops = append(stops, func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "stopping envtest: %v\n", err)
		}
	})
	defer func() {
		if err != nil {
			stop()
		}
	}()

	scheme := runtime.NewScheme()
	if err := errors.Join(clientgoscheme.AddToScheme(scheme), v1alpha1.AddToScheme(scheme), stretchv1alpha1.AddToScheme(scheme), apiextensionsv1.AddToScheme(scheme)); err != nil {
		return nil, err
	}
	wio := env.WebhookInstallOptions
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		WebhookServer: ctrlwebhook.NewServer(ctrlwebhook.Options{
			Host: wio.LocalServingHost, Port: wio.LocalServingPort, CertDir: wio.LocalServingCertDir,
		}),
	})
	if err != nil {
		return nil, fmt.Errorf("creating the manager: %w", err)
	}
	if err := webhook.SetupWithManager(mgr, injected); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	stops = append(stops, func() {
		cancel()
		if err := <-done; err != nil {
			fmt.Fprintln(os.Stderr, "manager:", err)
		}
	})
	if err := waitServing(mgr, done); err != nil {
		return nil, err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("creating the client: %w", err)
	}
	return &server{client: c, cfg: cfg, stop: stop}, nil
}

// lazyServer is a server with the extended Etcd CRD, started once, when a
// test first needs it: most runs of a single test do not.
type lazyServer struct {
	once sync.Once
	srv  *server
	err  error
}

// client starts the server unless it runs, and returns its client.
func (l *lazyServer) client(t *testing.T) client.Client {
	t.Helper()
	l.once.Do(func() { l.srv, l.err = startServer(testbin.WithExtendedEtcdCRD()) })
	if l.err != nil {
		t.Fatalf("starting the kube-apiserver with the extended Etcd CRD: %v", l.err)
	}
	return l.srv.client
}

func (l *lazyServer) stop() {
	if l.srv != nil {
		l.srv.stop()
	}
}

// waitServing waits until the webhook server answers TLS, so that no test
// meets a failurePolicy=Fail refusal from a server still starting.
func waitServing(mgr ctrl.Manager, done <-chan error) error {
	check := mgr.GetWebhookServer().StartedChecker()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := check(&http.Request{})
		if err == nil {
			return nil
		}
		select {
		case merr := <-done:
			return fmt.Errorf("the manager stopped before the webhook server served: %v", merr)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the webhook server did not start within 30s: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// newNamespace gives a test its own namespace on k8s.
func newNamespace(t *testing.T) string {
	t.Helper()
	return namespaceIn(t, k8s)
}

// managedNamespaceLabel marks the namespaces whose every Etcd the tests'
// webhook manages (webhook.Options.ManagedNamespaces); newNamespace's have
// none.
const managedNamespaceLabel = "druid-stretch.test/managed"

func mustOptIn(selector string) etcdview.NamespaceOptIn {
	o, err := etcdview.ParseNamespaceOptIn(selector)
	if err != nil {
		panic(err)
	}
	return o
}

// managedNamespace gives a test its own namespace, one whose Etcds the
// webhook manages without an EtcdMembership.
func managedNamespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "webhook-managed-", Labels: map[string]string{managedNamespaceLabel: "true"}}}
	if err := k8s.Create(t.Context(), ns); err != nil {
		t.Fatalf("creating a namespace: %v", err)
	}
	return ns.Name
}

// namespaceIn gives a test its own namespace on the API server of c.
func namespaceIn(t *testing.T, c client.Client) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "webhook-"}}
	if err := c.Create(t.Context(), ns); err != nil {
		t.Fatalf("creating a namespace: %v", err)
	}
	return ns.Name
}

// webhookRequests is how many admission requests the webhook at path has
// served so far, from controller-runtime's request counter: the servers of
// both kube-apiservers count into it, and tests run one at a time.
func webhookRequests(t *testing.T, path string) float64 {
	t.Helper()
	families, err := crmetrics.Registry.Gather()
	if err != nil {
		t.Fatalf("gathering metrics: %v", err)
	}
	var n float64
	for _, f := range families {
		if f.GetName() != "controller_runtime_webhook_requests_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			if label(m, "webhook") == path {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
