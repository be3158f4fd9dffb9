package image

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"
	. "github.com/onsi/gomega"
)

// The test programs are compiled once, into binDir, for all tests.
var (
	binDir        string
	buildOnce     sync.Once
	staticBin     string
	dynamicBin    string
	buildBinError error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "druid-stretch-image-test-")
	if err != nil {
		panic(err)
	}
	binDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// testBinaries compiles a tiny Go program twice: static (CGO_ENABLED=0, as
// make image builds druid-stretch) and as a PIE, which Go links against
// the system's dynamic loader, i.e. a binary that cannot start FROM scratch.
func testBinaries(t *testing.T) (static, dynamic string) {
	t.Helper()
	buildOnce.Do(func() {
		src := filepath.Join(binDir, "src")
		if buildBinError = os.MkdirAll(src, 0o755); buildBinError != nil {
			return
		}
		files := map[string]string{
			"go.mod":  "module tiny\n\ngo 1.26\n",
			"main.go": "package main\n\nimport \"os\"\n\nfunc main() { os.Stdout.WriteString(\"hello from the image\\n\") }\n",
		}
		for f, text := range files {
			if buildBinError = os.WriteFile(filepath.Join(src, f), []byte(text), 0o644); buildBinError != nil {
				return
			}
		}
		goTool, err := exec.LookPath("go")
		if err != nil {
			buildBinError = err
			return
		}
		staticBin, dynamicBin = filepath.Join(binDir, "static"), filepath.Join(binDir, "pie")
		for _, args := range [][]string{
			{"build", "-trimpath", "-o", staticBin, "."},
			{"build", "-trimpath", "-buildmode=pie", "-o", dynamicBin, "."},
		} {
			cmd := exec.Command(goTool, args...)
			cmd.Dir = src
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH, "GOFLAGS=-buildvcs=false")
			if out, err := cmd.CombinedOutput(); err != nil {
				buildBinError = fmt.Errorf("go %v: %w: %s", args, err, out)
				return
			}
		}
	})
	if buildBinError != nil {
		t.Fatalf("compiling the test programs: %v", buildBinError)
	}
	return staticBin, dynamicBin
}

// layerFile is one entry of the image's layer.
type layerFile struct {
	hdr  tar.Header
	data []byte
}

// TestWriteImage writes an image, reads the tarball back the way crane and
// kind's importer do, and checks config, platform, tag and every file.
func TestWriteImage(t *testing.T) {
	g := NewWithT(t)
	static, _ := testBinaries(t)
	binary, err := os.ReadFile(static)
	g.Expect(err).NotTo(HaveOccurred())
	created, err := SourceDateEpoch("1700000000")
	g.Expect(err).NotTo(HaveOccurred())
	dir := t.TempDir()
	out := filepath.Join(dir, "druid-stretch-image.tar")

	res, err := Write(Options{
		Binary: static, Output: out, Created: created,
		Tag: "registry.example.com/druid-stretch:v1.2.3", Version: "v1.2.3", Revision: "0123abcd",
	})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Tag).To(Equal("registry.example.com/druid-stretch:v1.2.3"))
	g.Expect(res.Platform).To(Equal("linux/" + runtime.GOARCH))

	fi, err := os.Stat(out)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(fi.Size()).To(Equal(res.Size))
	g.Expect(fi.Mode().Perm()).To(Equal(fs.FileMode(0o644)))
	entries, err := os.ReadDir(dir)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(entries).To(HaveLen(1), "no temporary file is left beside the tarball")

	tag, err := name.NewTag(res.Tag)
	g.Expect(err).NotTo(HaveOccurred())
	img, err := tarball.ImageFromPath(out, &tag)
	g.Expect(err).NotTo(HaveOccurred())
	// Every digest, diff ID and size in manifest and config matches the
	// blobs, as a registry checks on push.
	g.Expect(validate.Image(img)).To(Succeed())
	digest, err := img.Digest()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(digest).To(Equal(res.Digest))
	id, err := img.ConfigName()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(id).To(Equal(res.ImageID))

	cf, err := img.ConfigFile()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(cf.OS).To(Equal("linux"))
	g.Expect(cf.Architecture).To(Equal(runtime.GOARCH))
	g.Expect(cf.Created.Time.Equal(created)).To(BeTrue(), "created %s", cf.Created.Time)
	g.Expect(cf.Config.Entrypoint).To(Equal([]string{"/druid-stretch"}))
	g.Expect(cf.Config.Cmd).To(BeEmpty(), "the chart passes the subcommand as args")
	g.Expect(cf.Config.User).To(Equal("65532:65532"))
	g.Expect(cf.Config.Labels).To(Equal(map[string]string{
		"org.opencontainers.image.source":   "https://github.com/druid-stretch/druid-stretch",
		"org.opencontainers.image.title":    "druid-stretch",
		"org.opencontainers.image.version":  "v1.2.3",
		"org.opencontainers.image.revision": "0123abcd",
	}))
	g.Expect(cf.History).To(HaveLen(1))
	g.Expect(cf.History[0].Created.Time.Equal(created)).To(BeTrue())

	layers, err := img.Layers()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(layers).To(HaveLen(1))
	mt, err := layers[0].MediaType()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(mt).To(Equal(types.DockerLayer))
	rc, err := layers[0].Uncompressed()
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = rc.Close() }()
	files := map[string]layerFile{}
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		g.Expect(err).NotTo(HaveOccurred())
		data, err := io.ReadAll(tr)
		g.Expect(err).NotTo(HaveOccurred())
		files[hdr.Name] = layerFile{hdr: *hdr, data: data}
	}
	g.Expect(files).To(HaveLen(2), "the layer holds the binary and /tmp only")

	bin := files["druid-stretch"]
	g.Expect(bin.hdr.Typeflag).To(Equal(byte(tar.TypeReg)))
	g.Expect(bin.hdr.FileInfo().Mode()).To(Equal(fs.FileMode(0o755)))
	g.Expect(bin.hdr.Uid).To(Equal(0), "root owns the binary, so the non-root process cannot replace it")
	g.Expect(bin.hdr.ModTime.Equal(created)).To(BeTrue())
	g.Expect(bytes.Equal(bin.data, binary)).To(BeTrue(), "the layer holds the binary's exact bytes")

	tmp := files["tmp/"]
	g.Expect(tmp.hdr.Typeflag).To(Equal(byte(tar.TypeDir)))
	g.Expect(tmp.hdr.FileInfo().Mode()).To(Equal(fs.ModeDir | fs.ModeSticky | 0o777))
	g.Expect(tmp.hdr.ModTime.Equal(created)).To(BeTrue())

	// The file from the layer is the program: it runs and prints.
	if runtime.GOOS == "linux" {
		extracted := filepath.Join(t.TempDir(), "druid-stretch")
		g.Expect(os.WriteFile(extracted, bin.data, bin.hdr.FileInfo().Mode())).To(Succeed())
		stdout, err := exec.Command(extracted).Output()
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(string(stdout)).To(Equal("hello from the image\n"))
	}
}

// TestWriteIsReproducible builds the same inputs twice (byte-identical
// tarballs, one digest) and shows that each input moves the digest, so the
// equality is not that of a constant.
func TestWriteIsReproducible(t *testing.T) {
	g := NewWithT(t)
	static, _ := testBinaries(t)
	dir := t.TempDir()
	// A copy with one byte appended is still a valid ELF file that differs.
	changed := filepath.Join(dir, "changed")
	data, err := os.ReadFile(static)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(os.WriteFile(changed, append(data, 0), 0o755)).To(Succeed())

	base := Options{Binary: static, Tag: "druid-stretch:v1", Version: "v1"}
	write := func(o Options, file string) ([]byte, Result) {
		o.Output = filepath.Join(dir, file)
		res, err := Write(o)
		g.Expect(err).NotTo(HaveOccurred())
		b, err := os.ReadFile(o.Output)
		g.Expect(err).NotTo(HaveOccurred())
		return b, res
	}
	first, firstRes := write(base, "first.tar")
	second, secondRes := write(base, "second.tar")
	g.Expect(secondRes.Digest).To(Equal(firstRes.Digest))
	g.Expect(secondRes.ImageID).To(Equal(firstRes.ImageID))
	g.Expect(bytes.Equal(first, second)).To(BeTrue(), "two builds give byte-identical tarballs")
	// Without SOURCE_DATE_EPOCH the times are the epoch, not the build's.
	img, err := tarball.ImageFromPath(filepath.Join(dir, "first.tar"), nil)
	g.Expect(err).NotTo(HaveOccurred())
	cf, err := img.ConfigFile()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(cf.Created.Time.Equal(time.Unix(0, 0))).To(BeTrue(), "created %s", cf.Created.Time)

	for _, tc := range []struct {
		name   string
		change func(*Options)
	}{
		{"other binary", func(o *Options) { o.Binary = changed }},
		{"other version", func(o *Options) { o.Version = "v2" }},
		{"other revision", func(o *Options) { o.Revision = "fedc" }},
		{"other created time", func(o *Options) { o.Created = time.Unix(1700000000, 0) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := base
			tc.change(&o)
			_, res := write(o, tc.name+".tar")
			NewWithT(t).Expect(res.Digest).NotTo(Equal(firstRes.Digest))
		})
	}
}

// TestWriteRefusesBadInput checks that each bad input is named in the error
// and that the output directory, with an older tarball in it, is exactly as
// before.
func TestWriteRefusesBadInput(t *testing.T) {
	static, dynamic := testBinaries(t)
	for _, tc := range []struct {
		name string
		// opts gets the test's directory and the output path already in it.
		opts func(dir, out string) Options
		// culprit picks the input the error must name.
		culprit func(Options) string
		want    string
	}{
		{
			name: "missing binary",
			opts: func(dir, out string) Options {
				return Options{Binary: filepath.Join(dir, "nope"), Output: out, Tag: "x:y"}
			},
			culprit: binaryPath,
			want:    "no such file",
		},
		{
			name:    "binary is a directory",
			opts:    func(dir, out string) Options { return Options{Binary: dir, Output: out, Tag: "x:y"} },
			culprit: binaryPath,
			want:    "is a directory",
		},
		{
			name: "binary is a script",
			opts: func(dir, out string) Options {
				script := filepath.Join(dir, "entry.sh")
				if err := os.WriteFile(script, []byte("#!/bin/sh\necho hi\n"), 0o755); err != nil {
					panic(err)
				}
				return Options{Binary: script, Output: out, Tag: "x:y"}
			},
			culprit: binaryPath,
			want:    "not a Linux ELF executable",
		},
		{
			name:    "dynamically linked binary",
			opts:    func(dir, out string) Options { return Options{Binary: dynamic, Output: out, Tag: "x:y"} },
			culprit: binaryPath,
			want:    "dynamically linked (interpreter /",
		},
		{
			name: "output directory missing",
			opts: func(dir, out string) Options {
				return Options{Binary: static, Output: filepath.Join(dir, "missing", "image.tar"), Tag: "x:y"}
			},
			culprit: outputPath,
			want:    "no such file",
		},
		{
			name:    "output is a directory",
			opts:    func(dir, out string) Options { return Options{Binary: static, Output: dir, Tag: "x:y"} },
			culprit: outputPath,
			want:    "is a directory",
		},
		{
			name: "bad tag",
			opts: func(dir, out string) Options {
				return Options{Binary: static, Output: out, Tag: "druid-stretch:not a tag"}
			},
			culprit: func(o Options) string { return o.Tag },
			want:    "tag",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			dir := t.TempDir()
			out := filepath.Join(dir, "image.tar")
			g.Expect(os.WriteFile(out, []byte("an older tarball"), 0o644)).To(Succeed())
			o := tc.opts(dir, out)
			before := dirContents(t, dir)

			_, err := Write(o)
			g.Expect(err).To(HaveOccurred())
			g.Expect(err.Error()).To(ContainSubstring(tc.culprit(o)))
			g.Expect(err.Error()).To(ContainSubstring(tc.want))
			g.Expect(dirContents(t, dir)).To(Equal(before), "nothing written, the older tarball kept")
		})
	}
}

func binaryPath(o Options) string { return o.Binary }
func outputPath(o Options) string { return o.Output }

// dirContents maps every file below dir to its content.
func dirContents(t *testing.T, dir string) map[string]string {
	t.Helper()
	files := map[string]string{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		files[path] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func TestSourceDateEpoch(t *testing.T) {
	for _, tc := range []struct {
		value   string
		want    time.Time
		wantErr bool
	}{
		{value: "", want: time.Unix(0, 0)},
		{value: "1700000000", want: time.Unix(1700000000, 0)},
		{value: "-1", wantErr: true},
		{value: "yesterday", wantErr: true},
	} {
		t.Run(tc.value, func(t *testing.T) {
			g := NewWithT(t)
			got, err := SourceDateEpoch(tc.value)
			if tc.wantErr {
				g.Expect(err).To(MatchError(ContainSubstring("SOURCE_DATE_EPOCH=%q", tc.value)))
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(got.Equal(tc.want)).To(BeTrue(), "got %s", got)
		})
	}
}
