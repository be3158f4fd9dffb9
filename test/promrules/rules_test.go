// Package promrules validates the chart's PrometheusRule with Prometheus'
// own rule parser (github.com/prometheus/prometheus/model/rulefmt, what
// promtool check rules runs). It is a module of its own because the
// Prometheus module would raise shared dependencies of the shipped binary;
// make test runs it.
package promrules

import (
	"log/slog"
	"testing"

	. "github.com/onsi/gomega"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"

	"github.com/druid-stretch/druid-stretch/test/chart"
)

// TestPrometheusRuleParses renders the PrometheusRule for the default
// thresholds and for changed ones, and has rulefmt parse its groups: valid
// PromQL, durations, unique alert names, and label and annotation templates
// that expand.
func TestPrometheusRuleParses(t *testing.T) {
	for name, extra := range map[string]map[string]any{
		"defaults": {},
		"changed":  {"stuckFor": "1h", "learnerLagEntries": 250, "learnerLagFor": "5m"},
	} {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			rule := map[string]any{"enabled": true}
			for k, v := range extra {
				rule[k] = v
			}
			r, err := chart.Render(chart.Options{ReleaseName: "druid-stretch", Namespace: "garden", Values: map[string]any{
				"image":            map[string]any{"repository": "registry.example.com/druid-stretch"},
				"clusterIdentity":  "seed-a",
				"sidecarClientTLS": map[string]any{"secretName": "druid-stretch-sidecar-client"},
				"metrics":          map[string]any{"prometheusRule": rule},
			}})
			g.Expect(err).NotTo(HaveOccurred())
			obj, err := r.One("PrometheusRule")
			g.Expect(err).NotTo(HaveOccurred())
			// spec of a PrometheusRule is exactly a Prometheus rule file.
			spec, err := yaml.Marshal(obj.Object["spec"])
			g.Expect(err).NotTo(HaveOccurred())
			groups, errs := rulefmt.Parse(spec, false, model.UTF8Validation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
			g.Expect(errs).To(BeEmpty(), "%s", spec)
			g.Expect(groups.Groups).To(HaveLen(1))
			g.Expect(groups.Groups[0].Rules).To(HaveLen(5))
		})
	}
}

// TestRuleParserRefusesABrokenRule shows the parser used above fails on a
// broken expression, so a pass means something.
func TestRuleParserRefusesABrokenRule(t *testing.T) {
	g := NewWithT(t)
	_, errs := rulefmt.Parse([]byte("groups:\n- name: x\n  rules:\n  - alert: A\n    expr: max by (namespace (x)\n"), false, model.UTF8Validation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	g.Expect(errs).NotTo(BeEmpty())
}
