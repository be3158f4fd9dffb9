package sidecarcluster_test

import (
	"context"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/druid-stretch/druid-stretch/internal/etcdconfig"
	"github.com/druid-stretch/druid-stretch/internal/sidecarcluster"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// admitConfig is druid's etcd.conf.yaml of etcd-main (abridged); the
// joining pod etcd-main-4 lies outside its ordinals, so its URLs come from
// the sidecar's member flags.
const admitConfig = `name: etcd-config
initial-cluster-state: new
initial-cluster: etcd-main-0=http://etcd-main-0.etcd-main-peer.ns.svc:2380
initial-advertise-peer-urls:
  etcd-main-0: [http://etcd-main-0.etcd-main-peer.ns.svc:2380]
advertise-client-urls:
  etcd-main-0: [http://etcd-main-0.etcd-main-peer.ns.svc:2379]
`

// peer4 is the peer URL of the joining pod etcd-main-4.
const peer4 = "http://etcd-main-4.etcd-main-peer.ns.svc:2380"

// joiningPod serves the sidecar of the joining pod etcd-main-4 as
// etcd-wrapper's server, with a data volume under a temporary folder.
func joiningPod(t *testing.T) *httptest.Server {
	t.Helper()
	g := NewWithT(t)
	dir := t.TempDir()
	config := filepath.Join(dir, "etcd.conf.yaml")
	g.Expect(os.MkdirAll(filepath.Join(dir, "data"), 0o700)).To(Succeed()) // the pod's data volume
	g.Expect(os.WriteFile(config, []byte(admitConfig+"data-dir: "+filepath.Join(dir, "data", "new.etcd")+"\n"), 0o600)).To(Succeed())
	srv, err := sidecar.New(sidecar.Config{
		Endpoints:                    []string{"http://127.0.0.1:1"},
		InsecureAllowUnauthenticated: true,
		PollInterval:                 -1,
		Joining: &sidecar.Joining{EtcdConfigFile: config, Member: etcdconfig.Member{
			Name: "etcd-main-4", PeerURLs: []string{peer4},
			ClientURLs: []string{"http://etcd-main-4.etcd-main-peer.ns.svc:2379"},
		}},
	})
	g.Expect(err).NotTo(HaveOccurred())
	hs := httptest.NewServer(srv)
	t.Cleanup(func() { hs.Close(); _ = srv.Close() })
	return hs
}

// TestAdmissionFollowsTheMembership: a learner admitted while the cluster
// had four members, which another learner joined before it started, is
// admitted again with the five: etcd refuses to join with an initial
// cluster that does not list exactly the cluster's members (seen on real
// sites with learners added side by side), and etcd-wrapper asks the
// sidecar for its configuration again. An admission that still fits is
// left alone.
func TestAdmissionFollowsTheMembership(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	hs := joiningPod(t)
	c, err := sidecarcluster.New(sidecarcluster.Config{Holder: "test"})
	g.Expect(err).NotTo(HaveOccurred())
	voter := func(i, id string) sidecar.Member {
		return sidecar.Member{ID: id, Name: "etcd-main-" + i, PeerURLs: []string{"http://etcd-main-" + i + ".etcd-main-peer.ns.svc:2380"}}
	}
	members := []sidecar.Member{voter("0", "a0"), voter("1", "a1"), voter("3", "b3"),
		{ID: "b4", PeerURLs: []string{peer4}, IsLearner: true}}
	obs := func(ms ...sidecar.Member) *sidecarcluster.Observation {
		return &sidecarcluster.Observation{List: &sidecar.MemberList{Members: ms}}
	}
	joiners := []sidecarcluster.Joiner{{Member: "etcd-main-4", PeerURLs: []string{peer4}, Sidecar: hs.URL}}
	admission := func() *sidecar.Admission {
		st, err := sidecar.NewClient(hs.URL, nil).Join(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		return st.Admission
	}

	admitted, err := c.Admit(ctx, obs(members...), joiners)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(admitted).To(Equal([]string{"etcd-main-4"}))
	first := admission()
	g.Expect(first.MemberID).To(Equal("b4"))
	g.Expect(strings.Split(first.InitialCluster, ",")).To(HaveLen(4))

	admitted, err = c.Admit(ctx, obs(members...), joiners)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(admitted).To(BeEmpty(), "an admission that fits the membership is left alone")
	g.Expect(admission()).To(Equal(first))

	const peer5 = "http://etcd-main-5.etcd-main-peer.ns.svc:2380"
	grown := append(members, sidecar.Member{ID: "b5", PeerURLs: []string{peer5}, IsLearner: true})
	admitted, err = c.Admit(ctx, obs(grown...), joiners)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(admitted).To(Equal([]string{"etcd-main-4"}))
	renewed := admission()
	g.Expect(renewed.MemberID).To(Equal("b4"))
	g.Expect(strings.Split(renewed.InitialCluster, ",")).To(ConsistOf(append(strings.Split(first.InitialCluster, ","), "b5="+peer5)))

	// The same membership listed in another order, with the other learner
	// named once it started, is the same admission.
	started := grown[4]
	started.Name, started.IsLearner = "etcd-main-5", false
	reordered := append([]sidecar.Member{started}, grown[:4]...)
	admitted, err = c.Admit(ctx, obs(reordered...), joiners)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(admitted).To(BeEmpty())
	g.Expect(admission()).To(Equal(renewed))
}

// TestAdmissionAsksOnlyTheLearnersOwnPod: both seeds of a GEP-39 move run
// the Etcd under one name, so the in-cluster name of a learner's pod can
// lead to the other seed's pod of that name, whose sidecar answers for
// another member. The admission is not sent there: the error names both
// members, and the pod reached keeps what it held.
func TestAdmissionAsksOnlyTheLearnersOwnPod(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	hs := joiningPod(t) // the sidecar of etcd-main-4
	c, err := sidecarcluster.New(sidecarcluster.Config{Holder: "test"})
	g.Expect(err).NotTo(HaveOccurred())
	const peer5 = "http://etcd-main-5.etcd-main-peer.ns.svc:2380"
	obs := &sidecarcluster.Observation{List: &sidecar.MemberList{Members: []sidecar.Member{
		{ID: "a0", Name: "etcd-main-0", PeerURLs: []string{"http://etcd-main-0.etcd-main-peer.ns.svc:2380"}},
		{ID: "b5", PeerURLs: []string{peer5}, IsLearner: true},
	}}}
	before, err := sidecar.NewClient(hs.URL, nil).Join(ctx)
	g.Expect(err).NotTo(HaveOccurred())

	admitted, err := c.Admit(ctx, obs, []sidecarcluster.Joiner{{Member: "etcd-main-5", PeerURLs: []string{peer5}, Sidecar: hs.URL}})
	g.Expect(err).To(MatchError(ContainSubstring(`answers for member "etcd-main-4", not for etcd-main-5`)))
	g.Expect(admitted).To(BeEmpty())
	after, err := sidecar.NewClient(hs.URL, nil).Join(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(after.Admission).To(BeNil())
	g.Expect(after.Admission).To(Equal(before.Admission))

	// A bootstrap that reaches it for another member neither.
	ok, why, err := c.Bootstrap(ctx, []sidecarcluster.Joiner{{Member: "etcd-main-5", Sidecar: hs.URL}})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(ok).To(BeFalse())
	g.Expect(why).To(ContainSubstring(`answers for member "etcd-main-4", not for etcd-main-5`))
	after, err = sidecar.NewClient(hs.URL, nil).Join(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(after.Admission).To(BeNil())
}

// TestAdmissionLeavesAStartedLearnerAlone: a pod starting its etcd may
// accept its sidecar's connections and not answer for seconds (the demo's
// pods did for 10 s, until etcd's publish), which held the controller's
// whole reconcile, the learner's promotion included. A learner the raft
// transport has connected runs already, so its sidecar is not asked; one
// that is not connected is asked within the observe timeout, and the
// error names it.
func TestAdmissionLeavesAStartedLearnerAlone(t *testing.T) {
	g := NewWithT(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	g.Expect(err).NotTo(HaveOccurred())
	var accepted atomic.Int32
	var conns []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			mu.Lock()
			conns = append(conns, c) // held open, never answered
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})

	c, err := sidecarcluster.New(sidecarcluster.Config{Holder: "test", ObserveTimeout: 300 * time.Millisecond})
	g.Expect(err).NotTo(HaveOccurred())
	const peer4 = "http://etcd-main-4.etcd-main-peer.ns.svc:2380"
	learner := sidecar.Member{ID: "b4", PeerURLs: []string{peer4}, IsLearner: true, ConnectedForSeconds: 2}
	obs := func(l sidecar.Member) *sidecarcluster.Observation {
		return &sidecarcluster.Observation{List: &sidecar.MemberList{Members: []sidecar.Member{
			{ID: "a0", Name: "etcd-main-0", PeerURLs: []string{"http://etcd-main-0.etcd-main-peer.ns.svc:2380"}, IsLeader: true},
			l,
		}}}
	}
	joiners := []sidecarcluster.Joiner{{Member: "etcd-main-4", PeerURLs: []string{peer4}, Sidecar: "http://" + ln.Addr().String()}}

	admitted, err := c.Admit(context.Background(), obs(learner), joiners)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(admitted).To(BeEmpty())
	g.Expect(accepted.Load()).To(BeZero(), "the sidecar of a connected learner is not asked")

	learner.ConnectedForSeconds = 0
	admitted, err = c.Admit(context.Background(), obs(learner), joiners)
	g.Expect(admitted).To(BeEmpty())
	g.Expect(err).To(MatchError(And(ContainSubstring("asking the sidecar of etcd-main-4 whether it waits"), ContainSubstring("context deadline exceeded"))))
	g.Expect(accepted.Load()).To(BeNumerically(">=", 1), "the sidecar of a learner that has not started is asked")
}

// TestAdmissionTellsHowLongTheLearnersEtcdRuns: the next learner joins once
// this one's etcd has asked the cluster for its members (planner rule 2),
// so Admit notes how long the learner's etcd has run with its
// configuration, as the pod's sidecar says, and the planner's input
// carries it.
func TestAdmissionTellsHowLongTheLearnersEtcdRuns(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	hs := joiningPod(t)
	c, err := sidecarcluster.New(sidecarcluster.Config{Holder: "test"})
	g.Expect(err).NotTo(HaveOccurred())
	members := []sidecar.Member{
		{ID: "a0", Name: "etcd-main-0", PeerURLs: []string{"http://etcd-main-0.etcd-main-peer.ns.svc:2380"}, IsLeader: true, Healthy: true},
		{ID: "B4", PeerURLs: []string{peer4}, IsLearner: true},
	}
	observe := func() *sidecarcluster.Observation {
		return &sidecarcluster.Observation{List: &sidecar.MemberList{Members: slices.Clone(members)}, At: time.Now()}
	}
	joiners := []sidecarcluster.Joiner{{Member: "etcd-main-4", PeerURLs: []string{peer4}, Sidecar: hs.URL}}
	configuredFor := func(o *sidecarcluster.Observation) time.Duration {
		in := c.Input(o, sidecarcluster.Target{}, sidecarcluster.NewProgress(nil))
		for _, m := range in.Members {
			if m.ID == "B4" {
				return m.ConfiguredFor
			}
		}
		t.Fatalf("no member B4 in %+v", in.Members)
		return 0
	}

	o := observe()
	admitted, err := c.Admit(ctx, o, joiners)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(admitted).To(Equal([]string{"etcd-main-4"}))
	g.Expect(configuredFor(o)).To(BeZero(), "admitted just now: its etcd has not taken the configuration")

	resp, err := hs.Client().Get(hs.URL + "/config") // the wrapper takes it
	g.Expect(err).NotTo(HaveOccurred())
	_ = resp.Body.Close()
	g.Expect(resp.StatusCode).To(Equal(200))
	o = observe()
	admitted, err = c.Admit(ctx, o, joiners)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(admitted).To(BeEmpty())
	g.Expect(configuredFor(o)).To(BeNumerically(">", 0))

	members[1].ConnectedForSeconds = 1 // its raft runs: its sidecar is not asked again
	o = observe()
	_, err = c.Admit(ctx, o, joiners)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(configuredFor(o)).To(BeZero())
}

// TestPodsWaitingAskTheirSidecars: a pod whose sidecar answers waits for
// its member, whether that sidecar serves etcd-wrapper or not (its member
// then starts on its own); one whose sidecar refuses the connection, or
// accepts it and answers nothing, has not started, and the answer says
// why. A sidecar that answers for another member is another pod's (a name
// both seeds' pods share): that says nothing of the member's own pod.
func TestPodsWaitingAskTheirSidecars(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	joining := joiningPod(t)
	plain, err := sidecar.New(sidecar.Config{Endpoints: []string{"http://127.0.0.1:1"}, InsecureAllowUnauthenticated: true, PollInterval: -1})
	g.Expect(err).NotTo(HaveOccurred())
	plainHS := httptest.NewServer(plain)
	t.Cleanup(func() { plainHS.Close(); _ = plain.Close() })
	refused, err := net.Listen("tcp", "127.0.0.1:0")
	g.Expect(err).NotTo(HaveOccurred())
	refusedURL := "http://" + refused.Addr().String()
	g.Expect(refused.Close()).To(Succeed()) // nothing listens there now
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = silent.Close() }) // accepted by the kernel, never answered

	c, err := sidecarcluster.New(sidecarcluster.Config{Holder: "test", ObserveTimeout: 500 * time.Millisecond})
	g.Expect(err).NotTo(HaveOccurred())
	got := c.PodsWaiting(ctx, []sidecarcluster.Joiner{
		{Member: "etcd-main-4", Sidecar: joining.URL},
		{Member: "etcd-main-5", Sidecar: joining.URL},
		{Member: "plain", Sidecar: plainHS.URL},
		{Member: "refused", Sidecar: refusedURL},
		{Member: "silent", Sidecar: "http://" + silent.Addr().String()},
		{Member: "silent-too", Sidecar: "http://" + silent.Addr().String()},
	})
	g.Expect(got).To(HaveLen(6))
	g.Expect(got["etcd-main-4"]).To(BeEmpty())
	g.Expect(got["etcd-main-5"]).To(ContainSubstring(`answers for member "etcd-main-4", not for etcd-main-5`))
	g.Expect(got["plain"]).To(BeEmpty())
	g.Expect(got["refused"]).To(And(HavePrefix("its pod's sidecar does not answer yet"), ContainSubstring("refused")))
	g.Expect(got["silent"]).To(And(HavePrefix("its pod's sidecar does not answer yet"), ContainSubstring("deadline")))
	g.Expect(got["silent-too"]).To(HavePrefix("its pod's sidecar does not answer yet"))
}
