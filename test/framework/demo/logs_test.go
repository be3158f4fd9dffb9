package demo

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/druid-stretch/druid-stretch/test/framework/report"
)

// TestLogsKeptWhenTheRunNeedsThem: the demo's temporary folder goes after
// a run that kept every guarantee and stays, named on the screen, after
// one that failed or broke a guarantee.
func TestLogsKeptWhenTheRunNeedsThem(t *testing.T) {
	for _, c := range []struct {
		name   string
		err    error
		rep    report.Report
		kept   bool
		saying string
	}{
		{name: "every guarantee held", saying: "removed the logs' folder"},
		{name: "the run failed", err: errors.New("site B did not start"), kept: true, saying: "the logs are kept"},
		{name: "a request failed", rep: report.Report{KubeAPIServers: []report.APIServer{{Name: "A", Failed: 2}}}, kept: true, saying: "the logs are kept"},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := NewWithT(t)
			dir := t.TempDir()
			logs := filepath.Join(dir, "demo")
			g.Expect(os.MkdirAll(logs, 0o755)).To(Succeed())
			g.Expect(os.WriteFile(filepath.Join(logs, "demo.log"), []byte("x"), 0o644)).To(Succeed())
			var out bytes.Buffer
			g.Expect(removeLogs(&out, logs, c.err, c.rep)).To(Succeed())
			g.Expect(out.String()).To(ContainSubstring(c.saying))
			g.Expect(out.String()).To(ContainSubstring(logs))
			_, err := os.Stat(filepath.Join(logs, "demo.log"))
			if c.kept {
				g.Expect(err).NotTo(HaveOccurred())
			} else {
				g.Expect(os.IsNotExist(err)).To(BeTrue(), "removed: %v", err)
			}
		})
	}
}
