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
func Start(cmd *exec.Cmd) error {
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
				req.done <- req.cmd.Start()
			}
		}()
	})
	req := spawnRequest{cmd: cmd, done: make(chan error, 1)}
	spawnRequests <- req
	return <-req.done
}

var (
	spawnOnce     sync.Once
	spawnRequests chan spawnRequest
)

type spawnRequest struct {
	cmd  *exec.Cmd
	done chan error
}
