package podrunner_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	"github.com/go-logr/logr/testr"
	. "github.com/onsi/gomega"
	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	stretchv1alpha1 "github.com/druid-stretch/druid-stretch/api/stretch/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/internal/etcdview"
	"github.com/druid-stretch/druid-stretch/internal/testing/pki"
	"github.com/druid-stretch/druid-stretch/internal/testing/podrunner"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
)

var k8s client.Client

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	if testbin.Short() {
		fmt.Println("every test of this package runs real binaries: none runs under -short")
		return 0
	}
	env, err := testbin.Environment()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cfg, err := env.Start()
	if err != nil {
		fmt.Fprintf(os.Stderr, "starting envtest (binaries in %s): %v\n", env.BinaryAssetsDirectory, err)
		return 1
	}
	defer func() { _ = env.Stop() }()
	scheme := runtime.NewScheme()
	_ = corev1.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	_ = stretchv1alpha1.AddToScheme(scheme)
	if k8s, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// TestRunnerPlaysKubelet bootstraps a new Etcd, holds and releases a pod,
// lets a pod crash-loop until its member is added, keeps a pod outside the
// range running while etcd still lists its member, stops it once the member
// is gone, and starts it again on a fresh data dir when it joins again.
// The test plays the membership controller by hand: it changes membership
// with an etcd client and writes status.membership.
func TestRunnerPlaysKubelet(t *testing.T) {
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "runner-"}}
	g.Expect(k8s.Create(ctx, ns)).To(Succeed())
	ca, err := pki.NewCA("runner-test")
	g.Expect(err).NotTo(HaveOccurred())
	r, err := podrunner.New(podrunner.Options{Client: k8s, Namespace: ns.Name, Dir: t.TempDir(), CA: ca, Logger: testr.NewWithOptions(t, testr.Options{Verbosity: 1})})
	g.Expect(err).NotTo(HaveOccurred())
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		<-done
		g.Expect(r.Close()).To(Succeed())
	})

	e := &v1alpha1.Etcd{ObjectMeta: metav1.ObjectMeta{Name: "etcd-main", Namespace: ns.Name}}
	e.Spec.Replicas = 3
	e.Spec.MemberNamePrefix = ptr.To("run")
	e.Spec.Labels = map[string]string{"app": "etcd"}
	e.Spec.Etcd.PeerUrlTLS = &druidv1alpha1.PeerTLSConfig{TLSConfig: druidv1alpha1.TLSConfig{
		TLSCASecretRef:     druidv1alpha1.SecretReference{SecretReference: corev1.SecretReference{Name: "ca"}},
		ServerTLSSecretRef: corev1.SecretReference{Name: "server"},
	}}
	// Its EtcdMembership, empty for now, carries the ordinal start and
	// the status below, as druid-stretch's controller would write them.
	g.Expect(k8s.Create(ctx, stretchv1alpha1.For(e, v1alpha1.MembershipSpec{}))).To(Succeed())
	g.Expect(k8s.Create(ctx, e)).To(Succeed())
	edit := func(mutate func(*v1alpha1.Etcd)) {
		g.Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
			p, err := etcdview.Get(ctx, k8s, client.ObjectKeyFromObject(e))
			if err != nil {
				return err
			}
			want := p.View.DeepCopy()
			mutate(want)
			return etcdview.Apply(ctx, k8s, p, want)
		})).To(Succeed())
	}
	pod := func(o int64) string { return fmt.Sprintf("etcd-main-%d", o) }
	member := func(o int64) string { return "run-" + pod(o) }

	// A new Etcd is bootstrapped from its range, all pods at once.
	g.Eventually(func() bool {
		return r.Running(ns.Name, pod(0)) && r.Running(ns.Name, pod(1)) && r.Running(ns.Name, pod(2))
	}).
		WithTimeout(time.Minute).Should(BeTrue())
	m0, err := r.Member(e, 0)
	g.Expect(err).NotTo(HaveOccurred())
	// The client talks to pods 1 and 2, which stay members throughout.
	var eps []string
	for _, o := range []int64{1, 2} {
		m, err := r.Member(e, o)
		g.Expect(err).NotTo(HaveOccurred())
		eps = append(eps, m.ClientURL)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, TLS: m0.ClientTLSConfig(), DialTimeout: 5 * time.Second})
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = cli.Close() }()
	list := func(g Gomega) []string {
		resp, err := cli.MemberList(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		var out []string
		for _, m := range resp.Members {
			out = append(out, fmt.Sprintf("%s learner=%t", m.Name, m.IsLearner))
		}
		slices.Sort(out)
		return out
	}
	g.Expect(list(g)).To(Equal([]string{"run-etcd-main-0 learner=false", "run-etcd-main-1 learner=false", "run-etcd-main-2 learner=false"}))
	writeStatus(ctx, g, cli, e)

	// Hold stops a pod; Release starts it again on its data.
	r.Hold(ns.Name, pod(2))
	g.Eventually(func() bool { return r.Running(ns.Name, pod(2)) }).WithTimeout(20 * time.Second).Should(BeFalse())
	r.Release(ns.Name, pod(2))
	g.Eventually(func() bool { return r.Running(ns.Name, pod(2)) }).WithTimeout(30 * time.Second).Should(BeTrue())
	g.Expect(list(g)).To(HaveLen(3))

	// A fourth pod crash-loops until its member is added.
	edit(func(e *v1alpha1.Etcd) { e.Spec.Replicas = 4 })
	m3, err := r.Member(e, 3)
	g.Expect(err).NotTo(HaveOccurred())
	g.Consistently(func() bool { return r.Running(ns.Name, pod(3)) }).WithTimeout(3 * time.Second).Should(BeFalse())
	added := addLearner(ctx, g, cli, m3.PeerURL)
	g.Eventually(func() bool { return r.Running(ns.Name, pod(3)) }).WithTimeout(30 * time.Second).Should(BeTrue())
	g.Eventually(list).WithTimeout(10 * time.Second).Should(ContainElement(member(3) + " learner=true"))
	writeStatus(ctx, g, cli, e)

	// Out of the range, a pod runs while etcd lists its member...
	edit(func(e *v1alpha1.Etcd) { e.Spec.OrdinalStart = ptr.To[int32](1) })
	g.Consistently(func() bool { return r.Running(ns.Name, pod(0)) }).WithTimeout(2 * time.Second).Should(BeTrue())
	// ...and stops once it is gone.
	first := memberID(ctx, g, cli, member(0))
	g.Eventually(func() error { _, err := cli.MemberRemove(ctx, first); return err }).WithTimeout(15 * time.Second).Should(Succeed())
	writeStatus(ctx, g, cli, e)
	g.Eventually(func() bool { return r.Running(ns.Name, pod(0)) }).WithTimeout(20 * time.Second).Should(BeFalse())

	// Back in the range, it joins again as a new member, on a fresh data dir.
	g.Eventually(func() error { _, err := cli.MemberPromote(ctx, added.Member.ID); return err }).WithTimeout(30 * time.Second).Should(Succeed())
	edit(func(e *v1alpha1.Etcd) { e.Spec.OrdinalStart = nil })
	again := addLearner(ctx, g, cli, m0.PeerURL)
	g.Expect(again.Member.ID).NotTo(Equal(first))
	g.Eventually(list).WithTimeout(40 * time.Second).Should(ContainElement(member(0) + " learner=true"))
	g.Expect(list(g)).To(HaveLen(4))
	g.Eventually(func() bool { return r.Running(ns.Name, pod(0)) }).WithTimeout(10 * time.Second).Should(BeTrue())
	log, err := os.ReadFile(m0.LogPath)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(log)).To(ContainSubstring(fmt.Sprintf(`"local-member-id":"%x"`, again.Member.ID)), "it runs as the new member")
	g.Eventually(func() bool { return r.Running(ns.Name, pod(4)) }).WithTimeout(10*time.Second).Should(BeFalse(), "pod 4 left the window")
}

// memberID is the ID of the named member.
func memberID(ctx context.Context, g Gomega, cli *clientv3.Client, name string) uint64 {
	resp, err := cli.MemberList(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	for _, m := range resp.Members {
		if m.Name == name {
			return m.ID
		}
	}
	g.Expect(name).To(BeEmpty(), "no member named %s", name)
	return 0
}

// addLearner adds a learner, retrying while etcd's strict reconfiguration
// check refuses (a member restarted less than 5 s ago).
func addLearner(ctx context.Context, g Gomega, cli *clientv3.Client, peerURL string) *clientv3.MemberAddResponse {
	var resp *clientv3.MemberAddResponse
	g.Eventually(func() (err error) {
		resp, err = cli.MemberAddAsLearner(ctx, []string{peerURL})
		return err
	}).WithTimeout(15 * time.Second).WithPolling(500 * time.Millisecond).Should(Succeed())
	return resp
}

// writeStatus writes etcd's member list into status.membership of e's
// EtcdMembership, as the controller would.
func writeStatus(ctx context.Context, g Gomega, cli *clientv3.Client, e *v1alpha1.Etcd) {
	resp, err := cli.MemberList(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	m := &stretchv1alpha1.EtcdMembership{}
	g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(e), m)).To(Succeed())
	st := &v1alpha1.MembershipStatus{Phase: v1alpha1.MembershipPhaseConverged}
	for _, m := range resp.Members {
		role := v1alpha1.MemberRoleVoter
		if m.IsLearner {
			role = v1alpha1.MemberRoleLearner
		}
		st.Members = append(st.Members, v1alpha1.ObservedMember{ID: fmt.Sprintf("%x", m.ID), Name: m.Name, PeerURLs: m.PeerURLs, Role: role})
	}
	m.Status.Membership = st
	g.Expect(k8s.Status().Update(ctx, m)).To(Succeed())
}
