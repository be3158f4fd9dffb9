package workload

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestSummarizeCountsGapsAndPhases(t *testing.T) {
	g := NewWithT(t)
	h := NewHistory(nil)
	h.AddMark(Mark{At: 0, Name: "before", Phase: true})
	h.AddMark(Mark{At: ms(100), Name: "during", Phase: true})
	h.AddMark(Mark{At: ms(150), Name: "promote b-0"})
	h.AddMark(Mark{At: ms(300), Name: "after", Phase: true})
	var kv KeyValue
	rev := int64(1)
	// before: writes every 10 ms taking 2 ms.
	for call := 0; call < 100; call += 10 {
		rev++
		h.Record(write(0, "k", call, call+2, kv, fmt.Sprint("v", rev), Succeeded, rev, ""))
		kv = KeyValue{Value: fmt.Sprint("v", rev), Rev: rev}
	}
	// during: one slow write (a leader transfer), a conflict, a failure.
	rev++
	h.Record(write(0, "k", 100, 250, kv, "slow", Succeeded, rev, ""))
	kv = KeyValue{Value: "slow", Rev: rev}
	h.Record(write(1, "k", 260, 262, KeyValue{}, "lost-race", Conflict, rev, "slow"))
	h.Record(write(1, "k", 265, 290, kv, "gave-up", Failed, 0, ""))
	h.Record(read(2, "k", 270, 271, "slow", rev))
	// after: fast again.
	for call := 300; call < 400; call += 10 {
		rev++
		h.Record(write(0, "k", call, call+3, kv, fmt.Sprint("v", rev), Succeeded, rev, ""))
		kv = KeyValue{Value: fmt.Sprint("v", rev), Rev: rev}
	}
	h.Record(Op{Client: 2, Kind: Read, Key: "k", Call: ms(310), Return: ms(320), Outcome: Failed, Attempts: 3, Err: "etcdserver: request timed out"})

	f := Summarize(h)
	g.Expect(f.Writes).To(Equal(21))
	g.Expect(f.WriteConflicts).To(Equal(1))
	g.Expect(f.Reads).To(Equal(1))
	g.Expect(f.FailedWrites).To(Equal(1))
	g.Expect(f.FailedReads).To(Equal(1))
	g.Expect(f.FailedRequests).To(Equal(2))
	g.Expect(f.FailedErrors).To(Equal([]ErrorCount{{Message: "", Count: 1}, {Message: "etcdserver: request timed out", Count: 1}}))
	g.Expect(f.Retries).To(Equal(2))
	g.Expect(f.Duration).To(Equal(ms(393)))
	// The slow write ended at 250, the last "before" write at 92, the next at 303.
	g.Expect(f.MaxWriteGap).To(Equal(ms(158)))
	g.Expect(f.MaxWriteGapAt).To(Equal(ms(92)))
	g.Expect(f.Series).To(HaveLen(23))
	g.Expect(f.Series).To(ContainElement(Sample{At: ms(265), Latency: ms(25), OK: false}))
	g.Expect(f.Marks).To(HaveLen(4))

	g.Expect(f.Phases).To(HaveLen(3))
	before, during, after := f.Phases[0], f.Phases[1], f.Phases[2]
	g.Expect(before).To(Equal(PhaseFigures{
		Name: "before", Start: 0, End: ms(100), Writes: 10, MaxWriteGap: ms(10),
		WriteLatency: Latency{Count: 10, P50: ms(2), P99: ms(2), Max: ms(2)},
	}))
	g.Expect(during.Name).To(Equal("during"))
	g.Expect(during.Writes).To(Equal(1))
	g.Expect(during.Failed).To(Equal(1))
	// The stall began in "before" (last write at 92) and is cut at the phase start.
	g.Expect(during.MaxWriteGap).To(Equal(ms(150)))
	g.Expect(during.WriteLatency).To(Equal(Latency{Count: 2, P50: ms(2), P99: ms(150), Max: ms(150)}))
	g.Expect(after.Start).To(Equal(ms(300)))
	g.Expect(after.End).To(Equal(ms(393)))
	g.Expect(after.Writes).To(Equal(10))
	g.Expect(after.Failed).To(Equal(1))
	g.Expect(after.WriteLatency.P99).To(Equal(ms(3)))
	g.Expect(after.MaxWriteGap).To(Equal(ms(10)))
	g.Expect(f.WriteLatency.Count).To(Equal(22))
	g.Expect(f.WriteLatency.Max).To(Equal(ms(150)))
}

func TestPercentileIsNearestRank(t *testing.T) {
	g := NewWithT(t)
	var v []time.Duration
	for i := 1; i <= 200; i++ {
		v = append(v, ms(i))
	}
	g.Expect(Percentile(v, 50)).To(Equal(ms(100)))
	g.Expect(Percentile(v, 99)).To(Equal(ms(198)))
	g.Expect(Percentile(v[:1], 99)).To(Equal(ms(1)))
	g.Expect(Percentile(v[:3], 50)).To(Equal(ms(2)))
}

func TestIsTransient(t *testing.T) {
	tests := []struct {
		err       error
		transient bool
	}{
		{rpctypes.ErrGRPCLeaderChanged, true},
		{rpctypes.ErrGRPCNoLeader, true},
		{rpctypes.ErrGRPCTimeout, true},
		{rpctypes.ErrGRPCStopped, true},
		{rpctypes.ErrGRPCNotSupportedForLearner, true},
		{rpctypes.ErrTooManyRequests, true},
		{errors.New("raft proposal dropped"), true},
		{status.Error(codes.Unknown, "raft: stopped"), true},
		{context.DeadlineExceeded, true},
		{fmt.Errorf("attempt: %w", context.DeadlineExceeded), true},
		{rpctypes.ErrGRPCNoSpace, false},
		{rpctypes.ErrGRPCRequestTooLarge, false},
		{rpctypes.ErrGRPCPermissionDenied, false},
		{rpctypes.ErrGRPCCompacted, false},
		{nil, false},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.err), func(t *testing.T) {
			NewWithT(t).Expect(isTransient(tt.err)).To(Equal(tt.transient))
		})
	}
}

func TestOptionsAreChecked(t *testing.T) {
	tests := []struct {
		name string
		opts Options
		err  string
	}{
		{"no endpoint", Options{}, "Endpoints is empty"},
		{"empty endpoint", Options{Endpoints: []string{" "}}, "empty URL"},
		{"negative keys", Options{Endpoints: []string{"http://127.0.0.1:1"}, Keys: -1}, "Keys must not be negative"},
		{"negative timeout", Options{Endpoints: []string{"http://127.0.0.1:1"}, AttemptTimeout: -time.Second}, "AttemptTimeout must not be negative"},
		{"deadline below attempt", Options{Endpoints: []string{"http://127.0.0.1:1"}, AttemptTimeout: 2 * time.Second, RequestDeadline: time.Second}, "RequestDeadline (1s) is shorter than AttemptTimeout (2s)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			w, err := New(tt.opts)
			g.Expect(err).To(MatchError(ContainSubstring(tt.err)))
			g.Expect(w).To(BeNil())
		})
	}

	g := NewWithT(t)
	o, err := Options{Endpoints: []string{"http://127.0.0.1:1"}}.withDefaults()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(o.AttemptTimeout).To(Equal(time.Second))
	g.Expect(o.RequestDeadline).To(Equal(30 * time.Second))
	g.Expect(o.Keys).To(Equal(8))
	g.Expect(o.InitialPhase).To(Equal("before"))
}
