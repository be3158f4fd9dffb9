//go:build linux

package podnet

import (
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// threadPanic carries a panic of fn out of withLockedThread's goroutine.
type threadPanic struct{ value any }

// withLockedThread runs fn on a new goroutine locked to its OS thread. fn may
// move the thread into another network namespace (setns, unshare); afterwards
// the thread is moved back to the namespace it started in.
//
// The Go runtime schedules other goroutines on a thread once it is unlocked,
// so a thread must never be unlocked while in a foreign namespace: those
// goroutines would then open their sockets in the wrong network. When the way
// back fails, or fn panics, the goroutine therefore ends still locked, and the
// runtime terminates the thread instead of reusing it (the main thread, which
// cannot exit, it parks for good). Threads the runtime
// creates while fn runs are cloned from its template thread, not from this
// one, so they start in the root namespace too.
func withLockedThread(fn func() error) error {
	done := make(chan error, 1)
	var panicked *threadPanic
	go func() {
		runtime.LockOSThread()
		home, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread() // nothing has moved the thread yet
			done <- fmt.Errorf("open the thread's network namespace: %w", err)
			return
		}
		defer func() { _ = home.Close() }()
		returned := false
		defer func() {
			if !returned {
				panicked = &threadPanic{recover()}
				done <- nil // the thread stays locked and dies with the goroutine
			}
		}()
		fnErr := fn()
		returned = true
		if err := netns.Set(home); err != nil {
			// Stay locked: see above.
			done <- fmt.Errorf("return the thread to its network namespace: %w", err)
			return
		}
		runtime.UnlockOSThread()
		done <- fnErr
	}()
	err := <-done
	if panicked != nil {
		panic(panicked.value)
	}
	return err
}

// inNetns runs fn on an OS thread inside the network namespace ns. Sockets fn
// creates belong to ns for their whole life; goroutines fn starts do not run
// in ns.
func inNetns(ns netns.NsHandle, fn func() error) error {
	return withLockedThread(func() error {
		if err := netns.Set(ns); err != nil {
			return fmt.Errorf("enter network namespace: %w", err)
		}
		return fn()
	})
}

// newNetns creates a network namespace with no name: it lives as long as the
// returned handle, or a process or socket inside it.
func newNetns() (netns.NsHandle, error) {
	ns := netns.None()
	err := withLockedThread(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("unshare network namespace: %w", err)
		}
		var err error
		ns, err = netns.Get()
		return err
	})
	return ns, err
}

// dupNetns returns a second handle to ns, so that a caller can use the
// namespace while another goroutine closes the original handle.
func dupNetns(ns netns.NsHandle) (netns.NsHandle, error) {
	fd, err := unix.FcntlInt(uintptr(ns), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return netns.None(), fmt.Errorf("dup network namespace handle: %w", err)
	}
	return netns.NsHandle(fd), nil
}
