// Package testbin finds the real binaries that hack/test-binaries.sh builds
// (etcd, the Kubernetes control plane, etcd-druid, etcdbrctl and this
// project's own static binaries), and builds them on demand.
package testbin

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/druid-stretch/druid-stretch/internal/testing/druidcrds"
	"github.com/druid-stretch/druid-stretch/internal/testing/extendedcrd"
)

// Need skips t under go test -short, the unit tier (make test-unit): a
// test that runs real parts (etcd, a kube-apiserver, druid; as binaries or
// in process) or builds a binary calls it first, so that the unit tier
// runs on a fresh clone without bin/ and in seconds.
func Need(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("runs real parts: not under -short (make test-unit); make test runs it")
	}
}

// Short reports whether the tests run under -short, for a TestMain, which
// must parse the flags before it asks and then starts no environment.
func Short() bool {
	if !flag.Parsed() {
		flag.Parse()
	}
	return testing.Short()
}

// hint tells a reader how to get a missing binary.
const hint = "run hack/test-binaries.sh (or make test-binaries) to build it"

// RepoRoot walks up from the working directory to the folder holding the
// project's go.mod and hack script.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "hack", "test-binaries.sh")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("cannot find the druid-stretch repository (hack/test-binaries.sh) above the working directory")
		}
		dir = parent
	}
}

// Dir is the folder holding the binaries under the names envtest expects:
// $KUBEBUILDER_ASSETS when set, else bin/envtest in the repository.
func Dir() (string, error) {
	if d := os.Getenv("KUBEBUILDER_ASSETS"); d != "" {
		return d, nil
	}
	root, err := RepoRoot()
	if err != nil {
		return "", fmt.Errorf("%w; or set KUBEBUILDER_ASSETS", err)
	}
	return filepath.Join(root, "bin", "envtest"), nil
}

// Bin is the folder hack/test-binaries.sh builds into: $DRUID_STRETCH_BIN
// when set, else bin in the repository.
func Bin() (string, error) {
	if d := os.Getenv("DRUID_STRETCH_BIN"); d != "" {
		return d, nil
	}
	root, err := RepoRoot()
	if err != nil {
		return "", fmt.Errorf("%w; or set DRUID_STRETCH_BIN", err)
	}
	return filepath.Join(root, "bin"), nil
}

// Etcd is the path of the etcd binary ($DRUID_STRETCH_ETCD overrides it).
func Etcd() (string, error) { return inEnvtest("etcd", "DRUID_STRETCH_ETCD") }

// KubeAPIServer is the path of the kube-apiserver binary.
func KubeAPIServer() (string, error) { return inEnvtest("kube-apiserver", "") }

// KubeControllerManager is the path of the kube-controller-manager binary.
func KubeControllerManager() (string, error) { return inEnvtest("kube-controller-manager", "") }

// KubeScheduler is the path of the kube-scheduler binary.
func KubeScheduler() (string, error) { return inEnvtest("kube-scheduler", "") }

// EtcdDruid is the path of the real etcd-druid manager.
func EtcdDruid() (string, error) { return inBin("etcd-druid") }

// Etcdbrctl is the path of the real etcd-backup-restore binary, static.
func Etcdbrctl() (string, error) { return inBin("etcdbrctl") }

// EtcdWrapper is the path of the static etcd-wrapper stand-in
// (test/cmd/etcd-wrapper).
func EtcdWrapper() (string, error) { return ownBinary("etcd-wrapper") }

// PodSandbox is the path of the static pod-sandbox (test/cmd/pod-sandbox).
func PodSandbox() (string, error) { return ownBinary("pod-sandbox") }

// DruidStretchStatic is the path of a static druid-stretch binary, for pods.
func DruidStretchStatic() (string, error) { return ownBinary("druid-stretch-static") }

// binaries lists every binary hack/test-binaries.sh provides.
var binaries = []func() (string, error){
	Etcd, KubeAPIServer, KubeControllerManager, KubeScheduler,
	EtcdDruid, Etcdbrctl, EtcdWrapper, PodSandbox, DruidStretchStatic,
}

// inEnvtest finds name in Dir, unless the environment variable env names it.
func inEnvtest(name, env string) (string, error) {
	if env != "" {
		if p := os.Getenv(env); p != "" {
			return executable(p, name)
		}
	}
	dir, err := Dir()
	if err != nil {
		return "", err
	}
	return executable(filepath.Join(dir, name), name)
}

// ownBinary finds name, a binary built from this repository, in Bin, and
// refuses it when a Go source file of the repository is newer: the sites'
// pods would run an older controller and sidecar than the code under test,
// and their figures would say nothing about it (hack/test-binaries.sh
// rebuilds these on every run; go test alone does not).
func ownBinary(name string) (string, error) {
	path, err := inBin(name)
	if err != nil {
		return "", err
	}
	st, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	newest, file := newestSource()
	if newest.After(st.ModTime()) {
		return "", fmt.Errorf("%s at %s (built %s) is older than %s (changed %s): %s", name, path,
			st.ModTime().Format(time.DateTime), file, newest.Format(time.DateTime), hintRebuild)
	}
	return path, nil
}

// hintRebuild tells a reader how to refresh a stale binary.
const hintRebuild = "run hack/test-binaries.sh (or make test-binaries) to rebuild it"

var newestOnce struct {
	sync.Once
	at   time.Time
	file string
}

// newestSource is newestSourceIn for the repository of the working
// directory, looked up once; zero outside a checkout.
func newestSource() (time.Time, string) {
	newestOnce.Do(func() {
		if root, err := RepoRoot(); err == nil {
			newestOnce.at, newestOnce.file = newestSourceIn(root)
		}
	})
	return newestOnce.at, newestOnce.file
}

// newestSourceIn is the newest Go source (tests excluded), go.mod or go.sum
// under root outside .git, bin/ and hack/tools/ (the pinned tools'
// modules), and its path relative to root.
func newestSourceIn(root string) (at time.Time, file string) {
	_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // a file removed meanwhile
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			switch rel {
			case ".git", "bin", filepath.Join("hack", "tools"):
				return filepath.SkipDir
			}
			return nil
		}
		name := d.Name()
		if (!strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go")) && name != "go.mod" && name != "go.sum" {
			return nil
		}
		if info, err := d.Info(); err == nil && info.ModTime().After(at) {
			at, file = info.ModTime(), rel
		}
		return nil
	})
	return at, file
}

// inBin finds name in Bin.
func inBin(name string) (string, error) {
	dir, err := Bin()
	if err != nil {
		return "", err
	}
	return executable(filepath.Join(dir, name), name)
}

func executable(path, name string) (string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("%s binary not found at %s: %s", name, path, hint)
	}
	if st.IsDir() || st.Mode()&0o111 == 0 {
		return "", fmt.Errorf("%s at %s is not an executable file: %s", name, path, hint)
	}
	return path, nil
}

// Ensure builds the binaries when any is missing, or when one built from
// this repository (etcd-wrapper, pod-sandbox, druid-stretch-static) is
// older than its sources, streaming the hack script's progress to out. On a
// fresh machine that takes many minutes; once the tools are built, seconds.
func Ensure(ctx context.Context, out io.Writer) error {
	if missing() == nil {
		return nil
	}
	root, err := RepoRoot()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, "hack", "test-binaries.sh"))
	cmd.Dir = root
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("building the test binaries with hack/test-binaries.sh: %w", err)
	}
	return missing()
}

// missing names every binary that cannot be found, or is nil.
func missing() error {
	var errs []error
	for _, find := range binaries {
		if _, err := find(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// EnvironmentOption changes what Environment installs.
type EnvironmentOption func(*environmentOptions)

type environmentOptions struct{ extendedEtcdCRD bool }

// WithExtendedEtcdCRD installs the extended Etcd CRD of earlier releases
// (internal/testing/extendedcrd) in place of druid's own, for the tests of Etcds that
// carry druid-stretch's fields inline.
func WithExtendedEtcdCRD() EnvironmentOption {
	return func(o *environmentOptions) { o.extendedEtcdCRD = true }
}

// Environment is an envtest environment on the real binaries with the CRDs
// of a seed: etcd-druid's own, exactly as its API module ships them, and
// druid-stretch's chart's (the EtcdMembership). Where setpriv exists,
// kube-apiserver and its etcd are started through it with a parent death
// signal, so that they die with the test binary even when it ends without
// its cleanup (SIGKILL, the panic of a test timeout): envtest starts them
// as ordinary children, which would outlive it.
func Environment(opts ...EnvironmentOption) (*envtest.Environment, error) {
	var o environmentOptions
	for _, f := range opts {
		f(&o)
	}
	assets, err := Dir()
	if err != nil {
		return nil, err
	}
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	crds, err := druidcrds.All()
	if err != nil {
		return nil, err
	}
	if o.extendedEtcdCRD {
		ext, err := extendedcrd.CRD()
		if err != nil {
			return nil, err
		}
		crds = slices.DeleteFunc(crds, func(c *apiextensionsv1.CustomResourceDefinition) bool { return c.Name == ext.Name })
		crds = append(crds, ext)
	}
	env := &envtest.Environment{
		// envtest's default of 20 s is too short for a kube-apiserver
		// started while the real-site tests load both cores.
		ControlPlaneStartTimeout: 2 * time.Minute,
		BinaryAssetsDirectory:    assets,
		CRDs:                     crds,
		CRDDirectoryPaths:        []string{filepath.Join(root, "charts", "druid-stretch", "crds")},
		ErrorIfCRDPathMissing:    true,
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		return env, nil
	}
	wrapped := filepath.Join(root, "bin", "pdeathsig")
	apiserver, err := wrap(wrapped, setpriv, filepath.Join(assets, "kube-apiserver"))
	if err != nil {
		return nil, err
	}
	etcd, err := wrap(wrapped, setpriv, filepath.Join(assets, "etcd"))
	if err != nil {
		return nil, err
	}
	env.ControlPlane.APIServer = &envtest.APIServer{Path: apiserver}
	env.ControlPlane.Etcd = &envtest.Etcd{Path: etcd}
	return env, nil
}

// wrap writes a script into dir that execs binary through setpriv with a
// parent death signal. Several test binaries may write it at once, so it is
// written aside and renamed into place.
func wrap(dir, setpriv, binary string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	path := filepath.Join(dir, filepath.Base(binary))
	script := fmt.Sprintf("#!/bin/sh\nexec %q --pdeathsig KILL %q \"$@\"\n", setpriv, binary)
	tmp, err := os.CreateTemp(dir, filepath.Base(binary)+".*")
	if err != nil {
		return "", err
	}
	_, werr := tmp.WriteString(script)
	cerr := tmp.Close()
	if err := errors.Join(werr, cerr, os.Chmod(tmp.Name(), 0o755)); err != nil {
		_ = os.Remove(tmp.Name())
		return "", fmt.Errorf("writing the %s wrapper: %w", filepath.Base(binary), err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		_ = os.Remove(tmp.Name())
		return "", err
	}
	return path, nil
}
