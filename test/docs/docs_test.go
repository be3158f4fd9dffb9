// Package docs holds the docs (README.md and docs/*.md) to the code: every
// file they cite is in this repository, every flag they mention is a flag of
// a druid-stretch command or of a named other tool, every port in the ports
// table is a flag's default, and every chart values example in them passes
// helm lint and renders. It holds tests only.
package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/druid-stretch/druid-stretch/internal/cli"
	"github.com/druid-stretch/druid-stretch/internal/testing/docscheck"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
	"github.com/druid-stretch/druid-stretch/test/devcli"
	"github.com/druid-stretch/druid-stretch/test/infrastructure/standin/etcdwrapper"
)

func docs(t *testing.T) (string, []docscheck.Doc) {
	t.Helper()
	root, err := testbin.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	d, err := docscheck.Docs(root)
	if err != nil {
		t.Fatal(err)
	}
	return root, d
}

// repoDirs are the top-level folders of this repository: a code span that
// starts with one names a path here. bin/ is left out: it holds what the
// build makes, not what the repository has.
var repoDirs = []string{"api/", "charts/", "controllers/", "docs/", "hack/", "internal/", "sidecar/", "test/"}

var (
	codeSpanRE = regexp.MustCompile("`([^`\\s]+)`")
	linkRE     = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	fileExtRE  = regexp.MustCompile(`\.(go|ya?ml|json|md|sh|txt|svg|tpl|mod)$`)
	// A path followed by a Go identifier (internal/livemove.Mover) or a
	// function (file.go: Func) names that identifier in the path.
	identSuffixRE = regexp.MustCompile(`\.[A-Z][A-Za-z0-9]*$`)
)

// TestDocsCiteOnlyFilesInTheRepo: every relative link and every code span
// that names a path of this repository (a top-level folder first, or a file
// with a folder) exists, so the docs need nothing outside the repository.
func TestDocsCiteOnlyFilesInTheRepo(t *testing.T) {
	root, all := docs(t)
	for _, d := range repoDirs {
		if _, err := os.Stat(filepath.Join(root, d)); err != nil {
			t.Errorf("repoDirs names %s, which is not a folder of the repository: a doc citing it would be held to a folder that is gone", d)
		}
	}
	checked := 0
	for _, d := range all {
		dir := filepath.Join(root, filepath.Dir(d.Path))
		for _, m := range linkRE.FindAllStringSubmatch(d.Text, -1) {
			target, _, _ := strings.Cut(m[1], "#")
			if target == "" || strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			checked++
			if _, err := os.Stat(filepath.Join(dir, target)); err != nil {
				t.Errorf("%s links %s, which is not in the repository", d.Path, m[1])
			}
		}
		for _, m := range codeSpanRE.FindAllStringSubmatch(d.Text, -1) {
			span := strings.TrimSuffix(m[1], ":")
			isRepoPath := slices.ContainsFunc(repoDirs, func(p string) bool { return strings.HasPrefix(span, p) })
			isFile := strings.Contains(span, "/") && fileExtRE.MatchString(span) && !strings.Contains(span, "://") && !strings.HasPrefix(span, "/") && !strings.HasPrefix(span, "$")
			if !isRepoPath && !isFile {
				continue
			}
			checked++
			path := identSuffixRE.ReplaceAllString(span, "")
			if strings.ContainsAny(path, "*<{") {
				matches, _ := filepath.Glob(filepath.Join(root, regexp.MustCompile(`<[^>]*>|\{[^}]*\}`).ReplaceAllString(path, "*")))
				if len(matches) == 0 {
					t.Errorf("%s cites %s, which matches nothing in the repository", d.Path, span)
				}
				continue
			}
			if _, err := os.Stat(filepath.Join(root, path)); err != nil {
				if _, err := os.Stat(filepath.Join(dir, path)); err != nil {
					t.Errorf("%s cites %s, which is not in the repository", d.Path, span)
				}
			}
		}
	}
	if checked < 50 {
		t.Fatalf("checked only %d citations: the patterns no longer find them", checked)
	}
}

// mdNameRE is a Markdown file named in prose, e.g. known-limits.md.
var mdNameRE = regexp.MustCompile(`(?:^|[\s(\x60])([\w./-]*[A-Za-z0-9_-]\.md)\b`)

// TestDocsNameOnlyDocsInTheRepo: every Markdown file the docs name, linked
// or not, is one of this repository's.
func TestDocsNameOnlyDocsInTheRepo(t *testing.T) {
	root, all := docs(t)
	have := map[string]bool{}
	for _, d := range all {
		have[filepath.Base(d.Path)] = true
	}
	named := 0
	for _, d := range all {
		for _, m := range mdNameRE.FindAllStringSubmatch(d.Text, -1) {
			named++
			name := m[1]
			if have[filepath.Base(name)] {
				continue
			}
			if _, err := os.Stat(filepath.Join(root, name)); err == nil {
				continue
			}
			if _, err := os.Stat(filepath.Join(root, filepath.Dir(d.Path), name)); err == nil {
				continue
			}
			t.Errorf("%s names %s, which is not in the repository", d.Path, name)
		}
	}
	if named < 10 {
		t.Fatalf("found only %d names of Markdown files: the pattern no longer finds them", named)
	}
}

// foreignFlags are flags the docs mention of tools other than druid-stretch,
// by tool, so that a flag druid-stretch lacks cannot pass as someone
// else's by accident.
var foreignFlags = map[string][]string{
	"helm":                {"--set", "--wait", "--namespace", "--create-namespace", "--reuse-values", "--skip-crds", "--skip-schema-validation", "--dry-run", "--values"},
	"kubectl":             {"--from-file", "--type", "--server-side", "--force-conflicts", "--namespace", "--context", "--kubeconfig"},
	"curl":                {"--cacert", "--cert", "--key"},
	"etcdctl":             {"--endpoints", "--cacert", "--cert", "--key"},
	"etcd":                {"--initial-cluster-state", "--quota-backend-bytes", "--max-learners", "--strict-reconfig-check"},
	"kube-apiserver":      {"--etcd-servers", "--etcd-cafile", "--etcd-certfile", "--etcd-keyfile", "--authorization-mode", "--advertise-address", "--endpoint-reconciler-type"},
	"kube-controller-mgr": {"--use-service-account-credentials", "--controllers"},
	"etcd-druid":          {"--enable-etcd-spec-auto-reconcile", "--etcd-components-webhook-exempt-service-accounts", "--enable-member-lease-renewal"},
	"test/cmd/site":       {"--dir", "--druid-stretch", "--namespace"},
	"etcdbrctl":           {"--use-etcd-wrapper", "--store-prefix", "--storage-provider", "--etcd-connection-timeout-leader-election", "--k8s-heartbeat-duration", "--reelection-period", "--service-endpoints", "--defragmentation-schedule", "--etcd-defrag-timeout", "--freespace-threshold"},
}

// commands are every druid-stretch and druid-stretch-dev command by its
// path after the binary ("migrate", "sidecar", "demo", ...; "" the root).
func commands() map[string]*cobra.Command {
	out := map[string]*cobra.Command{}
	var walk func(prefix string, c *cobra.Command)
	walk = func(prefix string, c *cobra.Command) {
		out[prefix] = c
		for _, sub := range c.Commands() {
			walk(strings.TrimSpace(prefix+" "+sub.Name()), sub)
		}
	}
	walk("", cli.NewRootCommand())
	dev := devcli.NewRootCommand()
	for _, sub := range dev.Commands() {
		walk(sub.Name(), sub)
	}
	return out
}

// flagsOf are the long flags a command takes, its parents' persistent ones
// and --help included.
func flagsOf(c *cobra.Command) map[string]*pflag.Flag {
	out := map[string]*pflag.Flag{"help": {Name: "help"}}
	c.InitDefaultHelpFlag()
	c.Flags().VisitAll(func(f *pflag.Flag) { out[f.Name] = f })
	c.InheritedFlags().VisitAll(func(f *pflag.Flag) { out[f.Name] = f })
	return out
}

// commandLineRE finds a druid-stretch command line in a code block: the
// binary (any path) first on the line, the subcommand words, then the
// arguments.
var commandLineRE = regexp.MustCompile(`^\s*(?:sudo\s+)?(?:[\w./-]*/)?druid-stretch(-dev)?((?:\s+[a-z][a-z-]*)*)((?:\s.*)?)$`)

// TestDocsFlagsExist: a flag the docs give a druid-stretch command in a
// code block is one of that command's flags; any other flag they mention
// is a flag of some druid-stretch command or of a tool in foreignFlags.
func TestDocsFlagsExist(t *testing.T) {
	_, all := docs(t)
	cmds := commands()
	known := map[string]bool{"--version": true}
	for _, c := range cmds {
		for name := range flagsOf(c) {
			known["--"+name] = true
		}
	}
	// The etcd-wrapper stand-in (test/cmd/etcd-wrapper) takes the real
	// etcd-wrapper's flags.
	wrapper := pflag.NewFlagSet("etcd-wrapper", pflag.ContinueOnError)
	(&etcdwrapper.Config{}).AddFlags(wrapper)
	wrapper.VisitAll(func(f *pflag.Flag) { known["--"+f.Name] = true })
	for _, flags := range foreignFlags {
		for _, f := range flags {
			known[f] = true
		}
	}
	perCommand := 0
	for _, d := range all {
		for flag, line := range docscheck.Flags(d.Text) {
			if !known[flag] {
				t.Errorf("%s:%d mentions %s, which no druid-stretch command has (nor a tool in foreignFlags)", d.Path, line, flag)
			}
		}
		for _, b := range docscheck.Blocks(d.Text) {
			for _, line := range joinContinuations(b.Text) {
				m := commandLineRE.FindStringSubmatch(line)
				if m == nil {
					continue
				}
				path := strings.Join(strings.Fields(m[2]), " ")
				// The longest prefix of the words that is a command; the
				// rest are positional arguments.
				c, ok := cmds[path]
				for !ok && path != "" {
					path = strings.TrimSpace(path[:max(strings.LastIndex(path, " "), 0)])
					c, ok = cmds[path]
				}
				if !ok {
					continue
				}
				flags := flagsOf(c)
				for flag := range docscheck.Flags(m[3]) {
					perCommand++
					if _, ok := flags[strings.TrimPrefix(flag, "--")]; !ok {
						t.Errorf("%s:%d: `druid-stretch%s %s` has no flag %s", d.Path, b.Line, m[1], path, flag)
					}
				}
			}
		}
	}
	if perCommand < 20 {
		t.Fatalf("checked only %d flags on druid-stretch command lines: the patterns no longer find them", perCommand)
	}
}

// joinContinuations joins shell lines ending in a backslash.
func joinContinuations(text string) []string {
	var out []string
	cur := ""
	for line := range strings.Lines(text) {
		line = strings.TrimRight(line, "\n")
		if strings.HasSuffix(line, "\\") {
			cur += strings.TrimSuffix(line, "\\") + " "
			continue
		}
		out = append(out, cur+line)
		cur = ""
	}
	if cur != "" {
		out = append(out, cur)
	}
	return out
}
