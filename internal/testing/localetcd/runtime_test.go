package localetcd

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	. "github.com/onsi/gomega"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
)

// newRuntime returns a runtime in a fresh temp dir, closed at the end of the
// test; on failure the tail of every member's log is printed.
func newRuntime(t *testing.T, opts Options) *Runtime {
	t.Helper()
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	if opts.Logger.GetSink() == nil {
		opts.Logger = testr.New(t)
	}
	r, err := New(opts)
	if err != nil {
		t.Fatalf("localetcd.New: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, m := range r.Members() {
				t.Logf("log tail of %s:\n%s", m.Name, m.LogTail(25))
			}
		}
		if err := r.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return r
}

func testContext(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// processGone reports whether pid no longer runs. A zombie counts as gone:
// it runs nothing, and a child of a killed helper is reaped by whoever
// inherited it, not by us.
func processGone(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	// The state follows the command name in parentheses.
	s := string(stat)
	rest := s[strings.LastIndexByte(s, ')')+1:]
	return strings.HasPrefix(strings.TrimSpace(rest), "Z")
}

type memberView struct {
	Name    string
	Learner bool
}

func memberList(ctx context.Context, g Gomega, c *clientv3.Client) []memberView {
	resp, err := c.MemberList(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	var out []memberView
	for _, m := range resp.Members {
		out = append(out, memberView{Name: m.Name, Learner: m.IsLearner})
	}
	slices.SortFunc(out, func(a, b memberView) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// TestClusterLifecycle walks one 3-member cluster through write/read, Stop
// and Restart, Kill, and Close, checking data and processes at each step.
func TestClusterLifecycle(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	r := newRuntime(t, Options{})
	ctx := testContext(t, 2*time.Minute)

	ms, err := r.StartCluster(ctx, []string{"a", "b", "c"}, MemberOptions{Site: "one"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(InitialCluster(ms...)).To(Equal(fmt.Sprintf("a=%s,b=%s,c=%s", ms[0].PeerURL, ms[1].PeerURL, ms[2].PeerURL)))
	ca, cb, cc := client(t, ms[0]), client(t, ms[1]), client(t, ms[2])

	g.Expect(memberList(ctx, g, ca)).To(Equal([]memberView{{"a", false}, {"b", false}, {"c", false}}))
	_, err = ca.Put(ctx, "k1", "v1")
	g.Expect(err).NotTo(HaveOccurred())
	got, err := cc.Get(ctx, "k1") // linearizable, so through consensus
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got.Kvs).To(HaveLen(1))
	g.Expect(string(got.Kvs[0].Value)).To(Equal("v1"))

	// Stop keeps the data dir; the restarted member has the old key and
	// catches up on the one written while it was down.
	pidB := ms[1].PID()
	g.Expect(ms[1].Stop(ctx)).To(Succeed())
	g.Expect(ms[1].Running()).To(BeFalse())
	g.Expect(ms[1].PID()).To(BeZero())
	g.Expect(processGone(pidB)).To(BeTrue())
	g.Expect(ms[1].Stop(ctx)).To(Succeed(), "stopping a stopped member does nothing")
	g.Expect(ms[1].DataDir + "/member/wal").To(BeADirectory())
	// A sidecar lists its own member first, running or not, and leaves the
	// stopped ones out of the others.
	g.Expect(SidecarEndpoints(ms[1], r.Members())).To(Equal([]string{ms[1].LocalClientURL, ms[0].ClientURL, ms[2].ClientURL}))
	g.Expect(SidecarEndpoints(ms[0], r.Members())).To(Equal([]string{ms[0].LocalClientURL, ms[2].ClientURL}))
	_, err = ca.Put(ctx, "k2", "v2")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(ms[1].Restart(ctx)).To(Succeed())
	g.Expect(ms[1].PID()).NotTo(Equal(pidB))
	g.Eventually(func(g Gomega) {
		resp, err := cb.Get(ctx, "k", clientv3.WithPrefix(), clientv3.WithSerializable())
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(resp.Kvs).To(HaveLen(2))
	}).WithContext(ctx).WithTimeout(10 * time.Second).Should(Succeed())

	// Kill is a crash: the process is gone at once, the other two keep a
	// quorum, and the member comes back on its data dir.
	pidC := ms[2].PID()
	g.Expect(ms[2].Kill()).To(Succeed())
	g.Expect(ms[2].Running()).To(BeFalse())
	g.Expect(processGone(pidC)).To(BeTrue())
	g.Expect(ms[2].WaitReady(ctx)).To(MatchError(ContainSubstring(`member "c" is not running`)))
	// If c led, the first attempts time out until a and b elect a leader.
	g.Eventually(func() error {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := ca.Put(actx, "k3", "v3")
		return err
	}).WithContext(ctx).WithTimeout(20 * time.Second).Should(Succeed())
	g.Expect(ms[2].Restart(ctx)).To(Succeed())
	got, err = cc.Get(ctx, "k3")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got.Kvs).To(HaveLen(1))
	g.Expect(ms[2].LogTail(5)).NotTo(BeEmpty())
	g.Expect(strings.Count(ms[2].LogTail(-1), "--- localetcd ")).To(Equal(2), "one log across both starts")

	// Close ends every process, once; later calls fail cleanly.
	pids := []int{ms[0].PID(), ms[1].PID(), ms[2].PID()}
	g.Expect(pids).NotTo(ContainElement(0))
	g.Expect(r.Close()).To(Succeed())
	for _, pid := range pids {
		g.Expect(processGone(pid)).To(BeTrue(), "pid %d still runs after Close", pid)
	}
	for _, m := range ms {
		g.Expect(m.Running()).To(BeFalse())
	}
	g.Expect(r.Close()).To(Succeed())
	_, err = r.NewMember("d", MemberOptions{})
	g.Expect(err).To(MatchError(ContainSubstring("closed")))
	_, err = ms[0].Client()
	g.Expect(err).To(MatchError(ContainSubstring("closed")))
	g.Expect(ms[0].Start(ctx, InitialCluster(ms...), ClusterStateExisting)).To(MatchError(ContainSubstring("closed")))
}

func client(t *testing.T, m *Member) *clientv3.Client {
	t.Helper()
	c, err := m.Client()
	if err != nil {
		t.Fatalf("client of %s: %v", m.Name, err)
	}
	return c
}

// TestJoinAsLearner adds a learner in one call, promotes it through clientv3
// and sees it as a voter; a join that fails leaves the member list as it was.
func TestJoinAsLearner(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	r := newRuntime(t, Options{})
	ctx := testContext(t, 2*time.Minute)

	ms, err := r.StartCluster(ctx, []string{"v1"}, MemberOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	cv := client(t, ms[0])
	for i := range 50 {
		_, err := cv.Put(ctx, fmt.Sprintf("key-%02d", i), "x")
		g.Expect(err).NotTo(HaveOccurred())
	}

	_, err = r.JoinAsLearner(ctx, "l1", MemberOptions{})
	g.Expect(err).To(MatchError(ContainSubstring("at least one running member")))
	g.Expect(r.Member("l1")).To(BeNil())

	// A learner whose etcd cannot start is removed from the cluster again.
	before := memberList(ctx, g, cv)
	_, err = r.JoinAsLearner(ctx, "l1", MemberOptions{ExtraArgs: []string{"--no-such-flag"}}, ms[0])
	g.Expect(err).To(MatchError(And(
		ContainSubstring("exited during start"),
		ContainSubstring("flag provided but not defined: -no-such-flag"))))
	g.Expect(memberList(ctx, g, cv)).To(Equal(before))
	g.Expect(r.Member("l1")).To(BeNil(), "a failed join frees the name")

	l, err := r.JoinAsLearner(ctx, "l1", MemberOptions{}, ms[0])
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(l.Running()).To(BeTrue())
	g.Expect(memberList(ctx, g, cv)).To(Equal([]memberView{{"l1", true}, {"v1", false}}))
	resp, err := client(t, l).Get(ctx, "key-", clientv3.WithPrefix(), clientv3.WithSerializable())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(resp.Kvs).To(HaveLen(50), "the learner has the data")

	// etcd refuses to promote a learner that has not caught up; retry.
	id := memberID(ctx, g, cv, "l1")
	g.Eventually(func() error {
		_, err := cv.MemberPromote(ctx, id)
		return err
	}).WithContext(ctx).WithTimeout(30 * time.Second).Should(Succeed())
	g.Expect(memberList(ctx, g, cv)).To(Equal([]memberView{{"l1", false}, {"v1", false}}))
	_, err = client(t, l).Put(ctx, "after-promotion", "y")
	g.Expect(err).NotTo(HaveOccurred())
}

func memberID(ctx context.Context, g Gomega, c *clientv3.Client, name string) uint64 {
	resp, err := c.MemberList(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	for _, m := range resp.Members {
		if m.Name == name {
			return m.ID
		}
	}
	g.Expect(name).To(BeEmpty(), "member not in list")
	return 0
}
