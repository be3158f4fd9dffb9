package workload

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/druid-stretch/druid-stretch/internal/testing/localetcd"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
)

// startCluster runs three real etcd members for the test.
func startCluster(t *testing.T) []*localetcd.Member {
	t.Helper()
	g := NewWithT(t)
	r, err := localetcd.New(localetcd.Options{Dir: t.TempDir()})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = r.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ms, err := r.StartCluster(ctx, []string{"a", "b", "c"}, localetcd.MemberOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	return ms
}

func clientURLs(ms []*localetcd.Member) []string {
	var eps []string
	for _, m := range ms {
		eps = append(eps, m.ClientURL)
	}
	return eps
}

// startWorkload starts traffic on the members and stops it when the test ends.
func startWorkload(t *testing.T, ms []*localetcd.Member, opts Options) *Workload {
	t.Helper()
	g := NewWithT(t)
	opts.Endpoints = clientURLs(ms)
	w, err := New(opts)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = w.Close() })
	return w
}

// writesGrowBy waits until n more writes are acknowledged.
func writesGrowBy(g Gomega, w *Workload, n int64) {
	target := w.Live().Writes + n
	g.Eventually(func() int64 { return w.Live().Writes }).WithTimeout(30 * time.Second).WithPolling(20 * time.Millisecond).
		Should(BeNumerically(">=", target))
}

func TestHealthyClusterRun(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	ms := startCluster(t)
	w := startWorkload(t, ms, Options{PreloadKeys: 300, PreloadValueSize: 100})
	ctx := context.Background()

	pre, err := w.Preload(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(pre.Keys).To(Equal(300))
	count, err := w.Client().Get(ctx, "/druid-stretch/workload/preload/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(count.Count).To(BeEquivalentTo(300))

	g.Expect(w.Start(ctx)).To(Succeed())
	g.Expect(w.Start(ctx)).To(MatchError(ContainSubstring("already started")))
	writesGrowBy(g, w, 100)
	w.MarkPhase("during")
	w.Mark("nothing happens")
	writesGrowBy(g, w, 100)
	w.MarkPhase("after")
	writesGrowBy(g, w, 100)
	w.Stop()

	f, lost, err := w.Verify(ctx, VerifyOptions{LinearizabilityTimeout: time.Minute})
	g.Expect(err).NotTo(HaveOccurred())
	t.Logf("writes %d (conflicts %d), reads %d, failed %d, retries %d, max gap %s, p50 %s, p99 %s, porcupine %s",
		f.Writes, f.WriteConflicts, f.Reads, f.FailedRequests, f.Retries, f.MaxWriteGap, f.WriteLatency.P50, f.WriteLatency.P99, f.LinearizabilityResult)
	g.Expect(f.FailedRequests).To(BeZero())
	g.Expect(f.LostAcknowledgedWrites).To(BeZero())
	g.Expect(f.FinalReadMismatches).To(BeZero())
	g.Expect(f.Linearizable).To(BeTrue())
	g.Expect(f.Writes).To(BeNumerically(">=", 300))
	g.Expect(f.Reads).To(BeNumerically(">", 0))
	g.Expect(lost.Checked).To(Equal(f.Writes), "every acknowledged write was read back")
	g.Expect(f.Preload).To(Equal(pre))
	g.Expect(phaseNames(f.Phases)).To(Equal([]string{"before", "during", "after"}))
	g.Expect(f.Marks).To(ContainElement(HaveField("Name", "nothing happens")))

	// The final state the workload believes in is what etcd holds.
	final, err := w.Client().Get(ctx, "/druid-stretch/workload/key-", clientv3.WithPrefix())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(final.Kvs).NotTo(BeEmpty())

	t.Run("a retried write learns whether its timed-out attempt was applied", func(t *testing.T) {
		// Replay what a writer sees after a timed-out attempt: its compare
		// now fails on someone else's value. The key's first change after the
		// expected revision tells whether the lost attempt was applied.
		g := NewWithT(t)
		c := w.Client()
		put := func(key, value string, expected int64) int64 {
			resp, err := c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", expected)).Then(clientv3.OpPut(key, value)).Commit()
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(resp.Succeeded).To(BeTrue())
			return resp.Header.Revision
		}
		tests := []struct {
			name        string
			oursApplied bool
			wantOutcome Outcome
		}{
			{"applied, then overwritten", true, Succeeded},
			{"never applied", false, Conflict},
		}
		for i, tt := range tests {
			key := fmt.Sprintf("/test/resolve/%d", i)
			var ourRev, rev int64
			if tt.oursApplied {
				ourRev = put(key, "ours.", 0)
				rev = put(key, "theirs.", ourRev)
			} else {
				rev = put(key, "theirs.", 0)
			}
			op := Op{Kind: Write, Key: key, ExpectedRev: 0, Value: "ours.", Outcome: Conflict, SeenValue: "theirs.", Rev: rev}
			w.resolveRetriedWrite(&op, newRetrier(w.opts))
			g.Expect(op.Outcome).To(Equal(tt.wantOutcome), tt.name)
			if tt.oursApplied {
				g.Expect(op.Rev).To(Equal(ourRev), tt.name)
			} else {
				g.Expect(op.SeenValue).To(Equal("theirs."), tt.name)
				g.Expect(op.Rev).To(Equal(rev), tt.name)
			}
		}
	})

	t.Run("a fabricated acknowledged write is caught", func(t *testing.T) {
		tests := []struct {
			name   string
			rev    func(real int64) int64
			reason string
		}{
			{"at a revision that holds another value", func(real int64) int64 { return real + 1 }, "holds"},
			{"at a revision the store never reached (a rollback)", func(int64) int64 { return 1 << 40 }, "has not reached revision"},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				g := NewWithT(t)
				forged, h := forgeAcknowledgedWrite(g, w.History(), tt.rev)

				lost, err := CheckLostWrites(ctx, w.Client(), h)
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(lost.Checked).To(Equal(f.Writes + 1))
				g.Expect(lost.Lost).To(HaveLen(1))
				g.Expect(lost.Lost[0].Write).To(Equal(forged))
				g.Expect(lost.Lost[0].Reason).To(ContainSubstring(tt.reason))
				t.Logf("lost write reason: %s", lost.Lost[0].Reason)

				ok, info := h.CheckLinearizable(time.Minute)
				g.Expect(ok).To(BeFalse())
				g.Expect(string(info.Result)).To(Equal("Illegal"))
				html := filepath.Join(t.TempDir(), "history.html")
				g.Expect(info.WriteVisualization(html)).To(Succeed())
				st, err := os.Stat(html)
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(st.Size()).To(BeNumerically(">", 0))
			})
		}
	})
}

func phaseNames(ps []PhaseFigures) []string {
	var names []string
	for _, p := range ps {
		names = append(names, p.Name)
	}
	return names
}

// forgeAcknowledgedWrite copies h and slips in a write that etcd never
// stored: acknowledged (at the revision rev gives) between a real write X
// and a later read that saw X.
func forgeAcknowledgedWrite(g Gomega, h *History, rev func(real int64) int64) (Op, *History) {
	ops := h.Ops()
	for i, x := range ops {
		if !x.Acknowledged() {
			continue
		}
		for _, y := range ops[i+1:] {
			if y.Key != x.Key || y.Call <= x.Return || y.Kind != Read || y.Outcome != Succeeded || y.SeenValue != x.Value {
				continue
			}
			span := y.Call - x.Return
			forged := Op{
				Client: 99, Kind: Write, Key: x.Key,
				Call: x.Return + span/3, Return: x.Return + 2*span/3,
				ExpectedValue: x.Value, ExpectedRev: x.Rev, Value: "forged.",
				Outcome: Succeeded, Rev: rev(x.Rev), Attempts: 1,
			}
			copied := NewHistory(h.initial)
			for _, op := range ops {
				copied.Record(op)
			}
			copied.Record(forged)
			return forged, copied
		}
	}
	g.Expect(false).To(BeTrue(), "no read after an acknowledged write to forge around")
	return Op{}, nil
}

// leader finds the member that leads, asking each running member.
func leader(ctx context.Context, c *clientv3.Client, ms []*localetcd.Member) *localetcd.Member {
	for _, m := range ms {
		if !m.Running() {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		st, err := c.Status(sctx, m.ClientURL)
		cancel()
		if err == nil && st.Leader != 0 && st.Leader == st.Header.MemberId {
			return m
		}
	}
	return nil
}

func TestLeaderKilledAndRestartedMidRun(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	ms := startCluster(t)
	w := startWorkload(t, ms, Options{})
	ctx := context.Background()
	g.Expect(w.Start(ctx)).To(Succeed())
	writesGrowBy(g, w, 100)

	var old *localetcd.Member
	g.Eventually(func() *localetcd.Member { old = leader(ctx, w.Client(), ms); return old }).
		WithTimeout(10 * time.Second).ShouldNot(BeNil())
	w.MarkPhase("during")
	w.Mark("kill " + old.Name)
	g.Expect(old.Kill()).To(Succeed())
	writesGrowBy(g, w, 100) // the survivors elected a leader and serve writes

	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	w.Mark("restart " + old.Name)
	g.Expect(old.Restart(rctx)).To(Succeed())
	w.MarkPhase("after")
	writesGrowBy(g, w, 100)
	w.Stop()

	f, _, err := w.Verify(ctx, VerifyOptions{LinearizabilityTimeout: time.Minute})
	g.Expect(err).NotTo(HaveOccurred())
	t.Logf("writes %d (conflicts %d), reads %d, failed %d, retries %d, max gap %s at %s, p50 %s, p99 %s, porcupine %s",
		f.Writes, f.WriteConflicts, f.Reads, f.FailedRequests, f.Retries, f.MaxWriteGap, f.MaxWriteGapAt, f.WriteLatency.P50, f.WriteLatency.P99, f.LinearizabilityResult)
	for _, p := range f.Phases {
		t.Logf("phase %s: writes %d, p50 %s, p99 %s, max gap %s", p.Name, p.Writes, p.WriteLatency.P50, p.WriteLatency.P99, p.MaxWriteGap)
	}
	g.Expect(f.Retries).To(BeNumerically(">", 0), "the kill should have hit requests in flight")
	g.Expect(f.FailedRequests).To(BeZero())
	g.Expect(f.LostAcknowledgedWrites).To(BeZero())
	g.Expect(f.FinalReadMismatches).To(BeZero())
	g.Expect(f.Linearizable).To(BeTrue())
}

func TestSetEndpointsRescuesTrafficFromADeadMember(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	ms := startCluster(t)
	ctx := context.Background()
	w := startWorkload(t, ms, Options{})
	var follower *localetcd.Member
	var others []string
	g.Eventually(func() *localetcd.Member { return leader(ctx, w.Client(), ms) }).WithTimeout(10 * time.Second).ShouldNot(BeNil())
	l := leader(ctx, w.Client(), ms)
	for _, m := range ms {
		if m != l && follower == nil {
			follower = m
		} else {
			others = append(others, m.ClientURL)
		}
	}
	g.Expect(w.SetEndpoints()).To(MatchError(ContainSubstring("no endpoint")))
	g.Expect(w.SetEndpoints(follower.ClientURL)).To(Succeed())
	g.Expect(w.Start(ctx)).To(Succeed())
	writesGrowBy(g, w, 50)

	w.Mark("kill " + follower.Name)
	g.Expect(follower.Kill()).To(Succeed())
	// The only endpoint is dead: writes stall until the list changes.
	stalled := w.Live().Writes
	g.Consistently(func() int64 { return w.Live().Writes }).WithTimeout(500 * time.Millisecond).Should(BeNumerically("<=", stalled+int64(w.opts.Writers)))
	w.Mark("route to the others")
	g.Expect(w.SetEndpoints(others...)).To(Succeed())
	g.Expect(w.Endpoints()).To(ConsistOf(others))
	writesGrowBy(g, w, 100)
	w.Stop()

	f, _, err := w.Verify(ctx, VerifyOptions{LinearizabilityTimeout: time.Minute})
	g.Expect(err).NotTo(HaveOccurred())
	t.Logf("writes %d, failed %d, retries %d, max gap %s, porcupine %s", f.Writes, f.FailedRequests, f.Retries, f.MaxWriteGap, f.LinearizabilityResult)
	// Requests wait for a ready connection (the etcd client's wait-for-ready),
	// so the stall shows as a gap, and the switch ends it within the attempt.
	g.Expect(f.MaxWriteGap).To(BeNumerically(">=", 500*time.Millisecond))
	g.Expect(f.FailedRequests).To(BeZero())
	g.Expect(f.LostAcknowledgedWrites).To(BeZero())
	g.Expect(f.Linearizable).To(BeTrue())
}

func TestMoveLeaderMidRun(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	ms := startCluster(t)
	ctx := context.Background()
	w := startWorkload(t, ms, Options{})
	g.Expect(w.Start(ctx)).To(Succeed())
	writesGrowBy(g, w, 100)

	var old *localetcd.Member
	g.Eventually(func() *localetcd.Member { old = leader(ctx, w.Client(), ms); return old }).WithTimeout(10 * time.Second).ShouldNot(BeNil())
	lc, err := old.Client()
	g.Expect(err).NotTo(HaveOccurred())
	members, err := lc.MemberList(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	var to uint64
	for _, m := range members.Members {
		if m.Name != old.Name {
			to = m.ID
			break
		}
	}
	w.MarkPhase("during")
	w.Mark("move leader")
	_, err = lc.MoveLeader(ctx, to)
	g.Expect(err).NotTo(HaveOccurred())
	writesGrowBy(g, w, 100)
	w.MarkPhase("after")
	writesGrowBy(g, w, 100)
	w.Stop()
	g.Expect(leader(ctx, w.Client(), ms)).NotTo(Equal(old))

	f, _, err := w.Verify(ctx, VerifyOptions{LinearizabilityTimeout: time.Minute})
	g.Expect(err).NotTo(HaveOccurred())
	t.Logf("writes %d, failed %d, retries %d, max gap %s, p99 during %s, porcupine %s",
		f.Writes, f.FailedRequests, f.Retries, f.MaxWriteGap, f.Phases[1].WriteLatency.P99, f.LinearizabilityResult)
	g.Expect(f.FailedRequests).To(BeZero())
	g.Expect(f.LostAcknowledgedWrites).To(BeZero())
	g.Expect(f.FinalReadMismatches).To(BeZero())
	g.Expect(f.Linearizable).To(BeTrue())
}
