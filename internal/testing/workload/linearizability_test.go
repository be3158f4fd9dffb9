package workload

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

// ms turns milliseconds into the history clock.
func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func write(client int, key string, call, ret int, expected KeyValue, value string, outcome Outcome, rev int64, seen string) Op {
	return Op{
		Client: client, Kind: Write, Key: key, Call: ms(call), Return: ms(ret),
		ExpectedValue: expected.Value, ExpectedRev: expected.Rev, Value: value,
		Outcome: outcome, Rev: rev, SeenValue: seen, Attempts: 1,
	}
}

func read(client int, key string, call, ret int, seen string, rev int64) Op {
	return Op{Client: client, Kind: Read, Key: key, Call: ms(call), Return: ms(ret), SeenValue: seen, Rev: rev, Outcome: Succeeded, Attempts: 1}
}

func TestCheckLinearizableTellsHistoriesApart(t *testing.T) {
	none := KeyValue{}
	a1 := KeyValue{Value: "a1", Rev: 5}
	tests := []struct {
		name         string
		initial      map[string]KeyValue
		ops          []Op
		linearizable bool
	}{
		{
			name: "sequential writes and reads",
			ops: []Op{
				write(0, "k", 0, 10, none, "a1", Succeeded, 5, ""),
				read(1, "k", 11, 20, "a1", 5),
				write(0, "k", 21, 30, a1, "a2", Succeeded, 9, ""),
				read(1, "k", 31, 40, "a2", 9),
			},
			linearizable: true,
		},
		{
			name: "a concurrent read may see the old or the new value",
			ops: []Op{
				write(0, "k", 0, 10, none, "a1", Succeeded, 5, ""),
				write(0, "k", 20, 40, a1, "a2", Succeeded, 9, ""),
				read(1, "k", 25, 30, "a2", 9),
				read(2, "k", 26, 35, "a1", 5),
			},
			linearizable: true, // a1 read linearizes before the write, a2 read after
		},
		{
			name: "a read after an acknowledged write sees an older value",
			ops: []Op{
				write(0, "k", 0, 10, none, "a1", Succeeded, 5, ""),
				write(0, "k", 20, 30, a1, "a2", Succeeded, 9, ""),
				read(1, "k", 31, 40, "a1", 5),
			},
			linearizable: false,
		},
		{
			name: "two compare-and-sets on the same revision both succeed",
			ops: []Op{
				write(0, "k", 0, 10, none, "a1", Succeeded, 5, ""),
				write(0, "k", 20, 30, a1, "a2", Succeeded, 9, ""),
				write(1, "k", 21, 31, a1, "b1", Succeeded, 10, ""),
			},
			linearizable: false,
		},
		{
			name: "a conflict reports the value that was there",
			ops: []Op{
				write(0, "k", 0, 10, none, "a1", Succeeded, 5, ""),
				write(1, "k", 20, 30, none, "b1", Conflict, 5, "a1"),
			},
			linearizable: true,
		},
		{
			name: "a conflict although the expected revision was current",
			ops: []Op{
				write(0, "k", 0, 10, none, "a1", Succeeded, 5, ""),
				write(1, "k", 20, 30, a1, "b1", Conflict, 5, "a1"),
			},
			linearizable: false,
		},
		{
			name: "an ambiguous write that was applied is seen later",
			ops: []Op{
				write(0, "k", 0, 10, none, "a1", Succeeded, 5, ""),
				write(0, "k", 20, 1000, a1, "a2", Failed, 0, ""),
				read(1, "k", 2000, 2010, "a2", 12),
				write(1, "k", 2020, 2030, KeyValue{Value: "a2", Rev: 12}, "b1", Succeeded, 13, ""),
			},
			linearizable: true,
		},
		{
			name: "an ambiguous write that was not applied",
			ops: []Op{
				write(0, "k", 0, 10, none, "a1", Succeeded, 5, ""),
				write(0, "k", 20, 1000, a1, "a2", Failed, 0, ""),
				read(1, "k", 2000, 2010, "a1", 5),
			},
			linearizable: true,
		},
		{
			name: "a read sees a value nobody wrote",
			ops: []Op{
				write(0, "k", 0, 10, none, "a1", Succeeded, 5, ""),
				read(1, "k", 20, 30, "zz", 7),
			},
			linearizable: false,
		},
		{
			name: "a write acknowledged at a revision below the value it replaced",
			ops: []Op{
				write(0, "k", 0, 10, none, "a1", Succeeded, 5, ""),
				write(0, "k", 20, 30, a1, "a2", Succeeded, 4, ""),
			},
			linearizable: false,
		},
		{
			name:    "the initial state comes from the history",
			initial: map[string]KeyValue{"k": {Value: "old", Rev: 3}},
			ops: []Op{
				read(1, "k", 0, 5, "old", 3),
				write(0, "k", 6, 10, KeyValue{Value: "old", Rev: 3}, "a1", Succeeded, 5, ""),
			},
			linearizable: true,
		},
		{
			name: "a stale read of one key is caught among other keys",
			ops: []Op{
				write(0, "k", 0, 10, none, "a1", Succeeded, 5, ""),
				write(1, "j", 0, 10, none, "b1", Succeeded, 6, ""),
				read(2, "j", 20, 30, "b1", 6),
				read(2, "k", 20, 30, "", 0),
			},
			linearizable: false,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			h := NewHistory(tt.initial)
			for _, op := range tt.ops {
				h.Record(op)
			}
			ok, info := h.CheckLinearizable(5 * time.Second)
			g.Expect(ok).To(Equal(tt.linearizable), "porcupine said %s", info.Result)
			g.Expect(info.Operations).To(Equal(len(tt.ops)))
		})
	}
}

func TestWriteVisualizationOfAnIllegalHistory(t *testing.T) {
	g := NewWithT(t)
	h := NewHistory(nil)
	h.Record(write(0, "k", 0, 10, KeyValue{}, "a1", Succeeded, 5, ""))
	h.Record(read(1, "k", 20, 30, "", 0))
	ok, info := h.CheckLinearizable(time.Second)
	g.Expect(ok).To(BeFalse())

	path := filepath.Join(t.TempDir(), "history.html")
	g.Expect(info.WriteVisualization(path)).To(Succeed())
	html, err := os.ReadFile(path)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(html)).To(ContainSubstring("<html"))
	g.Expect(string(html)).To(ContainSubstring(`cas(k`))

	g.Expect(LinearizabilityInfo{}.WriteVisualization(path)).To(MatchError(ContainSubstring("no linearizability check result")))
}

func TestFailedReadsAreLeftOutOfTheCheck(t *testing.T) {
	g := NewWithT(t)
	h := NewHistory(nil)
	h.Record(write(0, "k", 0, 10, KeyValue{}, "a1", Succeeded, 5, ""))
	h.Record(Op{Client: 1, Kind: Read, Key: "k", Call: ms(20), Return: ms(30), Outcome: Failed, Err: "timeout"})
	ok, info := h.CheckLinearizable(time.Second)
	g.Expect(ok).To(BeTrue())
	g.Expect(info.Operations).To(Equal(1))
}

func TestOpStringNamesTheOutcome(t *testing.T) {
	g := NewWithT(t)
	g.Expect(write(0, "k", 0, 1, KeyValue{}, "w0-1......", Succeeded, 5, "").String()).To(Equal(`c0 write k ""@0 -> "w0-1"@5`))
	g.Expect(write(0, "k", 0, 1, KeyValue{}, "w0-1.", Failed, 0, "").String()).To(ContainSubstring("ambiguous"))
	g.Expect(strings.Contains(read(1, "k", 0, 1, "w0-1.", 5).String(), `"w0-1"@5`)).To(BeTrue())
}
