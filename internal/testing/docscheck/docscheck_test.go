package docscheck

import (
	"testing"

	. "github.com/onsi/gomega"
)

func TestMetricsTable(t *testing.T) {
	g := NewWithT(t)
	md := "| Metric | Type | Labels | Meaning |\n|---|---|---|---|\n" +
		"| `x_total` | counter | `kind`, `etcd` | a |\n| `x_seconds` | histogram | none | b |\n| `y` | gauge | none | c |\n"
	rows, err := Metrics(md, "x_")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(rows).To(Equal([]Metric{{Name: "x_total", Type: "counter", Labels: []string{"etcd", "kind"}}, {Name: "x_seconds", Type: "histogram"}}))
	_, err = Metrics("| `x_a` | gauge | kind | a |\n", "x_")
	g.Expect(err).To(MatchError(ContainSubstring(`label "kind" is not in backticks`)))
}

func TestBlocksAndFlags(t *testing.T) {
	g := NewWithT(t)
	md := "text --real-flag and shoot--p--s\n\n1. a step:\n\n   ```sh\n   cmd --x \\\n     --y\n   ```\n"
	g.Expect(Blocks(md)).To(Equal([]Block{{Lang: "sh", Text: "cmd --x \\\n  --y\n", Line: 5}}))
	g.Expect(Flags(md)).To(Equal(map[string]int{"--real-flag": 1, "--x": 6, "--y": 7}))
}
