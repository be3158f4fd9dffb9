package testbin

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

// The freshness check of the project's own binaries looks at the sources
// that go into them: a newer test file, a file under bin/ or a pinned
// tool's module does not make them stale.
func TestNewestSourceIn(t *testing.T) {
	g := NewWithT(t)
	root := t.TempDir()
	base := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	for i, f := range []struct {
		path string
		age  time.Duration
	}{
		{"go.mod", 3 * time.Hour},
		{"sidecar/members.go", time.Hour},
		{"sidecar/members_test.go", 0},
		{"bin/generated.go", 0},
		{"hack/tools/tools.go", 0},
		{"README.md", 0},
	} {
		p := filepath.Join(root, f.path)
		g.Expect(os.MkdirAll(filepath.Dir(p), 0o755)).To(Succeed())
		g.Expect(os.WriteFile(p, []byte("package x\n"), 0o644)).To(Succeed(), "file %d", i)
		at := base.Add(-f.age)
		g.Expect(os.Chtimes(p, at, at)).To(Succeed())
	}
	at, file := newestSourceIn(root)
	g.Expect(file).To(Equal(filepath.Join("sidecar", "members.go")))
	g.Expect(at).To(BeTemporally("==", base.Add(-time.Hour)))
}
