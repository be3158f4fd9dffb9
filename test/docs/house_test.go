package docs

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/druid-stretch/druid-stretch/internal/testbin"
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
// (docs/usage.md, known-limits.md) is one of this repository's, so the
// code's reasons point at something a reader can open.
func TestGoCommentsNameOnlyDocsInTheRepo(t *testing.T) {
	g := NewWithT(t)
	root, err := testbin.RepoRoot()
	g.Expect(err).NotTo(HaveOccurred())
	ls := exec.CommandContext(t.Context(), "git", "ls-files", "--cached", "--others", "--exclude-standard", "*.go", "*.md")
	ls.Dir = root
	out, err := ls.Output()
	g.Expect(err).NotTo(HaveOccurred())
	have := map[string]bool{}
	var goFiles []string
	for _, f := range strings.Fields(string(out)) {
		if strings.HasPrefix(f, "hack/tools/") {
			continue
		}
		if strings.HasSuffix(f, ".md") {
			have[f], have[filepath.Base(f)] = true, true
		} else {
			goFiles = append(goFiles, f)
		}
	}
	named := 0
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
		}
		g.Expect(sc.Err()).NotTo(HaveOccurred())
		_ = file.Close()
	}
	if named < 10 {
		t.Fatalf("found only %d names of Markdown files in Go comments: the pattern no longer finds them", named)
	}
}
