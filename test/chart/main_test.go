package chart

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	stretchv1alpha1 "github.com/druid-stretch/druid-stretch/api/stretch/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
)

// One kube-apiserver for the package: starting one takes seconds. Tests run
// one after another (none is parallel) because the webhook configurations
// and CRDs they create are cluster-wide.
var (
	// adminCfg is envtest's admin (system:masters), allowed to impersonate.
	adminCfg *rest.Config
	// admin knows the built-in kinds, the Etcd, the EtcdMembership and CRDs.
	admin client.Client
	// kubeVersion is the API server's version, e.g. v1.35.4, for renders.
	kubeVersion string
	// kubeconfigPath points Helm's own Kubernetes client at the API server.
	kubeconfigPath string
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if testbin.Short() {
		fmt.Println("every test of this package runs real binaries: none runs under -short")
		return 0
	}
	// The webhook server logs through controller-runtime; errors only.
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(zapcore.ErrorLevel)))
	env, err := testbin.Environment()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// The API server starts as a seed does before druid-stretch: with
	// etcd-druid's own CRDs (env.CRDs), written before any chart of
	// druid-stretch's. The chart's CRD comes in setUp, as helm or kubectl
	// would create it, not through envtest.
	env.CRDDirectoryPaths, env.ErrorIfCRDPathMissing = nil, false
	adminCfg, err = env.Start()
	if err != nil {
		fmt.Fprintf(os.Stderr, "starting envtest (kube-apiserver from %s): %v\n", env.BinaryAssetsDirectory, err)
		return 1
	}
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "stopping envtest: %v\n", err)
		}
	}()
	if err := setUp(env); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = os.RemoveAll(filepath.Dir(kubeconfigPath)) }()
	return m.Run()
}

// setUp makes the admin client and installs the CRDs the chart's objects
// need: the chart's own (as the first helm install does) and the minimal
// cert-manager and ServiceMonitor stand-ins of testdata/crds.
func setUp(env *envtest.Environment) error {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, apiextensionsv1.AddToScheme, v1alpha1.AddToScheme, stretchv1alpha1.AddToScheme} {
		if err := add(scheme); err != nil {
			return fmt.Errorf("building scheme: %w", err)
		}
	}
	var err error
	if admin, err = client.New(adminCfg, client.Options{Scheme: scheme}); err != nil {
		return fmt.Errorf("creating the admin client: %w", err)
	}
	if kubeVersion, err = apiServerVersion(); err != nil {
		return err
	}

	dir, err := os.MkdirTemp("", "druid-stretch-chart-")
	if err != nil {
		return err
	}
	kubeconfigPath = filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfigPath, env.KubeConfig, 0o600); err != nil {
		return fmt.Errorf("writing the kubeconfig: %w", err)
	}

	ch, err := Load()
	if err != nil {
		return err
	}
	var crds []*unstructured.Unstructured
	for _, f := range ch.CRDObjects() {
		objs, err := DecodeManifest(string(f.File.Data))
		if err != nil {
			return fmt.Errorf("decoding %s: %w", f.Filename, err)
		}
		crds = append(crds, objs...)
	}
	for _, name := range []string{"cert-manager.yaml", "servicemonitor.yaml"} {
		data, err := os.ReadFile(filepath.Join("testdata", "crds", name))
		if err != nil {
			return err
		}
		objs, err := DecodeManifest(string(data))
		if err != nil {
			return fmt.Errorf("decoding testdata/crds/%s: %w", name, err)
		}
		crds = append(crds, objs...)
	}
	return InstallCRDs(context.Background(), admin, crds)
}

// apiServerVersion is the API server's Kubernetes version. A kube-apiserver
// built from source without version stamping (as hack/test-binaries.sh builds
// it) reports v0.0.0-master; then the version comes from the binary's name,
// kube-apiserver-<version>, which the hack script takes from the
// k8s.io/kubernetes module it builds.
func apiServerVersion() (string, error) {
	dc, err := discovery.NewDiscoveryClientForConfig(adminCfg)
	if err != nil {
		return "", fmt.Errorf("creating a discovery client: %w", err)
	}
	v, err := dc.ServerVersion()
	if err != nil {
		return "", fmt.Errorf("reading the API server version: %w", err)
	}
	if !strings.HasPrefix(v.GitVersion, "v0.0.0") {
		return v.GitVersion, nil
	}
	bin, err := testbin.KubeAPIServer()
	if err != nil {
		return "", err
	}
	real, err := filepath.EvalSymlinks(bin)
	if err != nil {
		return "", fmt.Errorf("resolving %s: %w", bin, err)
	}
	name := filepath.Base(real)
	version, ok := strings.CutPrefix(name, "kube-apiserver-")
	if !ok || !strings.HasPrefix(version, "v1.") {
		return "", fmt.Errorf("the API server reports %s and its binary %s names no version", v.GitVersion, real)
	}
	return version, nil
}

// requiredValues are the values every install must give.
const requiredValues = `
image:
  repository: registry.example.com/druid-stretch
clusterIdentity: seed-a
sidecarClientTLS:
  secretName: druid-stretch-sidecar-client
`

// values parses requiredValues followed by extra (YAML), extra winning, the
// way several -f files combine.
func values(t *testing.T, extra string) map[string]any {
	t.Helper()
	base, err := ParseValues(requiredValues)
	if err != nil {
		t.Fatal(err)
	}
	over, err := ParseValues(extra)
	if err != nil {
		t.Fatal(err)
	}
	return mergeValues(base, over)
}

func mergeValues(base, over map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range base {
		out[k] = v
	}
	for k, v := range over {
		if bm, ok := out[k].(map[string]any); ok {
			if om, ok := v.(map[string]any); ok {
				out[k] = mergeValues(bm, om)
				continue
			}
		}
		out[k] = v
	}
	return out
}

// newNamespace gives a test its own namespace; envtest has no namespace
// controller, so namespaces are never deleted.
func newNamespace(t *testing.T, prefix string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}
	if err := admin.Create(context.Background(), ns); err != nil {
		t.Fatalf("creating namespace: %v", err)
	}
	return ns.Name
}

// render renders the chart for a release in namespace with values, on the
// API server's Kubernetes version.
func render(t *testing.T, release, namespace string, vals map[string]any) *Rendered {
	t.Helper()
	r, err := Render(Options{ReleaseName: release, Namespace: namespace, Values: vals, KubeVersion: kubeVersion})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// install creates every rendered object and deletes them when the test ends,
// so cluster-wide objects (webhook configurations, ClusterRoles) of one test
// never act on the next.
func install(t *testing.T, r *Rendered) {
	t.Helper()
	g := NewWithT(t)
	ctx := context.Background()
	t.Cleanup(func() {
		if err := Delete(ctx, admin, r.Objects); err != nil {
			t.Errorf("cleaning up: %v", err)
		}
	})
	g.Expect(Create(ctx, admin, r.Objects)).To(Succeed())
}
