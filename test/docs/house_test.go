package docs

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
)

// readmeMaxLines keeps README.md one screenful per topic: what it is, the
// two commands, the results, where the docs are. The rest lives in docs/.
const readmeMaxLines = 250

func TestReadmeIsShort(t *testing.T) {
	root, err := testbin.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	lines := strings.Count(string(b), "\n")
	if lines > readmeMaxLines {
		t.Errorf("README.md has %d lines, at most %d: move the detail into docs/ and link it", lines, readmeMaxLines)
	}
}

// TestGoCommentsNameOnlyDocsInTheRepo: a Markdown file a Go comment names
// (docs/usage.md, known-limits.md) is one of this repository's, and so is
// a file it names by its path from the repository's root
// (sidecar/handoff.go, hack/test-binaries.sh), so the code's reasons point
// at something a reader can open.
func TestGoCommentsNameOnlyDocsInTheRepo(t *testing.T) {
	g := NewWithT(t)
	root, err := testbin.RepoRoot()
	g.Expect(err).NotTo(HaveOccurred())
	ls := exec.CommandContext(t.Context(), "git", "ls-files", "--cached", "--others", "--exclude-standard")
	ls.Dir = root
	out, err := ls.Output()
	g.Expect(err).NotTo(HaveOccurred())
	have := map[string]bool{}
	var goFiles []string
	files := map[string]bool{}
	for _, f := range strings.Fields(string(out)) {
		files[f] = true
		for d := filepath.Dir(f); d != "."; d = filepath.Dir(d) {
			files[d] = true
		}
		if strings.HasPrefix(f, "hack/tools/") {
			continue
		}
		switch {
		case strings.HasSuffix(f, ".md"):
			have[f], have[filepath.Base(f)] = true, true
		case strings.HasSuffix(f, ".go"):
			goFiles = append(goFiles, f)
		}
	}
	named, paths := 0, 0
	for _, f := range goFiles {
		file, err := os.Open(filepath.Join(root, f))
		g.Expect(err).NotTo(HaveOccurred())
		sc := bufio.NewScanner(file)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for n := 1; sc.Scan(); n++ {
			_, comment, ok := strings.Cut(sc.Text(), "//")
			if !ok {
				continue
			}
			for _, m := range mdNameRE.FindAllStringSubmatch(comment, -1) {
				named++
				name := strings.TrimPrefix(m[1], "./")
				if !have[name] && !have[filepath.Base(name)] {
					t.Errorf("%s:%d names %s, which is not in the repository", f, n, name)
				}
			}
			for _, m := range repoPathRE.FindAllStringSubmatch(comment, -1) {
				paths++
				if name := strings.TrimSuffix(m[1], "/"); !files[name] {
					t.Errorf("%s:%d names %s, which is not in the repository", f, n, name)
				}
			}
		}
		g.Expect(sc.Err()).NotTo(HaveOccurred())
		_ = file.Close()
	}
	if named < 10 {
		t.Fatalf("found only %d names of Markdown files in Go comments: the pattern no longer finds them", named)
	}
	if paths < 10 {
		t.Fatalf("found only %d paths of the repository's files in Go comments: the pattern no longer finds them", paths)
	}
}

// repoPathRE is a file of the repository named by its path from the root
// in prose: a top folder of the repository, then at least one more part,
// the last with an extension (test/site/rebalance_test.go,
// hack/test-binaries.sh). A Go import path (github.com/...) does not start
// at a top folder, and a package named by its folder has no extension.
var repoPathRE = regexp.MustCompile(`(?:^|[\s(\x60"'])((?:api|charts|cmd|controllers|docs|hack|internal|sidecar|test)/[\w.-]+(?:/[\w.-]+)*\.(?:go|md|sh|yaml|yml|json|tpl|txt))\b`)

// TestMakefileNamesPackagesThatExist: every package folder the Makefile
// builds or tests (./test/cmd/druid-stretch-dev, ./test/site, ...) is in
// the repository, so a move of a folder cannot leave a target that fails
// only when someone runs it.
func TestMakefileNamesPackagesThatExist(t *testing.T) {
	g := NewWithT(t)
	root, err := testbin.RepoRoot()
	g.Expect(err).NotTo(HaveOccurred())
	b, err := os.ReadFile(filepath.Join(root, "Makefile"))
	g.Expect(err).NotTo(HaveOccurred())
	pathRE := regexp.MustCompile(`(?:^|\s)(\./[A-Za-z0-9_./-]*)`)
	checked := 0
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.Contains(line, "$(GO) build") && !strings.Contains(line, "$(GO) test") && !strings.Contains(line, "_PACKAGES :=") {
			continue
		}
		for _, m := range pathRE.FindAllStringSubmatch(line, -1) {
			dir := strings.TrimSuffix(m[1], "...")
			checked++
			if _, err := os.Stat(filepath.Join(root, dir)); err != nil {
				t.Errorf("the Makefile names %s, which is not in the repository: %s", m[1], strings.TrimSpace(line))
			}
		}
	}
	g.Expect(checked).To(BeNumerically(">=", 5), "the check finds the Makefile's package paths")
}
