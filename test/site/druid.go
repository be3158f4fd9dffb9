package site

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"helm.sh/helm/v3/pkg/chart/loader"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/druid-stretch/druid-stretch/internal/testing/freeport"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
	"github.com/druid-stretch/druid-stretch/test/chart"
)

// DruidNamespace is where the site installs etcd-druid (its chart's release
// namespace and the namespace of its ServiceAccount).
const DruidNamespace = "etcd-druid"

// druidServiceAccount is the ServiceAccount druid's chart runs druid as.
const druidServiceAccount = "etcd-druid"

// druidModuleDir is the etcd-druid module that hack/tools/etcd-druid pins,
// in the module cache: its chart and CRDs are the ones of the binary the
// site runs.
var druidModuleDir = sync.OnceValues(func() (string, error) {
	root, err := testbin.RepoRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.Command("go", "mod", "download", "-json", "github.com/gardener/etcd-druid")
	cmd.Dir = filepath.Join(root, "hack", "tools", "etcd-druid")
	cmd.Env = append(os.Environ(), "GOWORK=off") // a module of its own, outside go.work
	out, err := cmd.Output()
	var m struct{ Dir, Error string }
	if jerr := json.Unmarshal(out, &m); err != nil || jerr != nil || m.Dir == "" {
		return "", fmt.Errorf("finding the etcd-druid module of hack/tools/etcd-druid: %w", errors.Join(err, jerr, errors.New(m.Error)))
	}
	return m.Dir, nil
})

// druidCRDs is the folder of druid's own CRDs (Etcd, EtcdCopyBackupsTask,
// EtcdOpsTask), as its chart ships them.
func druidCRDs() (string, error) {
	dir, err := druidModuleDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "charts", "crds"), nil
}

// startDruid installs etcd-druid from its own chart and runs its manager:
// the chart's ServiceAccount and RBAC are created and druid acts as that
// ServiceAccount; its operator configuration is the chart's ConfigMap, with
// the ports moved to free ones on 127.0.0.1 (druid runs on the host, not in
// a pod), the compaction controller (on, as the chart has it) at
// Options.CompactionEventsThreshold when set, and the UpgradeEtcdVersion
// feature gate on, which makes druid pick the etcd-wrapper v0.8.1 and
// etcdbrctl v0.44.1 images, the ones Gardener ships: v0.44.1 is the
// backup-restore release the site runs (druid's default, v0.41.2, is not
// on the module proxy).
func (s *Site) startDruid(ctx context.Context) error {
	mod, err := druidModuleDir()
	if err != nil {
		return err
	}
	ch, err := loader.Load(filepath.Join(mod, "charts"))
	if err != nil {
		return fmt.Errorf("loading etcd-druid's chart: %w", err)
	}
	metricsPort, err := freeport.Pick()
	if err != nil {
		return err
	}
	webhookPort, err := freeport.Pick()
	if err != nil {
		return err
	}
	values, err := chart.ParseValues(fmt.Sprintf(`
operatorConfig:
  server:
    metrics: {bindAddress: 127.0.0.1, port: %d}
    webhooks: {bindAddress: 127.0.0.1, port: %d}
  featureGates:
    UpgradeEtcdVersion: true
  logConfiguration:
    logFormat: text
`, metricsPort, webhookPort))
	if err != nil {
		return err
	}
	if t := s.opts.CompactionEventsThreshold; t > 0 {
		if err := unstructured.SetNestedField(values, t, "operatorConfig", "controllers", "compaction", "eventsThreshold"); err != nil {
			return err
		}
	}
	r, err := chart.RenderChart(ch, chart.Options{ReleaseName: "etcd-druid", Namespace: DruidNamespace, Values: values})
	if err != nil {
		return fmt.Errorf("rendering etcd-druid's chart: %w", err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: DruidNamespace}}
	if err := s.Client.Create(ctx, ns); err != nil {
		return err
	}
	rbac := r.RBACObjects()
	for _, o := range rbac {
		if strings.HasPrefix(o.GetKind(), "Cluster") {
			o.SetNamespace("") // the chart sets one on cluster-scoped objects
		}
	}
	if err := chart.Create(ctx, s.Client, rbac); err != nil {
		return err
	}

	dir := filepath.Join(s.Dir, "etcd-druid")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	cm, err := r.Get("ConfigMap", "etcd-druid-operator-config")
	if err != nil {
		return err
	}
	config, _, err := unstructured.NestedString(cm.Object, "data", "config.yaml")
	if err != nil || config == "" {
		return fmt.Errorf("etcd-druid's chart renders no operator configuration: %v", err)
	}
	configPath := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(configPath, []byte(config), 0o644); err != nil {
		return err
	}
	args, err := druidArgs(r, configPath)
	if err != nil {
		return err
	}
	kubeconfig, err := chart.ImpersonatingKubeconfig(s.Config, DruidNamespace, druidServiceAccount)
	if err != nil {
		return err
	}
	kubeconfigPath := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfigPath, kubeconfig, 0o600); err != nil {
		return err
	}
	bin, err := testbin.EtcdDruid()
	if err != nil {
		return err
	}
	s.druid = &druidProcess{bin: bin, args: args, env: []string{"KUBECONFIG=" + kubeconfigPath}, metrics: fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort)}
	return s.runDruid(ctx)
}

// druidProcess is the etcd-druid manager of a site: its process, and what
// starts it again.
type druidProcess struct {
	bin     string
	args    []string
	env     []string
	metrics string

	mu   sync.Mutex
	proc *process
}

// runDruid starts druid's manager and waits until it serves metrics.
func (s *Site) runDruid(ctx context.Context) error {
	d := s.druid
	p, err := s.start("etcd-druid", d.bin, d.args, d.env)
	if err != nil {
		return err
	}
	d.mu.Lock()
	d.proc = p
	d.mu.Unlock()
	// druid serves metrics once its manager runs (after a fixed 10 s pause
	// in its start-up).
	return waitHealthy(ctx, p, d.metrics)
}

// druidArgs are the arguments of the chart's etcd-druid container, with the
// operator configuration's mount path replaced by the file on this machine.
func druidArgs(r *chart.Rendered, configPath string) ([]string, error) {
	dep, err := r.One("Deployment")
	if err != nil {
		return nil, err
	}
	containers, _, err := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "containers")
	if err != nil || len(containers) != 1 {
		return nil, fmt.Errorf("etcd-druid's Deployment: want one container, have %d (%v)", len(containers), err)
	}
	args, _, err := unstructured.NestedStringSlice(containers[0].(map[string]any), "args")
	if err != nil {
		return nil, err
	}
	replaced := false
	for i, a := range args {
		if strings.HasPrefix(a, "--config=") {
			args[i], replaced = "--config="+configPath, true
		}
	}
	if !replaced {
		return nil, fmt.Errorf("etcd-druid's Deployment passes no --config: %q", args)
	}
	return args, nil
}
