package cli

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

// runRebalance runs the rebalance command with args and returns its
// output and error.
func runRebalance(t *testing.T, stdin string, args ...string) (string, error) {
	t.Helper()
	cmd := newRootCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetIn(strings.NewReader(stdin))
	cmd.SetArgs(append([]string{"rebalance"}, args...))
	// The test's own bound, should a run never end: not an asserted time.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := cmd.ExecuteContext(ctx)
	return out.String(), err
}

// A --file over the bound is refused before it is parsed, and no sidecar
// is called: nothing changed.
func TestRebalanceRefusesAnOversizedFile(t *testing.T) {
	var calls atomic.Int64
	sc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		calls.Add(1)
		http.Error(w, "no", http.StatusTeapot)
	}))
	t.Cleanup(sc.Close)
	// A valid spec, padded with a YAML comment past the bound.
	spec := "sidecars: [{member: a-0, url: " + sc.URL + "}]\ntarget: [{name: b-0, peerURLs: [\"https://10.0.1.1:2380\"], group: b}]\n#"
	big := spec + strings.Repeat("x", maxInputBytes) + "\n"
	path := filepath.Join(t.TempDir(), "spec.yaml")
	if err := os.WriteFile(path, []byte(big), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, args := range map[string][]string{
		"a file":        {"--file", path},
		"stdin (\"-\")": {"--file", "-"},
	} {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			_, err := runRebalance(t, big, args...)
			g.Expect(err).To(MatchError(ContainSubstring("is larger than 4 MiB, the bound of a command's input; nothing was parsed or changed")))
			g.Expect(exitCode(err)).To(Equal(ExitUsage))
			g.Expect(calls.Load()).To(BeZero(), "no sidecar was called")
		})
	}
}

// A sidecar that takes the connection and never answers stops the run at
// its --timeout, with an error that names the sidecar's URL.
func TestRebalanceNamesAnUnreachableSidecar(t *testing.T) {
	g := NewWithT(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = l.Close() })
	// Accept and hold every connection: the TCP handshake succeeds, no
	// answer ever comes.
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				_ = c.Close()
			}
		}()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	url := "http://" + l.Addr().String()
	out, err := runRebalance(t, "", "--sidecar", "a-0="+url, "--target", "b/b-0=https://10.0.1.1:2380",
		"--call-timeout", "500ms", "--timeout", "2s", "--interval", "100ms")
	g.Expect(err).To(HaveOccurred(), "output: %s", out)
	g.Expect(err.Error()).To(ContainSubstring("--timeout 2s reached"))
	g.Expect(err.Error()).To(ContainSubstring("no sidecar answered"))
	g.Expect(err.Error()).To(ContainSubstring(url), "the error names the sidecar that did not answer")
	g.Expect(errors.Is(err, context.DeadlineExceeded)).To(BeTrue())
	g.Expect(exitCode(err)).To(Equal(ExitNotFinished))
}

// A run without a time limit is refused: every sidecar call and the whole
// run have one.
func TestRebalanceNeedsTimeLimits(t *testing.T) {
	g := NewWithT(t)
	for _, flag := range []string{"--timeout=0", "--call-timeout=0"} {
		_, err := runRebalance(t, "", "--sidecar", "a-0=http://127.0.0.1:1", "--target", "b/b-0=https://10.0.1.1:2380", flag)
		g.Expect(err).To(MatchError(ContainSubstring("must be positive")), flag)
		g.Expect(exitCode(err)).To(Equal(ExitUsage), flag)
	}
}
