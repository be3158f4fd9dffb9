package localetcd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"
)

// readyPath is etcd 3.6's readiness check minus "non_learner": /readyz
// fails on every learner by design, while its other checks (no corruption
// alarm, serializable and linearizable reads) are exactly "serves clients".
// The older /health reads only once and says nothing about corruption.
const readyPath = "/readyz?exclude=non_learner&verbose"

// readyPoll is how often readiness is polled while waiting.
const readyPoll = 100 * time.Millisecond

// WaitReady waits until the member serves clients, polling its own client
// port (not the WAN front). There is no built-in time limit: a member that
// catches up by snapshot may take 9-19 s, so the caller's ctx decides. It
// fails at once when the member is not running or when etcd exits, with the
// tail of its log.
func (m *Member) WaitReady(ctx context.Context) error {
	p := m.current()
	if p == nil {
		return fmt.Errorf("localetcd: member %q is not running", m.Name)
	}
	return m.waitReady(ctx, p)
}

func (m *Member) waitReady(ctx context.Context, p *process) error {
	o := m.r.opts
	// A linearizable read needs a leader; without one etcd holds the request
	// open, so each probe has its own deadline, longer than an election.
	hc := &http.Client{
		Timeout:   2*time.Second + 2*o.ElectionTimeout,
		Transport: &http.Transport{TLSClientConfig: m.ClientTLSConfig(), DisableKeepAlives: true},
	}
	defer hc.CloseIdleConnections()
	url := m.LocalClientURL + readyPath
	tick := time.NewTicker(readyPoll)
	defer tick.Stop()
	var last string
	for {
		ok, answer := probe(ctx, hc, url)
		if ok {
			return nil
		}
		if answer != "" {
			last = answer
		}
		select {
		case <-p.done:
			return m.exitError(p)
		case <-ctx.Done():
			if last == "" {
				last = "no answer"
			}
			return fmt.Errorf("localetcd: member %q (pid %d) not ready at %s: %w; last answer: %s; log tail:\n%s",
				m.Name, p.pid, m.LocalClientURL, ctx.Err(), last, m.LogTail(15))
		case <-tick.C:
		}
	}
}

func probe(ctx context.Context, hc *http.Client, url string) (bool, string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false, err.Error()
	}
	resp, err := hc.Do(req)
	if err != nil {
		return false, err.Error()
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode == http.StatusOK {
		return true, ""
	}
	return false, fmt.Sprintf("%s: %s", resp.Status, strings.Join(strings.Fields(string(body)), " "))
}

// exitError explains an etcd that exited while it was expected to start,
// with what it wrote during this run.
func (m *Member) exitError(p *process) error {
	out := m.runOutput(p, 3, 15)
	err := fmt.Errorf("localetcd: etcd of member %q (pid %d) exited during start (%v); its output (%s):\n%s", m.Name, p.pid, p.err, m.LogPath, out)
	if strings.Contains(out, "address already in use") {
		return fmt.Errorf("%w: %w", ErrPortInUse, err)
	}
	return err
}

// runOutput is the output of one run: all of it when short, else its first
// head lines (where etcd reports a bad flag before its usage text) and its
// last tail lines (where a fatal error ends the log).
func (m *Member) runOutput(p *process, head, tail int) string {
	lines, err := m.readLines(p.logStart)
	if err != nil {
		return fmt.Sprintf("(log unreadable: %v)", err)
	}
	if len(lines) > head+tail+1 {
		cut := fmt.Sprintf("[... %d lines ...]", len(lines)-head-tail)
		lines = append(append(lines[:head:head], cut), lines[len(lines)-tail:]...)
	}
	return strings.Join(lines, "\n")
}

// logTailBytes bounds how much of the log LogTail reads.
const logTailBytes = 256 << 10

// LogTail returns the last n lines of the member's log file (etcd's output
// across all its starts), for a failing test to print.
func (m *Member) LogTail(n int) string {
	lines, err := m.readLines(0)
	if err != nil {
		return fmt.Sprintf("(log unreadable: %v)", err)
	}
	if n >= 0 && len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// readLines reads the log from offset from, at most its last logTailBytes.
func (m *Member) readLines(from int64) ([]string, error) {
	f, err := os.Open(m.LogPath)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	off := max(st.Size()-logTailBytes, from, 0)
	buf := make([]byte, max(st.Size()-off, 0))
	if _, err := f.ReadAt(buf, off); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	text := strings.TrimRight(string(buf), "\n")
	if text == "" {
		return nil, nil
	}
	lines := strings.Split(text, "\n")
	if off > from && len(lines) > 1 {
		lines = lines[1:] // the first line is cut
	}
	return lines, nil
}
