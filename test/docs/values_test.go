package docs

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	"helm.sh/helm/v3/pkg/lint/support"
	"helm.sh/helm/v3/pkg/strvals"

	"github.com/druid-stretch/druid-stretch/internal/testing/docscheck"
	"github.com/druid-stretch/druid-stretch/test/chart"
)

// example is one set of chart values the docs show.
type example struct {
	where  string
	values map[string]any
}

// helmCommandRE is a `helm install` or `helm template` command; upgrades
// with --reuse-values build on values the docs do not show.
var helmCommandRE = regexp.MustCompile(`^\s*helm (install|template) `)

// valuesExamples are the docs' chart values: every yaml block that starts
// with "# values:", and the --set values of every helm install command in a
// code block.
func valuesExamples(t *testing.T) []example {
	t.Helper()
	_, all := docs(t)
	var out []example
	for _, d := range all {
		for _, b := range docscheck.Blocks(d.Text) {
			where := fmt.Sprintf("%s:%d", d.Path, b.Line)
			if strings.HasPrefix(b.Lang, "yaml") && strings.HasPrefix(b.Text, "# values:") {
				v, err := chart.ParseValues(b.Text)
				if err != nil {
					t.Fatalf("%s: %v", where, err)
				}
				out = append(out, example{where, v})
				continue
			}
			for _, line := range joinContinuations(b.Text) {
				if !helmCommandRE.MatchString(line) || !strings.Contains(line, "charts/druid-stretch") {
					continue
				}
				v := map[string]any{}
				fields := strings.Fields(line)
				for i, f := range fields {
					if f == "--set" && i+1 < len(fields) {
						// The shell takes the quotes off a quoted value.
						if err := strvals.ParseInto(strings.Trim(fields[i+1], `'"`), v); err != nil {
							t.Fatalf("%s: --set %s: %v", where, fields[i+1], err)
						}
					}
				}
				out = append(out, example{where, v})
			}
		}
	}
	return out
}

// TestDocsValuesExamples: every values example in the docs passes helm
// lint without a warning and renders (helm template) with schema
// validation.
func TestDocsValuesExamples(t *testing.T) {
	examples := valuesExamples(t)
	if len(examples) < 4 {
		t.Fatalf("found %d values examples in the docs, want at least 4", len(examples))
	}
	for _, ex := range examples {
		t.Run(ex.where, func(t *testing.T) {
			g := NewWithT(t)
			r, err := chart.Render(chart.Options{ReleaseName: "druid-stretch", Namespace: "druid-stretch-system", Values: ex.values})
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(r.Objects).NotTo(BeEmpty())
			msgs, err := chart.Lint(ex.values, "druid-stretch-system", "")
			g.Expect(err).NotTo(HaveOccurred())
			for _, m := range msgs {
				g.Expect(m.Severity).To(BeNumerically("<", support.WarningSev), "lint: %s", m)
			}
		})
	}
}
