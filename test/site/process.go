package site

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/druid-stretch/druid-stretch/internal/testing/childproc"
)

// process is one control-plane binary of the site (kube-controller-manager,
// kube-scheduler, etcd-druid): started with its output in logs/<name>.log,
// dying with this process (childproc), stopped with SIGTERM then SIGKILL.
type process struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

func (s *Site) start(name, binary string, args, env []string) (*process, error) {
	logPath := filepath.Join(s.Dir, "logs", name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	_, _ = fmt.Fprintf(f, "--- site %s: %s %s\n", time.Now().Format(time.RFC3339Nano), binary, strings.Join(args, " "))
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := childproc.Start(cmd); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("starting %s (%s): %w", name, binary, err)
	}
	p := &process{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = f.Close()
		close(p.done)
	}()
	s.onStop(p.stop)
	return p, nil
}

// stop ends the process group: SIGTERM, SIGKILL after 10 s.
func (p *process) stop() error {
	select {
	case <-p.done:
		return nil
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
	return nil
}

// exited names how a process ended while the site waited for it.
func (p *process) exited() error {
	select {
	case <-p.done:
		return fmt.Errorf("%s exited (%v); see %s", p.name, p.err, p.log)
	default:
		return nil
	}
}

// waitHealthy polls url (the process's /healthz or metrics endpoint) until it
// answers 200, failing early when the process exits.
func waitHealthy(ctx context.Context, p *process, url string) error {
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		// The components serve /healthz with a self-signed certificate.
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // a health probe on loopback
	}}
	defer hc.CloseIdleConnections()
	var last error
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		if err := p.exited(); err != nil {
			return false, err
		}
		resp, err := hc.Get(url)
		if err != nil {
			last = err
			return false, nil
		}
		_ = resp.Body.Close()
		last = fmt.Errorf("%s answered %s", url, resp.Status)
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		return fmt.Errorf("%s did not get healthy: %w", p.name, errors.Join(err, last))
	}
	return nil
}
