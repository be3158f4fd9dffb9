package workload

import (
	"fmt"
	"slices"
	"sync"
	"time"
)

// Kind says what a recorded operation did.
type Kind int

const (
	// Read is a linearizable Get of one key.
	Read Kind = iota
	// Write is one optimistic-concurrency update of one key, the way
	// kube-apiserver's GuaranteedUpdate does it:
	// Txn(If ModRevision(key) == ExpectedRev, Then Put(key, Value), Else Get(key)).
	Write
)

// String names the kind in messages.
func (k Kind) String() string {
	if k == Write {
		return "write"
	}
	return "read"
}

// Outcome is what the client learned about an operation.
type Outcome int

const (
	// Succeeded: a read returned a value, or a write was applied at Rev
	// (an acknowledged write).
	Succeeded Outcome = iota
	// Conflict: a write's compare failed; SeenValue/Rev is what the key held.
	// kube-apiserver treats this as "object modified" and tries again with
	// the fresh object, so it is not a failed request.
	Conflict
	// Failed: no definite answer before the request deadline. For a write
	// this is ambiguous: it may or may not have been applied, and the
	// linearizability check explores both.
	Failed
)

// String names the outcome in messages.
func (o Outcome) String() string {
	switch o {
	case Succeeded:
		return "ok"
	case Conflict:
		return "conflict"
	default:
		return "failed"
	}
}

// Op is one recorded client request: one GuaranteedUpdate transaction or one
// Get, including the transient-error retries the client made for it.
type Op struct {
	// Client is the goroutine that issued the request (porcupine's client id).
	Client int
	Kind   Kind
	Key    string
	// Call and Return are offsets on the workload's monotonic clock.
	// For a Failed op Return is when the client gave up; the write may still
	// be applied later, so the linearizability check treats it as open-ended.
	Call, Return time.Duration

	// ExpectedValue and ExpectedRev are the key's value and ModRevision the
	// writer believed current (its cache, like kube-apiserver's watch cache);
	// Value is the new value. Values are unique per write.
	ExpectedValue string
	ExpectedRev   int64
	Value         string

	Outcome Outcome
	// Rev is the key's ModRevision after an acknowledged write, or the
	// ModRevision of SeenValue for a read or a conflict (0: key absent).
	Rev int64
	// SeenValue is what a read or a conflicting write saw.
	SeenValue string
	// HeaderRev is the store revision etcd reported with the answer.
	HeaderRev int64
	// Attempts counts the RPC attempts (1 when no retry was needed).
	Attempts int
	// Err is the last error of a Failed op, or of the last retried attempt.
	Err string
	// Phase is the caller-named phase in force when the op was called.
	Phase string
}

// Latency is the time from call to answer.
func (o Op) Latency() time.Duration { return o.Return - o.Call }

// Acknowledged reports whether the client was told the write was applied.
func (o Op) Acknowledged() bool { return o.Kind == Write && o.Outcome == Succeeded }

// String describes the operation for logs and failure reports.
func (o Op) String() string {
	switch {
	case o.Kind == Read:
		return fmt.Sprintf("c%d read %s -> %q@%d (%s)", o.Client, o.Key, short(o.SeenValue), o.Rev, o.Outcome)
	case o.Outcome == Succeeded:
		return fmt.Sprintf("c%d write %s %q@%d -> %q@%d", o.Client, o.Key, short(o.ExpectedValue), o.ExpectedRev, short(o.Value), o.Rev)
	case o.Outcome == Conflict:
		return fmt.Sprintf("c%d write %s %q@%d -> conflict, saw %q@%d", o.Client, o.Key, short(o.ExpectedValue), o.ExpectedRev, short(o.SeenValue), o.Rev)
	default:
		return fmt.Sprintf("c%d write %s %q@%d -> %q ambiguous (%s)", o.Client, o.Key, short(o.ExpectedValue), o.ExpectedRev, short(o.Value), o.Err)
	}
}

// short trims the padding off generated values for messages.
func short(v string) string {
	for i := 0; i < len(v); i++ {
		if v[i] == '.' {
			return v[:i]
		}
	}
	return v
}

// KeyValue is a key's value and ModRevision (0 when the key is absent).
type KeyValue struct {
	Value string
	Rev   int64
}

// Mark is a caller-named point in time on the workload's clock: a phase
// start (MarkPhase) or an event such as a migration step (Mark).
type Mark struct {
	At    time.Duration
	Name  string
	Phase bool
}

// History is the record of a run: the state of the keys when it began,
// every operation, and the caller's marks. It is safe for concurrent use.
type History struct {
	mu      sync.Mutex
	initial map[string]KeyValue
	ops     []Op
	marks   []Mark
}

// NewHistory starts an empty history whose keys held initial when it began
// (keys not listed were absent).
func NewHistory(initial map[string]KeyValue) *History {
	h := &History{initial: make(map[string]KeyValue, len(initial))}
	for k, v := range initial {
		h.initial[k] = v
	}
	return h
}

// setInitial replaces the initial state (Start reads it after New made the
// history).
func (h *History) setInitial(initial map[string]KeyValue) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.initial = make(map[string]KeyValue, len(initial))
	for k, v := range initial {
		h.initial[k] = v
	}
}

// Record appends one finished operation.
func (h *History) Record(op Op) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, op)
}

// AddMark appends one mark.
func (h *History) AddMark(m Mark) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.marks = append(h.marks, m)
}

// Ops returns a copy of the operations in call order.
func (h *History) Ops() []Op {
	h.mu.Lock()
	ops := slices.Clone(h.ops)
	h.mu.Unlock()
	slices.SortStableFunc(ops, func(a, b Op) int { return compareDuration(a.Call, b.Call) })
	return ops
}

// Marks returns a copy of the marks in time order.
func (h *History) Marks() []Mark {
	h.mu.Lock()
	marks := slices.Clone(h.marks)
	h.mu.Unlock()
	slices.SortStableFunc(marks, func(a, b Mark) int { return compareDuration(a.At, b.At) })
	return marks
}

// Initial returns the state of a key when the history began.
func (h *History) Initial(key string) KeyValue {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.initial[key]
}

func compareDuration(a, b time.Duration) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
