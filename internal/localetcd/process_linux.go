package localetcd

import (
	"os/exec"
	"runtime"
	"sync"
	"syscall"
)

// childProcAttr puts etcd in its own process group (so a terminal's Ctrl-C
// reaches only the parent, which ends the children in order, and a group
// kill reaches everything etcd might start) and has the kernel SIGKILL it
// when the parent dies, even by SIGKILL or a panic that skips every cleanup.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// The kernel sends Pdeathsig when the thread that forked the child ends,
// not the process. Go may end a thread when a goroutine locked to it
// returns, so every child is forked from one goroutine locked to a thread
// that lives as long as the process.
var (
	spawnOnce     sync.Once
	spawnRequests chan spawnRequest
)

type spawnRequest struct {
	cmd  *exec.Cmd
	done chan error
}

// startChild runs cmd.Start on the long-lived spawner thread.
func startChild(cmd *exec.Cmd) error {
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
