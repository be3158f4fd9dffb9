package devcli

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	. "github.com/onsi/gomega"
)

// TestImageCommand runs `druid-stretch-dev image` on a real static binary: the
// flags and SOURCE_DATE_EPOCH reach the tarball, whose tag defaults to
// druid-stretch:VERSION. A bad SOURCE_DATE_EPOCH or a missing --output
// writes nothing.
func TestImageCommand(t *testing.T) {
	g := NewWithT(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	g.Expect(os.Mkdir(src, 0o755)).To(Succeed())
	g.Expect(os.WriteFile(filepath.Join(src, "go.mod"), []byte("module tiny\n\ngo 1.26\n"), 0o644)).To(Succeed())
	g.Expect(os.WriteFile(filepath.Join(src, "main.go"), []byte("package main\n\nfunc main() {}\n"), 0o644)).To(Succeed())
	binary := filepath.Join(dir, "druid-stretch-linux")
	build := exec.Command("go", "build", "-trimpath", "-o", binary, ".")
	build.Dir = src
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH, "GOFLAGS=-buildvcs=false")
	out, err := build.CombinedOutput()
	g.Expect(err).NotTo(HaveOccurred(), "%s", out)

	run := func(args ...string) (string, error) {
		root := NewRootCommand()
		var stdout bytes.Buffer
		root.SetOut(&stdout)
		root.SetErr(&stdout)
		root.SetArgs(append([]string{"image"}, args...))
		err := root.Execute()
		return stdout.String(), err
	}
	tarPath := filepath.Join(dir, "image.tar")

	t.Setenv("SOURCE_DATE_EPOCH", "not-a-number")
	_, err = run("--binary", binary, "--output", tarPath)
	g.Expect(err).To(MatchError(ContainSubstring(`SOURCE_DATE_EPOCH="not-a-number"`)))
	_, err = run("--binary", binary)
	g.Expect(err).To(MatchError(ContainSubstring(`"output" not set`)))
	g.Expect(tarPath).NotTo(BeAnExistingFile())

	t.Setenv("SOURCE_DATE_EPOCH", "1700000000")
	stdout, err := run("--binary", binary, "-o", tarPath, "--version", "v9.8.7")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(stdout).To(HavePrefix("wrote " + tarPath + ": druid-stretch:v9.8.7 linux/" + runtime.GOARCH + ", digest sha256:"))

	tag, err := name.NewTag("druid-stretch:v9.8.7")
	g.Expect(err).NotTo(HaveOccurred())
	img, err := tarball.ImageFromPath(tarPath, &tag)
	g.Expect(err).NotTo(HaveOccurred())
	digest, err := img.Digest()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(stdout).To(ContainSubstring("digest " + digest.String()))
	cf, err := img.ConfigFile()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(cf.Created.Time.Equal(time.Unix(1700000000, 0))).To(BeTrue(), "created %s", cf.Created.Time)
	g.Expect(cf.Config.Labels).To(HaveKeyWithValue("org.opencontainers.image.version", "v9.8.7"))
}
