package devcli

import (
	"bytes"
	"context"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/druid-stretch/druid-stretch/internal/cli"
	"github.com/druid-stretch/druid-stretch/test/framework/demo"
	"github.com/druid-stretch/druid-stretch/test/framework/report"
)

// kept is the report of a move that kept every guarantee, with a write
// gap over the 1 s target.
func kept() report.Report {
	return report.Report{
		TieSeconds: 0.2,
		KubeAPIServers: []report.APIServer{
			{Name: "site-a", Writes: 900, MaxWriteGapMs: 300},
			{Name: "site-b", Writes: 600, MaxWriteGapMs: 1400},
		},
		APIHistory:            &report.APIHistory{Linearizable: true, LinearizabilityResult: "Ok"},
		Linearizable:          true,
		LinearizabilityResult: "Ok",
	}
}

// TestDemoExitsNonZeroWhenAGuaranteeBroke runs the demo command as
// druid-stretch-dev's main does, on reports of moves instead of a move:
// the last line is the verdict, and the exit code is 1 exactly when a
// guarantee broke; a missed target is named and fails nothing.
func TestDemoExitsNonZeroWhenAGuaranteeBroke(t *testing.T) {
	for _, tc := range []struct {
		name     string
		edit     func(*report.Report)
		exit     int
		verdict  string
		mentions []string
	}{
		{"every guarantee held, a gap over the target", func(*report.Report) {}, cli.ExitOK,
			"VERDICT: every guarantee held", []string{"target of under 1 s missed: site-b's longest write gap 1.40 s"}},
		{"a failed request", func(r *report.Report) { r.KubeAPIServers[1].Failed = 3 }, cli.ExitFailure,
			"VERDICT: FAILED: 3 failed requests at site-b's kube-apiserver", nil},
		{"a lost write", func(r *report.Report) { r.APIHistory.LostAcknowledgedWrites = 1 }, cli.ExitFailure,
			"VERDICT: FAILED: 1 acknowledged writes of the kube-apiservers lost", nil},
		{"not linearizable", func(r *report.Report) {
			r.APIHistory.Linearizable, r.APIHistory.LinearizabilityResult = false, "Illegal"
		}, cli.ExitFailure,
			"VERDICT: FAILED: the kube-apiservers' history is not linearizable (Illegal)", nil},
		{"an etcd panic", func(r *report.Report) { r.EtcdCrashes = []string{"etcd-main-3: panic"} }, cli.ExitFailure,
			"VERDICT: FAILED: 1 etcd panics or fatal exits", nil},
		{"a long tie", func(r *report.Report) { r.TieSeconds = 1.3 }, cli.ExitOK,
			"VERDICT: every guarantee held", []string{"time in tie 1.30 s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			rep := kept()
			tc.edit(&rep)
			runOnSites = func(context.Context, demo.SiteOptions) (report.Report, error) { return rep, nil }
			t.Cleanup(func() { runOnSites = demo.RunOnSites })
			root := NewRootCommand()
			var out bytes.Buffer
			root.SetOut(&out)
			root.SetErr(&out)
			g.Expect(cli.Run(root, []string{"demo"})).To(Equal(tc.exit), "%s", out.String())
			lines := bytes.Split(bytes.TrimSpace(out.Bytes()), []byte("\n"))
			last := string(lines[len(lines)-1])
			g.Expect(last).To(HavePrefix(tc.verdict))
			for _, m := range tc.mentions {
				g.Expect(last).To(ContainSubstring(m))
			}
		})
	}
}
