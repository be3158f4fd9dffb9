package logtail

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
)

func TestLastKeepsTheLastMatchingLinesCut(t *testing.T) {
	g := NewWithT(t)
	path := filepath.Join(t.TempDir(), "x.log")
	long := "match " + strings.Repeat("x", 500)
	content := strings.Join([]string{"match 1", "other", "match 2", "match 3", long, "other"}, "\n") + "\n"
	g.Expect(os.WriteFile(path, []byte(content), 0o600)).To(Succeed())
	got, err := Last(path, 3, func(l string) bool { return strings.HasPrefix(l, "match") })
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got).To(Equal([]string{"match 2", "match 3", long[:maxLine] + "…"}))

	_, err = Last(filepath.Join(t.TempDir(), "missing.log"), 3, func(string) bool { return true })
	g.Expect(err).To(HaveOccurred())
}
