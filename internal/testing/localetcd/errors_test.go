package localetcd

import (
	"context"
	"errors"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	. "github.com/onsi/gomega"

	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
)

// TestNewRejectsBadOptions: each bad option is named, and the hack script
// is named when the etcd binary is missing.
func TestNewRejectsBadOptions(t *testing.T) {
	testbin.Need(t)
	missing := filepath.Join(t.TempDir(), "no-etcd-here")
	for _, tc := range []struct {
		name string
		env  string // DRUID_STRETCH_ETCD, which testbin.Etcd honours
		opts Options
		want []string
	}{
		{"no dir", "", Options{}, []string{"Options.Dir is required"}},
		{"explicit binary missing", "", Options{Dir: t.TempDir(), EtcdBinary: missing},
			[]string{"etcd binary not found at " + missing, "hack/test-binaries.sh"}},
		{"binary is a folder", "", Options{Dir: t.TempDir(), EtcdBinary: t.TempDir()},
			[]string{"not an executable file", "hack/test-binaries.sh"}},
		{"default binary missing", missing, Options{Dir: t.TempDir()},
			[]string{"etcd binary not found at " + missing, "hack/test-binaries.sh"}},
		{"election too short", "", Options{Dir: t.TempDir(), HeartbeatInterval: 200 * time.Millisecond, ElectionTimeout: 500 * time.Millisecond},
			[]string{"election timeout 500ms must be at least five heartbeat intervals (200ms)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			if tc.env != "" {
				t.Setenv("DRUID_STRETCH_ETCD", tc.env)
			}
			r, err := New(tc.opts)
			g.Expect(r).To(BeNil())
			for _, w := range tc.want {
				g.Expect(err).To(MatchError(ContainSubstring(w)))
			}
		})
	}
}

// TestNewMemberRejectsBadInput: the message names the problem and the
// runtime is unchanged.
func TestNewMemberRejectsBadInput(t *testing.T) {
	testbin.Need(t)
	r := newRuntime(t, Options{})
	if _, err := r.NewMember("taken", MemberOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, member, want string }{
		{"empty", "", `member name "" is invalid`},
		{"slash", "a/b", `member name "a/b" is invalid`},
		{"leading dash", "-a", `member name "-a" is invalid`},
		{"duplicate", "taken", `a member named "taken" already exists`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			m, err := r.NewMember(tc.member, MemberOptions{})
			g.Expect(m).To(BeNil())
			g.Expect(err).To(MatchError(ContainSubstring(tc.want)))
			g.Expect(r.Members()).To(HaveLen(1))
		})
	}
	g := NewWithT(t)
	m := r.Member("taken")
	ctx := testContext(t, time.Minute)
	g.Expect(m.Start(ctx, InitialCluster(m), "maybe")).To(MatchError(ContainSubstring(`cluster state "maybe" is neither "new" nor "existing"`)))
	g.Expect(m.Start(ctx, "", ClusterStateNew)).To(MatchError(ContainSubstring("initial cluster is empty")))
	g.Expect(m.Restart(ctx)).To(MatchError(ContainSubstring("never started")))
	g.Expect(m.Running()).To(BeFalse())
}

// TestPortInUse: a port taken while the member was down is named before
// etcd starts; a port only etcd itself notices (here the metrics port)
// ends etcd, and the error carries its output.
func TestPortInUse(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	r := newRuntime(t, Options{})
	ctx := testContext(t, time.Minute)
	ms, err := r.StartCluster(ctx, []string{"p1"}, MemberOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	m := ms[0]

	g.Expect(m.Stop(ctx)).To(Succeed())
	u, err := url.Parse(m.LocalClientURL)
	g.Expect(err).NotTo(HaveOccurred())
	squatter, err := net.Listen("tcp", u.Host)
	g.Expect(err).NotTo(HaveOccurred())
	err = m.Restart(ctx)
	g.Expect(errors.Is(err, ErrPortInUse)).To(BeTrue(), "%v", err)
	g.Expect(err).To(MatchError(ContainSubstring(`the client port ` + u.Host + ` of member "p1" is taken by another process`)))
	g.Expect(m.Running()).To(BeFalse())
	g.Expect(squatter.Close()).To(Succeed())
	g.Expect(m.Restart(ctx)).To(Succeed(), "starts once the port is free again")

	metrics, err := net.Listen("tcp", "127.0.0.1:0")
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = metrics.Close() }()
	m2, err := r.NewMember("p2", MemberOptions{ExtraArgs: []string{"--listen-metrics-urls=http://" + metrics.Addr().String()}})
	g.Expect(err).NotTo(HaveOccurred())
	err = m2.Start(ctx, InitialCluster(m2), ClusterStateNew)
	g.Expect(errors.Is(err, ErrPortInUse)).To(BeTrue(), "%v", err)
	g.Expect(err).To(MatchError(And(
		ContainSubstring(`etcd of member "p2"`),
		ContainSubstring("exited during start"),
		ContainSubstring("listen tcp "+metrics.Addr().String()+": bind: address already in use"))))
	g.Expect(m2.Running()).To(BeFalse())
}

// TestWaitReadyFollowsContext: a member that cannot become ready (the only
// other voter of its cluster never starts) is waited for until ctx ends,
// and the error says what the last probe saw. Start then ends the process.
func TestWaitReadyFollowsContext(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	r := newRuntime(t, Options{})
	a, err := r.NewMember("alone", MemberOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	b, err := r.NewMember("absent", MemberOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	start := time.Now()
	err = a.Start(ctx, InitialCluster(a, b), ClusterStateNew)
	g.Expect(time.Since(start)).To(BeNumerically(">=", 2*time.Second), "waits for ctx, not a timeout of its own")
	g.Expect(err).To(MatchError(And(
		ContainSubstring(`member "alone"`),
		ContainSubstring("not ready at "+a.LocalClientURL),
		ContainSubstring("context deadline exceeded"),
		ContainSubstring("last answer:"))))
	g.Expect(errors.Is(err, context.DeadlineExceeded)).To(BeTrue())
	g.Expect(a.Running()).To(BeFalse())
}

// TestPortClashRetry: when etcd exits on a port clash while bootstrapping
// or joining, the runtime retries on new ports; when the clash persists it
// gives up with the port error and leaves nothing behind (no process, no
// member in the cluster, the name free again).
func TestPortClashRetry(t *testing.T) {
	testbin.Need(t)
	for _, tc := range []struct {
		name       string
		join       bool
		clashHeals bool // the squatter leaves after the first failure
	}{
		{"bootstrap, clash heals", false, true},
		{"bootstrap, clash persists", false, false},
		{"join, clash heals", true, true},
		{"join, clash persists", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			// etcd binds the metrics port itself, so a squatter there makes
			// etcd exit with "address already in use", like a lost race.
			squatter, err := net.Listen("tcp", "127.0.0.1:0")
			g.Expect(err).NotTo(HaveOccurred())
			defer func() { _ = squatter.Close() }()
			retries := 0
			logger := funcr.New(func(_, args string) {
				if strings.Contains(args, "retrying on new ports") {
					retries++
					if tc.clashHeals {
						_ = squatter.Close()
					}
				}
			}, funcr.Options{})
			r := newRuntime(t, Options{Logger: logger})
			ctx := testContext(t, time.Minute)
			opts := MemberOptions{ExtraArgs: []string{"--listen-metrics-urls=http://" + squatter.Addr().String()}}

			var via *Member
			var before []memberView
			if tc.join {
				ms, err := r.StartCluster(ctx, []string{"voter"}, MemberOptions{})
				g.Expect(err).NotTo(HaveOccurred())
				via = ms[0]
				before = memberList(ctx, g, client(t, via))
			}
			var ms []*Member
			if tc.join {
				var m *Member
				m, err = r.JoinAsLearner(ctx, "clash", opts, via)
				ms = []*Member{m}
			} else {
				ms, err = r.StartCluster(ctx, []string{"clash"}, opts)
			}
			if tc.clashHeals {
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(retries).To(Equal(1))
				g.Expect(ms[0].Running()).To(BeTrue())
				return
			}
			g.Expect(errors.Is(err, ErrPortInUse)).To(BeTrue(), "%v", err)
			g.Expect(err).To(MatchError(ContainSubstring("bind: address already in use")))
			g.Expect(retries).To(Equal(startAttempts - 1))
			g.Expect(r.Member("clash")).To(BeNil())
			if tc.join {
				g.Expect(memberList(ctx, g, client(t, via))).To(Equal(before))
			}
		})
	}
}
