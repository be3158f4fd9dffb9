package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
	"github.com/druid-stretch/druid-stretch/internal/version"
)

// TestVersionOfAStampedBinary builds druid-stretch with the link-time stamps
// the Makefile and hack/test-binaries.sh pass, and reads them back through
// `version -o json` and `--version`. It builds as hack/test-binaries.sh
// builds druid-stretch-static (static, -trimpath), so that only the link
// runs: the stamps touch nothing else, and any other flag would compile the
// whole binary again beside the other packages' tests.
func TestVersionOfAStampedBinary(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	root, err := testbin.RepoRoot()
	g.Expect(err).NotTo(HaveOccurred())
	binary := filepath.Join(t.TempDir(), "druid-stretch")
	const pkg = "github.com/druid-stretch/druid-stretch/internal/version"
	build := exec.CommandContext(t.Context(), "go", "build", "-trimpath",
		"-ldflags=-X "+pkg+".version=v9.8.7 -X "+pkg+".commit=0123abcd", "-o", binary, ".")
	build.Dir = root
	// As hack/test-binaries.sh builds druid-stretch-static: the root go.mod
	// alone, static, so the build cache serves all but the link.
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off")
	out, err := build.CombinedOutput()
	g.Expect(err).NotTo(HaveOccurred(), "%s", out)

	out, err = exec.CommandContext(t.Context(), binary, "version", "-o", "json").Output()
	g.Expect(err).NotTo(HaveOccurred())
	var info map[string]string
	g.Expect(json.Unmarshal(out, &info)).To(Succeed(), "%s", out)
	g.Expect(info).To(HaveKeyWithValue("version", "v9.8.7"))
	g.Expect(info).To(HaveKeyWithValue("commit", "0123abcd"))
	g.Expect(info).To(HaveKeyWithValue("goVersion", runtime.Version()))
	g.Expect(info).To(HaveKeyWithValue("etcdClientVersion", etcdClientVersion(t)))
	g.Expect(info).To(HaveKeyWithValue("platform", runtime.GOOS+"/"+runtime.GOARCH))

	out, err = exec.CommandContext(t.Context(), binary, "--version").Output()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(out)).To(Equal("druid-stretch v9.8.7 (commit 0123abcd, " + runtime.Version() + ", " +
		runtime.GOOS + "/" + runtime.GOARCH + ", etcd client " + etcdClientVersion(t) + ")\n"))
}

// etcdClientVersion is the etcd client version the root go.mod pins.
func etcdClientVersion(t *testing.T) string {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), "go", "list", "-m", "-f", "{{.Version}}", "go.etcd.io/etcd/client/v3")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -m go.etcd.io/etcd/client/v3: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// TestVersionOutputs checks every -o of `version` in process, and that an
// unknown one is a usage error (exit code 2).
func TestVersionOutputs(t *testing.T) {
	info := version.Get()
	tests := []struct {
		args []string
		want string
	}{
		{nil, info.String() + "\n"},
		{[]string{"-o", "text"}, info.String() + "\n"},
		{[]string{"-o", "yaml"}, "commit: " + info.Commit + "\netcdClientVersion: " + info.EtcdClientVersion +
			"\ngoVersion: " + info.GoVersion + "\nplatform: " + info.Platform + "\nversion: " + info.Version + "\n"},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			g := NewWithT(t)
			out, err := runRoot(append([]string{"version"}, tc.args...)...)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(out).To(Equal(tc.want))
		})
	}
	g := NewWithT(t)
	_, err := runRoot("version", "-o", "xml")
	g.Expect(err).To(MatchError(ContainSubstring(`-o "xml"`)))
	g.Expect(exitCode(err)).To(Equal(ExitUsage))
	_, err = runRoot("version", "--no-such-flag")
	g.Expect(exitCode(err)).To(Equal(ExitUsage))
}

// runRoot runs the root command in process and returns what it printed.
func runRoot(args ...string) (string, error) {
	root := newRootCommand()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}
