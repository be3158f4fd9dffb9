package cli

import (
	"os/exec"
	"slices"
	"strings"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/druid-stretch/druid-stretch/internal/testbin"
)

// TestShippedBinaryCarriesOnlyTheShippedCommands: the binary in the image
// runs the controller, the sidecar and the migration; the demo, the
// benchmarks and the image writer (druid-stretch-dev) and the packages they
// need stay out of it.
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
	for _, dev := range []string{"internal/devcli", "internal/demo", "internal/site", "internal/image"} {
		g.Expect(deps).NotTo(ContainElement("github.com/druid-stretch/druid-stretch/"+dev), "the shipped binary links %s", dev)
	}
}
