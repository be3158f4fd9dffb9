package webhook_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
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
	"github.com/druid-stretch/druid-stretch/internal/testbin"
)

// One kube-apiserver and one webhook server for the package: starting them
// takes seconds. Tests use namespaces of their own.
var (
	k8s client.Client
	// env is kept for the test that edits the CRD.
	env *envtest.Environment
	// injected is what the tests' webhook injects.
	injected = webhook.Options{
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
	level := zapcore.ErrorLevel
	if os.Getenv("WEBHOOK_TEST_VERBOSE") != "" {
		level = zapcore.DebugLevel
	}
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(level)))
	_, err := testbin.KubeAPIServer()
	if err == nil {
		env, err = testbin.Environment()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	env.WebhookInstallOptions = envtest.WebhookInstallOptions{Paths: []string{filepath.Join("testdata", "webhooks.yaml")}}
	cfg, err := env.Start()
	if err != nil {
		fmt.Fprintf(os.Stderr, "starting envtest (kube-apiserver from %s): %v\n", env.BinaryAssetsDirectory, err)
		return 1
	}
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "stopping envtest: %v\n", err)
		}
	}()

	scheme := runtime.NewScheme()
	if err := errors.Join(clientgoscheme.AddToScheme(scheme), v1alpha1.AddToScheme(scheme), stretchv1alpha1.AddToScheme(scheme), apiextensionsv1.AddToScheme(scheme)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
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
		fmt.Fprintln(os.Stderr, "creating the manager:", err)
		return 1
	}
	if err := webhook.SetupWithManager(mgr, injected); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			fmt.Fprintln(os.Stderr, "manager:", err)
		}
	}()
	if err := waitServing(mgr, done); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if k8s, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		fmt.Fprintln(os.Stderr, "creating the client:", err)
		return 1
	}
	return m.Run()
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

// newNamespace gives a test its own namespace.
func newNamespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "webhook-"}}
	if err := k8s.Create(t.Context(), ns); err != nil {
		t.Fatalf("creating a namespace: %v", err)
	}
	return ns.Name
}

// webhookRequests is how many admission requests the webhook at path has
// served so far, from controller-runtime's request counter.
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
