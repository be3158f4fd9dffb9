// Package apimodule checks the api module the way gardenlet uses it: a
// module that imports only github.com/druid-stretch/druid-stretch/api builds
// without the controller's, the sidecar's or the tests' dependencies.
package apimodule

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
)

// importer uses every package of the api module that gardenlet imports.
const importer = `package main

import (
	"fmt"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/members"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/migration"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/validation"
)

func main() {
	e := &v1alpha1.Etcd{}
	fmt.Println(members.LocalMemberNames(e), migration.NewDestination(e, 3).Name, validation.ValidateEtcd(e))
}
`

// forbidden are modules that must appear nowhere in the importer's module
// graph or go.sum: the etcd server and client, controller-runtime (its
// manager, client and envtest), and what the controller, the CLI and the
// tests use.
var forbidden = []string{
	"go.etcd.io/",
	"sigs.k8s.io/controller-runtime",
	"google.golang.org/grpc",
	"github.com/prometheus/",
	"helm.sh/",
}

// compiled are the only modules whose packages the importer may compile:
// the API types, druid's API, and what k8s.io/api and apimachinery need.
// A new module here makes every importer heavier; it needs a reason.
var compiled = []string{
	"example.com/importer",
	"github.com/druid-stretch/druid-stretch/api",
	"github.com/gardener/etcd-druid/api",
	"k8s.io/api",
	"k8s.io/apimachinery",
	"k8s.io/klog/v2",
	"k8s.io/kube-openapi",
	"k8s.io/utils",
	"sigs.k8s.io/json",
	"sigs.k8s.io/randfill",
	"sigs.k8s.io/structured-merge-diff/v6",
	"github.com/fxamacker/cbor/v2",
	"github.com/go-logr/logr",
	"github.com/json-iterator/go",
	"github.com/modern-go/concurrent",
	"github.com/modern-go/reflect2",
	"github.com/x448/float16",
	"go.yaml.in/yaml/v2",
	"golang.org/x/net",
	"golang.org/x/text",
	"gopkg.in/inf.v0",
}

// TestScratchImporterBuildsWithTheAPIModuleAlone builds a fresh module that
// requires only the api module (replaced by this checkout's api/) and
// checks its go.sum, its module graph and the modules it compiles.
func TestScratchImporterBuildsWithTheAPIModuleAlone(t *testing.T) {
	root, err := testbin.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	goMod := "module example.com/importer\n\ngo 1.26.0\n\n" +
		"require github.com/druid-stretch/druid-stretch/api v0.0.0\n\n" +
		"replace github.com/druid-stretch/druid-stretch/api => " + filepath.Join(root, "api") + "\n"
	write(t, filepath.Join(dir, "go.mod"), goMod)
	write(t, filepath.Join(dir, "main.go"), importer)

	goCmd(t, dir, "mod", "tidy")
	goCmd(t, dir, "build", "-o", filepath.Join(dir, "importer"), ".")

	sum, err := os.ReadFile(filepath.Join(dir, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	graph := goCmd(t, dir, "list", "-m", "all")
	for _, bad := range forbidden {
		for name, text := range map[string]string{"go.sum": string(sum), "go list -m all": graph} {
			for line := range strings.Lines(text) {
				if strings.HasPrefix(line, bad) {
					t.Errorf("%s of an importer of the api module has %s", name, strings.TrimSpace(line))
				}
			}
		}
	}

	mods := goCmd(t, dir, "list", "-deps", "-f", "{{with .Module}}{{.Path}}{{end}}", ".")
	for line := range strings.Lines(mods) {
		if m := strings.TrimSpace(line); m != "" && !slices.Contains(compiled, m) {
			t.Errorf("an importer of the api module compiles packages of %s", m)
		}
	}
}

// TestForbiddenModulesAreInTheRootModule shows the check can fail: the root
// module's own graph has every forbidden module the check looks for first.
func TestForbiddenModulesAreInTheRootModule(t *testing.T) {
	root, err := testbin.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	graph := goCmd(t, root, "list", "-m", "all")
	for _, m := range []string{"go.etcd.io/etcd/server/v3", "sigs.k8s.io/controller-runtime"} {
		if !strings.Contains(graph, "\n"+m+" ") {
			t.Errorf("the root module's graph lacks %s, so the importer check proves nothing about it", m)
		}
	}
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// goCmd runs the go command in dir outside any workspace, with modules
// fetched as needed, and returns its standard output.
func goCmd(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), "go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("go %s in %s: %v\n%s", strings.Join(args, " "), dir, err, stderr)
	}
	return string(out)
}
