package localetcd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"strings"
	"time"

	"github.com/go-logr/logr"
)

// SidecarEndpoints is the etcd endpoint list a member's sidecar runs with,
// as its pod would: m's own client port first (same pod, so no WAN between
// them), then the advertised client URLs of the running members of peers
// other than m. The sidecar needs the others while m is a learner, which
// cannot serve membership calls.
func SidecarEndpoints(m *Member, peers []*Member) []string {
	eps := []string{m.LocalClientURL}
	for _, o := range peers {
		if o != m && o.Running() {
			eps = append(eps, o.ClientURL)
		}
	}
	return eps
}

// startSidecar serves Options.Sidecar's handler on the member's reserved
// sidecar port, once: later restarts of etcd keep the same sidecar.
func (m *Member) startSidecar() error {
	build := m.r.opts.Sidecar
	if build == nil {
		return nil
	}
	m.mu.Lock()
	running := m.sidecar != nil
	m.mu.Unlock()
	if running {
		return nil
	}
	h, err := build(m)
	if err != nil {
		return fmt.Errorf("localetcd: building the sidecar of %q: %w", m.Name, err)
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		// Refused handshakes (a client without a good certificate) are the
		// server's own errors; keep them in the structured log.
		ErrorLog: log.New(logWriter{m.r.log.WithValues("member", m.Name, "server", "sidecar")}, "", 0),
	}
	m.mu.Lock()
	ln := m.ep.sidecarLn
	if already := m.sidecar != nil; already || ln == nil || m.r.isClosed() {
		m.mu.Unlock()
		_ = closeHandler(h)
		if already {
			return nil
		}
		return fmt.Errorf("localetcd: the sidecar port of %q is already released (runtime closed)", m.Name)
	}
	m.sidecar, m.sidecarHandler = srv, h
	m.mu.Unlock()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			m.r.log.Error(err, "sidecar server ended", "member", m.Name)
		}
	}()
	m.r.log.Info("sidecar serving", "member", m.Name, "url", m.SidecarURL)
	return nil
}

// stopSidecar ends the sidecar server (giving calls in flight a moment)
// and closes its handler when it is an io.Closer.
func (m *Member) stopSidecar() error {
	m.mu.Lock()
	srv, h := m.sidecar, m.sidecarHandler
	m.sidecar, m.sidecarHandler = nil, nil
	m.mu.Unlock()
	if srv == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		_ = srv.Close()
	}
	return closeHandler(h)
}

// logWriter turns the lines of a standard library logger into log entries.
type logWriter struct{ log logr.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	w.log.Info(strings.TrimSpace(string(p)))
	return len(p), nil
}

func closeHandler(h http.Handler) error {
	if c, ok := h.(io.Closer); ok {
		return c.Close()
	}
	return nil
}
