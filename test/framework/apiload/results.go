package apiload

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/druid-stretch/druid-stretch/internal/testing/workload"
)

// VerifyOptions tune Results.
type VerifyOptions struct {
	// LinearizabilityTimeout bounds porcupine (0: no limit). A timeout
	// gives Linearizable false with result "Unknown".
	LinearizabilityTimeout time.Duration
	// VisualizationPath, when set, receives porcupine's HTML drawing of the
	// history if it is not linearizable.
	VisualizationPath string
}

// Results are the figures a run is judged by. Durations are offsets on the
// load's clock (zero at New, StartedAt in wall-clock time), in nanoseconds
// in JSON.
type Results struct {
	StartedAt time.Time `json:"startedAt"`
	// Duration is from New to Stop.
	Duration time.Duration `json:"durationNs"`
	// Servers are the figures per kube-apiserver, in Options order.
	Servers []ServerFigures `json:"servers"`
	// Total counts every server's requests together; its MaxWriteGap is the
	// longest time in which no server's write was acknowledged. Readiness
	// series and windows are per server only; Total's ReadyButFailing is
	// their sum.
	Total ServerFigures `json:"total"`

	// Linearizable is true when porcupine found all servers' requests,
	// plus a final read of every object, linearizable as one history (the
	// servers share one etcd); LinearizabilityResult is porcupine's verdict
	// (Ok, Illegal, Unknown) over CheckedOperations operations.
	Linearizable          bool   `json:"linearizable"`
	LinearizabilityResult string `json:"linearizabilityResult"`
	CheckedOperations     int    `json:"checkedOperations"`

	// LostAcknowledgedWrites counts the acknowledged writes the store does
	// not hold (see checkLostWrites); LostWrites lists them.
	// UnverifiedWrites could not be judged (an object that could not be
	// read at the end, or a value no write explains).
	LostAcknowledgedWrites int         `json:"lostAcknowledgedWrites"`
	LostWrites             []LostWrite `json:"lostWrites,omitempty"`
	UnverifiedWrites       int         `json:"unverifiedWrites"`

	// Marks are the caller's phases and events.
	Marks []Mark `json:"marks,omitempty"`
}

// ServerFigures are the figures of one kube-apiserver's requests.
type ServerFigures struct {
	Name string `json:"name"`
	// Writes are acknowledged writes; Conflicts are writes answered 409
	// (their compare failed: not a failure); Reads are answered reads,
	// the reads after a conflict included.
	Writes    int `json:"writes"`
	Conflicts int `json:"conflicts"`
	Reads     int `json:"reads"`
	// Failed is FailedWrites plus FailedReads: requests without a usable
	// answer. A failed write is ambiguous: it may have been applied.
	Failed       int `json:"failed"`
	FailedWrites int `json:"failedWrites"`
	FailedReads  int `json:"failedReads"`
	// FailedByClass counts the failures per class, most frequent first;
	// FailedErrors per error text.
	FailedByClass []ClassCount `json:"failedByClass,omitempty"`
	FailedErrors  []ErrorCount `json:"failedErrors,omitempty"`

	// MaxWriteGap is the longest time between two consecutive acknowledged
	// write completions, counted from the server's first readiness (or from
	// when the writers started, after the load created its objects, if that
	// is later) to Stop,
	// or to SwitchedAt for a server switched away (so a server that became
	// ready and never wrote shows the whole stretch, and a switched one does
	// not show the rest of the run as a stall); it starts at MaxWriteGapAt.
	MaxWriteGap   time.Duration `json:"maxWriteGapNs"`
	MaxWriteGapAt time.Duration `json:"maxWriteGapAtNs"`
	// WriteLatency covers answered writes (acknowledged or conflicting),
	// ReadLatency answered reads.
	WriteLatency Latency `json:"writeLatency"`
	ReadLatency  Latency `json:"readLatency"`

	// BecameReady tells whether /readyz ever answered 200, first at
	// FirstReady; Ready are the runs of 200 answers and Readyz every probe.
	BecameReady bool           `json:"becameReady"`
	FirstReady  time.Duration  `json:"firstReadyNs"`
	Ready       []Window       `json:"ready,omitempty"`
	Readyz      []ReadyzSample `json:"readyz,omitempty"`
	// ReadyButFailing counts failed requests that were in flight while
	// /readyz said 200, grouped in ReadyButFailingWindows (C3 in the
	// project's notes: a kube-apiserver whose etcd members were all removed
	// still answers /readyz 200).
	ReadyButFailing        int             `json:"readyButFailing"`
	ReadyButFailingWindows []FailingWindow `json:"readyButFailingWindows,omitempty"`

	// SwitchedTo names the server Switch moved this server's clients to,
	// at SwitchedAt; from then on their requests count under SwitchedTo
	// (with Request.Origin naming this server).
	SwitchedTo string        `json:"switchedTo,omitempty"`
	SwitchedAt time.Duration `json:"switchedAtNs,omitempty"`

	// Phases are the figures per caller-named phase, in time order.
	Phases []PhaseFigures `json:"phases,omitempty"`
}

// ClassCount is how many failed requests fell in one class.
type ClassCount struct {
	Class FailureClass `json:"class"`
	Count int          `json:"count"`
}

// ErrorCount is how many failed requests ended on one error text.
type ErrorCount struct {
	Message string `json:"message"`
	Count   int    `json:"count"`
}

// Latency is a latency distribution summary (nearest-rank percentiles).
type Latency struct {
	Count int           `json:"count"`
	P50   time.Duration `json:"p50Ns"`
	P99   time.Duration `json:"p99Ns"`
	Max   time.Duration `json:"maxNs"`
}

// PhaseFigures are the figures of the requests called during one phase.
type PhaseFigures struct {
	Name  string        `json:"name"`
	Start time.Duration `json:"startNs"`
	End   time.Duration `json:"endNs"`
	// Writes are acknowledged writes; Failed are requests without answer.
	Writes int `json:"writes"`
	Reads  int `json:"reads"`
	Failed int `json:"failed"`
	// MaxWriteGap is the longest stretch of the phase without an
	// acknowledged write (a stall that began earlier counts from the
	// phase's start).
	MaxWriteGap  time.Duration `json:"maxWriteGapNs"`
	WriteLatency Latency       `json:"writeLatency"`
}

// Results reads every object once more through a server that answers (the
// read joins the history), checks the history for linearizability and lost
// acknowledged writes, and returns the figures. Call it after Stop. When
// some object cannot be read before ctx ends, the figures are returned with
// an error, and that object's acknowledged writes count as unverified.
func (l *Load) Results(ctx context.Context, vo VerifyOptions) (Results, error) {
	l.mu.Lock()
	started, stopped, stopAt, trafficAt, h := l.started, l.stopped, l.stopAt, l.trafficAt, l.history
	l.mu.Unlock()
	if !started || !stopped || h == nil {
		return Results{}, errors.New("apiload: Results needs a load that was started and stopped")
	}
	final, readErr := l.finalReads(ctx, h)

	l.mu.Lock()
	reqs := slices.Clone(l.requests)
	marks := slices.Clone(l.marks)
	l.mu.Unlock()
	slices.SortStableFunc(marks, func(a, b Mark) int { return cmp.Compare(a.At, b.At) })
	phases := slices.DeleteFunc(slices.Clone(marks), func(m Mark) bool { return !m.Phase })

	r := Results{StartedAt: l.start, Duration: stopAt, Marks: marks}
	var (
		allReady   bool
		firstReady time.Duration
	)
	for _, s := range l.servers {
		var mine []Request
		for _, req := range reqs {
			if req.Server == s.name {
				mine = append(mine, req)
			}
		}
		ready, first, series := s.readiness()
		servedUntil := stopAt
		to, at, switched := l.switchedAway(s)
		if switched {
			servedUntil = min(at, stopAt)
		}
		f := summarize(s.name, mine, ready, first, trafficAt, servedUntil, stopAt, phases)
		f.SwitchedTo, f.SwitchedAt = to, at
		f.Readyz, f.Ready = series, readyWindows(series)
		f.ReadyButFailing, f.ReadyButFailingWindows = readyButFailing(mine, f.Ready, l.opts.ReadyzInterval)
		r.Servers = append(r.Servers, f)
		if ready && (!allReady || first < firstReady) {
			allReady, firstReady = true, first
		}
	}
	r.Total = summarize("total", reqs, allReady, firstReady, trafficAt, stopAt, stopAt, phases)
	for _, f := range r.Servers {
		r.Total.ReadyButFailing += f.ReadyButFailing
	}

	ok, info := h.CheckLinearizable(vo.LinearizabilityTimeout)
	r.Linearizable, r.LinearizabilityResult, r.CheckedOperations = ok, string(info.Result), info.Operations
	var visErr error
	if !ok && vo.VisualizationPath != "" {
		visErr = info.WriteVisualization(vo.VisualizationPath)
	}

	owner := map[string]string{}
	for _, obj := range l.objects {
		owner[obj.key] = l.servers[obj.server].name
	}
	lost := checkLostWrites(h.Ops(), h.Initial, final)
	for _, lo := range lost.lost {
		r.LostWrites = append(r.LostWrites, LostWrite{
			Server: owner[lo.op.Key], Object: lo.op.Key, Value: lo.op.Value, Rev: lo.op.Rev,
			Call: lo.op.Call, Return: lo.op.Return, Reason: lo.reason,
		})
		l.log.Info("lost acknowledged write", "write", lo.op.String(), "reason", lo.reason)
	}
	r.LostAcknowledgedWrites, r.UnverifiedWrites = len(lost.lost), lost.unverified
	return r, errors.Join(readErr, visErr)
}

// finalReads reads every object through the first server that answers,
// trying the servers that ever became ready in turn until ctx ends (after
// a move the source kube-apiserver may fail every request), and records the
// answers in h.
func (l *Load) finalReads(ctx context.Context, h *workload.History) (map[string]workload.KeyValue, error) {
	client := len(l.servers) * (l.opts.Writers + l.opts.Readers)
	final := map[string]workload.KeyValue{}
	lastErr := map[string]string{}
	// Servers whose last /readyz said 200 first, and a server that failed a
	// read goes last: after a move the source kube-apiserver may hang every
	// request for RequestTimeout, and asking it for each object in turn
	// would take minutes.
	order := slices.Clone(l.servers)
	slices.SortStableFunc(order, func(a, b *server) int {
		return cmp.Compare(b.readyNow(), a.readyNow())
	})
	for {
		for _, obj := range l.objects {
			if _, done := final[obj.key]; done {
				continue
			}
			for _, s := range slices.Clone(order) {
				if !s.becameReady() || ctx.Err() != nil {
					continue
				}
				req, kv := l.get(ctx, s, obj)
				if req.Failed() {
					lastErr[obj.key] = fmt.Sprintf("%s: %s", s.name, req.Err)
					order = append(slices.DeleteFunc(order, func(o *server) bool { return o == s }), s)
					continue
				}
				req.Phase = "final read"
				op := readOp(client, obj, req, kv)
				h.Record(op)
				final[obj.key] = kv
				break
			}
		}
		if len(final) == len(l.objects) {
			return final, nil
		}
		t := time.NewTimer(l.opts.ReadyzInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			var errs []error
			for _, obj := range l.objects {
				if _, done := final[obj.key]; !done {
					errs = append(errs, fmt.Errorf("final read of %s: %s", obj.key, cmp.Or(lastErr[obj.key], "no server became ready")))
				}
			}
			return final, fmt.Errorf("apiload: %w: %w", ctx.Err(), errors.Join(errs...))
		case <-t.C:
		}
	}
}

// summarize computes one server's (or all servers') figures from its
// requests. Write gaps count from firstReady, or from trafficAt (when the
// writers started) if that is later, to servedUntil (stopAt, or the switch
// away from the server), and not at all for a server that never became
// ready; the last phase ends at stopAt.
func summarize(name string, reqs []Request, ready bool, firstReady, trafficAt, servedUntil, stopAt time.Duration, phases []Mark) ServerFigures {
	f := ServerFigures{Name: name, BecameReady: ready, FirstReady: firstReady}
	classes := map[FailureClass]int{}
	errs := map[string]int{}
	for _, r := range reqs {
		switch {
		case r.Failed():
			classes[r.Class]++
			errs[r.Err]++
			if r.Kind == workload.Write {
				f.FailedWrites++
			} else {
				f.FailedReads++
			}
		case r.Kind == workload.Read:
			f.Reads++
		case r.Outcome == workload.Conflict:
			f.Conflicts++
		default:
			f.Writes++
		}
	}
	f.Failed = f.FailedWrites + f.FailedReads
	f.FailedByClass = countedClasses(classes)
	f.FailedErrors = countedErrors(errs)
	f.WriteLatency = latency(reqs, workload.Write)
	f.ReadLatency = latency(reqs, workload.Read)
	done := completions(reqs, ready, max(firstReady, trafficAt), servedUntil)
	f.MaxWriteGap, f.MaxWriteGapAt = workload.MaxGapWithin(done, 0, max(servedUntil, lastReturn(reqs)))

	for i, m := range phases {
		p := PhaseFigures{Name: m.Name, Start: m.At, End: stopAt}
		last := i == len(phases)-1
		if !last {
			p.End = phases[i+1].At
		}
		var in []Request
		for _, r := range reqs {
			if r.Call >= p.Start && (last || r.Call < p.End) {
				in = append(in, r)
			}
		}
		for _, r := range in {
			switch {
			case r.Failed():
				p.Failed++
			case r.Kind == workload.Read:
				p.Reads++
			case r.Acknowledged():
				p.Writes++
			}
		}
		p.WriteLatency = latency(in, workload.Write)
		p.MaxWriteGap, _ = workload.MaxGapWithin(done, p.Start, p.End)
		f.Phases = append(f.Phases, p)
	}
	return f
}

func lastReturn(reqs []Request) time.Duration {
	var end time.Duration
	for _, r := range reqs {
		end = max(end, r.Return)
	}
	return end
}

// completions are the sorted completion times of acknowledged writes,
// framed by the first readiness and end (Stop, or the switch away from the
// server), so that a stall at either end counts as a gap.
func completions(reqs []Request, ready bool, firstReady, end time.Duration) []time.Duration {
	if !ready {
		return nil
	}
	done := []time.Duration{firstReady, max(end, firstReady)}
	for _, r := range reqs {
		if r.Acknowledged() {
			done = append(done, r.Return)
		}
	}
	slices.Sort(done)
	return done
}

// latency summarizes the answered requests of one kind.
func latency(reqs []Request, kind workload.Kind) Latency {
	var lat []time.Duration
	for _, r := range reqs {
		if r.Kind == kind && !r.Failed() {
			lat = append(lat, r.Latency())
		}
	}
	if len(lat) == 0 {
		return Latency{}
	}
	slices.Sort(lat)
	return Latency{Count: len(lat), P50: workload.Percentile(lat, 50), P99: workload.Percentile(lat, 99), Max: lat[len(lat)-1]}
}

// countedClasses orders the class counts by count, then by the classes'
// report order, so reports of the same run compare equal.
func countedClasses(counts map[FailureClass]int) []ClassCount {
	var out []ClassCount
	for _, c := range failureClasses {
		if counts[c] > 0 {
			out = append(out, ClassCount{Class: c, Count: counts[c]})
		}
	}
	slices.SortStableFunc(out, func(a, b ClassCount) int { return b.Count - a.Count })
	return out
}

// countedErrors orders error counts by count, then message.
func countedErrors(counts map[string]int) []ErrorCount {
	out := make([]ErrorCount, 0, len(counts))
	for msg, n := range counts {
		out = append(out, ErrorCount{Message: msg, Count: n})
	}
	slices.SortFunc(out, func(a, b ErrorCount) int {
		if a.Count != b.Count {
			return b.Count - a.Count
		}
		return strings.Compare(a.Message, b.Message)
	})
	return out
}

// String is the text summary: one line per server, one for the total, and
// the verdicts.
func (r Results) String() string {
	var b strings.Builder
	for _, f := range r.Servers {
		b.WriteString(f.String())
		b.WriteByte('\n')
	}
	fmt.Fprintf(&b, "%s\n", r.Total.counts())
	fmt.Fprintf(&b, "linearizable: %v (%s, %d operations); lost acknowledged writes: %d",
		r.Linearizable, r.LinearizabilityResult, r.CheckedOperations, r.LostAcknowledgedWrites)
	if r.UnverifiedWrites > 0 {
		fmt.Fprintf(&b, " (%d unverified)", r.UnverifiedWrites)
	}
	return b.String()
}

// String is one line: counts, failure classes, write gap, readiness and
// switch, e.g. "site-a: 1234 writes, 310 reads, 3 failed (2 MemberRemoved,
// 1 ProposalDropped), max write gap 0.84 s from 40.2 s, ready 0.0-61.2 s,
// switched to site-b at 58.0 s".
func (f ServerFigures) String() string {
	s := f.counts()
	switched := ""
	if f.SwitchedTo != "" {
		switched = fmt.Sprintf(", switched to %s at %.1f s", f.SwitchedTo, f.SwitchedAt.Seconds())
	}
	if !f.BecameReady {
		return s + ", never ready" + switched
	}
	if len(f.Ready) == 0 {
		s += fmt.Sprintf(", ready from %.1f s", f.FirstReady.Seconds())
	} else {
		windows := make([]string, 0, len(f.Ready))
		for _, w := range f.Ready {
			windows = append(windows, fmt.Sprintf("%.1f-%.1f", w.From.Seconds(), w.To.Seconds()))
		}
		s += ", ready " + strings.Join(windows, ", ") + " s"
	}
	if f.ReadyButFailing > 0 {
		s += fmt.Sprintf(", %d failed while ready", f.ReadyButFailing)
	}
	return s + switched
}

func (f ServerFigures) counts() string {
	s := fmt.Sprintf("%s: %d writes, %d reads, %d failed", f.Name, f.Writes, f.Reads, f.Failed)
	if len(f.FailedByClass) > 0 {
		parts := make([]string, 0, len(f.FailedByClass))
		for _, c := range f.FailedByClass {
			parts = append(parts, fmt.Sprintf("%d %s", c.Count, c.Class))
		}
		s += " (" + strings.Join(parts, ", ") + ")"
	}
	if f.Conflicts > 0 {
		s += fmt.Sprintf(", %d conflicts", f.Conflicts)
	}
	s += fmt.Sprintf(", max write gap %.2f s", f.MaxWriteGap.Seconds())
	if f.MaxWriteGap > 0 {
		s += fmt.Sprintf(" from %.1f s", f.MaxWriteGapAt.Seconds())
	}
	return s
}
