// Package childproc starts the child processes of tests, the demo and the
// test sites so that they die with the process that started them, even when
// it ends by SIGKILL or by a panic that skips every cleanup.
package childproc

import (
	"os/exec"
	"runtime"
	"sync"
	"syscall"
)

// Start starts cmd in a process group of its own (so a terminal's Ctrl-C
// reaches only the parent, which ends its children in order, and a group kill
// reaches everything the child starts) with the kernel sending it SIGKILL
// when the parent dies. It keeps any other SysProcAttr field cmd sets.
//
// The kernel sends that parent-death signal when the thread that forked the
// child ends, not the process, and Go may end a thread when a goroutine
// locked to it returns. So every child is forked from one goroutine locked to
// a thread that lives as long as the process.
func Start(cmd *exec.Cmd) error { return StartNice(cmd, 0) }

// StartNice is Start with the child's nice value set to nice (0: the
// parent's) from its first instruction on, so every thread it creates
// inherits it; Linux keeps a nice value per thread, and setting it on a
// running process would reach its main thread only. A negative nice value
// needs CAP_SYS_NICE: without it the child starts at the parent's.
//
// Tests give the etcd members they run a negative one: on a seed, etcd's
// pod runs with CPU requests, which kubelet turns into a cgroup CPU weight
// far above that of best-effort work, while on a test machine every
// process shares the cores equally, and a busy machine would starve etcd
// past its election timeout where a node would not.
func StartNice(cmd *exec.Cmd, nice int) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	spawnOnce.Do(func() {
		spawnRequests = make(chan spawnRequest)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread must outlive every child
			for req := range spawnRequests {
				req.done <- startAt(req.cmd, req.nice)
			}
		}()
	})
	req := spawnRequest{cmd: cmd, nice: nice, done: make(chan error, 1)}
	spawnRequests <- req
	return <-req.done
}

var (
	spawnOnce     sync.Once
	spawnRequests chan spawnRequest
)

type spawnRequest struct {
	cmd  *exec.Cmd
	nice int
	done chan error
}

// startAt starts cmd from the spawning thread with that thread's nice value
// set to nice for the fork (a child inherits its forking thread's), then
// puts the thread's own back. A nice value the process may not take leaves
// the child at the thread's.
func startAt(cmd *exec.Cmd, nice int) error {
	if nice == 0 {
		return cmd.Start()
	}
	tid := syscall.Gettid()
	// The raw getpriority system call answers 20 - nice.
	raw, err := syscall.Getpriority(syscall.PRIO_PROCESS, tid)
	if err != nil {
		return cmd.Start()
	}
	own := 20 - raw
	if err := syscall.Setpriority(syscall.PRIO_PROCESS, tid, nice); err != nil {
		return cmd.Start()
	}
	defer func() { _ = syscall.Setpriority(syscall.PRIO_PROCESS, tid, own) }()
	return cmd.Start()
}
