//go:build linux

package baseline_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
	"github.com/druid-stretch/druid-stretch/test/framework/baseline"
	"github.com/druid-stretch/druid-stretch/test/infrastructure/podnet"
)

// sites are two peered pod networks, rtt apart, as the bench's sites are.
func sites(t *testing.T, rtt time.Duration) (a, b *podnet.Network) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the baseline runs etcd in pod network namespaces: run as root")
	}
	g := NewWithT(t)
	a, err := podnet.New(podnet.Options{CIDR: "10.231.0.0/24"})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = a.Close() })
	b, err = podnet.New(podnet.Options{CIDR: "10.232.0.0/24"})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = b.Close() })
	p, err := podnet.Peer(a, b)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = p.Close() })
	p.SetDelay(rtt / 2)
	return a, b
}

// TestScriptedMoveEndsInB runs the hand-scripted move between two sites
// and checks what etcd says afterwards: B's three members are the voters,
// A's are gone, every acknowledged write is there, leadership moved once
// at the tie, and no process of the run is left.
func TestScriptedMoveEndsInB(t *testing.T) {
	testbin.Need(t)
	a, b := sites(t, 180*time.Millisecond)
	g := NewWithT(t)
	res, err := baseline.Run(t.Context(), baseline.Options{A: a, B: b, Dir: t.TempDir(), PreloadKeys: 10000})
	g.Expect(err).NotTo(HaveOccurred())
	t.Logf("move %.1f s, tie %.2f s, %d writes, %d failed, %d lost, max write gap %s", res.Move.Seconds(), res.Tie.Seconds(), res.Writes, res.Failed, res.Lost, res.MaxWriteGap)
	for _, s := range res.Steps {
		t.Logf("  %6.2f s  %-28s %.2f s", s.At.Seconds(), s.Name, s.Took.Seconds())
	}

	g.Expect(res.Members).To(ConsistOf("baseline-b-0", "baseline-b-1", "baseline-b-2"))
	g.Expect(res.Writes).To(BeNumerically(">", 0))
	g.Expect(res.Lost).To(BeZero())
	var names []string
	for _, s := range res.Steps {
		names = append(names, strings.Fields(s.Name)[0])
		g.Expect(s.At + s.Took).To(BeNumerically("<=", res.Move))
	}
	g.Expect(names).To(Equal([]string{
		"add", "promote", "remove",
		"add", "promote", "move", "remove",
		"add", "promote", "remove",
	}), "one member at a time, leadership moved once at the tie")
	g.Expect(res.Tie).To(BeNumerically(">", 0))
	g.Expect(res.Tie).To(BeNumerically("<", res.Move))

	g.Expect(baselineProcesses(t)).To(BeEmpty(), "etcd processes of the run are left")
}

// TestMissingSitesAreNamed: without both networks, Run says what is
// missing and starts nothing.
func TestMissingSitesAreNamed(t *testing.T) {
	g := NewWithT(t)
	_, err := baseline.Run(t.Context(), baseline.Options{Dir: t.TempDir()})
	g.Expect(err).To(MatchError(ContainSubstring("Options.A and Options.B")))
	_, err = baseline.Run(t.Context(), baseline.Options{A: &podnet.Network{}, B: &podnet.Network{}})
	g.Expect(err).To(MatchError(ContainSubstring("Options.Dir is required")))
}

// TestEtcdThatCannotStartIsNamed: a member whose etcd exits at once ends
// the run with its name and log, and leaves no process behind.
func TestEtcdThatCannotStartIsNamed(t *testing.T) {
	testbin.Need(t)
	a, b := sites(t, 0)
	g := NewWithT(t)
	_, err := baseline.Run(t.Context(), baseline.Options{A: a, B: b, Dir: t.TempDir(), EtcdArgs: []string{"--no-such-flag"}})
	g.Expect(err).To(MatchError(MatchRegexp(`etcd of baseline-a-\d exited .*; its log is .*/etcd.log`)))
	g.Expect(baselineProcesses(t)).To(BeEmpty(), "etcd processes of the run are left")
}

// baselineProcesses are the command lines of running processes started
// with the baseline's cluster token.
func baselineProcesses(t *testing.T) []string {
	t.Helper()
	paths, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // the process ended meanwhile
		}
		if cmd := strings.ReplaceAll(string(b), "\x00", " "); strings.Contains(cmd, "--initial-cluster-token=druid-stretch-baseline") {
			out = append(out, cmd)
		}
	}
	return out
}
