package demo

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/druid-stretch/druid-stretch/internal/planner"
	"github.com/druid-stretch/druid-stretch/internal/sidecarcluster"
)

// StepEvent is one membership step a controller executed, as its executor
// reported it: once when the call starts (End zero) and once when it ends.
type StepEvent struct {
	// Cluster is the controller's cluster, "A" or "B".
	Cluster string
	Kind    planner.StepKind
	// Member is the name of the member the step acts on, ID its etcd ID
	// (empty for an AddLearner).
	Member, ID string
	Start, End time.Time
	// Outcome and Changed are the call's, set when it ended.
	Outcome sidecarcluster.Outcome
	Changed bool
}

// Done reports whether the event is the end of the call.
func (s StepEvent) Done() bool { return !s.End.IsZero() }

// Applied reports whether the step changed the cluster.
func (s StepEvent) Applied() bool {
	return s.Done() && s.Outcome == sidecarcluster.Succeeded && s.Changed
}

func (s StepEvent) String() string {
	verb := map[planner.StepKind]string{
		planner.AddLearner: "add learner", planner.Promote: "promote",
		planner.MoveLeader: "move leader to", planner.Remove: "remove",
	}[s.Kind]
	if verb == "" {
		verb = strings.ToLower(string(s.Kind))
	}
	return fmt.Sprintf("%s %s", verb, s.Member)
}

// stepLog collects the step events of both controllers and hands each to
// the listeners, in order, from the goroutine of the executor: a listener
// that must act before a step is sent (dropping a member from the client's
// endpoints before its removal) does so synchronously.
type stepLog struct {
	mu        sync.Mutex
	events    []StepEvent
	listeners []func(StepEvent)
}

func newStepLog() *stepLog { return &stepLog{} }

// listen adds a listener; the returned func removes it.
func (l *stepLog) listen(f func(StepEvent)) func() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.listeners = append(l.listeners, f)
	i := len(l.listeners) - 1
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.listeners[i] = nil
	}
}

func (l *stepLog) add(ev StepEvent) {
	l.mu.Lock()
	if ev.Done() {
		l.events = append(l.events, ev)
	}
	listeners := slices.Clone(l.listeners)
	l.mu.Unlock()
	for _, f := range listeners {
		if f != nil {
			f(ev)
		}
	}
}

// Steps are the steps that ended so far, in order: since the Env was
// made, so those of an Etcd that In scoped it to.
func (e *Env) Steps() []StepEvent {
	e.steps.mu.Lock()
	defer e.steps.mu.Unlock()
	var out []StepEvent
	for _, ev := range e.steps.events {
		if !ev.Start.Before(e.stepsSince) {
			out = append(out, ev)
		}
	}
	return out
}

// OnStep calls f for every step event of both controllers, at the start and
// at the end of each call, until the returned func is called. f runs on the
// executor's goroutine before the call is sent: keep it short.
func (e *Env) OnStep(f func(StepEvent)) (stop func()) { return e.steps.listen(f) }

// TieTracker measures the time the voters spend in a tie: no side holds a
// majority, so a cut between the sites would stop every write. The sidecar
// answers a promotion or a removal once etcd has applied it, and the answer
// is the call's last act, so a tie is timed from the return of the call
// that makes it to the return of the call that ends it: both ends late by
// the same few milliseconds of an answer on one machine.
type TieTracker struct {
	mu     sync.Mutex
	sideOf func(name string) string
	voters map[string]string // name -> side
	inTie  bool
	since  time.Time
	total  time.Duration
	ties   []Tie
}

// Tie is one stretch of time in a tie.
type Tie struct {
	Start, End time.Time
	// By and EndedBy are the steps that made and ended it.
	By, EndedBy string
}

// Duration is how long the tie lasted.
func (t Tie) Duration() time.Duration { return t.End.Sub(t.Start) }

// NewTieTracker starts from the given voters; sideOf places a member name
// on a side.
func NewTieTracker(voters []string, sideOf func(name string) string) *TieTracker {
	t := &TieTracker{sideOf: sideOf, voters: map[string]string{}}
	for _, v := range voters {
		t.voters[v] = sideOf(v)
	}
	return t
}

// Observe is a step listener.
func (t *TieTracker) Observe(ev StepEvent) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !ev.Applied() {
		return
	}
	switch ev.Kind {
	case planner.Promote:
		t.voters[ev.Member] = t.sideOf(ev.Member)
	case planner.Remove:
		delete(t.voters, ev.Member)
	default:
		return
	}
	tie := isTie(t.voters)
	switch {
	case tie && !t.inTie:
		t.inTie, t.since = true, ev.End
		t.ties = append(t.ties, Tie{Start: ev.End, By: ev.String()})
	case !tie && t.inTie:
		t.inTie = false
		t.total += ev.End.Sub(t.since)
		last := &t.ties[len(t.ties)-1]
		last.End, last.EndedBy = ev.End, ev.String()
	}
}

// Total is the time spent in ties so far, a tie under way counted to now.
func (t *TieTracker) Total() time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	d := t.total
	if t.inTie {
		d += time.Since(t.since)
	}
	return d
}

// Ties are the ties so far.
func (t *TieTracker) Ties() []Tie {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.ties)
}

// isTie reports whether voters on two or more sides leave every side
// without a majority.
func isTie(voters map[string]string) bool {
	counts := map[string]int{}
	for _, side := range voters {
		counts[side]++
	}
	if len(counts) < 2 {
		return false
	}
	for _, n := range counts {
		if 2*n > len(voters) {
			return false
		}
	}
	return true
}
