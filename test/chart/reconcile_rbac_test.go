package chart

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	"github.com/go-logr/logr/testr"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	stretchv1alpha1 "github.com/druid-stretch/druid-stretch/api/stretch/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	membershipctrl "github.com/druid-stretch/druid-stretch/controllers/membership"
	"github.com/druid-stretch/druid-stretch/internal/etcdview"
	"github.com/druid-stretch/druid-stretch/internal/testing/pki"
	"github.com/druid-stretch/druid-stretch/internal/testing/podrunner"
)

// TestRBACReconcileEndToEnd runs the real membership controller (its
// manager, with leader election) as the chart's ServiceAccount through
// impersonation, against real etcd members that a pod runner keeps running
// (the pod runner plays kubelet and acts as admin). The controller
// observes a freshly started 3-member Etcd opted in by its EtcdMembership,
// makes the Etcd the EtcdMembership's owner and reports it converged there,
// then moves one member live (the EtcdMembership's ordinalStart 0 -> 1),
// recording Events with the events.k8s.io API; the API server never refuses
// any of its requests. A plain Etcd beside it, whose StatefulSet druid has
// not made yet, stays druid's alone and never makes a reconcile fail.
func TestRBACReconcileEndToEnd(t *testing.T) {
	g := NewWithT(t)
	ctx := t.Context()
	f := newRBACFixture(t, values(t, ``))
	args, err := f.rendered.ControllerArgs()
	g.Expect(err).NotTo(HaveOccurred())
	leaderNS, identity := flagValue(args, "leader-election-namespace"), flagValue(args, "cluster-identity")
	g.Expect(leaderNS).To(Equal(f.releaseNS), "the chart elects the leader in the release namespace")
	g.Expect(identity).NotTo(BeEmpty(), "the chart sets --cluster-identity")

	// The Etcd gets a namespace of its own: the fixture's Etcd is not
	// runnable (no peer TLS), and the pod runner and the controller would
	// otherwise start it too.
	ns := newNamespace(t, "rbac-reconcile")
	log := testr.NewWithOptions(t, testr.Options{LogTimestamp: true})
	ca, err := pki.NewCA("chart-rbac-reconcile")
	g.Expect(err).NotTo(HaveOccurred())
	sidecarTLS, err := podrunner.ClientTLSConfig(ca, "membership-controller")
	g.Expect(err).NotTo(HaveOccurred())
	runner, err := podrunner.New(podrunner.Options{Client: admin, Namespace: ns, Dir: t.TempDir(), CA: ca, Logger: log.WithName("kubelet")})
	g.Expect(err).NotTo(HaveOccurred())
	runCtx, stopRunner := context.WithCancel(context.Background())
	runnerDone := make(chan struct{})
	go func() { defer close(runnerDone); _ = runner.Run(runCtx) }()
	t.Cleanup(func() {
		stopRunner()
		<-runnerDone
		if err := runner.Close(); err != nil {
			t.Errorf("closing the pod runner: %v", err)
		}
	})

	panics := reconcilePanics(g, "etcd-membership")
	// Every request the controller's manager makes, as the ServiceAccount.
	requests := &requestLog{}
	cfg := rest.CopyConfig(f.saCfg)
	cfg.WrapTransport = requests.wrap
	mgr, err := membershipctrl.NewManager(cfg, membershipctrl.ManagerOptions{
		MetricsBindAddress:      "0",
		HealthProbeBindAddress:  "0",
		LeaderElection:          true,
		LeaderElectionNamespace: leaderNS,
		Resolver:                runner,
		// The cache watches only this test's namespace: Etcds other tests of
		// the package leave behind have no pods to reach. The cluster-wide
		// list and watch the chart's Deployment does are in TestRBACControllerPath.
		Namespaces:         []string{ns},
		SkipNameValidation: true,
		Logger:             log.WithName("controller"),
		Reconciler: membershipctrl.Options{
			ClusterIdentity:   identity,
			SidecarTLS:        sidecarTLS,
			ProgressInterval:  500 * time.Millisecond,
			ConvergedInterval: 3 * time.Second,
		},
	})
	g.Expect(err).NotTo(HaveOccurred())
	mgrCtx, stopMgr := context.WithCancel(context.Background())
	mgrDone := make(chan struct{})
	go func() {
		defer close(mgrDone)
		if err := mgr.Start(mgrCtx); err != nil {
			t.Errorf("the controller manager failed: %v", err)
		}
	}()
	// Registered after the runner's, so it runs first: the controller stops
	// before its members do.
	t.Cleanup(func() {
		stopMgr()
		<-mgrDone
	})

	etcd := &v1alpha1.Etcd{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "etcd-main"}}
	etcd.Spec.Replicas = 3
	etcd.Spec.OrdinalStart = ptr.To[int32](0) // explicit, so the EtcdMembership opts the Etcd in
	etcd.Spec.MemberNamePrefix = ptr.To("rr")
	etcd.Spec.Labels = map[string]string{"app": "etcd"}
	etcd.Spec.Etcd.PeerUrlTLS = &druidv1alpha1.PeerTLSConfig{TLSConfig: druidv1alpha1.TLSConfig{
		TLSCASecretRef:     druidv1alpha1.SecretReference{SecretReference: corev1.SecretReference{Name: "ca-etcd-peer"}},
		ServerTLSSecretRef: corev1.SecretReference{Name: "etcd-peer-server"},
	}}
	// The EtcdMembership first, then the Etcd in druid's form, as the
	// migration adapter writes them; the EtcdMembership has no owner yet.
	g.Expect(etcdview.Create(ctx, admin, etcd)).To(Succeed())
	key := client.ObjectKeyFromObject(etcd)
	// Hibernated, so the pod runner runs none of its pods.
	plain := &v1alpha1.Etcd{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "etcd-events"}}
	plain.Spec.Labels = map[string]string{"app": "etcd-events"}
	g.Expect(admin.Create(ctx, plain)).To(Succeed())
	memberNames := func(ordinals ...int) []string {
		out := make([]string, len(ordinals))
		for i, o := range ordinals {
			out[i] = fmt.Sprintf("rr-etcd-main-%d", o)
		}
		return out
	}

	start := time.Now()
	expectConverged(g, key, pairGeneration(g, key), 90*time.Second, memberNames(0, 1, 2)...)
	t.Logf("converged on members 0-2 in %s", time.Since(start).Round(100*time.Millisecond))
	m := &stretchv1alpha1.EtcdMembership{}
	g.Expect(admin.Get(ctx, key, m)).To(Succeed())
	g.Expect(m.OwnerReferences).To(ConsistOf(HaveField("UID", etcd.UID)), "the controller made the Etcd its EtcdMembership's owner")

	start = time.Now()
	g.Eventually(func() error {
		if err := admin.Get(ctx, key, m); err != nil {
			return err
		}
		m.Spec.OrdinalStart = ptr.To[int32](1)
		return admin.Update(ctx, m)
	}).WithTimeout(10 * time.Second).Should(Succeed())
	st := expectConverged(g, key, pairGeneration(g, key), 90*time.Second, memberNames(1, 2, 3)...)
	g.Expect(st.RetiredMembers).To(ContainElement(memberNames(0)[0]))
	t.Logf("moved member 0 to 3 in %s", time.Since(start).Round(100*time.Millisecond))

	// The steps' Events, written by the controller with events.k8s.io.
	g.Eventually(func(g Gomega) {
		var list eventsv1.EventList
		g.Expect(admin.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
		reasons := map[string]int{}
		for _, ev := range list.Items {
			if ev.Regarding.Kind == "Etcd" && ev.Regarding.Name == etcd.Name && ev.ReportingController == "druid-stretch-membership" {
				reasons[ev.Reason]++
			}
		}
		g.Expect(reasons).To(HaveKey("LearnerAdded"))
		g.Expect(reasons).To(HaveKey("LearnerPromoted"))
		g.Expect(reasons).To(HaveKey("MemberRemoved"))
	}).WithTimeout(15 * time.Second).WithPolling(250 * time.Millisecond).Should(Succeed())

	// The controller held the chart's leader election Lease.
	g.Expect(requests.count(func(r request) bool {
		return strings.Contains(r.path, "/namespaces/"+leaderNS+"/leases/") && r.code < 300
	})).To(BeNumerically(">", 0), "leader election requests in %s", leaderNS)

	// Stop the controller first, so every request it made (the lease
	// released on exit among them) is in the log.
	stopMgr()
	<-mgrDone
	g.Expect(reconcilePanics(g, "etcd-membership")).To(Equal(panics), "no reconcile panicked")
	err = admin.Get(ctx, client.ObjectKeyFromObject(plain), &stretchv1alpha1.EtcdMembership{})
	g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the plain Etcd got no EtcdMembership: got %v", err)
	all := requests.snapshot()
	g.Expect(all).NotTo(BeEmpty())
	var notImpersonated, forbidden []string
	for _, r := range all {
		if r.user != f.saUser {
			notImpersonated = append(notImpersonated, r.String())
		}
		if r.code == http.StatusForbidden {
			forbidden = append(forbidden, r.String())
		}
	}
	g.Expect(notImpersonated).To(BeEmpty(), "every request acts as %s", f.saUser)
	g.Expect(forbidden).To(BeEmpty(), "requests the chart's RBAC refused")
	for _, want := range []struct{ what, method, path string }{
		{"status patch", http.MethodPatch, "/etcdmemberships/etcd-main/status"},
		{"owner reference patch", http.MethodPatch, "/etcdmemberships/etcd-main"},
		{"events.k8s.io Event", http.MethodPost, "/apis/events.k8s.io/v1/namespaces/" + ns + "/events"},
		{"Etcd list or watch", http.MethodGet, "/etcds"},
		{"EtcdMembership list or watch", http.MethodGet, "/etcdmemberships"},
	} {
		g.Expect(requests.count(func(r request) bool {
			return r.method == want.method && strings.Contains(r.path, want.path) && r.code < 300
		})).To(BeNumerically(">", 0), "a successful %s", want.what)
	}
	t.Logf("%d requests as %s, none forbidden", len(all), f.saUser)
}

// pairGeneration is the generation of the Etcd key's View, the one
// status.membership reports having observed (stretchv1alpha1.View).
func pairGeneration(g *WithT, key client.ObjectKey) int64 {
	p, err := etcdview.Get(context.Background(), admin, key)
	g.ExpectWithOffset(1, err).NotTo(HaveOccurred())
	return p.View.Generation
}

// expectConverged waits until status.membership of the Etcd key (in its
// EtcdMembership), for the pair's generation gen, says
// MembershipConverged=True with exactly the named members as voters.
func expectConverged(g *WithT, key client.ObjectKey, gen int64, timeout time.Duration, names ...string) *v1alpha1.MembershipStatus {
	var st *v1alpha1.MembershipStatus
	g.Eventually(func(g Gomega) {
		p, err := etcdview.Get(context.Background(), admin, key)
		g.Expect(err).NotTo(HaveOccurred())
		st = p.View.Status.Membership
		g.Expect(st).NotTo(BeNil())
		c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionMembershipConverged)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.ObservedGeneration).To(Equal(gen))
		g.Expect(c.Status).To(Equal(metav1.ConditionTrue), "%s: %s", c.Reason, c.Message)
		g.Expect(st.Voters()).To(ConsistOf(names))
	}).WithTimeout(timeout).WithPolling(250 * time.Millisecond).Should(Succeed())
	return st
}

// flagValue is the value of --name=value in args.
func flagValue(args []string, name string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v
		}
	}
	return ""
}

// request is one API request and the status code it got.
type request struct {
	method, path, user string
	code               int
}

func (r request) String() string {
	return fmt.Sprintf("%s %s as %q: %d", r.method, r.path, r.user, r.code)
}

// requestLog records the requests of a rest.Config. Its round tripper sits
// under client-go's impersonation, so it sees the Impersonate-User header.
type requestLog struct {
	mu       sync.Mutex
	requests []request
}

func (l *requestLog) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(req)
		r := request{method: req.Method, path: req.URL.Path, user: req.Header.Get("Impersonate-User")}
		if resp != nil {
			r.code = resp.StatusCode
		}
		l.mu.Lock()
		l.requests = append(l.requests, r)
		l.mu.Unlock()
		return resp, err
	})
}

func (l *requestLog) snapshot() []request {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]request(nil), l.requests...)
}

func (l *requestLog) count(match func(request) bool) int {
	n := 0
	for _, r := range l.snapshot() {
		if match(r) {
			n++
		}
	}
	return n
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// reconcilePanics is controller-runtime's count of the reconciles of the
// named controller that panicked (and were recovered).
func reconcilePanics(g *WithT, controller string) float64 {
	families, err := crmetrics.Registry.Gather()
	g.ExpectWithOffset(1, err).NotTo(HaveOccurred())
	var n float64
	for _, fam := range families {
		if fam.GetName() != "controller_runtime_reconcile_panics_total" {
			continue
		}
		for _, m := range fam.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "controller" && l.GetValue() == controller {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}
