package workload

import (
	"fmt"
	"math"
	"time"

	"github.com/anishathalye/porcupine"
)

// The model is a register per key holding (value, ModRevision), with
// compare-and-set on the ModRevision, as etcd serves kube-apiserver.
// The history is partitioned by key: keys are independent registers, so the
// history is linearizable if and only if every key's history is.

// unknownRev marks a register whose value came from an ambiguous write: the
// value is known, the revision it was written at is not (yet).
const unknownRev = -1

type registerState struct {
	// initial: the state has not been looked up yet; the partition's key is
	// only known at the first step, so the initial value is resolved there.
	initial bool
	Value   string
	Rev     int64
}

type modelInput struct {
	kind          Kind
	key           string
	expectedValue string
	expectedRev   int64
	value         string
}

type modelOutput struct {
	outcome Outcome
	value   string // read or conflict: the value seen
	rev     int64
}

// model builds the porcupine model for a history whose keys started at
// initial. Ambiguous writes make it nondeterministic (applied or not), so it
// is written as a NondeterministicModel.
func model(initial func(key string) KeyValue) porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Partition: partitionByKey,
		Init:      func() []interface{} { return []interface{}{registerState{initial: true}} },
		Step: func(state, input, output interface{}) []interface{} {
			s := state.(registerState)
			in := input.(modelInput)
			out := output.(modelOutput)
			if s.initial {
				kv := initial(in.key)
				s = registerState{Value: kv.Value, Rev: kv.Rev}
			}
			next := step(s, in, out)
			states := make([]interface{}, len(next))
			for i, n := range next {
				states[i] = n
			}
			return states
		},
		DescribeOperation: describeOperation,
		DescribeState: func(state interface{}) string {
			s := state.(registerState)
			switch {
			case s.initial:
				return "initial"
			case s.Rev == unknownRev:
				return fmt.Sprintf("%q@?", short(s.Value))
			}
			return fmt.Sprintf("%q@%d", short(s.Value), s.Rev)
		},
	}
	return nm.ToModel()
}

// step returns every state the register can be in after the operation, or
// none when the operation's answer is impossible from state s.
func step(s registerState, in modelInput, out modelOutput) []registerState {
	// A value identifies a write (values are unique), so when the revision is
	// unknown the value stands in for it.
	matchesExpected := s.Rev == in.expectedRev || (s.Rev == unknownRev && s.Value == in.expectedValue)
	// observe checks a (value, revision) answer against the register and
	// learns the revision of a value written ambiguously.
	observe := func(value string, rev int64) []registerState {
		if value != s.Value {
			return nil
		}
		if s.Rev == unknownRev {
			return []registerState{{Value: value, Rev: rev}}
		}
		if rev != s.Rev {
			return nil
		}
		return []registerState{s}
	}
	if in.kind == Read {
		return observe(out.value, out.rev)
	}
	switch out.outcome {
	case Succeeded:
		// etcd revisions only grow: an applied write lands above the value it replaced.
		if !matchesExpected || (s.Rev != unknownRev && out.rev <= s.Rev) {
			return nil
		}
		return []registerState{{Value: in.value, Rev: out.rev}}
	case Conflict:
		if matchesExpected {
			return nil
		}
		return observe(out.value, out.rev)
	default: // ambiguous: not applied, or applied at a revision nobody told us
		if matchesExpected {
			return []registerState{s, {Value: in.value, Rev: unknownRev}}
		}
		return []registerState{s}
	}
}

func describeOperation(input, output interface{}) string {
	in := input.(modelInput)
	out := output.(modelOutput)
	if in.kind == Read {
		return fmt.Sprintf("get(%s) -> %q@%d", in.key, short(out.value), out.rev)
	}
	cas := fmt.Sprintf("cas(%s, %q@%d -> %q)", in.key, short(in.expectedValue), in.expectedRev, short(in.value))
	switch out.outcome {
	case Succeeded:
		return fmt.Sprintf("%s -> ok@%d", cas, out.rev)
	case Conflict:
		return fmt.Sprintf("%s -> conflict %q@%d", cas, short(out.value), out.rev)
	}
	return cas + " -> ?"
}

func partitionByKey(history []porcupine.Operation) [][]porcupine.Operation {
	byKey := map[string][]porcupine.Operation{}
	var keys []string
	for _, op := range history {
		k := op.Input.(modelInput).key
		if _, ok := byKey[k]; !ok {
			keys = append(keys, k)
		}
		byKey[k] = append(byKey[k], op)
	}
	parts := make([][]porcupine.Operation, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, byKey[k])
	}
	return parts
}

// porcupineOperations turns the history into porcupine's form. A failed read
// says nothing about the store and is left out; a failed write stays in with
// an open end, because it may be applied at any time after its call.
func porcupineOperations(ops []Op) []porcupine.Operation {
	out := make([]porcupine.Operation, 0, len(ops))
	for _, op := range ops {
		if op.Kind == Read && op.Outcome == Failed {
			continue
		}
		ret := int64(op.Return)
		if op.Outcome == Failed {
			ret = math.MaxInt64
		}
		out = append(out, porcupine.Operation{
			ClientId: op.Client,
			Input: modelInput{
				kind: op.Kind, key: op.Key,
				expectedValue: op.ExpectedValue, expectedRev: op.ExpectedRev, value: op.Value,
			},
			Call:   int64(op.Call),
			Output: modelOutput{outcome: op.Outcome, value: op.SeenValue, rev: op.Rev},
			Return: ret,
		})
	}
	return out
}

// LinearizabilityInfo is the checker's verdict with what it needs to draw the
// history (porcupine's HTML visualization).
type LinearizabilityInfo struct {
	// Result is "Ok", "Illegal", or "Unknown" (the check timed out).
	Result porcupine.CheckResult
	// Operations is the number of operations checked.
	Operations int
	// Elapsed is how long the check took.
	Elapsed time.Duration

	model porcupine.Model
	info  porcupine.LinearizationInfo
}

// CheckLinearizable checks the history against the per-key register model.
// ok is true only for a definite "Ok"; a timeout gives ok false with Result
// "Unknown". timeout 0 means no limit.
func (h *History) CheckLinearizable(timeout time.Duration) (bool, LinearizabilityInfo) {
	m := model(h.Initial)
	ops := porcupineOperations(h.Ops())
	start := time.Now()
	res, info := porcupine.CheckOperationsVerbose(m, ops, timeout)
	return res == porcupine.Ok, LinearizabilityInfo{
		Result: res, Operations: len(ops), Elapsed: time.Since(start), model: m, info: info,
	}
}

// WriteVisualization writes porcupine's HTML drawing of the history and the
// longest linearizable prefix of each key to path; open it in a browser to
// see which operation could not be placed.
func (i LinearizabilityInfo) WriteVisualization(path string) error {
	if i.model.Init == nil {
		return fmt.Errorf("no linearizability check result to visualize")
	}
	if err := porcupine.VisualizePath(i.model, i.info, path); err != nil {
		return fmt.Errorf("writing linearizability visualization %s: %w", path, err)
	}
	return nil
}
