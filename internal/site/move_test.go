package site

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	. "github.com/onsi/gomega"
	clientv3 "go.etcd.io/etcd/client/v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlzap "sigs.k8s.io/controller-runtime/pkg/log/zap"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	move "github.com/druid-stretch/druid-stretch/api/v1alpha1/migration"
	"github.com/druid-stretch/druid-stretch/controllers/webhook"
	"github.com/druid-stretch/druid-stretch/internal/apiload"
	"github.com/druid-stretch/druid-stretch/internal/migration"
	"github.com/druid-stretch/druid-stretch/internal/workload"
)

// moveNamespace is the shoot namespace, the same in both sites as in two
// Gardener seeds.
const moveNamespace = "shoot--dev--move"

// siteRTT is the round trip between the two sites of the move: two regions
// apart, the distance a live control plane migration spans.
const siteRTT = 180 * time.Millisecond

// TestLiveMoveBetweenRealSites moves a 3-member Etcd from site A to site B,
// two sites of real parts (real druid, real backup-restore, the injected
// sidecar, pods run from their Pod objects) whose pod networks are peered,
// with the migration adapter as gardenlet would drive it, while a client
// writes and reads. Each site names its pods under its own external domain,
// as a seed's DNS does, and the Etcds advertise those names
// (spec.etcd.additionalAdvertisePeerURLs).
func TestLiveMoveBetweenRealSites(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("a real site needs root: its pods get network namespaces and chroots")
	}
	g := NewWithT(t)
	ctx := context.Background()
	sites := startSites(t,
		Options{DruidStretch: true, ClusterIdentity: "site-a", PodCIDR: "10.244.0.0/16", Domain: "site-a.test"},
		Options{DruidStretch: true, ClusterIdentity: "site-b", PodCIDR: "10.245.0.0/16", Domain: "site-b.test"})
	a, b := sites[0], sites[1]
	g.Expect(Peer(a, b, siteRTT)).To(Succeed())
	createNamespace(t, a, moveNamespace)
	createNamespace(t, b, moveNamespace)

	// The source: a shoot's etcd-main in A, opted in, advertising its
	// members' external names.
	src := applyEtcd(t, a, moveNamespace, func(o *unstructured.Unstructured) {
		g.Expect(unstructured.SetNestedField(o.Object, int64(0), "spec", "ordinalStart")).To(Succeed())
		g.Expect(unstructured.SetNestedSlice(o.Object, externalPeerURLs("", "etcd-main", 3, "site-a.test"), "spec", "etcd", "additionalAdvertisePeerURLs")).To(Succeed())
	})
	waitEtcdReady(t, a, src, 3)
	waitVoters(t, a, src, 3)

	// Client traffic through the members' external client URLs, for the
	// whole move: lost writes and linearizability are checked at the end.
	var eps []string // A's members, then B's
	for _, domain := range []string{"site-a.test", "site-b.test"} {
		for i := range 3 {
			if domain == "site-b.test" {
				i += 3
			}
			eps = append(eps, fmt.Sprintf("http://etcd-main-%d.%s.%s:2379", i, moveNamespace, domain))
		}
	}
	w, err := workload.New(workload.Options{
		Endpoints: eps, DialContext: a.DialContext, Prefix: "/move/",
		Log: ctrlzap.New(ctrlzap.WriteTo(logFileOf(t, a, "workload.log"))),
	})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = w.Close() })
	g.Expect(w.Start(ctx)).To(Succeed())
	t.Cleanup(w.Stop)

	history := recordMembership(t, etcdClientVia(t, a, eps...))

	// The clients that matter: client-go clients of the shoot's
	// kube-apiservers, one per site, each on the etcd client Service of its
	// own site, as Gardener runs a shoot's control plane in each seed
	// during a move. B's starts once B has a ready member.
	var servers []apiload.Server
	shoots := map[*Site]*ShootAPIServer{}
	for _, s := range []*Site{a, b} {
		api, err := s.NewShootAPIServer(s.opts.ClusterIdentity, moveNamespace, "etcd-main")
		g.Expect(err).NotTo(HaveOccurred())
		shoots[s] = api
		servers = append(servers, apiload.Server{Name: api.Name, Config: api.Config})
	}
	g.Expect(shoots[a].Start(ctx)).To(Succeed())
	startB := make(chan error, 1)
	bCtx, cancelB := context.WithCancel(ctx)
	t.Cleanup(cancelB)
	go func() { startB <- shoots[b].StartOnceEtcdServes(bCtx) }()
	load, err := apiload.New(apiload.Options{Servers: servers,
		Log: ctrlzap.New(ctrlzap.WriteTo(logFileOf(t, a, "apiload.log")))})
	g.Expect(err).NotTo(HaveOccurred())
	startCtx, cancelStart := context.WithTimeout(ctx, 3*time.Minute)
	defer cancelStart()
	g.Expect(load.Start(startCtx)).To(Succeed(), "A's kube-apiserver serves")
	t.Cleanup(load.Stop)

	templates := func(domain string) migration.URLTemplates {
		return migration.URLTemplates{
			Peer:    "http://{pod}.{namespace}." + domain + ":2380",
			Client:  "http://{pod}.{namespace}." + domain + ":2379",
			Sidecar: fmt.Sprintf("http://{pod}.{namespace}.%s:%d", domain, webhook.DefaultSidecarPort),
		}
	}
	var (
		reconciled    sync.WaitGroup
		reconcileErrs []error
	)
	// druid's view of B from its first member's join to the move's end.
	druidReady := watchDruidReady(b, moveNamespace, "etcd-main")
	t.Cleanup(func() { druidReady.stop() })
	mover, err := migration.New(migration.Options{
		Source: a.Client, Destination: b.Client,
		Namespace: moveNamespace, Name: "etcd-main",
		// B's pods take the ordinals after A's (etcd-main-3..5): in one shoot
		// namespace of two seeds, druid's in-cluster peer URL of a pod of
		// the same name is the same string, and etcd refuses a second
		// member with a peer URL it knows. The adapter makes B's members
		// advertise their site-b.test names.
		SourceAddresses: templates("site-a.test").Addresses(), DestinationAddresses: templates("site-b.test").Addresses(),
		StepTimeout: 5 * time.Minute,
		// Once B's first member votes and B's kube-apiserver serves on
		// it, before any of A's members goes, A's clients move to B's
		// kube-apiserver (the shoot's API endpoint switched) and A's
		// kube-apiserver stops, as gardenlet does it.
		SwitchClients: func(ctx context.Context) error {
			if err := <-startB; err != nil {
				return fmt.Errorf("starting B's kube-apiserver: %w", err)
			}
			if err := load.WaitReady(ctx, "site-b"); err != nil {
				return err
			}
			if err := load.Switch(ctx, "site-a", "site-b"); err != nil {
				return err
			}
			return shoots[a].Stop(ctx)
		},
		Logger: ctrlzap.New(ctrlzap.WriteTo(logFileOf(t, a, "mover.log"))),
		Progress: func(e migration.Event) {
			if e.Kind == migration.StepStarted || e.Kind == migration.StepDone {
				w.Mark(string(e.Step) + " " + string(e.Kind))
				load.Mark(string(e.Step) + " " + string(e.Kind))
			}
			if e.Kind == migration.StepDone && e.Step == move.StepJoinDestination {
				druidReady.start()
			}
			// In the middle of the move, druid is made to reconcile both
			// Etcds, as an operator's annotation does.
			if e.Kind == migration.StepStarted && e.Step == move.StepRetireSource {
				reconciled.Add(1)
				go func() {
					defer reconciled.Done()
					for _, s := range []*Site{a, b} {
						reconcileErrs = append(reconcileErrs, forceDruidReconcile(s, moveNamespace, "etcd-main"))
					}
				}()
			}
		},
	})
	g.Expect(err).NotTo(HaveOccurred())
	w.MarkPhase("during")
	load.MarkPhase("during")
	moveStart := time.Now()
	g.Expect(mover.Move(ctx)).To(Succeed())
	samples := druidReady.stop()
	firstReady := slices.Index(samples, true)
	g.Expect(firstReady).To(BeNumerically(">=", 0), "druid reported B Ready during the move (%d samples)", len(samples))
	g.Expect(samples[firstReady:]).To(HaveEach(BeTrue()), "once Ready, druid reports B Ready for the rest of the move")
	t.Logf("druid's Ready of B, sampled every second from B's join: first Ready after %d s, then %d samples, all Ready", firstReady, len(samples)-firstReady)
	t.Logf("the move took %s", time.Since(moveStart).Round(100*time.Millisecond))
	w.MarkPhase("after")
	load.MarkPhase("after")
	afterMove := time.Since(load.StartedAt())
	reconciled.Wait()
	g.Expect(errors.Join(reconcileErrs...)).NotTo(HaveOccurred(), "druid was asked to reconcile in the middle of the move")

	dst := &v1alpha1.Etcd{}
	dst.Namespace, dst.Name = moveNamespace, "etcd-main"
	waitVoters(t, b, dst, 3)
	// A member that joined by snapshot serves its first linearizable read
	// (etcd-wrapper's readiness) some seconds after its promotion; B's
	// StatefulSet has rolled out whatever druid changed at the move's end.
	g.Eventually(func(g Gomega) {
		pods := etcdPods(t, b, dst)
		g.Expect(pods).To(HaveLen(3))
		for _, p := range pods {
			g.Expect(podReady(&p)).To(BeTrue(), "pod %s of B is ready", p.Name)
		}
		sts, err := b.Kube.AppsV1().StatefulSets(moveNamespace).Get(ctx, "etcd-main", metav1.GetOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(sts.Status.CurrentRevision).To(Equal(sts.Status.UpdateRevision), "B's StatefulSet rolled out")
		g.Expect(sts.Status.ReadyReplicas).To(BeNumerically("==", 3))
	}).WithTimeout(3 * time.Minute).WithPolling(time.Second).Should(Succeed())
	logTemplateChanges(t, b, moveNamespace, "etcd-main")
	// druid reads its member leases by the ordinals 0..2; the member lease
	// bridge fills them from the leases B's members renew.
	waitEtcdReady(t, b, dst, 3)
	g.Expect(etcdPodRuns(t, b, "etcd-main-3")).To(Equal(1), "B's first member ran once: no template change restarted it during the move")
	w.Stop()
	g.Expect(w.SetEndpoints(eps[3:]...)).To(Succeed())
	f, lost, err := w.Verify(ctx, workload.VerifyOptions{LinearizabilityTimeout: time.Minute})
	g.Expect(err).NotTo(HaveOccurred())
	t.Logf("client traffic: %d writes, %d reads, %d failed (%v), %d retries, max write gap %s", f.Writes, f.Reads, f.FailedRequests, f.FailedErrors, f.Retries, f.MaxWriteGap)
	g.Expect(lost.Lost).To(BeEmpty(), "no acknowledged write lost")
	g.Expect(f.Linearizable).To(BeTrue(), "the client history is linearizable: %s", f.LinearizabilityResult)

	// What the kube-apiservers' clients saw.
	g.Eventually(func() bool { return wroteSince(load, "site-b", afterMove) }).WithTimeout(time.Minute).WithPolling(time.Second).
		Should(BeTrue(), "B's kube-apiserver serves writes on the moved etcd")
	load.Stop()
	api, err := load.Results(ctx, apiload.VerifyOptions{LinearizabilityTimeout: time.Minute})
	g.Expect(err).NotTo(HaveOccurred())
	t.Logf("kube-apiserver clients:\n%s", api)
	marks := make([]string, 0, len(api.Marks))
	for _, m := range api.Marks {
		marks = append(marks, fmt.Sprintf("%.1f s %s", m.At.Seconds(), m.Name))
	}
	t.Logf("on the load's clock: %s", strings.Join(marks, "; "))
	g.Expect(json.NewEncoder(logFileOf(t, a, "apiload-results.json")).Encode(api)).To(Succeed())
	g.Expect(api.LostAcknowledgedWrites).To(BeZero(), "no write a kube-apiserver acknowledged is lost: %v", api.LostWrites)
	g.Expect(api.Linearizable).To(BeTrue(), "the kube-apiservers' history is linearizable: %s", api.LinearizabilityResult)
	// A's clients are switched before any membership change that could
	// fail them; B's are drained before a removal and held through the
	// leader transfer by the client gate, each gate releasing its clients
	// as soon as its member sees the new leader. No cause of a failed
	// request is left, and the hold keeps the write gap under a second at
	// 180 ms RTT (docs/kube-apiserver-clients.md).
	for _, s := range api.Servers {
		g.Expect(s.Failed).To(BeZero(), "failed requests through %s's kube-apiserver: %v", s.Name, s.FailedErrors)
		g.Expect(s.MaxWriteGap).To(BeNumerically("<=", time.Second), "the longest write gap of %s's clients", s.Name)
	}

	steps := history.Transitions()
	t.Logf("membership steps: %s", strings.Join(steps, "; "))
	// The planner's interleaved move, one change at a time, and nothing
	// else: a destination member added and promoted, then a source member
	// removed; where the majority changes sides, the promotion that makes
	// the tie and the removal that ends it go in one sidecar call, so a
	// poll sees them together.
	// Which source member goes when depends on where the leader is (never
	// the leader first), so the source members are named by side only.
	var removed []string
	shape := slices.Clone(steps)
	for i, s := range shape {
		for _, src := range []string{"etcd-main-0", "etcd-main-1", "etcd-main-2"} {
			if strings.Contains(s, "remove "+src) {
				removed = append(removed, src)
				shape[i] = strings.Replace(s, "remove "+src, "remove a source member", 1)
			}
		}
	}
	// The tie's promotion and removal are one sidecar call; on a busy
	// machine a poll may still fall between etcd's two commits, and sees
	// them apart. How long the tie lasted is asserted below.
	if i := slices.Index(shape, "promote etcd-main-4"); i >= 0 && i+1 < len(shape) && shape[i+1] == "remove a source member" {
		shape = slices.Replace(shape, i, i+2, "promote etcd-main-4 + remove a source member")
	}
	g.Expect(shape).To(Equal([]string{
		"add learner (unnamed)", "promote etcd-main-3", "remove a source member",
		"add learner (unnamed)", "promote etcd-main-4 + remove a source member",
		"add learner (unnamed)", "promote etcd-main-5", "remove a source member",
	}), "membership history: %v", history.Snapshot())
	g.Expect(removed).To(ConsistOf("etcd-main-0", "etcd-main-1", "etcd-main-2"))
	g.Expect(history.Last()).To(ConsistOf(
		HaveField("Name", "etcd-main-3"), HaveField("Name", "etcd-main-4"), HaveField("Name", "etcd-main-5")))
	tie, ties := history.LongestTie(func(name string) bool { return memberOrdinal(name) >= 3 })
	t.Logf("polls saw the voters tied %d time(s), the longest for %s", ties, tie)
	g.Expect(ties).To(BeNumerically("<=", 1), "the move passes through one tie at most")
	g.Expect(tie).To(BeNumerically("<", time.Second), "the tie lasts one removal")
	// The controllers time each tie from etcd's answers to the change that
	// made it and the one that ended it (both sites' controllers see it:
	// they share this process's registry).
	n, sum, underOneSecond := tieHistogram(t)
	t.Logf("the controllers measured %d tie(s), %.3f s in all", n, sum)
	g.Expect(n).To(BeNumerically(">=", 1), "the majority changed sides through a tie")
	g.Expect(underOneSecond).To(Equal(n), "every tie lasted under a second")
	for _, m := range history.Last() {
		g.Expect(m.Learner).To(BeFalse(), "%s votes", m.Name)
	}
	// No etcd member of either site panicked or exited fatally (etcd
	// issue 21966: a member applying its own removal, polled).
	for _, s := range []*Site{a, b} {
		g.Expect(etcdCrashes(t, s)).To(BeEmpty(), "etcd panics or fatal exits in %s", s.opts.ClusterIdentity)
	}
	// Every run of B's pods, a pod druid restarted after the move included.
	for _, p := range etcdPods(t, b, dst) {
		log := containerLogs(t, b, p, "backup-restore")
		g.Expect(log).NotTo(ContainSubstring("Attempting to promote member"), "backup-restore of %s promoted", p.Name)
	}

	// B's backup-restore takes a full snapshot of the moved cluster into
	// B's store; a new Etcd restored from it holds every key.
	before := readPrefix(t, etcdClientVia(t, b, eps[3:]...), "/move/", false)
	g.Expect(before).NotTo(BeEmpty())
	triggerFullSnapshot(t, b, dst)
	store := filepath.Join(b.HostPathRoot, "etc", "gardener", "local-backupbuckets", "backups", "etcd-main")
	g.Expect(fullSnapshots(t, store)).NotTo(BeEmpty(), "a full snapshot in B's store %s", store)
	restored := applyEtcd(t, b, moveNamespace, func(o *unstructured.Unstructured) {
		o.SetName("etcd-restored")
		g.Expect(unstructured.SetNestedField(o.Object, int64(1), "spec", "replicas")).To(Succeed())
	})
	waitEtcdReady(t, b, restored, 1)
	g.Expect(readPrefix(t, etcdClientOf(t, b, restored, "etcd-restored-0"), "/move/", true)).To(Equal(before),
		"the Etcd restored from B's snapshot holds every key of the moved cluster")
}

// tieHistogram reads the controllers' tie durations from controller-
// runtime's registry: how many, their sum in seconds, and how many lasted at
// most a second.
func tieHistogram(t *testing.T) (n uint64, sum float64, underOneSecond uint64) {
	t.Helper()
	families, err := crmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "druid_stretch_membership_tie_duration_seconds" || len(f.Metric) == 0 {
			continue
		}
		h := f.Metric[0].GetHistogram()
		for _, b := range h.GetBucket() {
			if b.GetUpperBound() == 1 {
				underOneSecond = b.GetCumulativeCount()
			}
		}
		return h.GetSampleCount(), h.GetSampleSum(), underOneSecond
	}
	return 0, 0, 0
}

// forceDruidReconcile sets the operation annotation druid reconciles on.
func forceDruidReconcile(s *Site, namespace, name string) error {
	e := &v1alpha1.Etcd{}
	if err := s.Client.Get(context.Background(), client.ObjectKey{Namespace: namespace, Name: name}, e); err != nil {
		return err
	}
	patch := client.MergeFrom(e.DeepCopy())
	if e.Annotations == nil {
		e.Annotations = map[string]string{}
	}
	e.Annotations["gardener.cloud/operation"] = "reconcile"
	return s.Client.Patch(context.Background(), e, patch)
}

// readPrefix reads every key under prefix through cli, serializable (what
// the member asked holds) or linearizable.
func readPrefix(t *testing.T, cli *clientv3.Client, prefix string, serializable bool) map[string]string {
	t.Helper()
	opts := []clientv3.OpOption{clientv3.WithPrefix()}
	if serializable {
		opts = append(opts, clientv3.WithSerializable())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, prefix, opts...)
	if err != nil {
		t.Fatalf("reading %s: %v", prefix, err)
	}
	out := map[string]string{}
	for _, kv := range resp.Kvs {
		out[string(kv.Key)] = string(kv.Value)
	}
	return out
}

// startSites starts sites in parallel and stops them when the test ends.
func startSites(t *testing.T, opts ...Options) []*Site {
	t.Helper()
	sites := make([]*Site, len(opts))
	errs := make([]error, len(opts))
	var wg sync.WaitGroup
	for i, o := range opts {
		dir, err := os.MkdirTemp("", "druid-stretch-site-")
		if err != nil {
			t.Fatal(err)
		}
		logFile, err := os.Create(filepath.Join(dir, "site.log"))
		if err != nil {
			t.Fatal(err)
		}
		o.Dir, o.Logger = dir, ctrlzap.New(ctrlzap.WriteTo(logFile))
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			sites[i], errs[i] = Start(ctx, o)
			if errs[i] != nil {
				errs[i] = fmt.Errorf("starting site %s (logs in %s): %w", o.ClusterIdentity, dir, errs[i])
			}
		}()
		t.Cleanup(func() {
			if s := sites[i]; s != nil {
				if err := s.Stop(); err != nil {
					t.Errorf("stopping site %s: %v", o.ClusterIdentity, err)
				}
			}
			_ = logFile.Close()
			if t.Failed() || os.Getenv("DRUID_STRETCH_KEEP_SITES") != "" {
				t.Logf("the logs of site %s (processes in logs/, containers in node/): %s", o.ClusterIdentity, dir)
			} else {
				_ = os.RemoveAll(dir)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return sites
}

// externalPeerURLs is spec.etcd.additionalAdvertisePeerURLs giving the
// pods 0..n-1 of Etcd name (member name prefix prefix) their name under
// the site's domain.
func externalPeerURLs(prefix, name string, n int, domain string) []any {
	var out []any
	for i := range n {
		pod := fmt.Sprintf("%s-%d", name, i)
		member := pod
		if prefix != "" {
			member = prefix + "-" + pod
		}
		out = append(out, map[string]any{"memberName": member,
			"urls": []any{fmt.Sprintf("http://%s.%s.%s:2380", pod, moveNamespace, domain)}})
	}
	return out
}

// memberOrdinal is the ordinal at the end of a member name, -1 if none.
func memberOrdinal(name string) int {
	i := strings.LastIndex(name, "-")
	n, err := strconv.Atoi(name[i+1:])
	if i < 0 || err != nil {
		return -1
	}
	return n
}

// waitVoters waits until druid-stretch reports n voters for e.
func waitVoters(t *testing.T, s *Site, e *v1alpha1.Etcd, n int) {
	t.Helper()
	if err := s.WaitVoters(context.Background(), client.ObjectKeyFromObject(e), n, 3*time.Minute); err != nil {
		t.Fatal(err)
	}
}

// etcdClientVia is an etcd client of the given client URLs, dialing through
// s's pod network (and its peers').
func etcdClientVia(t *testing.T, s *Site, eps ...string) *clientv3.Client {
	t.Helper()
	cli, err := s.EtcdClient(eps...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// logFileOf is a log file in s's folder, closed when the test ends.
func logFileOf(t *testing.T, s *Site, name string) *os.File {
	f, err := os.Create(filepath.Join(s.Dir, name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	return f
}

// wroteSince tells whether server had a write acknowledged that it was
// called at or after since, an offset on the load's clock.
func wroteSince(l *apiload.Load, server string, since time.Duration) bool {
	for _, r := range l.Requests() {
		if r.Server == server && r.Acknowledged() && r.Call >= since {
			return true
		}
	}
	return false
}

// readySampler records druid's Ready of one Etcd once a second, from start
// until stop.
type readySampler struct {
	site      *Site
	key       client.ObjectKey
	startOnce sync.Once
	stopOnce  sync.Once
	cancel    context.CancelFunc
	done      chan struct{}
	ctx       context.Context
	samples   []bool
}

func watchDruidReady(s *Site, namespace, name string) *readySampler {
	ctx, cancel := context.WithCancel(context.Background())
	return &readySampler{site: s, key: client.ObjectKey{Namespace: namespace, Name: name}, ctx: ctx, cancel: cancel, done: make(chan struct{})}
}

func (r *readySampler) start() {
	r.startOnce.Do(func() {
		go func() {
			defer close(r.done)
			tick := time.NewTicker(time.Second)
			defer tick.Stop()
			for {
				var e v1alpha1.Etcd
				if err := r.site.Client.Get(r.ctx, r.key, &e); err == nil {
					r.samples = append(r.samples, e.DruidEtcd().IsReady())
				}
				select {
				case <-r.ctx.Done():
					return
				case <-tick.C:
				}
			}
		}()
	})
}

// stop ends the sampling and returns the samples (none if it never
// started).
func (r *readySampler) stop() []bool {
	r.stopOnce.Do(func() {
		r.cancel()
		r.startOnce.Do(func() { close(r.done) })
		<-r.done
	})
	return r.samples
}

// etcdCrashes are the panics and fatal exits in s's etcd logs.
func etcdCrashes(t *testing.T, s *Site) []string {
	t.Helper()
	out, err := s.EtcdCrashes()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// etcdPodRuns counts the pods of that name s's node ran (one folder each,
// named by the pod's UID).
func etcdPodRuns(t *testing.T, s *Site, pod string) int {
	t.Helper()
	dirs, err := filepath.Glob(filepath.Join(s.Dir, "node", "pods", moveNamespace+"_"+pod+"_*"))
	if err != nil {
		t.Fatal(err)
	}
	return len(dirs)
}

// containerLogs is a container's output over every run of the pod of that
// name on s's node, a deleted and recreated one included (the node keeps
// each pod's folder, named by its UID).
func containerLogs(t *testing.T, s *Site, p corev1.Pod, container string) string {
	t.Helper()
	dirs, err := filepath.Glob(filepath.Join(s.Dir, "node", "pods", p.Namespace+"_"+p.Name+"_*"))
	if err != nil || len(dirs) == 0 {
		t.Fatalf("no folder of pod %s/%s on the node (%v)", p.Namespace, p.Name, err)
	}
	var out strings.Builder
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, container+".log"))
		if err != nil && !os.IsNotExist(err) {
			t.Fatalf("reading the log of %s in %s: %v", container, dir, err)
		}
		out.Write(b)
	}
	return out.String()
}

// logTemplateChanges logs how each revision of a StatefulSet's pod template
// differs from the one before: a new revision restarts the pods, so these
// lines say what made a pod restart during a move.
func logTemplateChanges(t *testing.T, s *Site, namespace, name string) {
	t.Helper()
	list, err := s.Kube.AppsV1().ControllerRevisions(namespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Logf("listing the ControllerRevisions of %s/%s: %v", namespace, name, err)
		return
	}
	var revs []appsv1.ControllerRevision
	for _, r := range list.Items {
		if c := metav1.GetControllerOf(&r); c != nil && c.Kind == "StatefulSet" && c.Name == name {
			revs = append(revs, r)
		}
	}
	slices.SortFunc(revs, func(a, b appsv1.ControllerRevision) int { return cmp.Compare(a.Revision, b.Revision) })
	for i := 1; i < len(revs); i++ {
		var before, after map[string]any
		if err := json.Unmarshal(revs[i-1].Data.Raw, &before); err != nil {
			t.Logf("decoding revision %s: %v", revs[i-1].Name, err)
			return
		}
		if err := json.Unmarshal(revs[i].Data.Raw, &after); err != nil {
			t.Logf("decoding revision %s: %v", revs[i].Name, err)
			return
		}
		t.Logf("StatefulSet %s/%s of %s, pod template revision %d -> %d (-before +after):\n%s",
			namespace, name, s.opts.ClusterIdentity, revs[i-1].Revision, revs[i].Revision, gocmp.Diff(before, after))
	}
}
