package membership_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	. "github.com/onsi/gomega"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	stretchv1alpha1 "github.com/druid-stretch/druid-stretch/api/stretch/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	membershipctrl "github.com/druid-stretch/druid-stretch/controllers/membership"
	"github.com/druid-stretch/druid-stretch/internal/etcdview"
	"github.com/druid-stretch/druid-stretch/internal/testing/druidcrds"
	"github.com/druid-stretch/druid-stretch/internal/testing/extendedcrd"
	"github.com/druid-stretch/druid-stretch/internal/testing/pki"
	"github.com/druid-stretch/druid-stretch/internal/testing/podrunner"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
)

// One kube-apiserver for the package: starting one takes seconds.
var (
	restConfig *rest.Config
	k8s        client.Client
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	// Under -short only the tests that need no kube-apiserver run: the
	// others meet newEnv (or needsAPI), which skips them.
	if testbin.Short() {
		return m.Run()
	}
	env, err := testbin.Environment()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// The manager gets the test's logger; the global one only catches
	// library chatter.
	logf.SetLogger(logr.Discard())
	if restConfig, err = env.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "starting envtest (binaries in %s): %v\n", env.BinaryAssetsDirectory, err)
		return 1
	}
	defer func() { _ = env.Stop() }()
	scheme, err := membershipctrl.Scheme()
	if err == nil {
		// The CRDs too: the tests of Etcds stored under the extended Etcd
		// CRD install it for their duration.
		err = apiextensionsv1.AddToScheme(scheme)
	}
	if err == nil {
		k8s, err = client.New(restConfig, client.Options{Scheme: scheme})
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// identity is the test controller's cluster identity, the same across the
// restarts of a test: a restarted controller finds its own lock.
const identity = "test-cluster"

// env is one test's world: a namespace, a CA, a pod runner playing kubelet
// for it, and a log of every call the sidecars receive.
type env struct {
	t         *testing.T
	ns        string
	ca        *pki.CA
	clientTLS *tls.Config
	runner    *podrunner.Runner
	calls     *callLog
	log       logr.Logger
	// inline: Etcds are created with druid-stretch's fields inline, as
	// under the extended Etcd CRD (newExtendedEnv).
	inline bool
}

func newEnv(t *testing.T, runner ...func(*podrunner.Options)) *env {
	t.Helper()
	testbin.Need(t)
	g := NewWithT(t)
	ctx := t.Context()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "membership-"}}
	g.Expect(k8s.Create(ctx, ns)).To(Succeed())
	ca, err := pki.NewCA("controller-test")
	g.Expect(err).NotTo(HaveOccurred())
	clientTLS, err := podrunner.ClientTLSConfig(ca, "membership-controller")
	g.Expect(err).NotTo(HaveOccurred())
	e := &env{t: t, ns: ns.Name, ca: ca, clientTLS: clientTLS, calls: &callLog{}, log: testr.NewWithOptions(t, testr.Options{LogTimestamp: true})}
	ro := podrunner.Options{
		Client: k8s, Namespace: ns.Name, Dir: t.TempDir(), CA: ca,
		WrapSidecar: func(p podrunner.Pod, h http.Handler) http.Handler { return e.calls.wrap(p.Name, h) },
		Logger:      e.log,
	}
	for _, f := range runner {
		f(&ro)
	}
	e.runner, err = podrunner.New(ro)
	g.Expect(err).NotTo(HaveOccurred())
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = e.runner.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		<-done
		if err := e.runner.Close(); err != nil {
			t.Errorf("closing the pod runner: %v", err)
		}
		// Gone, so that later tests' controllers do not reconcile it.
		_ = k8s.DeleteAllOf(context.Background(), &v1alpha1.Etcd{}, client.InNamespace(ns.Name))
		_ = k8s.DeleteAllOf(context.Background(), &stretchv1alpha1.EtcdMembership{}, client.InNamespace(ns.Name))
	})
	return e
}

// newExtendedEnv is newEnv under the extended Etcd CRD of earlier releases,
// installed in place of druid's for this test, with its Etcds written as
// that CRD's users wrote them: druid-stretch's fields inline. The package's
// tests share one API server and the others run under druid's CRD, so a
// test that calls this must not run in parallel with another.
func newExtendedEnv(t *testing.T, runner ...func(*podrunner.Options)) *env {
	t.Helper()
	ext, err := extendedcrd.CRD()
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	druids := setEtcdCRD(t, ext.Spec, true)
	// Registered before newEnv's cleanup, so run after it: druid's CRD
	// comes back once the test's controllers, pods and Etcds are gone.
	t.Cleanup(func() { setEtcdCRD(t, druids, false) })
	e := newEnv(t, runner...)
	e.inline = true
	return e
}

// setEtcdCRD makes spec the Etcd CRD's and waits until the API server
// stores Etcds by it: their inline ordinalStart kept when inline, pruned
// otherwise. It returns the spec it replaced.
func setEtcdCRD(t *testing.T, spec apiextensionsv1.CustomResourceDefinitionSpec, inline bool) apiextensionsv1.CustomResourceDefinitionSpec {
	t.Helper()
	g := NewWithT(t)
	ctx := context.Background()
	var old apiextensionsv1.CustomResourceDefinitionSpec
	g.Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := k8s.Get(ctx, client.ObjectKey{Name: druidcrds.EtcdCRDName}, crd); err != nil {
			return err
		}
		old = *crd.Spec.DeepCopy()
		crd.Spec = *spec.DeepCopy()
		return k8s.Update(ctx, crd)
	})).To(Succeed())
	// The API server decodes Etcds with the new schema a moment after the
	// update, Established or not: a dry-run create shows which one it uses.
	g.Eventually(func(g Gomega) {
		probe := etcdObject("default", "probe", 1)
		probe.Name, probe.GenerateName = "", "crd-probe-"
		g.Expect(k8s.Create(ctx, probe, client.DryRunAll)).To(Succeed())
		g.Expect(probe.Spec.OrdinalStart != nil).To(Equal(inline), "an Etcd's inline ordinalStart kept")
	}).WithTimeout(30 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
	return old
}

// controller is one running controller manager.
type controller struct {
	cancel context.CancelFunc
	done   chan struct{} // closed when the manager has stopped
}

// stop ends the manager and waits until it has stopped.
func (c *controller) stop() {
	c.cancel()
	<-c.done
}

// startController runs the manager of `druid-stretch controller` in
// process, with the runner as resolver and the test's client certificate.
func (e *env) startController(mutate ...func(*membershipctrl.ManagerOptions)) *controller {
	e.t.Helper()
	o := membershipctrl.ManagerOptions{
		MetricsBindAddress:     "0",
		HealthProbeBindAddress: "0",
		Resolver:               e.runner,
		Namespaces:             []string{e.ns},
		SkipNameValidation:     true,
		Logger:                 e.log.WithName("controller"),
		Reconciler: membershipctrl.Options{
			ClusterIdentity:  identity,
			SidecarTLS:       e.clientTLS,
			ProgressInterval: 500 * time.Millisecond,
			// Changes made behind the controller's back (an unmanaged member
			// joining) show up at the next periodic round.
			ConvergedInterval: 3 * time.Second,
		},
	}
	for _, f := range mutate {
		f(&o)
	}
	mgr, err := membershipctrl.NewManager(restConfig, o)
	NewWithT(e.t).Expect(err).NotTo(HaveOccurred())
	ctx, cancel := context.WithCancel(context.Background())
	c := &controller{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		if err := mgr.Start(ctx); err != nil {
			e.t.Errorf("the controller manager failed: %v", err)
		}
	}()
	e.t.Cleanup(c.stop)
	return c
}

// newEtcd creates an Etcd of the given replicas with member name prefix
// prefix and peer TLS on. Its ordinalStart is set (to 0): the controller
// manages only Etcds that use the extension. It is written as a user
// writes it: druid-stretch's fields into its EtcdMembership, the Etcd in
// druid's form; under the extended Etcd CRD, the fields inline.
func (e *env) newEtcd(prefix string, replicas int32, mutate ...func(*v1alpha1.Etcd)) *v1alpha1.Etcd {
	e.t.Helper()
	etcd := etcdObject(e.ns, prefix, replicas)
	for _, f := range mutate {
		f(etcd)
	}
	g := NewWithT(e.t)
	if e.inline {
		g.Expect(k8s.Create(e.t.Context(), etcd)).To(Succeed())
	} else {
		g.Expect(etcdview.Create(e.t.Context(), k8s, etcd)).To(Succeed())
	}
	return etcd
}

// etcdObject is the view of the Etcd newEtcd creates in ns.
func etcdObject(ns, prefix string, replicas int32) *v1alpha1.Etcd {
	etcd := &v1alpha1.Etcd{ObjectMeta: metav1.ObjectMeta{Name: "etcd-main", Namespace: ns}}
	etcd.Spec.Replicas = replicas
	etcd.Spec.OrdinalStart = ptr.To[int32](0)
	etcd.Spec.MemberNamePrefix = ptr.To(prefix)
	etcd.Spec.Labels = map[string]string{"app": "etcd"}
	etcd.Spec.Etcd.PeerUrlTLS = &druidv1alpha1.PeerTLSConfig{TLSConfig: druidv1alpha1.TLSConfig{
		TLSCASecretRef:     druidv1alpha1.SecretReference{SecretReference: corev1.SecretReference{Name: "ca-etcd-peer"}},
		ServerTLSSecretRef: corev1.SecretReference{Name: "etcd-peer-server"},
	}}
	return etcd
}

// update changes the Etcd's view as a user does, each part where it lives
// (etcdview.Apply), leaves etcd as the view written, and returns the
// view's generation, the one status.membership observes. That is the
// Etcd's, which a change of druid-stretch's fields alone leaves as it was:
// converged also waits for the EtcdMembership's status to observe the
// EtcdMembership's own.
func update(g Gomega, etcd *v1alpha1.Etcd, mutate func(*v1alpha1.Etcd)) int64 {
	ctx := context.Background()
	g.Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p, err := etcdview.Get(ctx, k8s, client.ObjectKeyFromObject(etcd))
		if err != nil {
			return err
		}
		want := p.View.DeepCopy()
		mutate(want)
		if err := etcdview.Apply(ctx, k8s, p, want); err != nil {
			return err
		}
		*etcd = *etcdview.Of(p.Etcd, p.Membership).View
		return nil
	})).To(Succeed())
	return etcd.Generation
}

// current, as converged's generation, is the pair's generation at each
// look: for a pair the test has not changed since it was created (the
// controller's own first write of an EtcdMembership counts).
const current int64 = 0

// converged waits until the controller reports, for generation gen of the
// view (or the current one) and the current one of the EtcdMembership,
// MembershipConverged with exactly the named members as voters.
func converged(g Gomega, etcd *v1alpha1.Etcd, gen int64, timeout time.Duration, names ...string) *v1alpha1.MembershipStatus {
	var st *v1alpha1.MembershipStatus
	g.Eventually(func(g Gomega) {
		p := pair(g, etcd)
		g.Expect(p.Membership).NotTo(BeNil())
		g.Expect(p.Membership.Status.ObservedGeneration).To(Equal(p.Membership.Generation), "planned from the EtcdMembership's spec as it is")
		st = p.View.Status.Membership
		g.Expect(st).NotTo(BeNil())
		c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionMembershipConverged)
		g.Expect(c).NotTo(BeNil())
		want := gen
		if want == current {
			want = p.View.Generation
		}
		g.Expect(c.ObservedGeneration).To(Equal(want))
		g.Expect(c.Status).To(Equal(metav1.ConditionTrue), "%s: %s", c.Reason, c.Message)
		g.Expect(st.Voters()).To(ConsistOf(names))
	}).WithTimeout(timeout).WithPolling(250 * time.Millisecond).Should(Succeed())
	return st
}

// view reads the Etcd with its EtcdMembership from the API server, as the
// controller sees the pair.
func view(g Gomega, etcd *v1alpha1.Etcd) *v1alpha1.Etcd { return pair(g, etcd).View }

// pair reads the Etcd and its EtcdMembership from the API server.
func pair(g Gomega, etcd *v1alpha1.Etcd) *etcdview.Pair {
	p, err := etcdview.Get(context.Background(), k8s, client.ObjectKeyFromObject(etcd))
	g.Expect(err).NotTo(HaveOccurred())
	return p
}

// condition reads one condition of the Etcd's membership status from the
// API server.
func condition(g Gomega, etcd *v1alpha1.Etcd, typ string) *metav1.Condition {
	got := view(g, etcd)
	if got.Status.Membership == nil {
		return nil
	}
	return meta.FindStatusCondition(got.Status.Membership.Conditions, typ)
}

// events lists the reasons of the Events about the Etcd, oldest first.
func events(g Gomega, etcd *v1alpha1.Etcd) []corev1.Event {
	var list corev1.EventList
	g.Expect(k8s.List(context.Background(), &list, client.InNamespace(etcd.Namespace))).To(Succeed())
	var out []corev1.Event
	for _, ev := range list.Items {
		if ev.InvolvedObject.Name == etcd.Name && ev.InvolvedObject.Kind == "Etcd" {
			out = append(out, ev)
		}
	}
	slices.SortFunc(out, func(a, b corev1.Event) int { return a.EventTime.Compare(b.EventTime.Time) })
	return out
}

func reasons(evs []corev1.Event) map[string]int {
	out := map[string]int{}
	for _, ev := range evs {
		out[ev.Reason] += max(int(ev.Count), 1)
		if ev.Series != nil {
			out[ev.Reason] += int(ev.Series.Count) - 1
		}
	}
	return out
}

// call is one membership call a sidecar received.
type call struct {
	At      time.Time
	Pod     string
	Kind    string // AddLearner, Promote, MoveLeader, Remove; "" for lock and records
	Path    string
	Code    int
	Changed bool
}

// callLog wraps every sidecar: it records the calls, injects faults, and
// stops a controller in the middle of a step: the first call of the armed
// kind that changes etcd runs to its end, then the controller is stopped
// before the answer goes out, so it never learns the outcome.
type callLog struct {
	mu       sync.Mutex
	calls    []call
	fault    func(r *http.Request) (code int, body string, ok bool)
	killKind string
	kill     func()
	killed   bool
	// after runs once, after the first call of afterKind that changed
	// etcd and before its caller hears the answer.
	afterKind string
	after     func()
}

func stepKind(r *http.Request) string {
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/v1/members":
		return "AddLearner"
	case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/promote"):
		return "Promote"
	case r.Method == http.MethodPost && r.URL.Path == "/v1/leader":
		return "MoveLeader"
	case r.Method == http.MethodDelete && strings.HasPrefix(r.URL.Path, "/v1/members/"):
		return "Remove"
	}
	return ""
}

func (l *callLog) wrap(pod string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			h.ServeHTTP(w, r)
			return
		}
		kind := stepKind(r)
		l.mu.Lock()
		fault := l.fault
		var kill func()
		if kind != "" && kind == l.killKind && l.kill != nil {
			kill, l.kill = l.kill, nil
		}
		var after func()
		if kind != "" && kind == l.afterKind && l.after != nil {
			after, l.after = l.after, nil
		}
		l.mu.Unlock()
		if fault != nil {
			if code, body, ok := fault(r); ok {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(code)
				_, _ = w.Write([]byte(body))
				l.record(call{At: time.Now(), Pod: pod, Kind: kind, Path: r.URL.Path, Code: code})
				return
			}
		}
		// The call runs to its end even when its caller goes away, as it
		// would in etcd after the caller crashed.
		rec := &bufferedWriter{header: http.Header{}, code: http.StatusOK}
		h.ServeHTTP(rec, r.WithContext(context.WithoutCancel(r.Context())))
		var answer struct {
			Changed bool
			// Removed is the voter a promotion with ?thenRemove= removed
			// right after it (the tie of a move between two sides).
			Removed *json.RawMessage
		}
		_ = json.Unmarshal(rec.body.Bytes(), &answer)
		l.record(call{At: time.Now(), Pod: pod, Kind: kind, Path: r.URL.Path, Code: rec.code, Changed: answer.Changed})
		if kind == "Promote" && answer.Removed != nil {
			l.record(call{At: time.Now(), Pod: pod, Kind: "Remove", Path: r.URL.RequestURI(), Code: rec.code, Changed: true})
		}
		if after != nil {
			if rec.code < 300 && answer.Changed {
				after()
			} else {
				l.armAfter(kind, after)
			}
		}
		if kill != nil {
			if rec.code < 300 && answer.Changed {
				// The step took effect; the controller dies before it hears so.
				kill()
				// Its request is cancelled with it; answer only after that.
				select {
				case <-r.Context().Done():
				case <-time.After(5 * time.Second):
				}
				l.mu.Lock()
				l.killed = true
				l.mu.Unlock()
			} else {
				l.armKill(kind, kill) // refused: wait for the attempt that changes etcd
			}
		}
		for k, v := range rec.header {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.code)
		_, _ = w.Write(rec.body.Bytes())
	})
}

func (l *callLog) record(c call) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls = append(l.calls, c)
}

func (l *callLog) setFault(f func(r *http.Request) (int, string, bool)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.fault = f
}

// armKill stops a controller at the first call of kind.
func (l *callLog) armKill(kind string, kill func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.killKind, l.kill = kind, kill
}

// armAfter runs f once the first call of kind changed etcd, before the
// caller hears the answer.
func (l *callLog) armAfter(kind string, f func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.afterKind, l.after = kind, f
}

func (l *callLog) fired() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.killed
}

func (l *callLog) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls = nil
}

func (l *callLog) snapshot() []call {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.calls)
}

// changes are the calls that changed etcd (membership or leadership).
func changes(calls []call) []call {
	var out []call
	for _, c := range calls {
		if c.Kind != "" && c.Code < 300 && c.Changed {
			out = append(out, c)
		}
	}
	return out
}

// count is how many changes there were of each kind.
func count(calls []call) map[string]int {
	out := map[string]int{}
	for _, c := range changes(calls) {
		out[c.Kind]++
	}
	return out
}

// memberCounts is the sequence of member counts the changes went through,
// starting from start members.
func memberCounts(start int, calls []call) []int {
	seq := []int{start}
	for _, c := range changes(calls) {
		switch c.Kind {
		case "AddLearner":
			seq = append(seq, seq[len(seq)-1]+1)
		case "Remove":
			seq = append(seq, seq[len(seq)-1]-1)
		}
	}
	return seq
}

// bufferedWriter holds a sidecar's answer until the test lets it out.
type bufferedWriter struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (w *bufferedWriter) Header() http.Header         { return w.header }
func (w *bufferedWriter) WriteHeader(code int)        { w.code = code }
func (w *bufferedWriter) Write(b []byte) (int, error) { return w.body.Write(b) }

// histogram reads a histogram's sample count and sum from controller-
// runtime's registry.
func histogram(g Gomega, name string) (uint64, float64) {
	families, err := crmetrics.Registry.Gather()
	g.Expect(err).NotTo(HaveOccurred())
	for _, f := range families {
		if f.GetName() == name && f.GetType() == dto.MetricType_HISTOGRAM && len(f.Metric) > 0 {
			h := f.Metric[0].GetHistogram()
			return h.GetSampleCount(), h.GetSampleSum()
		}
	}
	return 0, 0
}

// counter reads a counter (or gauge) with the given labels from the
// registry; 0 when there is no such series.
func counter(g Gomega, name string, labels map[string]string) float64 {
	families, err := crmetrics.Registry.Gather()
	g.Expect(err).NotTo(HaveOccurred())
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	metric:
		for _, m := range f.Metric {
			for _, lp := range m.Label {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue metric
				}
			}
			if m.Gauge != nil {
				return m.GetGauge().GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}
