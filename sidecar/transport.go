package sidecar

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The raft transport's metrics the sidecar reads. active_peers is 1 per
// (Local, Remote) pair while the connection is active; disconnected_peers
// counts each time it went inactive. The strict reconfiguration check of
// the member that receives a removal counts the voters its transport has
// seen active for 5 s (etcd's ActiveSince); no API gives that time, so the
// sidecar watches its own member's metrics and notes when each peer turned
// active, starting over whenever the counter shows a break it did not see
// (a learner applying a snapshot restarts its streams within a second).
const (
	activePeersMetric       = "etcd_network_active_peers"
	disconnectedPeersMetric = "etcd_network_disconnected_peers_total"
)

// peerState is one peer as the local member's transport reports it.
type peerState struct {
	active      bool
	disconnects float64
}

// transportView is what the local member's raft transport reported at the
// latest scrape: since when each peer has been active without a break, as
// far as this sidecar saw (a peer seen active at the first scrape counts
// from then; a scrape that shows a peer inactive, or disconnected since the
// scrape before, starts it over, and one that failed starts every peer
// over).
type transportView struct {
	of          uint64               // the local member the view belongs to
	since       map[uint64]time.Time // remote member ID -> first scrape that saw it active
	disconnects map[uint64]float64   // remote member ID -> its disconnection counter then
	failed      string               // why the latest scrape failed; "" when it worked
	// fetched is when the latest scrape applied began its request: a scrape
	// that began earlier and answered later is older news and is dropped
	// (the background poll and an observation scrape concurrently).
	fetched time.Time
}

// transportFresh is how old the transport view may be when an observation
// answers: an older one is scraped again alongside the member list. The
// background poll alone refreshes it once a poll interval, and a poll that
// waits on a member that does not answer lasts a status timeout more: the
// view lagged etcd by up to 2 s, and every wait for a learner's 5 s
// connected (etcd's strict reconfiguration check) lasted as much longer.
const transportFresh = 200 * time.Millisecond

// metricsClient fetches the local member's /metrics, over the same TLS and
// dialer as the etcd clients.
func newMetricsClient(cfg *Config) *http.Client {
	tr := &http.Transport{TLSClientConfig: cfg.EtcdTLS, MaxIdleConns: 1, IdleConnTimeout: time.Minute}
	if d := cfg.DialContext; d != nil {
		tr.DialContext = d
	} else {
		tr.DialContext = (&net.Dialer{Timeout: cfg.StatusTimeout}).DialContext
	}
	return &http.Client{Transport: tr, Timeout: cfg.StatusTimeout}
}

// scrapeTransport reads the local member's active peers from its /metrics
// and updates the transport view.
func (s *Server) scrapeTransport(ctx context.Context) {
	s.mu.Lock()
	local := s.localID
	s.mu.Unlock()
	if local == 0 {
		return // the labels name members by ID; the local one is not known yet
	}
	fetched := time.Now()
	peers, err := s.transportPeers(ctx, local)
	if err != nil && ctx.Err() != nil {
		// The caller gave up (an observation whose client hung up, the
		// poll at shutdown): that says nothing of the connections, and
		// forgetting them would restart every peer's 5 s.
		return
	}
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if fetched.Before(s.transport.fetched) {
		return // a scrape that began later has been applied already
	}
	s.transport.fetched = fetched
	if err != nil {
		if s.transport.failed != err.Error() && ctx.Err() == nil {
			s.log.Info("cannot read the local member's raft transport; promotions wait for the learner's health instead", "error", err.Error())
		}
		// Forget the view: what happened to the connections meanwhile is
		// unknown (etcd may even have restarted, its counters with it), so
		// every peer counts again from the next scrape that works.
		s.transport.failed = err.Error()
		clear(s.transport.since)
		return
	}
	t := &s.transport
	if t.of != local {
		*t = transportView{of: local, since: map[uint64]time.Time{}, disconnects: map[uint64]float64{}, fetched: fetched}
	}
	t.failed = ""
	for id := range t.since {
		if p := peers[id]; !p.active || p.disconnects != t.disconnects[id] {
			delete(t.since, id)
			s.log.Info("peer inactive in the local member's raft transport", "member", formatID(local), "peer", formatID(id))
		}
	}
	for id, p := range peers {
		t.disconnects[id] = p.disconnects
		if _, ok := t.since[id]; p.active && !ok {
			t.since[id] = now
			s.log.Info("peer active in the local member's raft transport", "member", formatID(local), "peer", formatID(id))
		}
	}
}

// scrapeTransportIfStale scrapes the transport when the view is older than
// transportFresh.
func (s *Server) scrapeTransportIfStale(ctx context.Context) {
	s.mu.Lock()
	stale := time.Since(s.transport.fetched) > transportFresh
	s.mu.Unlock()
	if stale {
		s.scrapeTransport(ctx)
	}
}

// transportPeers are the remote members of the local member's transport.
func (s *Server) transportPeers(ctx context.Context, local uint64) (map[uint64]peerState, error) {
	body, err := s.getLocal(ctx, "/metrics", "the local member's metrics")
	if err != nil {
		return nil, err
	}
	defer func() { _ = body.Close() }()
	return parseTransport(body, local)
}

// getLocal GETs path from the local member's client URL, over the same
// TLS and dialer as the etcd clients; what names the read in its errors.
// The caller closes the body.
func (s *Server) getLocal(ctx context.Context, path, what string) (io.ReadCloser, error) {
	u := strings.TrimSuffix(s.cfg.Endpoints[0], "/") + path
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := s.metricsClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", what, err)
	}
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		_ = resp.Body.Close()
		return nil, fmt.Errorf("reading %s: %s answered %s", what, u, resp.Status)
	}
	return resp.Body, nil
}

// parseTransport reads etcd's metrics text and returns, per remote member
// of the local member's transport, whether it is active and how often it
// was disconnected. Only the two families' lines are parsed: a member's
// metrics run to a few hundred kilobytes, and every sidecar reads its
// member's every poll.
func parseTransport(r io.Reader, local uint64) (map[uint64]peerState, error) {
	var text strings.Builder
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		name := strings.TrimPrefix(strings.TrimPrefix(line, "# HELP "), "# TYPE ")
		for _, f := range []string{activePeersMetric, disconnectedPeersMetric} {
			if strings.HasPrefix(name, f+" ") || strings.HasPrefix(name, f+"{") {
				text.WriteString(line)
				text.WriteByte('\n')
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading the local member's metrics: %w", err)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	families, err := p.TextToMetricFamilies(strings.NewReader(text.String()))
	if err != nil {
		return nil, fmt.Errorf("parsing the local member's metrics: %w", err)
	}
	out := map[uint64]peerState{}
	// etcd registers a pair's series on its first activation: none yet
	// means no peer was ever connected.
	for _, name := range []string{activePeersMetric, disconnectedPeersMetric} {
		f, ok := families[name]
		if !ok {
			continue
		}
		for _, m := range f.GetMetric() {
			var from, to string
			for _, l := range m.GetLabel() {
				switch model.LabelName(l.GetName()) {
				case "Local":
					from = l.GetValue()
				case "Remote":
					to = l.GetValue()
				}
			}
			id, err := strconv.ParseUint(to, 16, 64)
			if from != formatID(local) || err != nil {
				continue
			}
			st := out[id]
			if name == activePeersMetric {
				st.active = m.GetGauge().GetValue() > 0
			} else {
				st.disconnects = m.GetCounter().GetValue()
			}
			out[id] = st
		}
	}
	return out, nil
}

// connectedForLocked is how long the local member's transport has seen member id
// active without a break, as the sidecar saw it; for the local member itself
// (etcd counts it as connected to itself) how long it has been healthy.
// Zero when unknown. The caller holds s.mu.
func (s *Server) connectedForLocked(id uint64, healthyFor time.Duration, now time.Time) time.Duration {
	if id == s.localID && id != 0 {
		return healthyFor
	}
	if s.transport.of != s.localID {
		return 0
	}
	since, ok := s.transport.since[id]
	if !ok {
		return 0
	}
	return now.Sub(since)
}
