// Package report turns a run's figures into the report a person reads after
// a live move: a JSON document (stable keys for scripts and the benchmarks page), a
// text rendering for the terminal, and SVG plots of write latency over time
// with the migration steps marked. A move is judged by the client-go clients
// of the kube-apiservers (package apiload); the project's own retrying etcd
// client (package workload) is a lower-level check beside them.
package report

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/druid-stretch/druid-stretch/internal/testing/workload"
)

// Report is what a run showed. Its clock (StartedAt, every *Seconds field)
// is that of what it was built from: the own etcd client's workload
// (FromFigures) or the kube-apiservers' load (FromAPILoad); AddOwnClient and
// AddKubeAPIServers add the other's figures shifted onto it. The
// orchestration adds the migration's own figures (MigrationSeconds,
// TieSeconds, RTTMs, Steps) and EtcdCrashes.
type Report struct {
	// Title names the run, e.g. "live move A -> B".
	Title string `json:"title,omitempty"`
	// StartedAt is the wall-clock instant the run's clock (every *Seconds
	// offset below) counts from.
	StartedAt time.Time `json:"startedAt,omitzero"`

	// RTTMs is the emulated round trip time between the clusters.
	RTTMs float64 `json:"rttMs"`
	// Preload is the data written before the run.
	Preload Preload `json:"preload"`
	// HeldSourceMembers is the move's HoldSource: above 0 the destination
	// took the majority first, holding that many source members for the
	// source's clients until they were switched; 0: the clients were
	// switched before any source member went.
	HeldSourceMembers int `json:"heldSourceMembers,omitempty"`

	// MigrationSeconds is how long the move took, first step to last.
	MigrationSeconds float64 `json:"migrationSeconds"`
	// MembershipSeconds is the membership part of the move: from the
	// first learner's add to the last removal, as the cluster's member
	// list showed them (0 when the run saw no such pair). The rest of the
	// move is the pods' start before the first add and the clients'
	// switch, when it comes after the last removal.
	MembershipSeconds float64 `json:"membershipSeconds,omitempty"`
	// TieSeconds is the time no side held a majority (a partition between
	// the clusters would have stalled writes).
	TieSeconds float64 `json:"tieSeconds"`
	// NoLeaderSeconds is the time no member was leader (writes could not
	// commit), from the members' own logs of their role changes.
	NoLeaderSeconds float64 `json:"noLeaderSeconds"`

	// KubeAPIServers are the figures of the client-go clients of each
	// kube-apiserver (AddKubeAPIServers), the figures a move is judged by.
	KubeAPIServers []APIServer `json:"kubeAPIServers"`
	// APIHistory are the verdicts on all kube-apiservers' requests as one
	// history; nil when the run had no kube-apiserver clients.
	APIHistory *APIHistory `json:"apiHistory,omitempty"`
	// EtcdCrashes are the etcd members' panics and fatal exits, one line
	// each, as the caller found them in the members' logs.
	EtcdCrashes []string `json:"etcdCrashes"`

	// The figures from here to Retries are the project's own etcd client's
	// (AddOwnClient); its retries hide failures a client-go client sees.

	// FailedRequests are client requests without an answer after the
	// client's own retries (FailedWrites + FailedReads).
	FailedRequests int `json:"failedRequests"`
	FailedWrites   int `json:"failedWrites"`
	FailedReads    int `json:"failedReads"`
	// FailedRequestErrors are the errors the failed requests ended on, with
	// how many ended on each.
	FailedRequestErrors []ErrorCount `json:"failedRequestErrors,omitempty"`
	// LostAcknowledgedWrites are acknowledged writes the store does not hold.
	LostAcknowledgedWrites int `json:"lostAcknowledgedWrites"`
	// FinalReadMismatches are keys whose final value is not the last
	// acknowledged write.
	FinalReadMismatches int `json:"finalReadMismatches"`
	// UnverifiedWrites could not be read back (compacted revisions).
	UnverifiedWrites int `json:"unverifiedWrites"`
	// Linearizable is porcupine's verdict on the recorded history;
	// LinearizabilityResult is the raw verdict (Ok, Illegal, Unknown).
	Linearizable          bool   `json:"linearizable"`
	LinearizabilityResult string `json:"linearizabilityResult"`

	// MaxWriteGapMs is the longest time without an acknowledged write.
	MaxWriteGapMs float64 `json:"maxWriteGapMs"`
	// MaxWriteGapAtSeconds is when that gap began, on the run's clock.
	MaxWriteGapAtSeconds float64 `json:"maxWriteGapAtSeconds"`
	// P50WriteMs, P99WriteMs and MaxWriteMs summarize write latency over
	// the whole run.
	P50WriteMs float64 `json:"p50WriteMs"`
	P99WriteMs float64 `json:"p99WriteMs"`
	MaxWriteMs float64 `json:"maxWriteMs"`
	// Phases are the same figures per phase (e.g. before, during, after).
	Phases []Phase `json:"phases"`

	// Writes are acknowledged writes, WriteConflicts writes whose compare
	// failed (answered, retried by the caller), Reads answered reads, and
	// Retries attempts beyond the first.
	Writes         int `json:"writes"`
	WriteConflicts int `json:"writeConflicts"`
	Reads          int `json:"reads"`
	Retries        int `json:"retries"`
	// DurationSeconds is how long the traffic on the report's clock ran
	// (the workload's or the load's).
	DurationSeconds float64 `json:"durationSeconds"`

	// Steps are the migration steps and other events, in time order.
	Steps []Step `json:"steps"`

	// Baseline is the hand-scripted clientv3 move of the same cluster on
	// the same sites (the bench runs it after the product's move); nil when
	// it was not run.
	Baseline *Baseline `json:"baseline,omitempty"`
}

// Baseline holds the figures of the hand-scripted move: its own etcd
// writer's, and its steps on a clock that starts with the move.
type Baseline struct {
	MoveSeconds   float64 `json:"moveSeconds"`
	TieSeconds    float64 `json:"tieSeconds"`
	Writes        int     `json:"writes"`
	FailedWrites  int     `json:"failedWrites"`
	LostWrites    int     `json:"lostWrites"`
	MaxWriteGapMs float64 `json:"maxWriteGapMs"`
	Steps         []Step  `json:"steps"`
}

// Ratio is the product's move time over the baseline's (0 without one).
func (r Report) Ratio() float64 {
	if r.Baseline == nil || r.Baseline.MoveSeconds == 0 {
		return 0
	}
	return r.MigrationSeconds / r.Baseline.MoveSeconds
}

// MembershipRatio is the move's membership part over the baseline's move,
// which is membership changes only (0 without either).
func (r Report) MembershipRatio() float64 {
	if r.Baseline == nil || r.Baseline.MoveSeconds == 0 {
		return 0
	}
	return r.MembershipSeconds / r.Baseline.MoveSeconds
}

// Preload is the data written before the run.
type Preload struct {
	Keys            int     `json:"keys"`
	ValueBytes      int     `json:"valueBytes"`
	DurationSeconds float64 `json:"durationSeconds"`
}

// Phase holds the write figures of one phase of the run.
type Phase struct {
	Name          string  `json:"name"`
	StartSeconds  float64 `json:"startSeconds"`
	EndSeconds    float64 `json:"endSeconds"`
	Writes        int     `json:"writes"`
	Failed        int     `json:"failed"`
	P50WriteMs    float64 `json:"p50WriteMs"`
	P99WriteMs    float64 `json:"p99WriteMs"`
	MaxWriteGapMs float64 `json:"maxWriteGapMs"`
}

// ErrorCount is how many failed requests ended on one error message.
type ErrorCount struct {
	Message string `json:"message"`
	Count   int    `json:"count"`
}

// Step is one named event on the run's clock (seconds since the workload
// started), such as "promote seed-b-etcd-main-3".
type Step struct {
	Name      string  `json:"name"`
	AtSeconds float64 `json:"atSeconds"`
	// At is the same instant on the wall clock, when the run's start is known.
	At time.Time `json:"at,omitzero"`
	// DurationSeconds is how long the step took, when known.
	DurationSeconds float64 `json:"durationSeconds,omitempty"`
}

func seconds(d time.Duration) float64 { return d.Seconds() }

func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// FromFigures fills a report with the workload's figures, on the workload's
// clock; its events (not its phases) become Steps.
func FromFigures(f workload.Figures) Report {
	r := newReport(f.StartedAt, f.Duration, f.Marks)
	r.AddOwnClient(f, 0)
	return r
}

// newReport is a report on the clock that starts at startedAt, with every
// list empty rather than nil.
func newReport(startedAt time.Time, d time.Duration, marks []workload.Mark) Report {
	r := Report{
		StartedAt: startedAt, DurationSeconds: seconds(d),
		KubeAPIServers: []APIServer{}, EtcdCrashes: []string{}, Phases: []Phase{}, Steps: []Step{},
	}
	for _, m := range marks {
		if !m.Phase {
			s := Step{Name: m.Name, AtSeconds: seconds(m.At)}
			if !startedAt.IsZero() {
				s.At = startedAt.Add(m.At)
			}
			r.Steps = append(r.Steps, s)
		}
	}
	return r
}

// AddOwnClient sets the own etcd client's figures from the workload's,
// replacing any before. offset moves the workload's clock onto the
// report's: pass f.StartedAt.Sub(r.StartedAt), 0 when they are the same.
// The workload's marks are not added (the report's Steps already are the
// run's events).
func (r *Report) AddOwnClient(f workload.Figures, offset time.Duration) {
	r.Preload = Preload{Keys: f.Preload.Keys, ValueBytes: f.Preload.ValueSize, DurationSeconds: seconds(f.Preload.Duration)}
	r.FailedRequests, r.FailedWrites, r.FailedReads = f.FailedRequests, f.FailedWrites, f.FailedReads
	r.FailedRequestErrors = nil
	for _, e := range f.FailedErrors {
		r.FailedRequestErrors = append(r.FailedRequestErrors, ErrorCount{Message: e.Message, Count: e.Count})
	}
	r.LostAcknowledgedWrites, r.FinalReadMismatches, r.UnverifiedWrites = f.LostAcknowledgedWrites, f.FinalReadMismatches, f.UnverifiedWrites
	r.Linearizable, r.LinearizabilityResult = f.Linearizable, f.LinearizabilityResult
	r.MaxWriteGapMs, r.MaxWriteGapAtSeconds = millis(f.MaxWriteGap), seconds(f.MaxWriteGapAt+offset)
	r.P50WriteMs, r.P99WriteMs, r.MaxWriteMs = millis(f.WriteLatency.P50), millis(f.WriteLatency.P99), millis(f.WriteLatency.Max)
	r.Phases = []Phase{}
	for _, p := range f.Phases {
		r.Phases = append(r.Phases, Phase{
			Name: p.Name, StartSeconds: seconds(p.Start + offset), EndSeconds: seconds(p.End + offset),
			Writes: p.Writes, Failed: p.Failed,
			P50WriteMs: millis(p.WriteLatency.P50), P99WriteMs: millis(p.WriteLatency.P99),
			MaxWriteGapMs: millis(p.MaxWriteGap),
		})
	}
	r.Writes, r.WriteConflicts, r.Reads, r.Retries = f.Writes, f.WriteConflicts, f.Reads, f.Retries
}

// hasOwnClient tells whether the own client's figures were set: a verified
// workload always has a linearizability verdict.
func (r Report) hasOwnClient() bool {
	return r.LinearizabilityResult != "" || r.Writes+r.WriteConflicts+r.Reads+r.FailedRequests > 0
}

// MarshalJSON writes the report with its lists as [] rather than null, so
// that scripts read the same shape whoever filled them (e.g. a caller that
// sets EtcdCrashes to a nil slice).
func (r Report) MarshalJSON() ([]byte, error) {
	type plain Report // without this method
	p := plain(r)
	p.KubeAPIServers, p.EtcdCrashes = orEmpty(p.KubeAPIServers), orEmpty(p.EtcdCrashes)
	p.Phases, p.Steps = orEmpty(p.Phases), orEmpty(p.Steps)
	return json.Marshal(p)
}

func orEmpty[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// WriteJSON writes the report as indented JSON to path.
func (r Report) WriteJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding report: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("writing report %s: %w", path, err)
	}
	return nil
}

// ReadJSON reads a report written by WriteJSON.
func ReadJSON(path string) (Report, error) {
	var r Report
	b, err := os.ReadFile(path)
	if err != nil {
		return r, fmt.Errorf("reading report %s: %w", path, err)
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("decoding report %s: %w", path, err)
	}
	return r, nil
}

// String renders the report as aligned text for a terminal.
func (r Report) String() string {
	var b strings.Builder
	_ = r.WriteText(&b)
	return b.String()
}

// ownClientLabel heads the own client's figures when kube-apiserver figures
// stand above them, so that a reader never takes one for the other.
const ownClientLabel = "the project's own etcd client (retries; a lower-level check)"

// lineFunc prints one tabwriter line.
type lineFunc func(format string, args ...any)

// WriteText renders the report as aligned text: the kube-apiservers'
// clients first when the run had them, then the migration's figures, then
// the own client's.
func (r Report) WriteText(out io.Writer) error {
	title := r.Title
	if title == "" {
		title = "druid-stretch report"
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	line := func(format string, args ...any) { _, _ = fmt.Fprintf(tw, format+"\n", args...) }
	line("%s", title)
	api := len(r.KubeAPIServers) > 0
	if api {
		r.writeKubeAPIServers(line)
	}
	if api || len(r.EtcdCrashes) > 0 {
		writeEtcdCrashes(line, r.EtcdCrashes)
	}
	if r.RTTMs > 0 || r.Preload.Keys > 0 {
		line("  setup\t%s RTT, %d preloaded keys of %d bytes", ms(r.RTTMs), r.Preload.Keys, r.Preload.ValueBytes)
	}
	if r.HeldSourceMembers > 0 {
		line("  order\tthe destination took the majority first, holding %d source member(s) until the clients switched", r.HeldSourceMembers)
	}
	line("  migration time\t%.2f s", r.MigrationSeconds)
	if r.MembershipSeconds > 0 {
		line("  membership part\t%.2f s (the first learner's add to the last removal)", r.MembershipSeconds)
	}
	line("  time in tie\t%.2f s", r.TieSeconds)
	line("  time without leader\t%.2f s", r.NoLeaderSeconds)
	switch {
	case !api:
		r.writeOwnClient(line, "  ")
	case r.hasOwnClient():
		line("  %s", ownClientLabel)
		r.writeOwnClient(line, "    ")
	}
	if len(r.Steps) > 0 {
		line("  steps")
		r.writeTimeline(line, "    ")
	}
	if b := r.Baseline; b != nil {
		line("  hand-scripted baseline	plain clientv3 on the same sites: %.2f s (the product took %.2fx), tie %.2f s", b.MoveSeconds, r.Ratio(), b.TieSeconds)
		line("    its writer	%d writes acknowledged, %d failed, %d lost, max write gap %s", b.Writes, b.FailedWrites, b.LostWrites, ms(b.MaxWriteGapMs))
		Report{Steps: b.Steps}.writeTimeline(line, "    ")
	}
	return tw.Flush()
}

// WriteTimeline prints the run's steps, one line each on the run's clock
// with its duration when known: where a move's seconds went. The demo's
// report and the bench print the same lines.
func (r Report) WriteTimeline(out io.Writer, indent string) error {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	r.writeTimeline(func(format string, args ...any) { _, _ = fmt.Fprintf(tw, format+"\n", args...) }, indent)
	return tw.Flush()
}

// writeTimeline's lines have no tab: the time is of fixed width, and a
// line reads the same in every report, whatever the report's other columns.
func (r Report) writeTimeline(line lineFunc, in string) {
	for _, s := range r.Steps {
		if s.DurationSeconds > 0 {
			line("%s%7.2f s  %s (%.2f s)", in, s.AtSeconds, s.Name, s.DurationSeconds)
		} else {
			line("%s%7.2f s  %s", in, s.AtSeconds, s.Name)
		}
	}
}

// writeOwnClient prints the own client's figures, each line indented by in.
func (r Report) writeOwnClient(line lineFunc, in string) {
	line("%sfailed requests\t%d (after the client's retries: %d writes, %d reads)", in, r.FailedRequests, r.FailedWrites, r.FailedReads)
	for _, e := range r.FailedRequestErrors {
		line("%s  %dx\t%s", in, e.Count, e.Message)
	}
	line("%slost acknowledged writes\t%d%s", in, r.LostAcknowledgedWrites, finalNote(r))
	line("%slinearizable\t%s", in, verdict(r.Linearizable, r.LinearizabilityResult))
	line("%smax write gap\t%s (from %.2f s)", in, ms(r.MaxWriteGapMs), r.MaxWriteGapAtSeconds)
	line("%swrite latency\tp50 %s, p99 %s, max %s", in, ms(r.P50WriteMs), ms(r.P99WriteMs), ms(r.MaxWriteMs))
	for _, p := range r.Phases {
		line("%s  %s\tp50 %s, p99 %s, max gap %s, %d writes, %d failed (%.1f-%.1f s)",
			in, p.Name, ms(p.P50WriteMs), ms(p.P99WriteMs), ms(p.MaxWriteGapMs), p.Writes, p.Failed, p.StartSeconds, p.EndSeconds)
	}
	line("%sclient traffic\t%d writes acknowledged, %d conflicts, %d reads, %d retries in %.1f s",
		in, r.Writes, r.WriteConflicts, r.Reads, r.Retries, r.DurationSeconds)
}

func finalNote(r Report) string {
	var notes []string
	if r.FinalReadMismatches > 0 {
		notes = append(notes, fmt.Sprintf("%d keys end on a value other than their last acknowledged write", r.FinalReadMismatches))
	}
	if r.UnverifiedWrites > 0 {
		notes = append(notes, fmt.Sprintf("%d writes unverifiable (compacted)", r.UnverifiedWrites))
	}
	if len(notes) == 0 {
		return ""
	}
	return " (" + strings.Join(notes, "; ") + ")"
}

// verdict words porcupine's verdict on a history.
func verdict(linearizable bool, result string) string {
	switch {
	case linearizable:
		return "yes"
	case result == "Unknown":
		return "unknown (the check timed out)"
	case result == "":
		return "not checked"
	}
	return "NO"
}

// ms prints milliseconds at a precision that suits their size.
func ms(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%.2f s", v/1000)
	case v >= 10:
		return fmt.Sprintf("%.0f ms", v)
	}
	return fmt.Sprintf("%.1f ms", v)
}
