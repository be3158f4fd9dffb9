package chart

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/druid-stretch/druid-stretch/internal/testing/docscheck"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
)

// monitoringValues switch on every monitoring object of the chart.
const monitoringValues = `
metrics:
  podMonitor:
    enabled: true
    interval: 20s
    labels: {prometheus: seed}
  prometheusRule:
    enabled: true
    labels: {prometheus: seed}
    stuckFor: 45m
    learnerLagEntries: 5000
  grafanaDashboard:
    enabled: true
`

// TestMonitoringObjects renders the PodMonitor, the PrometheusRule and the
// dashboard ConfigMap: the PodMonitor scrapes the controller pods' metrics
// port, the rule's thresholds come from the values, and every metric the
// rule and the dashboard query is one docs/metrics.md documents (and so,
// by TestMetricsTableMatchesTheEndpoint, one /metrics exposes).
func TestMonitoringObjects(t *testing.T) {
	g := NewWithT(t)
	r := render(t, "stretch", "druid-stretch-system", values(t, monitoringValues))

	pm, err := r.One("PodMonitor")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(pm.GetLabels()).To(HaveKeyWithValue("prometheus", "seed"))
	sel, _, _ := unstructured.NestedStringMap(pm.Object, "spec", "selector", "matchLabels")
	dep := deployment(g, r)
	g.Expect(selects(sel, dep.Spec.Template.Labels)).To(BeTrue(), "selects the controller pods")
	eps, _, _ := unstructured.NestedSlice(pm.Object, "spec", "podMetricsEndpoints")
	g.Expect(eps).To(HaveLen(1))
	g.Expect(eps[0]).To(HaveKeyWithValue("port", "metrics"))
	g.Expect(eps[0]).To(HaveKeyWithValue("interval", "20s"))
	g.Expect(controllerContainer(g, dep).Ports).To(ContainElement(And(HaveField("Name", "metrics"), HaveField("ContainerPort", int32(8080)))))
	g.Expect(controllerFlags(g, r)).To(HaveKeyWithValue("--metrics-bind-address", ":8080"), "the port the PodMonitor scrapes is the one the controller serves")

	rule, err := r.One("PrometheusRule")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(rule.GetLabels()).To(HaveKeyWithValue("prometheus", "seed"))
	groups, _, _ := unstructured.NestedSlice(rule.Object, "spec", "groups")
	g.Expect(groups).To(HaveLen(1))
	rules := groups[0].(map[string]any)["rules"].([]any)
	alerts := map[string]map[string]any{}
	var exprs []string
	for _, x := range rules {
		rule := x.(map[string]any)
		alerts[rule["alert"].(string)] = rule
		exprs = append(exprs, rule["expr"].(string))
	}
	g.Expect(alerts).To(HaveLen(5))
	g.Expect(alerts).To(HaveKey("DruidStretchQuorumAtRisk"))
	g.Expect(alerts).To(HaveKey("DruidStretchStepsFailing"))
	g.Expect(alerts).To(HaveKey("DruidStretchExtensionLost"))
	g.Expect(alerts["DruidStretchMembershipStuck"]).To(HaveKeyWithValue("for", "45m"))
	g.Expect(alerts["DruidStretchLearnerLagging"]["expr"]).To(HaveSuffix("> 5000"))

	cm, err := r.Get("ConfigMap", "stretch-druid-stretch-dashboard")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(cm.GetLabels()).To(HaveKeyWithValue("grafana_dashboard", "1"))
	data, _, _ := unstructured.NestedStringMap(cm.Object, "data")
	var dash struct {
		UID    string `json:"uid"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	g.Expect(json.Unmarshal([]byte(data["druid-stretch.json"]), &dash)).To(Succeed())
	g.Expect(dash.UID).To(Equal("druid-stretch-membership"))
	for _, p := range dash.Panels {
		g.Expect(p.Targets).NotTo(BeEmpty(), "panel %q", p.Title)
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}

	documented := documentedMetrics(g)
	for _, e := range exprs {
		for _, name := range metricRE.FindAllString(e, -1) {
			base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_count"), "_sum")
			g.Expect(documented).To(HaveKey(base), "%s in %q", name, e)
		}
	}

	off := render(t, "stretch", "druid-stretch-system", values(t, ``))
	for _, kind := range []string{"PodMonitor", "PrometheusRule", "ConfigMap"} {
		g.Expect(off.OfKind(kind)).To(BeEmpty(), "%s is off by default", kind)
	}
}

var metricRE = regexp.MustCompile(`druid_stretch_[a-z_]+`)

// documentedMetrics are the metric names of docs/metrics.md's tables.
func documentedMetrics(g *WithT) map[string]bool {
	root, err := testbin.RepoRoot()
	g.Expect(err).NotTo(HaveOccurred())
	md, err := os.ReadFile(filepath.Join(root, "docs", "metrics.md"))
	g.Expect(err).NotTo(HaveOccurred())
	rows, err := docscheck.Metrics(string(md), "druid_stretch_")
	g.Expect(err).NotTo(HaveOccurred())
	out := map[string]bool{}
	for _, m := range rows {
		out[m.Name] = true
	}
	return out
}

// TestImagesAndGlobal: the chart works as a subchart (global, with keys it
// does not know), global.imageRegistry prefixes both images, and
// controller.image and sidecar.image override image field by field.
func TestImagesAndGlobal(t *testing.T) {
	cases := []struct {
		name, values              string
		controller, sidecar, pull string
	}{
		{"defaults", ``, "registry.example.com/druid-stretch:", "registry.example.com/druid-stretch:", "IfNotPresent"},
		{"global from a parent chart", `global: {imageRegistry: mirror.example.com, storageClass: fast, other: {a: 1}}`,
			"mirror.example.com/registry.example.com/druid-stretch:", "mirror.example.com/registry.example.com/druid-stretch:", "IfNotPresent"},
		{"per component", `
image: {repository: druid-stretch, tag: v1}
global: {imageRegistry: mirror.example.com/}
controller: {image: {tag: v1-debug, pullPolicy: Always}}
sidecar: {image: {repository: druid-stretch-sidecar}}`,
			"mirror.example.com/druid-stretch:v1-debug", "mirror.example.com/druid-stretch-sidecar:v1", "Always"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			r := render(t, "stretch", "druid-stretch-system", values(t, tc.values))
			c := controllerContainer(g, deployment(g, r))
			g.Expect(c.Image).To(HavePrefix(tc.controller))
			g.Expect(string(c.ImagePullPolicy)).To(Equal(tc.pull))
			g.Expect(controllerFlags(g, r)["--sidecar-image"]).To(HavePrefix(tc.sidecar))
		})
	}
}

// TestLeaderElectionID: each release has its own lease, named after it,
// unless controller.leaderElectionID says otherwise; a release named
// druid-stretch keeps the binary's default name across the upgrade.
func TestLeaderElectionID(t *testing.T) {
	cases := []struct{ release, values, want string }{
		{"druid-stretch", ``, "druid-stretch-membership"},
		{"seed-a", ``, "seed-a-druid-stretch-membership"},
		{"seed-b", ``, "seed-b-druid-stretch-membership"},
		{"seed-a", `controller: {leaderElectionID: druid-stretch-membership}`, "druid-stretch-membership"},
	}
	for _, tc := range cases {
		t.Run(tc.release+" "+tc.values, func(t *testing.T) {
			g := NewWithT(t)
			r := render(t, tc.release, "garden", values(t, tc.values))
			g.Expect(controllerFlags(g, r)).To(HaveKeyWithValue("--leader-election-id", tc.want))
		})
	}
}
