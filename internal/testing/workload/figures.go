package workload

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Figures are the numbers a run is judged by.
type Figures struct {
	// StartedAt is the wall-clock instant the run's clock counts from (set
	// by Verify; zero from Summarize alone).
	StartedAt time.Time
	// Duration is from the first call to the last answer.
	Duration time.Duration

	// Writes are acknowledged writes; WriteConflicts are writes whose compare
	// failed (kube-apiserver's "object modified", not an error); Reads are
	// answered reads.
	Writes, WriteConflicts, Reads int
	// FailedWrites and FailedReads had no answer after all retries, within
	// the request deadline; FailedRequests is their sum.
	FailedWrites, FailedReads, FailedRequests int
	// FailedErrors are the last errors of the failed requests, counted per
	// message, most frequent first: what a failed request ran into.
	FailedErrors []ErrorCount
	// Retries counts attempts beyond the first, over all requests.
	Retries int

	// LostAcknowledgedWrites counts acknowledged writes the store does not
	// hold (see CheckLostWrites); FinalReadMismatches counts keys whose final
	// value is not the last acknowledged write; UnverifiedWrites could not be
	// read back because their revision was compacted. Filled by Verify.
	LostAcknowledgedWrites, FinalReadMismatches, UnverifiedWrites int
	// Linearizable is true when porcupine found the history linearizable;
	// LinearizabilityResult is porcupine's verdict (Ok, Illegal, Unknown).
	// Filled by Verify.
	Linearizable          bool
	LinearizabilityResult string

	// MaxWriteGap is the longest time between two consecutive acknowledged
	// write completions, over all writers; it starts at MaxWriteGapAt.
	MaxWriteGap, MaxWriteGapAt time.Duration
	// WriteLatency summarizes the latency of answered writes (acknowledged
	// or conflicting: both are one raft round).
	WriteLatency Latency
	// Phases are the same figures per caller-named phase, in time order.
	Phases []PhaseFigures

	// Series is every write, for plotting; Marks are the caller's phases and
	// events.
	Series []Sample
	Marks  []Mark

	Preload PreloadFigures
}

// ErrorCount is how many failed requests ended on one error message.
type ErrorCount struct {
	Message string
	Count   int
}

// Latency is a latency distribution summary.
type Latency struct {
	Count         int
	P50, P99, Max time.Duration
}

// PhaseFigures are the figures of the operations called during one phase.
type PhaseFigures struct {
	Name       string
	Start, End time.Duration
	Writes     int
	Failed     int
	// MaxWriteGap is the longest stretch of the phase in which no
	// acknowledged write completed (gaps that cross a phase boundary are cut
	// at it, so a stall that starts before the phase still counts in it).
	MaxWriteGap  time.Duration
	WriteLatency Latency
}

// Sample is one write request: when it was called, how long it took, and
// whether it got an answer (acknowledged or conflict).
type Sample struct {
	At, Latency time.Duration
	OK          bool
}

// Summarize computes the figures that follow from the history alone.
func Summarize(h *History) Figures {
	ops := h.Ops()
	marks := h.Marks()
	f := Figures{Marks: marks}
	var end time.Duration
	failedErrors := map[string]int{}
	for _, op := range ops {
		end = max(end, op.Return)
		f.Retries += op.Attempts - 1
		if op.Outcome == Failed {
			failedErrors[op.Err]++
		}
		switch {
		case op.Kind == Read && op.Outcome == Failed:
			f.FailedReads++
		case op.Kind == Read:
			f.Reads++
		case op.Outcome == Failed:
			f.FailedWrites++
		case op.Outcome == Conflict:
			f.WriteConflicts++
		default:
			f.Writes++
		}
		if op.Kind == Write {
			f.Series = append(f.Series, Sample{At: op.Call, Latency: op.Latency(), OK: op.Outcome != Failed})
		}
	}
	f.FailedRequests = f.FailedWrites + f.FailedReads
	f.FailedErrors = countedErrors(failedErrors)
	if len(ops) > 0 {
		f.Duration = end - ops[0].Call
	}
	f.WriteLatency = writeLatency(ops)
	done := completions(ops)
	f.MaxWriteGap, f.MaxWriteGapAt = MaxGapWithin(done, 0, end)

	phases := phaseMarks(marks)
	for i, m := range phases {
		p := PhaseFigures{Name: m.Name, Start: m.At, End: end}
		last := i == len(phases)-1
		if !last {
			p.End = phases[i+1].At
		}
		var in []Op
		for _, op := range ops {
			if op.Call >= p.Start && (last || op.Call < p.End) {
				in = append(in, op)
			}
		}
		for _, op := range in {
			switch {
			case op.Outcome == Failed:
				p.Failed++
			case op.Acknowledged():
				p.Writes++
			}
		}
		p.WriteLatency = writeLatency(in)
		p.MaxWriteGap, _ = MaxGapWithin(done, p.Start, p.End)
		f.Phases = append(f.Phases, p)
	}
	return f
}

func phaseMarks(marks []Mark) []Mark {
	var out []Mark
	for _, m := range marks {
		if m.Phase {
			out = append(out, m)
		}
	}
	return out
}

func writeLatency(ops []Op) Latency {
	var lat []time.Duration
	for _, op := range ops {
		if op.Kind == Write && op.Outcome != Failed {
			lat = append(lat, op.Latency())
		}
	}
	if len(lat) == 0 {
		return Latency{}
	}
	slices.Sort(lat)
	return Latency{Count: len(lat), P50: Percentile(lat, 50), P99: Percentile(lat, 99), Max: lat[len(lat)-1]}
}

// Percentile is the nearest-rank percentile p (1-100) of sorted values,
// which must not be empty.
func Percentile(sorted []time.Duration, p int) time.Duration {
	rank := (p*len(sorted) + 99) / 100
	return sorted[max(rank, 1)-1]
}

// completions are the sorted completion times of acknowledged writes.
func completions(ops []Op) []time.Duration {
	var done []time.Duration
	for _, op := range ops {
		if op.Acknowledged() {
			done = append(done, op.Return)
		}
	}
	slices.Sort(done)
	return done
}

// MaxGapWithin is the longest time between two consecutive completion
// times of sorted done, counting only the part of it that lies within
// [from, to], and where that part starts.
func MaxGapWithin(done []time.Duration, from, to time.Duration) (gap, at time.Duration) {
	for i := 1; i < len(done); i++ {
		start, end := max(done[i-1], from), min(done[i], to)
		if d := end - start; d > gap {
			gap, at = d, start
		}
	}
	return gap, at
}

// VerifyOptions tune Verify.
type VerifyOptions struct {
	// LinearizabilityTimeout bounds porcupine (0: no limit). A timeout gives
	// Linearizable false with result "Unknown".
	LinearizabilityTimeout time.Duration
	// VisualizationPath, when set, receives porcupine's HTML drawing of the
	// history if it is not linearizable.
	VisualizationPath string
}

// Verify runs the checks on the recorded run: it reads back every
// acknowledged write, checks linearizability, and returns all figures.
// Call it after Stop, while the cluster is healthy.
func (w *Workload) Verify(ctx context.Context, o VerifyOptions) (Figures, LostWrites, error) {
	h := w.History()
	f := Summarize(h)
	f.StartedAt = w.start
	w.mu.Lock()
	f.Preload = w.preload
	w.mu.Unlock()

	lost, err := CheckLostWrites(ctx, w.client, h)
	if err != nil {
		return f, lost, err
	}
	f.LostAcknowledgedWrites = len(lost.Lost)
	f.FinalReadMismatches = len(lost.FinalMismatches)
	f.UnverifiedWrites = lost.Unverifiable

	ok, info := h.CheckLinearizable(o.LinearizabilityTimeout)
	f.Linearizable, f.LinearizabilityResult = ok, string(info.Result)
	if !ok && o.VisualizationPath != "" {
		if err := info.WriteVisualization(o.VisualizationPath); err != nil {
			return f, lost, err
		}
	}
	for _, l := range lost.Lost {
		w.log.Info("lost acknowledged write", "write", l.Write.String(), "reason", l.Reason)
	}
	for _, m := range lost.FinalMismatches {
		w.log.Info("final value is not the last acknowledged write", "key", m.Key,
			"lastAcknowledged", fmt.Sprintf("%q@%d", short(m.LastAcknowledged.Value), m.LastAcknowledged.Rev),
			"found", fmt.Sprintf("%q@%d", short(m.Found.Value), m.Found.Rev))
	}
	return f, lost, nil
}

// countedErrors orders error counts by count, then message, so reports of
// the same run compare equal.
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
