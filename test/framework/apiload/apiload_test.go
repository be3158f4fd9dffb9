package apiload_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	. "github.com/onsi/gomega"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
	"github.com/druid-stretch/druid-stretch/internal/testing/workload"
	"github.com/druid-stretch/druid-stretch/test/framework/apiload"
)

// startEnv starts a real kube-apiserver on a real etcd, stopped when the
// test ends.
// stall is the write gap these tests call a stall: well past a write's
// latency on a busy machine, well short of etcd's request timeout.
const stall = 5 * time.Second

func startEnv(t *testing.T) (*envtest.Environment, *rest.Config) {
	t.Helper()
	env, err := testbin.Environment()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("starting envtest (binaries in %s): %v", env.BinaryAssetsDirectory, err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stopping envtest: %v", err)
		}
	})
	return env, cfg
}

// acknowledged counts the acknowledged writes of server so far.
func acknowledged(l *apiload.Load, server string) int {
	n := 0
	for _, r := range l.Requests() {
		if r.Server == server && r.Acknowledged() {
			n++
		}
	}
	return n
}

func newLoad(t *testing.T, opts apiload.Options) *apiload.Load {
	t.Helper()
	opts.Log = testr.New(t)
	l, err := apiload.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Stop)
	return l
}

func TestHealthyRun(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	_, cfg := startEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	l := newLoad(t, apiload.Options{Servers: []apiload.Server{{Name: "site-a", Config: cfg}}})
	// Start's context bounds the start only: the traffic outlives it.
	startCtx, cancelStart := context.WithTimeout(ctx, time.Minute)
	g.Expect(l.Start(startCtx)).To(Succeed())
	cancelStart()
	g.Eventually(func() int { return acknowledged(l, "site-a") }).WithTimeout(time.Minute).Should(BeNumerically(">=", 200))
	l.MarkPhase("after")
	g.Eventually(func() int { return acknowledged(l, "site-a") }).WithTimeout(time.Minute).Should(BeNumerically(">=", 300))
	l.Stop()

	r, err := l.Results(ctx, apiload.VerifyOptions{LinearizabilityTimeout: time.Minute})
	g.Expect(err).NotTo(HaveOccurred())
	t.Log("\n" + r.String())
	a := r.Servers[0]
	g.Expect(a.Name).To(Equal("site-a"))
	g.Expect(a.Writes).To(BeNumerically(">=", 300))
	g.Expect(a.Reads).To(BeNumerically(">", 0))
	g.Expect(a.Failed).To(BeZero(), "failed requests: %v", a.FailedErrors)
	g.Expect(r.Linearizable).To(BeTrue(), r.LinearizabilityResult)
	g.Expect(r.LostAcknowledgedWrites).To(BeZero())
	g.Expect(r.UnverifiedWrites).To(BeZero())
	g.Expect(a.BecameReady).To(BeTrue())
	g.Expect(a.Readyz).NotTo(BeEmpty())
	for _, s := range a.Readyz {
		g.Expect(s.Code).To(Equal(200))
	}
	g.Expect(a.Ready).To(HaveLen(1))
	g.Expect(a.ReadyButFailing).To(BeZero())
	// No stall: on a quiet machine the longest gap is a write's latency; a
	// busy one stretches it, so the bound is a stall's, not a target's.
	g.Expect(a.MaxWriteGap).To(BeNumerically("<", stall))
	g.Expect(a.WriteLatency.Count).To(Equal(a.Writes + a.Conflicts))
	g.Expect(a.Phases).To(HaveLen(2))
	g.Expect(a.Phases[1].Name).To(Equal("after"))
	g.Expect(a.Phases[0].Writes + a.Phases[1].Writes).To(Equal(a.Writes))
	g.Expect(r.Total.Writes).To(Equal(a.Writes))
	// The read after each conflict is one operation with the conflict in
	// the history; the final read of every object joined it.
	g.Expect(r.CheckedOperations).To(Equal(a.Writes + a.Conflicts + (a.Reads - a.Conflicts) + 4))

	out, err := json.Marshal(r)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(out)).To(ContainSubstring(`"linearizable":true`))
	g.Expect(r.String()).To(HavePrefix(fmt.Sprintf("site-a: %d writes, %d reads, 0 failed", a.Writes, a.Reads)))
}

func TestTwoServersShareOneHistory(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	_, cfg := startEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	l := newLoad(t, apiload.Options{
		Servers:   []apiload.Server{{Name: "site-a", Config: cfg}, {Name: "site-b", Config: cfg}},
		Namespace: "two-servers",
	})
	g.Expect(l.Start(ctx)).To(Succeed())
	for _, s := range []string{"site-a", "site-b"} {
		g.Eventually(func() int { return acknowledged(l, s) }).WithTimeout(time.Minute).Should(BeNumerically(">=", 100))
	}
	l.Stop()

	// Each server's readers read the other server's objects too.
	crossReads := 0
	for _, r := range l.Requests() {
		if r.Server == "site-b" && r.Kind == workload.Read && strings.Contains(r.Object, "apiload-site-a-") {
			crossReads++
		}
	}
	g.Expect(crossReads).To(BeNumerically(">", 0))

	r, err := l.Results(ctx, apiload.VerifyOptions{LinearizabilityTimeout: time.Minute})
	g.Expect(err).NotTo(HaveOccurred())
	t.Log("\n" + r.String())
	g.Expect(r.Servers).To(HaveLen(2))
	sum := 0
	for _, f := range r.Servers {
		g.Expect(f.Writes).To(BeNumerically(">=", 100), f.Name)
		g.Expect(f.Reads).To(BeNumerically(">", 0), f.Name)
		g.Expect(f.Failed).To(BeZero(), f.Name)
		g.Expect(f.BecameReady).To(BeTrue(), f.Name)
		sum += f.Writes + f.Reads // a conflict and the read after it are one operation
	}
	g.Expect(r.Total.Writes).To(Equal(r.Servers[0].Writes + r.Servers[1].Writes))
	// One history: both servers' operations and the final reads of all 8
	// objects were checked together.
	g.Expect(r.CheckedOperations).To(Equal(sum + 8))
	g.Expect(r.Linearizable).To(BeTrue(), r.LinearizabilityResult)
	g.Expect(r.LostAcknowledgedWrites).To(BeZero())
}

func TestUnreachableServerWaitsForReadiness(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	_, cfg := startEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	down := &rest.Config{Host: "https://" + freeAddress(t)}
	l := newLoad(t, apiload.Options{
		Servers:   []apiload.Server{{Name: "up", Config: cfg}, {Name: "down", Config: down}},
		Namespace: "unreachable",
	})
	g.Expect(l.Start(ctx)).To(Succeed())
	g.Eventually(func() int { return acknowledged(l, "up") }).WithTimeout(time.Minute).Should(BeNumerically(">=", 100))
	g.Expect(l.WaitReady(ctx, "up")).To(Succeed(), "a ready server")
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancelShort()
	g.Expect(l.WaitReady(short, "down")).To(MatchError(ContainSubstring("down never answered /readyz with 200")))
	g.Expect(l.WaitReady(ctx, "sideways")).To(MatchError(ContainSubstring(`unknown server "sideways" (servers: up, down)`)))
	begin := time.Now()
	l.Stop()
	g.Expect(time.Since(begin)).To(BeNumerically("<", 2*time.Second))

	for _, r := range l.Requests() {
		g.Expect(r.Server).To(Equal("up"))
	}
	r, err := l.Results(ctx, apiload.VerifyOptions{LinearizabilityTimeout: time.Minute})
	g.Expect(err).NotTo(HaveOccurred())
	t.Log("\n" + r.String())
	d := r.Servers[1]
	g.Expect(d.Name).To(Equal("down"))
	g.Expect(d.BecameReady).To(BeFalse())
	g.Expect(d.Writes + d.Reads + d.Failed).To(BeZero())
	g.Expect(d.MaxWriteGap).To(BeZero())
	g.Expect(d.Readyz).NotTo(BeEmpty())
	for _, s := range d.Readyz {
		g.Expect(s.Code).To(BeZero())
	}
	g.Expect(d.String()).To(HaveSuffix("never ready"))
	g.Expect(r.Servers[0].Failed).To(BeZero())
	g.Expect(r.Linearizable).To(BeTrue(), r.LinearizabilityResult)
	g.Expect(r.LostAcknowledgedWrites).To(BeZero())
}

// freeAddress is a loopback address nobody listens on.
func freeAddress(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	if err := lis.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// TestFailuresWhileEtcdHangs pauses envtest's etcd mid-run: requests hang
// until the client's timeout, as they do on a proposal lost in a leader
// transfer. Once etcd resumes, the history, ambiguous writes included, must
// still check out.
func TestFailuresWhileEtcdHangs(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	_, cfg := startEnv(t)
	etcd := childProcess(t, "etcd")
	// Registered after startEnv, so it runs before env.Stop.
	t.Cleanup(func() { _ = syscall.Kill(etcd, syscall.SIGCONT) })
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	l := newLoad(t, apiload.Options{
		Servers:        []apiload.Server{{Name: "site-a", Config: cfg}},
		RequestTimeout: 2 * time.Second,
	})
	g.Expect(l.Start(ctx)).To(Succeed())
	g.Eventually(func() int { return acknowledged(l, "site-a") }).WithTimeout(time.Minute).Should(BeNumerically(">=", 50))

	l.MarkPhase("etcd paused")
	g.Expect(syscall.Kill(etcd, syscall.SIGSTOP)).To(Succeed())
	// Counted by the phase they were called in: a request in flight when
	// etcd stopped fails too, in the phase before.
	g.Eventually(func() int { return failed(l, "etcd paused") }).WithTimeout(time.Minute).Should(BeNumerically(">=", 5))
	l.MarkPhase("etcd resumed")
	g.Expect(syscall.Kill(etcd, syscall.SIGCONT)).To(Succeed())
	before := acknowledged(l, "site-a")
	g.Eventually(func() int { return acknowledged(l, "site-a") }).WithTimeout(time.Minute).Should(BeNumerically(">=", before+20))
	l.Stop()

	r, err := l.Results(ctx, apiload.VerifyOptions{LinearizabilityTimeout: time.Minute})
	g.Expect(err).NotTo(HaveOccurred())
	t.Log("\n" + r.String())
	a := r.Servers[0]
	g.Expect(a.Failed).To(BeNumerically(">=", 5))
	g.Expect(classCount(a, apiload.Timeout)).To(BeNumerically(">", 0))
	g.Expect(classCount(a, "")).To(BeZero())
	g.Expect(a.FailedErrors).NotTo(BeEmpty())
	g.Expect(a.Phases).To(HaveLen(3))
	g.Expect(a.Phases[1].Failed).To(BeNumerically(">=", 5))
	g.Expect(a.Phases[1].MaxWriteGap).To(BeNumerically(">", time.Second))
	g.Expect(a.MaxWriteGap).To(BeNumerically(">", time.Second))
	g.Expect(r.Linearizable).To(BeTrue(), r.LinearizabilityResult)
	g.Expect(r.LostAcknowledgedWrites).To(BeZero())
	g.Expect(r.UnverifiedWrites).To(BeZero())
}

// TestFailuresWhenKubeAPIServerStops stops the kube-apiserver mid-run: the
// requests fail on the connection, and Results return their figures even
// though no server is left for the final reads.
func TestFailuresWhenKubeAPIServerStops(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	env, cfg := startEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	l := newLoad(t, apiload.Options{
		Servers:        []apiload.Server{{Name: "site-a", Config: cfg}},
		RequestTimeout: 2 * time.Second,
	})
	g.Expect(l.Start(ctx)).To(Succeed())
	g.Eventually(func() int { return acknowledged(l, "site-a") }).WithTimeout(time.Minute).Should(BeNumerically(">=", 50))

	g.Expect(env.ControlPlane.APIServer.Stop()).To(Succeed())
	g.Eventually(func() int { return failed(l, "") }).WithTimeout(time.Minute).Should(BeNumerically(">=", 5))
	l.Stop()

	rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
	defer rcancel()
	r, err := l.Results(rctx, apiload.VerifyOptions{LinearizabilityTimeout: time.Minute})
	g.Expect(err).To(MatchError(ContainSubstring("final read of")))
	t.Log("\n" + r.String())
	a := r.Servers[0]
	g.Expect(a.Writes).To(BeNumerically(">=", 50))
	g.Expect(a.Failed).To(BeNumerically(">=", 5))
	g.Expect(classCount(a, apiload.Unavailable)).To(BeNumerically(">", 0))
	g.Expect(classCount(a, "")).To(BeZero())
	g.Expect(r.Linearizable).To(BeTrue(), r.LinearizabilityResult)
	g.Expect(r.LostAcknowledgedWrites).To(BeZero())
	g.Expect(r.UnverifiedWrites).To(Equal(a.Writes))
}

// failed counts the failed requests, of those called in phase when it is
// not "".
func failed(l *apiload.Load, phase string) int {
	n := 0
	for _, r := range l.Requests() {
		if r.Failed() && (phase == "" || r.Phase == phase) {
			n++
		}
	}
	return n
}

// classCount is the number of failures of class c; "" counts those that
// FailedByClass does not account for.
func classCount(f apiload.ServerFigures, c apiload.FailureClass) int {
	sum := 0
	for _, cc := range f.FailedByClass {
		if cc.Class == c {
			return cc.Count
		}
		sum += cc.Count
	}
	if c == "" {
		return f.Failed - sum
	}
	return 0
}

// childProcess is the pid of this test binary's child process named name
// (envtest starts etcd and kube-apiserver as children).
func childProcess(t *testing.T, name string) int {
	t.Helper()
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid ...
		stat := string(b)
		end := strings.LastIndexByte(stat, ')')
		if end < 0 || stat[strings.IndexByte(stat, '(')+1:end] != name {
			continue
		}
		var state string
		var ppid int
		if _, err := fmt.Sscan(stat[end+1:], &state, &ppid); err == nil && ppid == os.Getpid() {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(path)))
			return pid
		}
	}
	t.Fatalf("no child process %s", name)
	return 0
}
