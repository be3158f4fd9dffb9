package report

import (
	"fmt"
	"strings"
	"time"

	"github.com/druid-stretch/druid-stretch/internal/testing/workload"
	"github.com/druid-stretch/druid-stretch/test/framework/apiload"
)

// APIServer holds the figures of one kube-apiserver's client-go clients
// (apiload.ServerFigures in the report's units and on its clock).
type APIServer struct {
	Name string `json:"name"`
	// Writes are acknowledged writes, Conflicts writes answered 409 (their
	// compare failed: not a failure), Reads answered reads.
	Writes    int `json:"writes"`
	Conflicts int `json:"conflicts"`
	Reads     int `json:"reads"`
	// Failed is FailedWrites plus FailedReads: requests without a usable
	// answer. Nothing of ours retries them, as a controller's would not.
	Failed       int `json:"failed"`
	FailedWrites int `json:"failedWrites"`
	FailedReads  int `json:"failedReads"`
	// FailedByClass counts the failures per class (apiload.FailureClass),
	// most frequent first; FailedErrors per error text.
	FailedByClass []ClassCount `json:"failedByClass"`
	FailedErrors  []ErrorCount `json:"failedErrors"`

	// MaxWriteGapMs is the longest time without an acknowledged write
	// while the server served its clients; it began at MaxWriteGapAtSeconds
	// (0 when there was no gap).
	MaxWriteGapMs        float64 `json:"maxWriteGapMs"`
	MaxWriteGapAtSeconds float64 `json:"maxWriteGapAtSeconds"`
	// P50WriteMs, P99WriteMs and MaxWriteMs summarize the latency of the
	// answered writes (acknowledged or conflicting).
	P50WriteMs float64 `json:"p50WriteMs"`
	P99WriteMs float64 `json:"p99WriteMs"`
	MaxWriteMs float64 `json:"maxWriteMs"`

	// BecameReady tells whether /readyz ever answered 200, first at
	// FirstReadySeconds; ReadyWindows are the runs of 200 answers.
	BecameReady       bool     `json:"becameReady"`
	FirstReadySeconds float64  `json:"firstReadySeconds"`
	ReadyWindows      []Window `json:"readyWindows"`
	// ReadyButFailing counts failed requests in flight while /readyz said
	// 200: a kube-apiserver whose etcd members are gone may still say so.
	ReadyButFailing int `json:"readyButFailing"`

	// SwitchedTo names the server this server's clients were moved to, at
	// SwitchedAtSeconds; their later requests count under SwitchedTo.
	SwitchedTo        string  `json:"switchedTo,omitempty"`
	SwitchedAtSeconds float64 `json:"switchedAtSeconds,omitempty"`
}

// ClassCount is how many failed requests fell in one failure class.
type ClassCount struct {
	Class string `json:"class"`
	Count int    `json:"count"`
}

// Window is a stretch of time on the report's clock.
type Window struct {
	FromSeconds float64 `json:"fromSeconds"`
	ToSeconds   float64 `json:"toSeconds"`
}

// APIHistory are the verdicts on all kube-apiservers' requests checked as
// one history (the servers share one etcd).
type APIHistory struct {
	// LostAcknowledgedWrites counts acknowledged writes the store does not
	// hold, listed in LostWrites; UnverifiedWrites could not be judged.
	LostAcknowledgedWrites int         `json:"lostAcknowledgedWrites"`
	LostWrites             []LostWrite `json:"lostWrites"`
	UnverifiedWrites       int         `json:"unverifiedWrites"`
	// Linearizable is porcupine's verdict over CheckedOperations
	// operations; LinearizabilityResult the raw one (Ok, Illegal, Unknown).
	Linearizable          bool   `json:"linearizable"`
	LinearizabilityResult string `json:"linearizabilityResult"`
	CheckedOperations     int    `json:"checkedOperations"`
}

// LostWrite is an acknowledged write the store does not hold.
type LostWrite struct {
	Server string `json:"server"`
	// Object is the ConfigMap's namespace/name; Rev the resourceVersion the
	// write was acknowledged with.
	Object        string  `json:"object"`
	Value         string  `json:"value"`
	Rev           int64   `json:"rev"`
	CallSeconds   float64 `json:"callSeconds"`
	ReturnSeconds float64 `json:"returnSeconds"`
	// Reason says how the final state contradicts the write.
	Reason string `json:"reason"`
}

// FromAPILoad is a report on the load's clock (StartedAt and
// DurationSeconds are the load's, its events become Steps) with the
// kube-apiservers' figures, for runs judged by them. The caller adds the
// migration's figures and may add the own client's (AddOwnClient).
func FromAPILoad(res apiload.Results) Report {
	marks := make([]workload.Mark, 0, len(res.Marks))
	for _, m := range res.Marks {
		marks = append(marks, workload.Mark{At: m.At, Name: m.Name, Phase: m.Phase})
	}
	r := newReport(res.StartedAt, res.Duration, marks)
	r.AddKubeAPIServers(res, 0)
	return r
}

// AddKubeAPIServers sets KubeAPIServers and APIHistory from the load's
// results, replacing any before; the load's marks are not added. offset is
// added to every time of the load to put it on the report's clock: pass
// res.StartedAt.Sub(r.StartedAt), 0 when the report is on the load's clock.
func (r *Report) AddKubeAPIServers(res apiload.Results, offset time.Duration) {
	at := func(d time.Duration) float64 { return seconds(d + offset) }
	r.KubeAPIServers = make([]APIServer, 0, len(res.Servers))
	for _, f := range res.Servers {
		s := APIServer{
			Name: f.Name, Writes: f.Writes, Conflicts: f.Conflicts, Reads: f.Reads,
			Failed: f.Failed, FailedWrites: f.FailedWrites, FailedReads: f.FailedReads,
			FailedByClass: make([]ClassCount, 0, len(f.FailedByClass)),
			FailedErrors:  make([]ErrorCount, 0, len(f.FailedErrors)),
			MaxWriteGapMs: millis(f.MaxWriteGap),
			P50WriteMs:    millis(f.WriteLatency.P50), P99WriteMs: millis(f.WriteLatency.P99), MaxWriteMs: millis(f.WriteLatency.Max),
			BecameReady:     f.BecameReady,
			ReadyWindows:    make([]Window, 0, len(f.Ready)),
			ReadyButFailing: f.ReadyButFailing,
			SwitchedTo:      f.SwitchedTo,
		}
		for _, c := range f.FailedByClass {
			s.FailedByClass = append(s.FailedByClass, ClassCount{Class: string(c.Class), Count: c.Count})
		}
		for _, e := range f.FailedErrors {
			s.FailedErrors = append(s.FailedErrors, ErrorCount{Message: e.Message, Count: e.Count})
		}
		// Times of things that did not happen stay 0 rather than offset.
		if f.MaxWriteGap > 0 {
			s.MaxWriteGapAtSeconds = at(f.MaxWriteGapAt)
		}
		if f.BecameReady {
			s.FirstReadySeconds = at(f.FirstReady)
		}
		for _, w := range f.Ready {
			s.ReadyWindows = append(s.ReadyWindows, Window{FromSeconds: at(w.From), ToSeconds: at(w.To)})
		}
		if f.SwitchedTo != "" {
			s.SwitchedAtSeconds = at(f.SwitchedAt)
		}
		r.KubeAPIServers = append(r.KubeAPIServers, s)
	}
	h := &APIHistory{
		LostAcknowledgedWrites: res.LostAcknowledgedWrites, LostWrites: make([]LostWrite, 0, len(res.LostWrites)),
		UnverifiedWrites: res.UnverifiedWrites,
		Linearizable:     res.Linearizable, LinearizabilityResult: res.LinearizabilityResult, CheckedOperations: res.CheckedOperations,
	}
	for _, w := range res.LostWrites {
		h.LostWrites = append(h.LostWrites, LostWrite{
			Server: w.Server, Object: w.Object, Value: w.Value, Rev: w.Rev,
			CallSeconds: at(w.Call), ReturnSeconds: at(w.Return), Reason: w.Reason,
		})
	}
	r.APIHistory = h
}

// The text shows at most this many of a server's error texts, ready
// windows and lost writes; the JSON report has them all.
const (
	shownErrors       = 5
	shownReadyWindows = 8
	shownLostWrites   = 5
)

// writeKubeAPIServers prints one block per kube-apiserver and the verdicts
// on their common history.
func (r Report) writeKubeAPIServers(line lineFunc) {
	line("  kube-apiserver clients (client-go, no retries of ours)")
	for _, s := range r.KubeAPIServers {
		// The headline has a second column so that all servers' figures
		// share one alignment.
		line("    %s\t%s", s.Name, headline(s))
		line("      failed requests\t%d (%d writes, %d reads)%s", s.Failed, s.FailedWrites, s.FailedReads, classCounts(s.FailedByClass))
		for i, e := range s.FailedErrors {
			if i == shownErrors {
				line("        \t... %d more error texts in the JSON report", len(s.FailedErrors)-shownErrors)
				break
			}
			line("        %dx\t%s", e.Count, e.Message)
		}
		line("      requests\t%d writes acknowledged, %d conflicts (409, not failures), %d reads answered", s.Writes, s.Conflicts, s.Reads)
		if s.MaxWriteGapMs > 0 {
			line("      max write gap\t%s (from %.2f s)", ms(s.MaxWriteGapMs), s.MaxWriteGapAtSeconds)
		} else {
			line("      max write gap\tnone")
		}
		line("      write latency\tp50 %s, p99 %s, max %s", ms(s.P50WriteMs), ms(s.P99WriteMs), ms(s.MaxWriteMs))
		line("      /readyz\t%s", readiness(s))
		if s.SwitchedTo != "" {
			line("      clients switched\tto %s at %.2f s", s.SwitchedTo, s.SwitchedAtSeconds)
		}
	}
	h := r.APIHistory
	if h == nil {
		return
	}
	unverified := ""
	if h.UnverifiedWrites > 0 {
		unverified = fmt.Sprintf(" (%d writes unverifiable)", h.UnverifiedWrites)
	}
	line("    lost acknowledged writes\t%d%s", h.LostAcknowledgedWrites, unverified)
	for i, w := range h.LostWrites {
		if i == shownLostWrites {
			line("      \t... %d more in the JSON report", len(h.LostWrites)-shownLostWrites)
			break
		}
		line("      %s\t%s rev %d, acknowledged at %.2f s: %s", w.Server, w.Object, w.Rev, w.ReturnSeconds, w.Reason)
	}
	if h.LinearizabilityResult == "" {
		line("    linearizable\t%s", verdict(h.Linearizable, h.LinearizabilityResult))
	} else {
		line("    linearizable\t%s (%s, %d operations checked)", verdict(h.Linearizable, h.LinearizabilityResult), h.LinearizabilityResult, h.CheckedOperations)
	}
}

// headline is what to see of a server at a glance, as in the plot's key.
func headline(s APIServer) string {
	if !s.BecameReady {
		return fmt.Sprintf("%d failed, never ready", s.Failed)
	}
	return fmt.Sprintf("%d failed, max write gap %s", s.Failed, ms(s.MaxWriteGapMs))
}

// classCounts is ": 2 MemberRemoved, 1 Timeout", or "" without failures.
func classCounts(cs []ClassCount) string {
	if len(cs) == 0 {
		return ""
	}
	parts := make([]string, 0, len(cs))
	for _, c := range cs {
		parts = append(parts, fmt.Sprintf("%d %s", c.Count, c.Class))
	}
	return ": " + strings.Join(parts, ", ")
}

// readiness is the /readyz line: first 200, the runs of 200, and the
// failures it did not show.
func readiness(s APIServer) string {
	if !s.BecameReady {
		return "never answered 200"
	}
	windows := make([]string, 0, len(s.ReadyWindows))
	for i, w := range s.ReadyWindows {
		if i == shownReadyWindows {
			windows = append(windows, fmt.Sprintf("... %d more", len(s.ReadyWindows)-shownReadyWindows))
			break
		}
		windows = append(windows, fmt.Sprintf("%.1f-%.1f s", w.FromSeconds, w.ToSeconds))
	}
	return fmt.Sprintf("first ready at %.2f s; 200 in %s; requests failed while it said 200: %d",
		s.FirstReadySeconds, strings.Join(windows, ", "), s.ReadyButFailing)
}

// writeEtcdCrashes prints the members' panics and fatal exits, aligned
// one under the other.
func writeEtcdCrashes(line lineFunc, crashes []string) {
	if len(crashes) == 0 {
		line("  etcd panics or fatal exits\tnone")
		return
	}
	line("  etcd panics or fatal exits\t%d", len(crashes))
	for _, c := range crashes {
		line("    \t%s", c)
	}
}
