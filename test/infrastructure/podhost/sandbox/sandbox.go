// Package sandbox starts one container's process the way a container runtime
// would, with host tools only: in the pod's network namespace, in a mount and
// UTS namespace of its own, chrooted into a root built from bind mounts (the
// image's binary, the host's system folders, the pod's volumes at their
// mountPaths, the pod's /etc/hosts and /etc/resolv.conf), under the user and
// groups the Pod's security context names.
//
// Go cannot run code between fork and exec, so the namespace work happens in
// a small helper binary (test/cmd/pod-sandbox) that reads a Spec, sets
// everything up in its own process and then execs the container's command:
// the container process replaces the helper, keeps its pid, and its mounts
// vanish with its mount namespace when it exits.
package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Mount is one bind mount into the container's root.
type Mount struct {
	// Source is a host path: a folder, or a file.
	Source string `json:"source"`
	// Target is the path inside the container.
	Target string `json:"target"`
	// ReadOnly remounts the bind read-only.
	ReadOnly bool `json:"readOnly,omitempty"`
}

// Spec is what the helper needs to become one container.
type Spec struct {
	// Netns is a path the helper opens and joins (setns CLONE_NEWNET):
	// the pod's network namespace.
	Netns string `json:"netns"`
	// Hostname is the pod's hostname, set in the container's UTS namespace.
	Hostname string `json:"hostname"`
	// Root is an empty folder that becomes the container's root (chroot).
	Root string `json:"root"`
	// Mounts are applied in order; later mounts may sit inside earlier ones.
	Mounts []Mount `json:"mounts"`
	// Args is the command: Args[0] is a path inside the container, or a
	// name looked up in the PATH of Env, as a container runtime does.
	Args []string `json:"args"`
	// Env is the complete environment, KEY=VALUE.
	Env []string `json:"env"`
	// WorkingDir inside the container; "/" when empty.
	WorkingDir string `json:"workingDir,omitempty"`
	// UID, GID and Groups are the credentials the command runs with.
	UID    uint32   `json:"uid"`
	GID    uint32   `json:"gid"`
	Groups []uint32 `json:"groups,omitempty"`
}

// Validate names the first thing wrong with s.
func (s *Spec) Validate() error {
	switch {
	case s.Netns == "":
		return errors.New("sandbox spec: netns is empty")
	case s.Root == "" || !filepath.IsAbs(s.Root):
		return fmt.Errorf("sandbox spec: root %q is not an absolute path", s.Root)
	case len(s.Args) == 0 || s.Args[0] == "":
		return errors.New("sandbox spec: the command is empty")
	}
	for _, m := range s.Mounts {
		if !filepath.IsAbs(m.Source) || !filepath.IsAbs(m.Target) {
			return fmt.Errorf("sandbox spec: mount %s -> %s: both paths must be absolute", m.Source, m.Target)
		}
	}
	return nil
}

// Command returns the command that runs spec through the helper binary. The
// spec is written beside root as a file, so that it can be read after the
// fact when a container does not start.
func Command(helper string, spec Spec) (*exec.Cmd, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	raw, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return nil, err
	}
	path := strings.TrimSuffix(spec.Root, "/") + ".spec.json"
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		return nil, err
	}
	cmd := exec.Command(helper, path)
	// Its own process group, so that a stop signal reaches the container
	// and whatever it started.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd, nil
}

// Main is the helper's body: it reads the spec at path and execs the
// container's command, or returns why it could not.
func Main(path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var spec Spec
	if err := json.Unmarshal(raw, &spec); err != nil {
		return fmt.Errorf("reading the sandbox spec %s: %w", path, err)
	}
	if err := spec.Validate(); err != nil {
		return err
	}
	// Namespaces belong to a thread; the exec below replaces the whole
	// process, so this thread never goes back to other goroutines.
	runtime.LockOSThread()
	if err := enter(&spec); err != nil {
		return err
	}
	argv0, err := resolve(spec.Args[0], spec.Env)
	if err != nil {
		return err
	}
	return unix.Exec(argv0, spec.Args, spec.Env)
}

func enter(spec *Spec) error {
	ns, err := os.Open(spec.Netns)
	if err != nil {
		return fmt.Errorf("opening the pod's network namespace: %w", err)
	}
	defer func() { _ = ns.Close() }()
	if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("joining the pod's network namespace %s: %w", spec.Netns, err)
	}
	if err := unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_NEWUTS); err != nil {
		return fmt.Errorf("unsharing the mount and UTS namespaces: %w", err)
	}
	// Mounts made below must not propagate back to the host.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making the mount namespace private: %w", err)
	}
	if spec.Hostname != "" {
		if err := unix.Sethostname([]byte(spec.Hostname)); err != nil {
			return fmt.Errorf("setting the hostname: %w", err)
		}
	}
	for _, m := range spec.Mounts {
		if err := bind(spec.Root, m); err != nil {
			return err
		}
	}
	if err := unix.Chroot(spec.Root); err != nil {
		return fmt.Errorf("chroot into %s: %w", spec.Root, err)
	}
	wd := spec.WorkingDir
	if wd == "" {
		wd = "/"
	}
	if err := os.MkdirAll(wd, 0o755); err != nil {
		return fmt.Errorf("creating the working directory %s: %w", wd, err)
	}
	if err := unix.Chdir(wd); err != nil {
		return fmt.Errorf("entering the working directory %s: %w", wd, err)
	}
	// Groups first: once the uid is not 0 any more, they cannot change.
	groups := make([]int, 0, len(spec.Groups))
	for _, g := range spec.Groups {
		groups = append(groups, int(g))
	}
	if err := unix.Setgroups(groups); err != nil {
		return fmt.Errorf("setting the supplementary groups: %w", err)
	}
	if err := unix.Setresgid(int(spec.GID), int(spec.GID), int(spec.GID)); err != nil {
		return fmt.Errorf("setting gid %d: %w", spec.GID, err)
	}
	if err := unix.Setresuid(int(spec.UID), int(spec.UID), int(spec.UID)); err != nil {
		return fmt.Errorf("setting uid %d: %w", spec.UID, err)
	}
	// The node stand-in is the parent; set after the credentials change,
	// which clears a parent-death signal set before it.
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0); err != nil {
		return fmt.Errorf("setting the parent death signal: %w", err)
	}
	if os.Getppid() == 1 {
		return errors.New("the node stand-in exited before the container started")
	}
	return nil
}

// bind mounts m.Source onto root+m.Target, creating the mount point.
func bind(root string, m Mount) error {
	target := filepath.Join(root, m.Target)
	st, err := os.Stat(m.Source)
	if err != nil {
		return fmt.Errorf("mount source %s: %w", m.Source, err)
	}
	if st.IsDir() {
		err = os.MkdirAll(target, 0o755)
	} else {
		if err = os.MkdirAll(filepath.Dir(target), 0o755); err == nil {
			var f *os.File
			if f, err = os.OpenFile(target, os.O_CREATE|os.O_RDONLY, 0o644); err == nil {
				err = f.Close()
			}
		}
	}
	if err != nil {
		return fmt.Errorf("creating the mount point %s: %w", m.Target, err)
	}
	if err := unix.Mount(m.Source, target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind mounting %s at %s: %w", m.Source, m.Target, err)
	}
	if m.ReadOnly {
		if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("making %s read-only: %w", m.Target, err)
		}
	}
	return nil
}

// resolve finds argv0 inside the new root: a path as it is (the kernel
// reports a missing one), else through the PATH the container gets.
func resolve(argv0 string, env []string) (string, error) {
	if strings.Contains(argv0, "/") {
		return argv0, nil
	}
	path := "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		candidate := filepath.Join(dir, argv0)
		if st, err := os.Stat(candidate); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return candidate, nil
		}
	}
	return "", fmt.Errorf("executable %q not found in the container's PATH %s", argv0, path)
}
