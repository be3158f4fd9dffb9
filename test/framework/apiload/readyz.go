package apiload

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"time"
)

// RBACBootstrapCheck is kube-apiserver's /readyz check of its RBAC
// bootstrap. The hook reconciles every default role and binding, one
// quorum read each (and a write where one is missing), one after another:
// a destination's kube-apiserver whose etcd leader is still in the source
// seed pays a round trip between the seeds for each, a wait that grows
// with the distance and the machine's load. A system:masters client, which the load's
// are, is authorised before RBAC is consulted, so the server serves it
// correctly meanwhile. The tests leave the check out of the readiness they
// wait on (Options.ReadyzExclude); the bench and the demo keep it, as a
// seed's readiness probe does, and so report what it costs a move.
const RBACBootstrapCheck = "poststarthook/rbac/bootstrap-roles"

// ReadyzPath is the /readyz request that leaves out the checks named.
func ReadyzPath(exclude []string) string {
	if len(exclude) == 0 {
		return "/readyz"
	}
	q := url.Values{"exclude": exclude}
	return "/readyz?" + q.Encode()
}

// probeTimeout bounds one /readyz probe. kube-apiserver's own etcd check
// may take a few seconds to give up on a dead etcd; a probe that takes
// longer records 0, like a transport error.
const probeTimeout = 5 * time.Second

// ReadyzSample is one /readyz probe of a server.
type ReadyzSample struct {
	// At is when the answer came, on the load's clock.
	At time.Duration `json:"atNs"`
	// Code is the HTTP status, 0 when there was no HTTP answer.
	Code int `json:"code"`
}

// pollReadyz probes s's /readyz every ReadyzInterval until ctx ends. The
// first 200 opens s's readiness gate and is announced on anyReady.
func (l *Load) pollReadyz(ctx context.Context, s *server, anyReady chan<- *server) {
	defer l.done.Done()
	for {
		var code int
		// StatusCode is set for every HTTP answer, error statuses included.
		s.probe.Get().RequestURI(ReadyzPath(l.opts.ReadyzExclude)).Do(ctx).StatusCode(&code)
		if ctx.Err() != nil {
			// Cut off by Stop: not an answer of the server.
			return
		}
		at := l.now()
		s.mu.Lock()
		s.readyz = append(s.readyz, ReadyzSample{At: at, Code: code})
		s.mu.Unlock()
		if code == http.StatusOK {
			s.readyOnce.Do(func() {
				s.mu.Lock()
				s.firstReady = at
				s.mu.Unlock()
				close(s.ready)
				anyReady <- s // buffered for every server
				l.log.Info("kube-apiserver ready", "server", s.name, "at", at)
			})
		}
		t := time.NewTimer(l.opts.ReadyzInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// WaitReady returns once the server name answered /readyz with 200 (at
// once if it did before), or with ctx's error. A caller switches clients
// to a server only after it: Switch refuses one that never was ready.
func (l *Load) WaitReady(ctx context.Context, name string) error {
	s := l.serverNamed(name)
	if s == nil {
		return fmt.Errorf("apiload: WaitReady for unknown server %q (servers: %s)", name, l.serverNames())
	}
	select {
	case <-s.ready:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("apiload: %s never answered /readyz with 200: %w", name, ctx.Err())
	}
}

// becameReady tells whether s ever answered /readyz 200.
func (s *server) becameReady() bool {
	select {
	case <-s.ready:
		return true
	default:
		return false
	}
}

// readiness is what was seen of s's readiness: whether and when it first
// answered 200, and the probe series.
func (s *server) readiness() (ready bool, first time.Duration, series []ReadyzSample) {
	ready = s.becameReady()
	s.mu.Lock()
	defer s.mu.Unlock()
	return ready, s.firstReady, slices.Clone(s.readyz)
}

// readyNow is 1 when the server's last /readyz answer was 200, else 0.
func (s *server) readyNow() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := len(s.readyz); n > 0 && s.readyz[n-1].Code == http.StatusOK {
		return 1
	}
	return 0
}

// Window is a stretch of time on the load's clock.
type Window struct {
	From time.Duration `json:"fromNs"`
	To   time.Duration `json:"toNs"`
}

// readyWindows are the runs of consecutive /readyz 200 answers, from the
// first answer of a run to its last: the stretches in which the server said
// it was ready.
func readyWindows(series []ReadyzSample) []Window {
	var out []Window
	inRun := false
	for _, s := range series {
		switch {
		case s.Code == http.StatusOK && inRun:
			out[len(out)-1].To = s.At
		case s.Code == http.StatusOK:
			out = append(out, Window{From: s.At, To: s.At})
			inRun = true
		default:
			inRun = false
		}
	}
	return out
}

// FailingWindow is a stretch in which a server's /readyz said 200 while
// its requests failed, with the number of those failed requests.
type FailingWindow struct {
	Window
	Failed int `json:"failed"`
}

// readyButFailing finds the failed requests that were in flight while
// /readyz said 200 (their [Call, Return] meets a ready window) and merges
// them into windows; failures closer than mergeWithin apart share one. A
// kube-apiserver whose etcd members were all removed answers /readyz 200
// while every request fails: that shows as one long window.
func readyButFailing(reqs []Request, ready []Window, mergeWithin time.Duration) (int, []FailingWindow) {
	var hits []Window
	for _, r := range reqs {
		if !r.Failed() {
			continue
		}
		for _, w := range ready {
			if r.Call <= w.To && r.Return >= w.From {
				hits = append(hits, Window{From: max(r.Call, w.From), To: min(r.Return, w.To)})
				break
			}
		}
	}
	slices.SortFunc(hits, func(a, b Window) int { return cmp.Compare(a.From, b.From) })
	var out []FailingWindow
	for _, h := range hits {
		if n := len(out); n > 0 && h.From <= out[n-1].To+mergeWithin {
			out[n-1].To = max(out[n-1].To, h.To)
			out[n-1].Failed++
			continue
		}
		out = append(out, FailingWindow{Window: h, Failed: 1})
	}
	return len(hits), out
}
