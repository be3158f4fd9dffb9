package sidecar_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	. "github.com/onsi/gomega"

	"github.com/druid-stretch/druid-stretch/internal/testing/localetcd"
	"github.com/druid-stretch/druid-stretch/internal/testing/localetcd/etcdtest"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// logLines collects log lines, for asserting that a refusal was logged.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.lines = append(l.lines, prefix+" "+args)
	}, funcr.Options{})
}

func (l *logLines) containing(parts ...string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range l.lines {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			out = append(out, line)
		}
	}
	return out
}

// TestALockGrantCarriesTheRecords shows that POST /v1/lock answers with
// the step record and the retirement records as they stood when the lock
// was written, equal to an observation's when nobody acted in between, so
// that a controller that planned with the lock free can tell whether its
// plan still stands.
func TestALockGrantCarriesTheRecords(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	tc := &testCluster{etcdtest.Start(t, etcdtest.Options{Names: etcdtest.Numbered("etcd", 3)})}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	c := tc.client(tc.Members[0])

	// A cluster nobody changed: no step record, no retirement record.
	grant, err := c.AcquireLock(ctx, "seed-a", lockToken(time.Minute), time.Minute)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(grant.Holder).To(Equal("seed-a"))
	g.Expect(grant.Step).To(BeNil())
	g.Expect(grant.Retired).To(BeEmpty())
	g.Expect(grant.Retired).NotTo(BeNil(), "an empty list, not a missing one")

	// seed-a moves leadership and retires a member, then lets go. The
	// transfer goes to a member that does not lead: one to the leader
	// changes nothing, and nothing is recorded.
	before, err := c.Members(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	target := ""
	for _, m := range before.Members {
		if !m.IsLeader && target == "" {
			target = m.Name
		}
	}
	g.Expect(target).NotTo(BeEmpty(), "a member that does not lead: %+v", before.Members)
	o := sidecar.CallOptions{LockHolder: "seed-a", LockToken: grant.Token}
	_, err = c.MoveLeader(ctx, target, o)
	g.Expect(err).NotTo(HaveOccurred())
	_, err = c.Retire(ctx, "etcd-9", "seed-a", o)
	g.Expect(err).NotTo(HaveOccurred())
	var seen *sidecar.MemberList
	g.Eventually(func(g Gomega) {
		seen, err = c.Members(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(seen.Step).NotTo(BeNil(), "the leader transfer is recorded after it happened")
	}).WithTimeout(10 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
	g.Expect(c.ReleaseLock(ctx, "seed-a", grant.Token)).To(Succeed())

	grant, err = tc.client(tc.Members[2]).AcquireLock(ctx, "seed-b", lockToken(time.Minute), time.Minute)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(grant.Step).To(Equal(seen.Step))
	g.Expect(grant.Step.Kind).To(Equal(sidecar.StepMoveLeader))
	g.Expect(grant.Retired).To(Equal(seen.Retired))
	g.Expect(grant.Retired).To(Equal([]sidecar.RetiredMember{{Name: "etcd-9", By: "seed-a"}}))
}

// TestTheLockIsAFence shows that a membership change is applied only under
// the caller's own lock token, checked in the transaction that records the
// change, not only in a read before it: a process whose lock a newer
// process of the same holder took over changes nothing, even when the
// takeover lands between the sidecar's check and the change; and while a
// change is in flight, neither another caller's change nor a takeover
// passes.
func TestTheLockIsAFence(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	var logs logLines
	servers := map[string]*sidecar.Server{}
	var mu sync.Mutex
	tc := &testCluster{etcdtest.Start(t, etcdtest.Options{
		Names:  etcdtest.Numbered("etcd", 3),
		Logger: logs.logger(),
		Wrap: func(m *localetcd.Member, s *sidecar.Server) http.Handler {
			mu.Lock()
			defer mu.Unlock()
			servers[m.Name] = s
			return s
		},
	})}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	via, other := tc.Members[0], tc.Members[1]
	c, oc := tc.client(via), tc.client(other)
	const holder = "seed-b"
	// Three processes of one holder, started one after the other.
	a := sidecar.CallOptions{LockHolder: holder, LockToken: lockToken(3 * time.Minute)}
	b := sidecar.CallOptions{LockHolder: holder, LockToken: lockToken(2 * time.Minute)}
	processC := lockToken(time.Minute)

	_, err := c.AcquireLock(ctx, holder, a.LockToken, time.Minute)
	g.Expect(err).NotTo(HaveOccurred())
	learner, err := tc.Runtime.NewMember("etcd-new", localetcd.MemberOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	// etcd refuses reconfigurations until its members have been connected
	// for 5 s (its strict reconfiguration check).
	var added *sidecar.ChangeResult
	g.Eventually(func() (err error) {
		added, err = c.AddLearner(ctx, learner.Name, []string{learner.PeerURL}, a)
		return err
	}).WithTimeout(20 * time.Second).WithPolling(500 * time.Millisecond).Should(Succeed())
	g.Expect(added.Changed).To(BeTrue())
	var rec *sidecar.StepRecord
	g.Eventually(func(g Gomega) {
		l, err := c.Members(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		rec = l.Step
		g.Expect(rec).NotTo(BeNil())
		g.Expect(rec.State).To(Equal(sidecar.StepSucceeded), "the record is closed once the call ended")
	}).WithTimeout(10 * time.Second).Should(Succeed())
	g.Expect([]string{rec.Kind, rec.Target, rec.Holder, rec.Token}).To(Equal([]string{sidecar.StepAddLearner, learner.Name, holder, a.LockToken}))
	// The learner never starts, so etcd knows it by its ID only.
	learnerID := added.Member.ID
	g.Expect(rec.Changed).To(BeTrue())
	g.Expect(rec.Revision).To(BeNumerically(">", 0))

	t.Run("a takeover between the check and the change fences the old process off", func(t *testing.T) {
		g := NewWithT(t)
		before := tc.membership(g, via)
		recBefore := stepRecord(g, ctx, c)
		tookOver := false
		sidecar.SetFenceHooks(servers[via.Name], func() {
			// A's request passed the sidecar's check; B takes the lock over
			// now, before A's change is recorded.
			_, err := oc.AcquireLock(ctx, holder, b.LockToken, time.Minute)
			g.Expect(err).NotTo(HaveOccurred())
			tookOver = true
		}, nil)
		_, err := c.Remove(ctx, learnerID, a)
		sidecar.SetFenceHooks(servers[via.Name], nil, nil)
		g.Expect(tookOver).To(BeTrue(), "the takeover ran inside A's call")
		g.Expect(sidecar.IsReason(err, sidecar.ReasonStaleToken)).To(BeTrue(), "%v", err)
		g.Expect(err.Error()).To(ContainSubstring(fmt.Sprintf("%q", b.LockToken)), "the refusal names the token that holds the lock")
		g.Expect(tc.membership(g, via)).To(Equal(before), "nothing changed")
		g.Expect(stepRecord(g, ctx, c)).To(Equal(recBefore), "nothing was recorded")
		g.Expect(logs.containing("membership change fenced off", a.LockToken, "StaleToken")).NotTo(BeEmpty(), "the refusal is logged")
	})

	t.Run("the stale process is refused from then on, before anything is recorded", func(t *testing.T) {
		g := NewWithT(t)
		before := tc.membership(g, via)
		_, err := c.Remove(ctx, learnerID, a)
		g.Expect(sidecar.IsReason(err, sidecar.ReasonStaleToken)).To(BeTrue(), "%v", err)
		err = c.ReleaseLock(ctx, holder, a.LockToken)
		g.Expect(sidecar.IsReason(err, sidecar.ReasonStaleToken)).To(BeTrue(), "a stale process cannot release its successor's lock: %v", err)
		_, err = c.AcquireLock(ctx, holder, a.LockToken, time.Minute)
		g.Expect(sidecar.IsReason(err, sidecar.ReasonStaleToken)).To(BeTrue(), "nor take it back: only a newer token takes over: %v", err)
		g.Expect(tc.membership(g, via)).To(Equal(before))
		l, err := c.Members(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(l.Lock).NotTo(BeNil())
		g.Expect(l.Lock.Token).To(Equal(b.LockToken))
	})

	t.Run("a change in flight holds off other callers and a takeover", func(t *testing.T) {
		g := NewWithT(t)
		inFlight, release := make(chan struct{}), make(chan struct{})
		sidecar.SetFenceHooks(servers[via.Name], nil, func() {
			close(inFlight)
			<-release
		})
		defer sidecar.SetFenceHooks(servers[via.Name], nil, nil)
		removed := make(chan error, 1)
		go func() {
			_, err := c.Remove(ctx, learnerID, b)
			removed <- err
		}()
		select {
		case <-inFlight:
		case <-ctx.Done():
			t.Fatal("B's removal was never recorded")
		}
		open := stepRecord(g, ctx, oc)
		g.Expect(open.State).To(Equal(sidecar.StepInFlight))
		g.Expect([]string{open.Kind, open.Target, open.Token}).To(Equal([]string{sidecar.StepRemove, learnerID, b.LockToken}))

		before := tc.membership(g, other)
		// An operator without the lock headers, through another sidecar.
		_, err := oc.AddLearner(ctx, "etcd-other", []string{"https://127.0.0.1:1"}, sidecar.CallOptions{})
		g.Expect(sidecar.IsReason(err, sidecar.ReasonChangeInFlight)).To(BeTrue(), "%v", err)
		g.Expect(err.Error()).To(ContainSubstring(learnerID), "the refusal names the change in flight")
		// A third process of the holder may not take over mid-change.
		_, err = oc.AcquireLock(ctx, holder, processC, time.Minute)
		g.Expect(sidecar.IsReason(err, sidecar.ReasonChangeInFlight)).To(BeTrue(), "%v", err)
		g.Expect(tc.membership(g, other)).To(Equal(before), "nothing changed while B's change was held")

		close(release)
		g.Expect(<-removed).To(Succeed())
		g.Eventually(func(g Gomega) {
			closed := stepRecord(g, ctx, oc)
			g.Expect(closed.State).To(Equal(sidecar.StepSucceeded))
			g.Expect(closed.Revision).To(Equal(open.Revision), "the same record, closed")
		}).WithTimeout(10 * time.Second).Should(Succeed())
		g.Expect(tc.membership(g, other)).To(HaveLen(3), "the learner is gone")
		_, err = oc.AcquireLock(ctx, holder, processC, time.Minute)
		g.Expect(err).NotTo(HaveOccurred(), "with the change ended, the takeover passes")
	})

	t.Run("a lock shorter than a request, or one about to run out, is refused", func(t *testing.T) {
		g := NewWithT(t)
		g.Expect(oc.ReleaseLock(ctx, holder, processC)).To(Succeed())
		short := lockToken(0)
		_, err := c.AcquireLock(ctx, "short", short, 5*time.Second)
		g.Expect(sidecar.IsReason(err, sidecar.ReasonInvalidArgument)).To(BeTrue(), "%v", err)
		g.Expect(err.Error()).To(ContainSubstring("request timeout"), "the refusal says why the TTL is too short")

		_, err = c.AcquireLock(ctx, "short", short, 11*time.Second)
		g.Expect(err).NotTo(HaveOccurred())
		g.Eventually(func(g Gomega) {
			l, err := c.Members(ctx)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(l.Lock.ExpiresInSeconds).To(BeNumerically("<", 10))
		}).WithTimeout(10 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())
		before := tc.membership(g, via)
		_, err = c.AddLearner(ctx, "etcd-other", []string{"https://127.0.0.1:1"}, sidecar.CallOptions{LockHolder: "short", LockToken: short})
		g.Expect(sidecar.IsReason(err, sidecar.ReasonLockExpiring)).To(BeTrue(), "%v", err)
		g.Expect(tc.membership(g, via)).To(Equal(before))
	})
}

// stepRecord is the step record as the sidecar lists it.
func stepRecord(g Gomega, ctx context.Context, c *sidecar.Client) sidecar.StepRecord {
	l, err := c.Members(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(l.Step).NotTo(BeNil())
	return *l.Step
}
