package apiload

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"k8s.io/client-go/rest"

	"github.com/druid-stretch/druid-stretch/internal/testing/workload"
)

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func TestReadyButFailing(t *testing.T) {
	g := NewWithT(t)
	series := []ReadyzSample{
		{At: ms(0), Code: 0}, {At: ms(200), Code: 200}, {At: ms(400), Code: 200},
		{At: ms(600), Code: 500}, {At: ms(800), Code: 200}, {At: ms(1000), Code: 200}, {At: ms(1200), Code: 200},
	}
	ready := readyWindows(series)
	g.Expect(ready).To(Equal([]Window{{From: ms(200), To: ms(400)}, {From: ms(800), To: ms(1200)}}))

	fail := func(call, ret int) Request {
		return Request{Kind: workload.Write, Call: ms(call), Return: ms(ret), Outcome: workload.Failed, Class: MemberRemoved}
	}
	reqs := []Request{
		fail(50, 60),   // before the first 200: not ready
		fail(300, 301), // ready
		fail(500, 510), // between a 200 and a 500: unknown, not counted
		{Kind: workload.Write, Call: ms(850), Return: ms(851)}, // acknowledged
		fail(900, 905), fail(950, 1100), fail(1190, 1250), // one stretch of failures while ready
	}
	n, windows := readyButFailing(reqs, ready, ms(200))
	g.Expect(n).To(Equal(4))
	g.Expect(windows).To(Equal([]FailingWindow{
		{Window: Window{From: ms(300), To: ms(301)}, Failed: 1},
		{Window: Window{From: ms(900), To: ms(1200)}, Failed: 3},
	}))
}

func TestSummarizeCountsFromFirstReadiness(t *testing.T) {
	g := NewWithT(t)
	ack := func(call, ret int) Request {
		return Request{Kind: workload.Write, Call: ms(call), Return: ms(ret), Outcome: workload.Succeeded, Code: 200}
	}
	reqs := []Request{
		ack(3000, 3010), ack(3020, 3030),
		{Kind: workload.Write, Call: ms(3040), Return: ms(3045), Outcome: workload.Conflict, Code: 409},
		{Kind: workload.Read, Call: ms(3050), Return: ms(3052), Code: 200},
		{Kind: workload.Read, Call: ms(3100), Return: ms(3200), Outcome: workload.Failed, Class: Timeout, Err: "etcdserver: request timed out"},
		{Kind: workload.Write, Call: ms(3100), Return: ms(3200), Outcome: workload.Failed, Class: Timeout, Err: "etcdserver: request timed out"},
		{Kind: workload.Write, Call: ms(3300), Return: ms(3301), Outcome: workload.Failed, Class: ProposalDropped, Err: "etcdserver: raft proposal dropped"},
		ack(3400, 3500),
	}
	phases := []Mark{{At: 0, Name: "before", Phase: true}, {At: ms(3100), Name: "during", Phase: true}}
	f := summarize("site-b", reqs, true, ms(1000), ms(500), ms(4000), ms(4000), phases)
	g.Expect(f.Writes).To(Equal(3))
	g.Expect(f.Conflicts).To(Equal(1))
	g.Expect(f.Reads).To(Equal(1))
	g.Expect(f.Failed).To(Equal(3))
	g.Expect(f.FailedByClass).To(Equal([]ClassCount{{Timeout, 2}, {ProposalDropped, 1}}))
	g.Expect(f.FailedErrors[0]).To(Equal(ErrorCount{Message: "etcdserver: request timed out", Count: 2}))
	// Ready at 1 s, first acknowledged write at 3.01 s.
	g.Expect(f.MaxWriteGap).To(Equal(ms(2010)))
	g.Expect(f.MaxWriteGapAt).To(Equal(ms(1000)))
	g.Expect(f.WriteLatency).To(Equal(Latency{Count: 4, P50: ms(10), P99: ms(100), Max: ms(100)}))
	g.Expect(f.Phases).To(HaveLen(2))
	g.Expect(f.Phases[1]).To(Equal(PhaseFigures{
		Name: "during", Start: ms(3100), End: ms(4000), Writes: 1, Failed: 3,
		MaxWriteGap: ms(500), WriteLatency: Latency{Count: 1, P50: ms(100), P99: ms(100), Max: ms(100)},
	}))
	g.Expect(f.String()).To(Equal("site-b: 3 writes, 1 reads, 3 failed (2 Timeout, 1 ProposalDropped), 1 conflicts, max write gap 2.01 s from 1.0 s, ready from 1.0 s"))

	// The load's own start (creating its objects after the first
	// readiness) is no gap of the server's: counted from 2.5 s, when the
	// writers started, the longest gap is the 0.51 s to the first write.
	late := summarize("site-b", reqs, true, ms(1000), ms(2500), ms(4000), ms(4000), phases)
	g.Expect(late.MaxWriteGap).To(Equal(ms(510)))
	g.Expect(late.MaxWriteGapAt).To(Equal(ms(2500)))
	g.Expect(late.FirstReady).To(Equal(ms(1000)), "readiness is reported as it was")

	never := summarize("site-c", nil, false, 0, ms(500), ms(4000), ms(4000), phases)
	g.Expect(never.MaxWriteGap).To(BeZero())
	g.Expect(never.String()).To(Equal("site-c: 0 writes, 0 reads, 0 failed, max write gap 0.00 s, never ready"))
}

func TestOptionsNameTheFieldAtFault(t *testing.T) {
	cfg := &rest.Config{Host: "https://127.0.0.1:6443"}
	for _, tc := range []struct {
		name string
		opts Options
		want string
	}{
		{"no servers", Options{}, "Servers is empty"},
		{"unnamed", Options{Servers: []Server{{Config: cfg}}}, "Servers[0].Name is empty"},
		{"bad name", Options{Servers: []Server{{Name: "Site_A", Config: cfg}}}, "Servers[0].Name \"Site_A\" is not a DNS-1123 label"},
		{"twice", Options{Servers: []Server{{Name: "a", Config: cfg}, {Name: "a", Config: cfg}}}, "Servers[1].Name \"a\" is used twice"},
		{"no config", Options{Servers: []Server{{Name: "a"}}}, "Servers[0].Config is nil"},
		{"namespace", Options{Servers: []Server{{Name: "a", Config: cfg}}, Namespace: "No"}, "Namespace \"No\""},
		{"writers", Options{Servers: []Server{{Name: "a", Config: cfg}}, Writers: -1}, "Writers must not be negative"},
		{"interval", Options{Servers: []Server{{Name: "a", Config: cfg}}, Interval: -time.Second}, "Interval must not be negative"},
		{"qps", Options{Servers: []Server{{Name: "a", Config: cfg}}, QPS: -1}, "QPS must not be negative"},
		{"empty check", Options{Servers: []Server{{Name: "a", Config: cfg}}, ReadyzExclude: []string{""}}, "ReadyzExclude[0] \"\" is not the name of a /readyz check"},
		{"query in a check", Options{Servers: []Server{{Name: "a", Config: cfg}}, ReadyzExclude: []string{RBACBootstrapCheck, "etcd&verbose"}}, "ReadyzExclude[1] \"etcd&verbose\""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.opts)
			NewWithT(t).Expect(err).To(MatchError(ContainSubstring(tc.want)))
		})
	}
	g := NewWithT(t)
	o, err := Options{Servers: []Server{{Name: "a", Config: cfg}}}.withDefaults()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(o.ObjectsPerServer).To(Equal(4))
	g.Expect([]int{o.Writers, o.Readers, o.Burst}).To(Equal([]int{4, 2, 1000}))
	g.Expect(o.QPS).To(BeEquivalentTo(1000))
	g.Expect([]time.Duration{o.Interval, o.RequestTimeout, o.ReadyzInterval}).To(Equal([]time.Duration{20 * time.Millisecond, 30 * time.Second, 200 * time.Millisecond}))
}

func TestReadyzPathLeavesOutTheChecksNamed(t *testing.T) {
	g := NewWithT(t)
	g.Expect(ReadyzPath(nil)).To(Equal("/readyz"))
	g.Expect(ReadyzPath([]string{RBACBootstrapCheck})).To(Equal("/readyz?exclude=poststarthook%2Frbac%2Fbootstrap-roles"))
	g.Expect(ReadyzPath([]string{"etcd", RBACBootstrapCheck})).To(Equal("/readyz?exclude=etcd&exclude=poststarthook%2Frbac%2Fbootstrap-roles"))
}
