package docs

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
)

// goIn runs the go command in dir of the repository, on that folder's own
// go.mod when workspace is false (GOWORK=off), in the workspace of go.work
// otherwise.
func goIn(t *testing.T, dir string, workspace bool, args ...string) string {
	t.Helper()
	root, err := testbin.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), "go", args...)
	cmd.Dir = filepath.Join(root, dir)
	cmd.Env = os.Environ()
	if !workspace {
		cmd.Env = append(cmd.Env, "GOWORK=off")
	}
	out, err := cmd.Output()
	if err != nil {
		var exit *exec.ExitError
		var stderr []byte
		if errors.As(err, &exit) {
			stderr = exit.Stderr
		}
		t.Fatalf("go %s in %s: %v\n%s", strings.Join(args, " "), cmd.Dir, err, stderr)
	}
	return string(out)
}

// shippedModules maps each module that provides a package of the shipped
// binary (the root module's main package) to the version the build selects
// and its replacement, if any.
func shippedModules(t *testing.T, workspace bool) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, line := range strings.Split(goIn(t, ".", workspace, "list", "-deps", "-f", "{{with .Module}}{{.Path}} {{.Version}}{{with .Replace}} => {{.Path}} {{.Version}}{{end}}{{end}}", "."), "\n") {
		if path, version, ok := strings.Cut(line, " "); ok {
			m[path] = version
		}
	}
	return m
}

// TestTestsBuildTheShippedVersions: make build and the image build the
// product from the root go.mod alone, while go test builds it in the
// workspace of go.work, where the test module's requirements count too.
// Every module the shipped binary links must be selected at the same
// version in the workspace, or the tests would not test what ships.
func TestTestsBuildTheShippedVersions(t *testing.T) {
	shipped := shippedModules(t, false)
	tested := shippedModules(t, true)
	NewWithT(t).Expect(shipped).To(HaveKey("sigs.k8s.io/controller-runtime"), "the check sees the root's build list")
	for path, v := range shipped {
		if path == "github.com/druid-stretch/druid-stretch" || strings.HasPrefix(path, "github.com/druid-stretch/druid-stretch/") {
			continue
		}
		if tested[path] != v {
			t.Errorf("%s: the root go.mod selects %q, the workspace of the tests %q: the test module raises or replaces it; make the root go.mod select the same",
				path, v, tested[path])
		}
	}
}

// rootModuleGraphMaxEdges is half the root module graph's edges when the
// test infrastructure (sites, stand-ins, the pod network, the demo, the
// bench) and etcd's server were in the root module: 2,929 on 2026-12-02.
// Their dependencies (Helm, virtual-kubelet, netlink, plotting, etcd's
// server) now live in test/go.mod and hack/tools/etcd/go.mod.
const rootModuleGraphMaxEdges = 2929 / 2

// TestRootModuleGraphStaysSmall: a dependency the test infrastructure
// needs belongs in test/go.mod, not in the root go.mod that the shipped
// binary and every importer of the root module resolve.
func TestRootModuleGraphStaysSmall(t *testing.T) {
	edges := strings.Count(goIn(t, ".", false, "mod", "graph"), "\n")
	if edges == 0 || edges > rootModuleGraphMaxEdges {
		t.Errorf("the root module graph has %d edges (go mod graph), at most %d: does a dependency of the test infrastructure belong in test/go.mod?", edges, rootModuleGraphMaxEdges)
	}
}

// TestOneEtcdRelease: the etcd server the tests run (hack/tools/etcd), the
// server the etcd-wrapper stand-in embeds (test/go.mod) and the client the
// product is built with (the root go.mod) are one release.
func TestOneEtcdRelease(t *testing.T) {
	g := NewWithT(t)
	version := func(dir, module string) string {
		return strings.TrimSpace(goIn(t, dir, false, "list", "-m", "-f", "{{.Version}}", module))
	}
	client := version(".", "go.etcd.io/etcd/client/v3")
	g.Expect(client).To(HavePrefix("v3."))
	g.Expect(version("hack/tools/etcd", "go.etcd.io/etcd/server/v3")).To(Equal(client), "hack/tools/etcd/go.mod's etcd server against the root go.mod's etcd client")
	g.Expect(version("test", "go.etcd.io/etcd/server/v3")).To(Equal(client), "test/go.mod's etcd server (the etcd-wrapper stand-in) against the root go.mod's etcd client")
}
