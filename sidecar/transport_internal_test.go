package sidecar

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

// TestCancelledScrapeKeepsTheView: an observation scrapes the transport on
// the caller's context, and a caller that hangs up mid-scrape (the
// controller asks a second sidecar when the first is slow, and drops the
// slower answer) must not make every peer's connected time start over. A
// scrape that fails on its own does.
func TestCancelledScrapeKeepsTheView(t *testing.T) {
	g := NewWithT(t)
	const local, peer = 0x8e9e05c52164694d, 0x91bc3c398fb3c146
	metrics := fmt.Sprintf("# TYPE etcd_network_active_peers gauge\netcd_network_active_peers{Local=\"%x\",Remote=\"%x\"} 1\n", uint64(local), uint64(peer))
	var (
		hang, fail atomic.Bool
		release    = make(chan struct{})
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case hang.Load():
			select {
			case <-release:
			case <-r.Context().Done():
			}
			return
		case fail.Load():
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		_, _ = fmt.Fprint(w, metrics)
	}))
	defer srv.Close()
	defer close(release)
	s, err := New(Config{Endpoints: []string{srv.URL}, PollInterval: -1})
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = s.Close() }()
	s.noteLocalID(local)
	since := func() (time.Time, bool) {
		s.mu.Lock()
		defer s.mu.Unlock()
		at, ok := s.transport.since[peer]
		return at, ok
	}

	s.scrapeTransport(t.Context())
	first, ok := since()
	g.Expect(ok).To(BeTrue(), "the peer is active from the first scrape")

	hang.Store(true)
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	s.scrapeTransport(ctx)
	cancel()
	at, ok := since()
	g.Expect(ok).To(BeTrue(), "a scrape its caller gave up on forgets nothing")
	g.Expect(at).To(Equal(first))

	hang.Store(false)
	fail.Store(true)
	s.scrapeTransport(t.Context())
	_, ok = since()
	g.Expect(ok).To(BeFalse(), "a scrape that failed on its own starts every peer over")
}
