package report

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/druid-stretch/druid-stretch/internal/testing/workload"
	"github.com/druid-stretch/druid-stretch/test/framework/apiload"
)

// apiResults are two kube-apiservers' figures: site-a's clients fail three
// requests around a member removal and are switched to site-b at 58 s.
func apiResults() apiload.Results {
	return apiload.Results{
		StartedAt: figures().StartedAt.Add(2 * time.Second),
		Duration:  80 * time.Second,
		Servers: []apiload.ServerFigures{
			{
				Name: "site-a", Writes: 1200, Conflicts: 40, Reads: 300,
				Failed: 3, FailedWrites: 2, FailedReads: 1,
				FailedByClass: []apiload.ClassCount{{Class: apiload.MemberRemoved, Count: 2}, {Class: apiload.Timeout, Count: 1}},
				FailedErrors: []apiload.ErrorCount{
					{Message: "etcdserver: server stopped", Count: 2},
					{Message: "the server was unable to return a response in the time allotted", Count: 1},
				},
				MaxWriteGap: msec(1210), MaxWriteGapAt: msec(40000),
				WriteLatency: apiload.Latency{Count: 1240, P50: msec(4), P99: msec(220), Max: msec(1100)},
				BecameReady:  true, FirstReady: msec(500),
				Ready: []apiload.Window{{From: msec(500), To: msec(44000)}, {From: msec(46000), To: msec(79000)}},
				Readyz: []apiload.ReadyzSample{
					{At: msec(0), Code: 0}, {At: msec(500), Code: 200}, {At: msec(44000), Code: 200},
					{At: msec(45000), Code: 500}, {At: msec(46000), Code: 200}, {At: msec(79000), Code: 200},
				},
				ReadyButFailing:        1,
				ReadyButFailingWindows: []apiload.FailingWindow{{Window: apiload.Window{From: msec(40000), To: msec(41000)}, Failed: 1}},
				SwitchedTo:             "site-b", SwitchedAt: msec(58000),
			},
			{
				Name: "site-b", Writes: 900, Reads: 200,
				MaxWriteGap: msec(120), MaxWriteGapAt: msec(61000),
				WriteLatency: apiload.Latency{Count: 900, P50: msec(5), P99: msec(30), Max: msec(120)},
				BecameReady:  true, FirstReady: msec(30000),
				Ready:  []apiload.Window{{From: msec(30000), To: msec(79500)}},
				Readyz: []apiload.ReadyzSample{{At: msec(29000), Code: 503}, {At: msec(30000), Code: 200}, {At: msec(79500), Code: 200}},
			},
		},
		Linearizable: true, LinearizabilityResult: "Ok", CheckedOperations: 2640,
		UnverifiedWrites: 2,
		Marks: []apiload.Mark{
			{At: 0, Name: "before", Phase: true},
			{At: msec(12000), Name: "promote seed-b-etcd-main-3"},
			{At: msec(58000), Name: "switch site-a to site-b"},
			{At: msec(70000), Name: "after", Phase: true},
		},
	}
}

// jsonDoc marshals v and decodes it generically, to see the keys a script
// sees.
func jsonDoc(g Gomega, v any) map[string]any {
	b, err := json.Marshal(v)
	g.Expect(err).NotTo(HaveOccurred())
	var doc map[string]any
	g.Expect(json.Unmarshal(b, &doc)).To(Succeed())
	return doc
}

func TestAddKubeAPIServersShiftsTheLoadOntoTheReportsClock(t *testing.T) {
	g := NewWithT(t)
	r := FromFigures(figures())
	res := apiResults()
	offset := res.StartedAt.Sub(r.StartedAt)
	g.Expect(offset).To(Equal(2 * time.Second))
	r.AddKubeAPIServers(res, offset)

	path := filepath.Join(t.TempDir(), "report.json")
	g.Expect(r.WriteJSON(path)).To(Succeed())
	raw, err := os.ReadFile(path)
	g.Expect(err).NotTo(HaveOccurred())
	var doc map[string]any
	g.Expect(json.Unmarshal(raw, &doc)).To(Succeed())

	g.Expect(doc["kubeAPIServers"]).To(HaveLen(2))
	a := doc["kubeAPIServers"].([]any)[0].(map[string]any)
	for key, want := range map[string]float64{
		"writes": 1200, "conflicts": 40, "reads": 300, "failed": 3, "failedWrites": 2, "failedReads": 1,
		"maxWriteGapMs": 1210, "maxWriteGapAtSeconds": 42, "p50WriteMs": 4, "p99WriteMs": 220, "maxWriteMs": 1100,
		"firstReadySeconds": 2.5, "readyButFailing": 1, "switchedAtSeconds": 60,
	} {
		g.Expect(a).To(HaveKeyWithValue(key, BeNumerically("==", want)), key)
	}
	g.Expect(a).To(HaveKeyWithValue("name", "site-a"))
	g.Expect(a).To(HaveKeyWithValue("becameReady", true))
	g.Expect(a).To(HaveKeyWithValue("switchedTo", "site-b"))
	g.Expect(a["failedByClass"]).To(Equal([]any{
		map[string]any{"class": "MemberRemoved", "count": 2.0},
		map[string]any{"class": "Timeout", "count": 1.0},
	}))
	g.Expect(a["failedErrors"]).To(ContainElement(map[string]any{"message": "etcdserver: server stopped", "count": 2.0}))
	g.Expect(a["readyWindows"]).To(Equal([]any{
		map[string]any{"fromSeconds": 2.5, "toSeconds": 46.0},
		map[string]any{"fromSeconds": 48.0, "toSeconds": 81.0},
	}))

	b := doc["kubeAPIServers"].([]any)[1].(map[string]any)
	g.Expect(b).NotTo(HaveKey("switchedTo"), "a server whose clients stayed has no switch")
	g.Expect(b).NotTo(HaveKey("switchedAtSeconds"))
	g.Expect(b).To(HaveKeyWithValue("failedByClass", BeEmpty()))
	g.Expect(b).To(HaveKeyWithValue("failedErrors", BeEmpty()))

	g.Expect(doc["apiHistory"]).To(Equal(map[string]any{
		"lostAcknowledgedWrites": 0.0, "lostWrites": []any{}, "unverifiedWrites": 2.0,
		"linearizable": true, "linearizabilityResult": "Ok", "checkedOperations": 2640.0,
	}))
	g.Expect(doc).To(HaveKeyWithValue("etcdCrashes", BeEmpty()))
	g.Expect(doc).To(HaveKeyWithValue("writes", BeNumerically("==", 4000)), "the own client's figures stay")
	g.Expect(doc["steps"]).To(HaveLen(2), "the load's marks are not added to the workload's steps")

	back, err := ReadJSON(path)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(back).To(Equal(r))
}

func TestLostWritesAreShifted(t *testing.T) {
	g := NewWithT(t)
	res := apiResults()
	res.LostAcknowledgedWrites = 1
	res.LostWrites = []apiload.LostWrite{{
		Server: "site-a", Object: "move/cm-3", Value: "v9", Rev: 812,
		Call: msec(40000), Return: msec(40100), Reason: "final value is v8 (rev 810)",
	}}
	var r Report
	r.AddKubeAPIServers(res, -time.Second)
	g.Expect(r.APIHistory.LostWrites).To(Equal([]LostWrite{{
		Server: "site-a", Object: "move/cm-3", Value: "v9", Rev: 812,
		CallSeconds: 39, ReturnSeconds: 39.1, Reason: "final value is v8 (rev 810)",
	}}))
	g.Expect(strings.Join(strings.Fields(r.String()), " ")).To(ContainSubstring(
		"lost acknowledged writes 1 (2 writes unverifiable) site-a move/cm-3 rev 812, acknowledged at 39.10 s: final value is v8 (rev 810)"))
}

func TestFromAPILoadIsOnTheLoadsClock(t *testing.T) {
	g := NewWithT(t)
	res := apiResults()
	r := FromAPILoad(res)
	g.Expect(r.StartedAt).To(Equal(res.StartedAt))
	g.Expect(r.DurationSeconds).To(Equal(80.0))
	g.Expect(r.Steps).To(Equal([]Step{
		{Name: "promote seed-b-etcd-main-3", AtSeconds: 12, At: res.StartedAt.Add(12 * time.Second)},
		{Name: "switch site-a to site-b", AtSeconds: 58, At: res.StartedAt.Add(58 * time.Second)},
	}), "events become steps, phases do not")
	g.Expect(r.KubeAPIServers).To(HaveLen(2))
	g.Expect(r.KubeAPIServers[0].MaxWriteGapAtSeconds).To(Equal(40.0), "no offset")
	g.Expect(r.KubeAPIServers[0].SwitchedAtSeconds).To(Equal(58.0))
	g.Expect(r.APIHistory.CheckedOperations).To(Equal(2640))

	// The own client's figures added afterwards land on the load's clock.
	f := figures()
	r.AddOwnClient(f, f.StartedAt.Sub(r.StartedAt))
	g.Expect(r.MaxWriteGapAtSeconds).To(Equal(18.5))
	g.Expect(r.Phases[1].StartSeconds).To(Equal(8.0))
	g.Expect(r.Writes).To(Equal(4000))
	g.Expect(r.Steps).To(HaveLen(2), "the workload's marks are not added")
}

func TestEmptyKubeAPIServerListsStayLists(t *testing.T) {
	tests := []struct {
		name string
		r    Report
	}{
		{"from an empty load", FromAPILoad(apiload.Results{})},
		{"from empty figures", FromFigures(workload.Figures{})},
		{"built by hand, crashes set to nil", Report{EtcdCrashes: nil}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			b, err := json.Marshal(tt.r)
			g.Expect(err).NotTo(HaveOccurred())
			for _, key := range []string{"kubeAPIServers", "etcdCrashes", "phases", "steps"} {
				g.Expect(string(b)).To(ContainSubstring(`"`+key+`":[]`), key)
			}
		})
	}

	g := NewWithT(t)
	doc := jsonDoc(g, FromAPILoad(apiload.Results{Servers: []apiload.ServerFigures{{Name: "site-a"}}}))
	g.Expect(doc["kubeAPIServers"]).To(ConsistOf(And(
		HaveKeyWithValue("failedByClass", []any{}),
		HaveKeyWithValue("failedErrors", []any{}),
		HaveKeyWithValue("readyWindows", []any{}),
		HaveKeyWithValue("becameReady", false),
		HaveKeyWithValue("firstReadySeconds", 0.0),
	)))
	g.Expect(doc["apiHistory"]).To(HaveKeyWithValue("lostWrites", []any{}))
	g.Expect(jsonDoc(g, FromFigures(figures()))).NotTo(HaveKey("apiHistory"), "no kube-apiserver clients, no verdict on them")
}

func TestKubeAPIServerText(t *testing.T) {
	g := NewWithT(t)
	r := FromFigures(figures())
	r.Title = "live move A -> B"
	r.MigrationSeconds, r.TieSeconds, r.NoLeaderSeconds, r.RTTMs = 19.5, 0.82, 0.1, 180
	res := apiResults()
	r.AddKubeAPIServers(res, res.StartedAt.Sub(r.StartedAt))
	r.EtcdCrashes = []string{"shoot--dev--move_etcd-main-0_uid: panic: runtime error: invalid memory address"}
	t.Logf("rendered:\n%s", r)

	words := func(r Report) string { return strings.Join(strings.Fields(r.String()), " ") }
	text := words(r)
	for _, want := range []string{
		"live move A -> B kube-apiserver clients (client-go, no retries of ours) site-a 3 failed, max write gap 1.21 s",
		"failed requests 3 (2 writes, 1 reads): 2 MemberRemoved, 1 Timeout " +
			"2x etcdserver: server stopped 1x the server was unable to return a response in the time allotted",
		"requests 1200 writes acknowledged, 40 conflicts (409, not failures), 300 reads answered",
		"max write gap 1.21 s (from 42.00 s)",
		"write latency p50 4.0 ms, p99 220 ms, max 1.10 s",
		"/readyz first ready at 2.50 s; 200 in 2.5-46.0 s, 48.0-81.0 s; requests failed while it said 200: 1",
		"clients switched to site-b at 60.00 s site-b 0 failed, max write gap 120 ms failed requests 0 (0 writes, 0 reads) requests 900",
		"lost acknowledged writes 0 (2 writes unverifiable) linearizable yes (Ok, 2640 operations checked)",
		"etcd panics or fatal exits 1 shoot--dev--move_etcd-main-0_uid: panic: runtime error: invalid memory address",
		"migration time 19.50 s",
		"the project's own etcd client (retries; a lower-level check) " +
			"failed requests 1 (after the client's retries: 1 writes, 0 reads) 1x etcdserver: request timed out",
		"4000 writes acknowledged, 120 conflicts, 800 reads, 17 retries in 42.0 s",
		"steps 11.00 s promote seed-b-etcd-main-3",
	} {
		g.Expect(text).To(ContainSubstring(want))
	}
	g.Expect(r.String()).To(ContainSubstring("\n    site-b                    0 failed"), "all servers share one column")
	g.Expect(strings.Index(text, "kube-apiserver clients")).To(BeNumerically("<", strings.Index(text, ownClientLabel)),
		"the kube-apiservers' figures come first")

	r.EtcdCrashes = nil
	g.Expect(words(r)).To(ContainSubstring("etcd panics or fatal exits none"))

	t.Run("without the own client", func(t *testing.T) {
		g := NewWithT(t)
		text := words(FromAPILoad(apiResults()))
		g.Expect(text).To(ContainSubstring("site-b 0 failed, max write gap 120 ms failed requests 0"))
		g.Expect(text).NotTo(ContainSubstring(ownClientLabel))
		g.Expect(text).NotTo(ContainSubstring("client traffic"), "no zeros for a client that did not run")
	})
	t.Run("a server that never became ready", func(t *testing.T) {
		g := NewWithT(t)
		text := words(FromAPILoad(apiload.Results{Servers: []apiload.ServerFigures{{Name: "site-c"}}}))
		g.Expect(text).To(ContainSubstring("site-c 0 failed, never ready"))
		g.Expect(text).To(ContainSubstring("max write gap none"))
		g.Expect(text).To(ContainSubstring("/readyz never answered 200"))
		g.Expect(text).To(ContainSubstring("linearizable not checked etcd panics"))
	})
	t.Run("without kube-apiservers the own client is unlabelled", func(t *testing.T) {
		g := NewWithT(t)
		text := words(FromFigures(figures()))
		g.Expect(text).NotTo(ContainSubstring(ownClientLabel))
		g.Expect(text).NotTo(ContainSubstring("etcd panics"), "nobody looked")
	})
}
