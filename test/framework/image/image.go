// Package image builds the druid-stretch container image without a Docker
// engine: a FROM-scratch image whose only layer holds the static
// druid-stretch binary, written as a `docker save` style tarball that
// `docker load`, `kind load image-archive` and `crane push` accept.
//
// The image is reproducible: every timestamp is fixed (the Unix epoch, or
// SOURCE_DATE_EPOCH), so the same binary and version always give the same
// digest.
package image

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

const (
	// Entrypoint is where the binary sits in the image; the chart's pods
	// pass only the subcommand and its flags as args.
	Entrypoint = "/druid-stretch"
	// User is the chart's runAsUser/runAsGroup (the distroless "nonroot"
	// ids), so the image also runs as non-root outside the chart.
	User = "65532:65532"
	// Source is the org.opencontainers.image.source label.
	Source = "https://github.com/druid-stretch/druid-stretch"
	// Title is the org.opencontainers.image.title label.
	Title = "druid-stretch"
)

// Options say what goes into the image and where it is written.
type Options struct {
	// Binary is the static Linux druid-stretch executable to ship.
	Binary string
	// Output is the tarball's path; its directory must exist.
	Output string
	// Tag is the reference the tarball is loaded as, e.g.
	// registry.example.com/druid-stretch:v0.1.0.
	Tag string
	// Version is the org.opencontainers.image.version label; empty leaves
	// the label out.
	Version string
	// Revision is the org.opencontainers.image.revision label, the commit
	// the binary was built from; empty leaves the label out.
	Revision string
	// Created is the time stamped on the image config, its history and
	// every file of the layer; the zero value means the Unix epoch.
	Created time.Time
}

// Result describes a written image.
type Result struct {
	// Tag is the reference in the tarball's manifest.
	Tag string
	// Digest is the manifest digest, the one a registry reports after
	// `crane push`.
	Digest v1.Hash
	// ImageID is the config digest, what `docker images` shows as IMAGE ID.
	ImageID v1.Hash
	// Platform is os/arch, taken from the binary.
	Platform string
	// Size is the tarball's size in bytes.
	Size int64
}

// SourceDateEpoch parses the value of the SOURCE_DATE_EPOCH variable
// (reproducible-builds.org): seconds since the Unix epoch. Empty means the
// epoch itself, so builds are reproducible without it.
func SourceDateEpoch(value string) (time.Time, error) {
	if value == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	sec, err := strconv.ParseInt(value, 10, 64)
	if err != nil || sec < 0 {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH=%q: want a non-negative number of seconds since the Unix epoch", value)
	}
	return time.Unix(sec, 0).UTC(), nil
}

// Build returns the image for o.Binary; o.Output and o.Tag are not used.
func Build(o Options) (v1.Image, error) {
	data, err := os.ReadFile(o.Binary)
	if err != nil {
		return nil, fmt.Errorf("reading the binary: %w", err)
	}
	arch, err := staticLinuxArch(o.Binary, data)
	if err != nil {
		return nil, err
	}
	created := o.Created
	if created.IsZero() {
		created = time.Unix(0, 0)
	}
	created = created.UTC().Truncate(time.Second)

	layerTar, err := rootFS(data, created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithCompressionLevel(gzip.DefaultCompression), tarball.WithCompressedCaching)
	if err != nil {
		return nil, fmt.Errorf("compressing the layer: %w", err)
	}
	img, err := mutate.Append(empty.Image, mutate.Addendum{
		Layer:   layer,
		History: v1.History{Created: v1.Time{Time: created}, CreatedBy: "druid-stretch-dev image: COPY druid-stretch " + Entrypoint},
	})
	if err != nil {
		return nil, fmt.Errorf("adding the layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("reading the image config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	cf.Created = v1.Time{Time: created}
	labels := map[string]string{
		"org.opencontainers.image.source": Source,
		"org.opencontainers.image.title":  Title,
	}
	if o.Version != "" {
		labels["org.opencontainers.image.version"] = o.Version
	}
	if o.Revision != "" {
		labels["org.opencontainers.image.revision"] = o.Revision
	}
	cf.Config = v1.Config{
		Entrypoint: []string{Entrypoint},
		User:       User,
		WorkingDir: "/",
		Labels:     labels,
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("setting the image config: %w", err)
	}
	return img, nil
}

// rootFS is the layer's uncompressed tar: the binary, root-owned so the
// non-root process cannot replace it, and /tmp, where controller-runtime
// keeps its webhook certificates by default (the chart mounts them there;
// with a read-only root file system the mount point should exist).
func rootFS(binary []byte, mtime time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	entries := []struct {
		hdr  tar.Header
		data []byte
	}{
		{hdr: tar.Header{Typeflag: tar.TypeDir, Name: "tmp/", Mode: 0o1777}},
		{hdr: tar.Header{Typeflag: tar.TypeReg, Name: Entrypoint[1:], Mode: 0o755, Size: int64(len(binary))}, data: binary},
	}
	for _, e := range entries {
		// USTAR holds no access or change times, so nothing but these
		// fields reaches the archive.
		e.hdr.ModTime, e.hdr.Format = mtime, tar.FormatUSTAR
		if err := tw.WriteHeader(&e.hdr); err != nil {
			return nil, fmt.Errorf("writing %s into the layer: %w", e.hdr.Name, err)
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, fmt.Errorf("writing %s into the layer: %w", e.hdr.Name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("closing the layer: %w", err)
	}
	return buf.Bytes(), nil
}

// Write builds the image and writes it as a tarball to o.Output. The
// tarball appears whole or not at all: it is written next to o.Output under
// a temporary name and renamed at the end, so a failed run leaves no
// partial file and keeps an older tarball at o.Output as it was.
func Write(o Options) (Result, error) {
	tag, err := name.NewTag(o.Tag)
	if err != nil {
		return Result{}, fmt.Errorf("tag %q: %w", o.Tag, err)
	}
	if o.Output == "" {
		return Result{}, fmt.Errorf("no output path given")
	}
	dir := filepath.Dir(o.Output)
	if fi, err := os.Stat(dir); err != nil {
		return Result{}, fmt.Errorf("output %s: %w", o.Output, err)
	} else if !fi.IsDir() {
		return Result{}, fmt.Errorf("output %s: %s is not a directory", o.Output, dir)
	}
	if fi, err := os.Stat(o.Output); err == nil && fi.IsDir() {
		return Result{}, fmt.Errorf("output %s is a directory, want a file name", o.Output)
	}
	img, err := Build(o)
	if err != nil {
		return Result{}, err
	}
	res := Result{Tag: tag.String()}
	if res.Digest, err = img.Digest(); err != nil {
		return Result{}, fmt.Errorf("image digest: %w", err)
	}
	if res.ImageID, err = img.ConfigName(); err != nil {
		return Result{}, fmt.Errorf("image config digest: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return Result{}, fmt.Errorf("reading the image config: %w", err)
	}
	res.Platform = cf.OS + "/" + cf.Architecture
	if res.Size, err = writeFileAtomically(o.Output, func(w io.Writer) error {
		return tarball.Write(tag, img, w)
	}); err != nil {
		return Result{}, err
	}
	return res, nil
}

// writeFileAtomically writes path through a temporary file in the same
// directory (so the rename cannot cross file systems) and returns the
// size written.
func writeFileAtomically(path string, write func(io.Writer) error) (size int64, err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return 0, fmt.Errorf("output %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	bw := bufio.NewWriterSize(tmp, 1<<20)
	if err := write(bw); err != nil {
		return 0, fmt.Errorf("writing %s: %w", path, err)
	}
	if err := bw.Flush(); err != nil {
		return 0, fmt.Errorf("writing %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		return 0, fmt.Errorf("writing %s: %w", path, err)
	}
	fi, err := tmp.Stat()
	if err != nil {
		return 0, fmt.Errorf("writing %s: %w", path, err)
	}
	// CreateTemp makes the file 0600; the tarball is not secret.
	if err := tmp.Chmod(0o644); err != nil {
		return 0, fmt.Errorf("writing %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return 0, fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return 0, fmt.Errorf("writing %s: %w", path, err)
	}
	return fi.Size(), nil
}
