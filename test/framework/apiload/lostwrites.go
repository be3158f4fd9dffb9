package apiload

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/druid-stretch/druid-stretch/internal/testing/workload"
)

// LostWrite is an acknowledged write that the store does not hold.
type LostWrite struct {
	Server string `json:"server"`
	// Object is the ConfigMap's namespace/name.
	Object string `json:"object"`
	Value  string `json:"value"`
	// Rev is the resourceVersion the write was acknowledged with.
	Rev int64 `json:"rev"`
	// Call and Return are when the write was sent and acknowledged.
	Call   time.Duration `json:"callNs"`
	Return time.Duration `json:"returnNs"`
	// Reason says how the final state contradicts the write.
	Reason string `json:"reason"`
}

// lostWriteCheck is the verdict on every acknowledged write.
type lostWriteCheck struct {
	lost []lostOp
	// unverified counts acknowledged writes that could not be judged: the
	// object was not read at the end, or its history reaches a value no
	// write of the load explains before it gets back to the write.
	unverified int
}

type lostOp struct {
	op     workload.Op
	reason string
}

// checkLostWrites judges every acknowledged write of ops against the final
// state of its object, read through the API (no etcd access needed).
//
// Every write is a compare-and-swap on the object's revision, and values are
// unique, so the writes that the store applied form one chain per object:
// initial -> w1 -> w2 -> ... -> final, where each write's ExpectedRev (and
// ExpectedValue, taken from what the writer had observed) is the state it
// replaced. The check walks that chain backwards from the final state: the
// final value names the write that produced it (an acknowledged or an
// ambiguous one: a failed write may have been applied), that write names
// the state before it, and so on down to the initial state. Revisions must
// fall at each step back. An acknowledged write is held if and only if it is
// on the chain at the revision it was acknowledged with; any other
// acknowledged write was overwritten by something that never replaced it,
// or rolled back: lost. When the walk meets a value no write explains, the
// chain above that point is still exact (writes above it and not on it are
// lost), and writes below it are counted unverified rather than guessed.
//
// No false positives in a correct store: each applied CAS replaced exactly
// the state at its ExpectedRev, and the writer's ExpectedValue is the value
// it observed at that revision, so the walk retraces the applied writes.
func checkLostWrites(ops []workload.Op, initial func(key string) workload.KeyValue, final map[string]workload.KeyValue) lostWriteCheck {
	type keyWrites struct {
		byValue map[string]workload.Op // writes that may have been applied
		acked   []workload.Op
	}
	perKey := map[string]*keyWrites{}
	var keys []string
	for _, op := range ops {
		if op.Kind != workload.Write || op.Outcome == workload.Conflict {
			continue
		}
		kw := perKey[op.Key]
		if kw == nil {
			kw = &keyWrites{byValue: map[string]workload.Op{}}
			perKey[op.Key] = kw
			keys = append(keys, op.Key)
		}
		kw.byValue[op.Value] = op
		if op.Acknowledged() {
			kw.acked = append(kw.acked, op)
		}
	}
	slices.Sort(keys)

	var c lostWriteCheck
	for _, key := range keys {
		kw := perKey[key]
		end, read := final[key]
		if !read {
			c.unverified += len(kw.acked)
			continue
		}
		onChain, wrongRev, brokenAt := walkChain(kw.byValue, initial(key), end)
		for _, w := range kw.acked {
			switch {
			case onChain[w.Value]:
			case wrongRev[w.Value] != "":
				c.lost = append(c.lost, lostOp{w, wrongRev[w.Value]})
			case brokenAt != nil && w.Rev < brokenAt.Rev:
				c.unverified++
			case w.Rev > end.Rev:
				c.lost = append(c.lost, lostOp{w, fmt.Sprintf("acknowledged at revision %d, but the object is back at revision %d (%q)", w.Rev, end.Rev, end.Value)})
			default:
				c.lost = append(c.lost, lostOp{w, fmt.Sprintf("acknowledged at revision %d, but not on the chain of updates that leads to the final state %q@%d", w.Rev, end.Value, end.Rev)})
			}
		}
	}
	slices.SortFunc(c.lost, func(a, b lostOp) int { return cmp.Compare(a.op.Call, b.op.Call) })
	return c
}

// walkChain follows the chain of applied writes back from end to initial.
// onChain holds the values of the writes on it; wrongRev the acknowledged
// writes whose value is on it at another revision than acknowledged (with
// the reason); brokenAt is the state where the walk had to stop before
// reaching initial (nil when it got there).
func walkChain(writes map[string]workload.Op, initial, end workload.KeyValue) (onChain map[string]bool, wrongRev map[string]string, brokenAt *workload.KeyValue) {
	onChain, wrongRev = map[string]bool{}, map[string]string{}
	state := end
	for state != initial {
		w, ok := writes[state.Value]
		if !ok || w.ExpectedRev >= state.Rev {
			// A value none of our writes explains (or revisions not
			// falling: a rollback that reused them).
			broken := state
			return onChain, wrongRev, &broken
		}
		if w.Acknowledged() && w.Rev != state.Rev {
			wrongRev[w.Value] = fmt.Sprintf("acknowledged at revision %d, but the store holds its value at revision %d", w.Rev, state.Rev)
		} else {
			onChain[w.Value] = true
		}
		state = workload.KeyValue{Value: w.ExpectedValue, Rev: w.ExpectedRev}
	}
	return onChain, wrongRev, nil
}
