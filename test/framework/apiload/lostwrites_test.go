package apiload

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/druid-stretch/druid-stretch/internal/testing/workload"
)

const key = "ns/apiload-site-a-0"

var initialKV = workload.KeyValue{Value: "initial", Rev: 10}

func initialOf(string) workload.KeyValue { return initialKV }

// write forges one recorded Update: expected is what the writer believed
// current; rev is the acknowledged resourceVersion (acknowledged writes).
func write(client, call int, expected workload.KeyValue, value string, outcome workload.Outcome, rev int64) workload.Op {
	return workload.Op{
		Client: client, Kind: workload.Write, Key: key,
		Call: time.Duration(call) * time.Millisecond, Return: time.Duration(call+5) * time.Millisecond,
		ExpectedValue: expected.Value, ExpectedRev: expected.Rev, Value: value, Outcome: outcome, Rev: rev,
	}
}

func kv(value string, rev int64) workload.KeyValue { return workload.KeyValue{Value: value, Rev: rev} }

func TestCheckLostWrites(t *testing.T) {
	ok, failed := workload.Succeeded, workload.Failed
	// a, b acknowledged in a row; c ambiguous on top of b.
	chain := []workload.Op{
		write(0, 0, initialKV, "a", ok, 11),
		write(1, 10, kv("a", 11), "b", ok, 12),
		write(0, 20, kv("b", 12), "c", failed, 0),
	}
	for _, tc := range []struct {
		name       string
		ops        []workload.Op
		final      map[string]workload.KeyValue
		lost       []string
		unverified int
	}{
		{name: "final is the last acknowledged write", ops: chain[:2], final: map[string]workload.KeyValue{key: kv("b", 12)}},
		{name: "an ambiguous write applied after it", ops: chain, final: map[string]workload.KeyValue{key: kv("c", 13)}},
		{name: "an ambiguous write never applied", ops: chain, final: map[string]workload.KeyValue{key: kv("b", 12)}},
		{
			// x was acknowledged on top of b, yet the final state
			// descends from b through y: nothing ever replaced x.
			name: "forged lost write, overwritten by a write that did not see it",
			ops: append(chain[:2:2],
				write(2, 30, kv("b", 12), "x", ok, 13),
				write(3, 40, kv("b", 12), "y", failed, 0)),
			final: map[string]workload.KeyValue{key: kv("y", 14)},
			lost:  []string{"x"},
		},
		{name: "rolled back", ops: chain[:2], final: map[string]workload.KeyValue{key: kv("a", 11)}, lost: []string{"b"}},
		{name: "object gone", ops: chain[:2], final: map[string]workload.KeyValue{key: {}}, lost: []string{"a", "b"}},
		{name: "value held at another revision", ops: chain[:2], final: map[string]workload.KeyValue{key: kv("b", 15)}, lost: []string{"b"}},
		{
			// d is a value no write of the load made: b below it cannot
			// be judged, e above it was acknowledged and overwritten.
			name: "foreign value",
			ops: append(chain[:2:2],
				write(2, 30, kv("d", 14), "e", ok, 15),
				write(2, 40, kv("d", 14), "f", failed, 0)),
			final:      map[string]workload.KeyValue{key: kv("f", 16)},
			lost:       []string{"e"},
			unverified: 2,
		},
		{name: "not read at the end", ops: chain, final: map[string]workload.KeyValue{}, unverified: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			c := checkLostWrites(tc.ops, initialOf, tc.final)
			var lost []string
			for _, l := range c.lost {
				lost = append(lost, l.op.Value)
				g.Expect(l.reason).NotTo(BeEmpty())
			}
			g.Expect(lost).To(Equal(tc.lost))
			g.Expect(c.unverified).To(Equal(tc.unverified))
		})
	}
}

// TestForgedLostWriteIsNotLinearizable checks that porcupine agrees with
// the explicit count on the forged lost write, once the final read is in
// the history.
func TestForgedLostWriteIsNotLinearizable(t *testing.T) {
	g := NewWithT(t)
	h := workload.NewHistory(map[string]workload.KeyValue{key: initialKV})
	for _, op := range []workload.Op{
		write(0, 0, initialKV, "a", workload.Succeeded, 11),
		write(1, 10, kv("a", 11), "x", workload.Succeeded, 12),
		write(2, 20, kv("a", 11), "y", workload.Failed, 0),
		{Client: 3, Kind: workload.Read, Key: key, Call: 100 * time.Millisecond, Return: 101 * time.Millisecond, SeenValue: "y", Rev: 13},
	} {
		h.Record(op)
	}
	ok, _ := h.CheckLinearizable(time.Minute)
	g.Expect(ok).To(BeFalse())
	g.Expect(checkLostWrites(h.Ops(), h.Initial, map[string]workload.KeyValue{key: kv("y", 13)}).lost).To(HaveLen(1))
}
