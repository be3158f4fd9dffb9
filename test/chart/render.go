package chart

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"helm.sh/helm/v3/pkg/action"
	helmchart "helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
)

// DefaultKubeVersion is the Kubernetes version a render assumes when
// Options.KubeVersion is empty: the minor that the project's k8s.io modules
// (v0.35) speak. The chart needs at least 1.31.
const DefaultKubeVersion = "v1.35.0"

// ControllerContainer is the name of the controller container in the chart's
// Deployment.
const ControllerContainer = "controller"

// Dir is the chart's folder, charts/druid-stretch in the repository.
func Dir() (string, error) {
	root, err := testbin.RepoRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "charts", "druid-stretch"), nil
}

// Load loads the chart from Dir, templates, values, schema and crds/.
func Load() (*helmchart.Chart, error) {
	dir, err := Dir()
	if err != nil {
		return nil, err
	}
	ch, err := loader.Load(dir)
	if err != nil {
		return nil, fmt.Errorf("loading the chart from %s: %w", dir, err)
	}
	return ch, nil
}

// ParseValues reads values from YAML as `helm install -f` does, so numbers
// and strings reach the schema exactly as an operator's file would.
func ParseValues(doc string) (map[string]any, error) {
	v, err := chartutil.ReadValues([]byte(doc))
	if err != nil {
		return nil, fmt.Errorf("parsing values: %w", err)
	}
	return v, nil
}

// Options of one render: a release as `helm install NAME -n NAMESPACE -f
// values.yaml` would make it.
type Options struct {
	ReleaseName string
	Namespace   string
	// Values are merged over the chart's values.yaml.
	Values map[string]any
	// KubeVersion of the target cluster, e.g. "v1.35.4"; DefaultKubeVersion
	// when empty.
	KubeVersion string
	// APIVersions the target cluster serves beyond the built-in ones, as
	// `helm template --api-versions` takes them.
	APIVersions []string
	// SkipSchemaValidation renders without values.schema.json, as
	// --skip-schema-validation does.
	SkipSchemaValidation bool
}

// Rendered is what `helm install` creates for one set of values.
type Rendered struct {
	Options Options
	// Manifest is the rendered YAML of the templates.
	Manifest string
	// Objects are the templates' objects in Helm's install order.
	Objects []*unstructured.Unstructured
	// CRDs are the chart's crds/ folder, which Helm creates before the
	// templates on the first install only.
	CRDs []*unstructured.Unstructured
	// Hooks are the objects of templates annotated as Helm hooks, which
	// Helm applies outside the manifest (before or after an install,
	// upgrade or uninstall).
	Hooks []*unstructured.Unstructured
	// Notes is the rendered NOTES.txt.
	Notes string
}

// Render renders the chart client-only, as `helm template` and `helm install
// --dry-run` do: values are validated against values.schema.json, templates
// run, nothing is sent to a cluster. lookup answers nothing, so the
// self-signed webhook certificate is always fresh.
func Render(opts Options) (*Rendered, error) {
	ch, err := Load()
	if err != nil {
		return nil, err
	}
	return RenderChart(ch, opts)
}

// RenderChart renders any loaded chart as Render renders druid-stretch's
// (a test site renders etcd-druid's own chart with it).
func RenderChart(ch *helmchart.Chart, opts Options) (*Rendered, error) {
	kv := opts.KubeVersion
	if kv == "" {
		kv = DefaultKubeVersion
	}
	kubeVersion, err := chartutil.ParseKubeVersion(kv)
	if err != nil {
		return nil, fmt.Errorf("parsing the Kubernetes version %q: %w", kv, err)
	}
	install := action.NewInstall(&action.Configuration{Log: func(string, ...any) {}})
	install.DryRun = true
	install.ClientOnly = true
	install.Replace = true
	install.ReleaseName = opts.ReleaseName
	install.Namespace = opts.Namespace
	install.KubeVersion = kubeVersion
	install.APIVersions = opts.APIVersions
	install.SkipSchemaValidation = opts.SkipSchemaValidation
	values := opts.Values
	if values == nil {
		values = map[string]any{}
	}
	rel, err := install.Run(ch, values)
	if err != nil {
		return nil, fmt.Errorf("rendering release %s/%s: %w", opts.Namespace, opts.ReleaseName, err)
	}
	objs, err := DecodeManifest(rel.Manifest)
	if err != nil {
		return nil, fmt.Errorf("decoding the rendered manifest: %w", err)
	}
	var crds []*unstructured.Unstructured
	for _, f := range ch.CRDObjects() {
		o, err := DecodeManifest(string(f.File.Data))
		if err != nil {
			return nil, fmt.Errorf("decoding the chart's CRD %s: %w", f.Filename, err)
		}
		crds = append(crds, o...)
	}
	var hooks []*unstructured.Unstructured
	for _, h := range rel.Hooks {
		o, err := DecodeManifest(h.Manifest)
		if err != nil {
			return nil, fmt.Errorf("decoding the hook %s: %w", h.Path, err)
		}
		hooks = append(hooks, o...)
	}
	return &Rendered{Options: opts, Manifest: rel.Manifest, Objects: objs, CRDs: crds, Hooks: hooks, Notes: rel.Info.Notes}, nil
}

// DecodeManifest splits a multi-document YAML manifest into objects, in
// document order, skipping empty documents.
func DecodeManifest(manifest string) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewBufferString(manifest), 4096)
	var out []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, err
		}
		if len(m) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		if u.GetKind() == "" || u.GetAPIVersion() == "" {
			return nil, fmt.Errorf("a document without apiVersion or kind: %v", m)
		}
		out = append(out, u)
	}
}

// OfKind returns the rendered objects of one kind.
func (r *Rendered) OfKind(kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range r.Objects {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}

// Get returns the rendered object of kind with the given name.
func (r *Rendered) Get(kind, name string) (*unstructured.Unstructured, error) {
	for _, o := range r.OfKind(kind) {
		if o.GetName() == name {
			return o, nil
		}
	}
	return nil, fmt.Errorf("the chart rendered no %s named %q", kind, name)
}

// One returns the only rendered object of kind, an error when there is not
// exactly one.
func (r *Rendered) One(kind string) (*unstructured.Unstructured, error) {
	objs := r.OfKind(kind)
	if len(objs) != 1 {
		return nil, fmt.Errorf("the chart rendered %d objects of kind %s, want 1", len(objs), kind)
	}
	return objs[0], nil
}

// Typed converts the only rendered object of kind into a typed object, e.g.
// an *appsv1.Deployment.
func (r *Rendered) Typed(kind string, into runtime.Object) error {
	u, err := r.One(kind)
	if err != nil {
		return err
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, into); err != nil {
		return fmt.Errorf("converting the rendered %s %s: %w", kind, u.GetName(), err)
	}
	return nil
}

// ServiceAccount is the namespace and name of the chart's ServiceAccount,
// the identity the controller and its webhooks run as.
func (r *Rendered) ServiceAccount() (namespace, name string, err error) {
	sa, err := r.One("ServiceAccount")
	if err != nil {
		return "", "", err
	}
	return sa.GetNamespace(), sa.GetName(), nil
}

// RBACObjects are the ServiceAccount, Roles, ClusterRoles and their
// bindings: what an impersonation test applies.
func (r *Rendered) RBACObjects() []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range r.Objects {
		switch o.GetKind() {
		case "ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding":
			out = append(out, o)
		}
	}
	return out
}

// ControllerArgs are the controller container's arguments in the chart's
// Deployment, starting with the subcommand ("controller"): an end-to-end
// test runs the controller with exactly the chart's flags.
func (r *Rendered) ControllerArgs() ([]string, error) {
	dep, err := r.One("Deployment")
	if err != nil {
		return nil, err
	}
	containers, _, err := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "containers")
	if err != nil {
		return nil, fmt.Errorf("reading the Deployment's containers: %w", err)
	}
	for _, c := range containers {
		cm, ok := c.(map[string]any)
		if !ok || cm["name"] != ControllerContainer {
			continue
		}
		args, _, err := unstructured.NestedStringSlice(cm, "args")
		if err != nil {
			return nil, fmt.Errorf("reading the %s container's args: %w", ControllerContainer, err)
		}
		return args, nil
	}
	return nil, fmt.Errorf("the Deployment has no container named %s", ControllerContainer)
}

// ControllerArgsWith are ControllerArgs with the values of some flags
// replaced, for running the controller outside a pod: local certificate
// paths instead of the Secret mounts, free 127.0.0.1 ports instead of the
// pod's. Each flag in overrides (e.g. "--webhook-cert-dir") must be one the
// chart sets, so a test notices when the chart stops setting it.
func (r *Rendered) ControllerArgsWith(overrides map[string]string) ([]string, error) {
	args, err := r.ControllerArgs()
	if err != nil {
		return nil, err
	}
	used := map[string]bool{}
	for i, a := range args {
		name, _, ok := strings.Cut(a, "=")
		if v, found := overrides[name]; ok && found {
			args[i] = name + "=" + v
			used[name] = true
		}
	}
	for name := range overrides {
		if !used[name] {
			return nil, fmt.Errorf("the chart does not set %s on the controller", name)
		}
	}
	return args, nil
}

// Lint runs `helm lint`'s checks on the chart folder with the given values
// (merged over values.yaml) and returns every message.
func Lint(values map[string]any, namespace, kubeVersion string) ([]support.Message, error) {
	dir, err := Dir()
	if err != nil {
		return nil, err
	}
	if kubeVersion == "" {
		kubeVersion = DefaultKubeVersion
	}
	kv, err := chartutil.ParseKubeVersion(kubeVersion)
	if err != nil {
		return nil, fmt.Errorf("parsing the Kubernetes version %q: %w", kubeVersion, err)
	}
	return lint.AllWithKubeVersion(dir, values, namespace, kv).Messages, nil
}
