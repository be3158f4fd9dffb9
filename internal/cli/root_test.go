package cli

import (
	"os/exec"
	"slices"
	"strings"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
)

// TestShippedBinaryCarriesOnlyTheShippedCommands: the binary in the image
// runs the controller, the sidecar and the migration; the demo, the
// benchmarks and the image writer (druid-stretch-dev, in the test module),
// the test infrastructure and the harness of the product's own tests stay
// out of it.
func TestShippedBinaryCarriesOnlyTheShippedCommands(t *testing.T) {
	g := NewWithT(t)
	var names []string
	for _, c := range newRootCommand().Commands() {
		names = append(names, c.Name())
	}
	slices.Sort(names)
	g.Expect(names).To(Equal([]string{"backup-restore-config", "controller", "migrate", "rebalance", "sidecar", "version"}))

	root, err := testbin.RepoRoot()
	g.Expect(err).NotTo(HaveOccurred())
	list := exec.CommandContext(t.Context(), "go", "list", "-deps", ".")
	list.Dir = root
	out, err := list.Output()
	g.Expect(err).NotTo(HaveOccurred())
	deps := strings.Fields(string(out))
	g.Expect(deps).To(ContainElement("github.com/druid-stretch/druid-stretch/controllers/membership"), "the check sees the binary's packages")
	for _, dep := range deps {
		rel, ours := strings.CutPrefix(dep, "github.com/druid-stretch/druid-stretch/")
		if !ours {
			continue
		}
		g.Expect(rel).NotTo(HavePrefix("test/"), "the shipped binary links %s, of the test module", dep)
		g.Expect(rel).NotTo(HavePrefix("internal/testing/"), "the shipped binary links %s, a harness of the tests", dep)
	}
}
