package site

import (
	"os"
	"path/filepath"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
)

// TestStartFailureStopsWhatStarted: a site whose start fails after its
// control plane is up returns the error that names the cause, and stops
// that control plane: envtest's folder (its certificates and kubeconfig,
// under TMPDIR) is gone again.
func TestStartFailureStopsWhatStarted(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	s, err := Start(testContext(t, siteTestDeadline), Options{
		Dir:   filepath.Join(tmp, "site"),
		Nodes: []NodeOptions{{Name: "node-0"}, {Name: "node-0"}},
	})
	g.Expect(err).To(MatchError(And(
		ContainSubstring("site: starting the node stand-ins"),
		ContainSubstring(`Options.Nodes names "node-0" twice`))))
	g.Expect(s).To(BeNil())
	left, err := filepath.Glob(filepath.Join(tmp, "k8s_test_framework_*"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(left).To(BeEmpty(), "the control plane's folders are removed: it was stopped")
	_, err = os.Stat(filepath.Join(tmp, "site", "logs"))
	g.Expect(err).NotTo(HaveOccurred(), "the site's logs stay for the reader")
}
