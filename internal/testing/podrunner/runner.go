// Package podrunner stands in for kubelet and druid's StatefulSet where there
// is no kubelet (tests and the demo): it watches the Etcd objects of one
// Kubernetes cluster and keeps a real local etcd member (package localetcd),
// with its sidecar, running for every pod the StatefulSet would have.
//
// The pods are those of the Etcd's StatefulSet where a test made one (its
// window is the webhook's), else members.PodWindow: the Etcd's ordinal
// range, widened to every local member still in the etcd membership
// (status.membership), so a pod is stopped only once its member has been
// removed. A pod whose member is not in
// the cluster yet starts like a crash-looping pod would: it tries to join
// (--initial-cluster-state=existing, the initial cluster from the observed
// members, external members included) and retries with backoff until the
// membership controller has added it as a learner. A pod whose member was
// removed gets a fresh data dir when it starts again. A new Etcd without
// external members and without observed members is bootstrapped as druid
// does: every pod of the range with --initial-cluster-state=new.
//
// The runner is also the controller's Resolver in tests and the demo: it
// hands out each pod's peer and sidecar URLs, reserving the pod's ports on
// first use. All pods of one runner sit in one WAN site, so two runners (two
// clusters) can be placed a WAN apart.
package podrunner

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	stretchv1alpha1 "github.com/druid-stretch/druid-stretch/api/stretch/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/members"
	"github.com/druid-stretch/druid-stretch/controllers/webhook"
	"github.com/druid-stretch/druid-stretch/internal/testing/linkemu"
	"github.com/druid-stretch/druid-stretch/internal/testing/localetcd"
	"github.com/druid-stretch/druid-stretch/internal/testing/pki"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// Options configure a Runner.
type Options struct {
	// Client reads the Etcd objects (a client of the envtest cluster, with
	// the v1alpha1 scheme). Required.
	Client client.Reader
	// Namespace limits the runner to one namespace; empty for all.
	Namespace string
	// Dir holds the members' data dirs, logs and certificates. Required.
	Dir string
	// CA turns on TLS for etcd and the sidecars (as localetcd.Options.CA).
	CA *pki.CA
	// WAN and Site place every pod of this runner in one WAN site.
	WAN  *linkemu.WAN
	Site string
	// HeartbeatInterval and ElectionTimeout are etcd's (default 100 ms, 1 s).
	HeartbeatInterval, ElectionTimeout time.Duration
	// EtcdArgs are appended to every member's etcd command line, as a
	// pod's etcd configuration would set them (e.g. --max-learners).
	EtcdArgs []string
	// MinLearnerHealthy is the sidecars' sidecar.Config.MinLearnerHealthy
	// (default 5 s): how long a new voter must be connected before a
	// removal sent with its promotion may count on it.
	MinLearnerHealthy time.Duration
	// WrapSidecar, when set, wraps each pod's sidecar handler; tests use it
	// to inject faults and to watch the calls.
	WrapSidecar func(pod Pod, h http.Handler) http.Handler
	// Resync is how often the Etcd objects are read (default 250 ms).
	Resync time.Duration
	// StartTimeout bounds one start attempt of a pod (default 60 s: a
	// member catching up by snapshot may take 9-19 s to serve).
	StartTimeout time.Duration
	// Logger receives the runner's and the runtime's events.
	Logger logr.Logger
}

// Pod names one pod of one Etcd.
type Pod struct {
	Namespace string
	// Etcd is the Etcd's name.
	Etcd string
	// Name is the pod name, <etcd>-<ordinal>.
	Name string
	// Member is the etcd member name.
	Member string
}

func (p Pod) String() string { return p.Namespace + "/" + p.Name }

// Runner keeps the pods of the Etcd objects running.
type Runner struct {
	opts Options
	log  logr.Logger
	rt   *localetcd.Runtime

	mu    sync.Mutex
	pods  map[Pod]*pod
	held  map[string]bool           // namespace/pod
	etcds map[string]*v1alpha1.Etcd // by namespace/name, as last read
	wg    sync.WaitGroup
}

// pod is the runner's state of one pod.
type pod struct {
	Pod
	m *localetcd.Member
	// starting is set while a start attempt runs; cancel ends it.
	starting bool
	cancel   context.CancelFunc
	// wasRunning notices an exit between two syncs (a crash, or etcd
	// stopping itself after its removal).
	wasRunning bool
	failures   int
	next       time.Time
	// dataID is the member ID the pod's data dir belongs to, once seen.
	dataID string
}

// New creates a runner and its local member runtime. Close it.
func New(opts Options) (*Runner, error) {
	if opts.Client == nil {
		return nil, errors.New("podrunner: Options.Client is required")
	}
	if opts.Dir == "" {
		return nil, errors.New("podrunner: Options.Dir is required")
	}
	if opts.WAN != nil && opts.Site == "" {
		return nil, errors.New("podrunner: a WAN needs Options.Site, the site of every pod of this runner")
	}
	if opts.Resync <= 0 {
		opts.Resync = 250 * time.Millisecond
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = time.Minute
	}
	if opts.Logger.GetSink() == nil {
		opts.Logger = logr.Discard()
	}
	r := &Runner{opts: opts, log: opts.Logger.WithName("podrunner"), pods: map[Pod]*pod{}, held: map[string]bool{}, etcds: map[string]*v1alpha1.Etcd{}}
	ro := localetcd.Options{
		Dir:               opts.Dir,
		CA:                opts.CA,
		HeartbeatInterval: opts.HeartbeatInterval,
		ElectionTimeout:   opts.ElectionTimeout,
		Sidecar:           r.newSidecar,
		Logger:            opts.Logger,
	}
	if opts.WAN != nil {
		ro.WAN = opts.WAN
	}
	rt, err := localetcd.New(ro)
	if err != nil {
		return nil, fmt.Errorf("podrunner: %w", err)
	}
	r.rt = rt
	return r, nil
}

// Runtime is the local member runtime the pods run in.
func (r *Runner) Runtime() *localetcd.Runtime { return r.rt }

// Close ends every pod and sidecar. Run must have returned.
func (r *Runner) Close() error {
	r.wg.Wait()
	return r.rt.Close()
}

// Run keeps the pods in line with the Etcd objects until ctx ends, then
// stops every pod (keeping the data dirs, as a node shutdown would).
func (r *Runner) Run(ctx context.Context) error {
	t := time.NewTicker(r.opts.Resync)
	defer t.Stop()
	for {
		if err := r.sync(ctx); err != nil && ctx.Err() == nil {
			r.log.Info("reading the Etcd objects failed; retrying", "error", err.Error())
		}
		select {
		case <-ctx.Done():
			r.stopAll()
			return nil
		case <-t.C:
		}
	}
}

// Hold keeps a pod from starting and stops it if it runs, like a pod stuck
// in Pending; Release lets it run again.
func (r *Runner) Hold(namespace, podName string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.held[namespace+"/"+podName] = true
}

// Release undoes Hold.
func (r *Runner) Release(namespace, podName string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.held, namespace+"/"+podName)
}

// Member returns the local member of e's pod with the given ordinal,
// reserving its ports and certificates on first use.
func (r *Runner) Member(e *v1alpha1.Etcd, ordinal int64) (*localetcd.Member, error) {
	p, err := r.pod(e, members.PodName(e, ordinal), members.MemberName(e, ordinal))
	if err != nil {
		return nil, err
	}
	return p.m, nil
}

// Running reports whether the pod's etcd runs and has served clients since
// it started (a pod that is Ready): a crash-looping pod is not running,
// even in the moments its process is up.
func (r *Runner) Running(namespace, podName string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, p := range r.pods {
		if k.Namespace == namespace && k.Name == podName {
			return !p.starting && p.m.Running()
		}
	}
	return false
}

// PeerURLs is the Resolver's: the advertised peer URL of the pod's member.
func (r *Runner) PeerURLs(e *v1alpha1.Etcd, memberName, podName string) ([]string, error) {
	p, err := r.pod(e, podName, memberName)
	if err != nil {
		return nil, err
	}
	return []string{p.m.PeerURL}, nil
}

// SidecarURL is the Resolver's: where the pod's sidecar serves.
func (r *Runner) SidecarURL(e *v1alpha1.Etcd, memberName, podName string) (string, error) {
	p, err := r.pod(e, podName, memberName)
	if err != nil {
		return "", err
	}
	return p.m.SidecarURL, nil
}

// pod returns the state of a pod, creating its member on first use.
func (r *Runner) pod(e *v1alpha1.Etcd, podName, memberName string) (*pod, error) {
	k := Pod{Namespace: e.Namespace, Etcd: e.Name, Name: podName, Member: memberName}
	r.mu.Lock()
	defer r.mu.Unlock()
	if p, ok := r.pods[k]; ok {
		return p, nil
	}
	m, err := r.rt.NewMember(memberName, localetcd.MemberOptions{Site: r.opts.Site, ExtraArgs: r.opts.EtcdArgs})
	if err != nil {
		return nil, fmt.Errorf("podrunner: pod %s: %w", k, err)
	}
	p := &pod{Pod: k, m: m}
	r.pods[k] = p
	return p, nil
}

// window is the ordinals of e's pods. Where a test made e's StatefulSet
// (druid's), the runner plays druid, the StatefulSet webhook and the
// StatefulSet controller together: the pods are the window the webhook
// would put the StatefulSet on at druid's next write, members.KeptWindow of
// what it runs (its pod-window annotation, which the membership controller
// moves, else its ordinals), so a dropped status stops no pod here either.
// Without a StatefulSet: members.PodWindow.
func (r *Runner) window(ctx context.Context, e *v1alpha1.Etcd) (members.Ordinals, error) {
	sts := &appsv1.StatefulSet{}
	if err := r.opts.Client.Get(ctx, client.ObjectKeyFromObject(e), sts); err != nil {
		if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) || runtime.IsNotRegisteredError(err) {
			// No StatefulSet, or a client that knows none (the demo's).
			return members.PodWindow(e), nil
		}
		return members.Ordinals{}, err
	}
	if !metav1.IsControlledBy(sts, e) {
		return members.PodWindow(e), nil
	}
	running := members.RunningOrdinals(sts)
	if w, err := members.ParseOrdinals(sts.Annotations[webhook.PodWindowAnnotation]); err == nil {
		running = w
	}
	return members.KeptWindow(e, running), nil
}

// sync reads the Etcd objects and starts and stops pods to match.
func (r *Runner) sync(ctx context.Context) error {
	var list v1alpha1.EtcdList
	var opts []client.ListOption
	if r.opts.Namespace != "" {
		opts = append(opts, client.InNamespace(r.opts.Namespace))
	}
	if err := r.opts.Client.List(ctx, &list, opts...); err != nil {
		return err
	}
	// Each Etcd as druid-stretch sees it, with its EtcdMembership.
	var ms stretchv1alpha1.EtcdMembershipList
	if err := r.opts.Client.List(ctx, &ms, opts...); err != nil {
		return err
	}
	attached := map[string]*stretchv1alpha1.EtcdMembership{}
	for i := range ms.Items {
		attached[ms.Items[i].Namespace+"/"+ms.Items[i].Name] = &ms.Items[i]
	}
	want := map[Pod]*v1alpha1.Etcd{}
	etcds := map[string]*v1alpha1.Etcd{}
	for i := range list.Items {
		e, _ := stretchv1alpha1.View(&list.Items[i], attached[list.Items[i].Namespace+"/"+list.Items[i].Name])
		etcds[e.Namespace+"/"+e.Name] = e
		if !e.DeletionTimestamp.IsZero() {
			continue
		}
		w, err := r.window(ctx, e)
		if err != nil {
			return err
		}
		for o := w.Start; o < w.End; o++ {
			p, err := r.pod(e, members.PodName(e, o), members.MemberName(e, o))
			if err != nil {
				r.log.Error(err, "reserving a pod")
				continue
			}
			want[p.Pod] = e
		}
	}
	r.mu.Lock()
	r.etcds = etcds
	pods := make([]*pod, 0, len(r.pods))
	for _, p := range r.pods {
		pods = append(pods, p)
	}
	r.mu.Unlock()
	for _, p := range pods {
		e, ok := want[p.Pod]
		r.mu.Lock()
		held := r.held[p.Namespace+"/"+p.Name]
		r.mu.Unlock()
		if !ok || held {
			r.stop(p)
			continue
		}
		r.keepRunning(ctx, p, e)
	}
	return nil
}

// keepRunning starts a pod that is not running, after its backoff.
func (r *Runner) keepRunning(ctx context.Context, p *pod, e *v1alpha1.Etcd) {
	running := p.m.Running()
	r.mu.Lock()
	if id := observedID(e, p); id != "" && running {
		p.dataID = id
	}
	if p.wasRunning && !running && !p.starting {
		// It exited on its own: a crash, or etcd stopping after its removal.
		p.failures++
		p.next = time.Now().Add(backoff(p.failures))
		r.log.Info("pod exited; restarting after backoff", "pod", p.String(), "backoff", backoff(p.failures).String())
	}
	p.wasRunning = running && !p.starting
	idle := !running && !p.starting && !time.Now().Before(p.next)
	r.mu.Unlock()
	if !idle {
		return
	}
	// Only sync starts pods, so the pod stays idle while the flags are
	// computed without the lock (they reserve pods, which takes it).
	ic, state := r.initialCluster(e, p)
	fresh := r.needsFreshData(e, p, state)
	attemptCtx, cancel := context.WithTimeout(ctx, r.opts.StartTimeout)
	r.mu.Lock()
	p.starting, p.cancel = true, cancel
	r.mu.Unlock()
	r.wg.Go(func() {
		defer cancel()
		err := r.start(attemptCtx, p, ic, state, fresh)
		r.mu.Lock()
		defer r.mu.Unlock()
		p.starting, p.cancel = false, nil
		if err != nil {
			p.failures++
			p.next = time.Now().Add(backoff(p.failures))
			r.log.Info("pod did not start; retrying after backoff", "pod", p.String(), "state", string(state), "backoff", backoff(p.failures).String(), "error", firstLine(err.Error()))
			return
		}
		p.failures, p.wasRunning = 0, true
		if fresh {
			p.dataID = ""
		}
		r.log.Info("pod running", "pod", p.String(), "member", p.Member, "state", string(state))
	})
}

func (r *Runner) start(ctx context.Context, p *pod, ic string, state localetcd.ClusterState, fresh bool) error {
	if fresh {
		if err := os.RemoveAll(p.m.DataDir); err != nil {
			return fmt.Errorf("emptying the data dir of %s: %w", p, err)
		}
	}
	return p.m.Start(ctx, ic, state)
}

// stop ends a pod's etcd (and a start attempt in flight); the data dir
// stays, as a PVC would.
func (r *Runner) stop(p *pod) {
	r.mu.Lock()
	cancel := p.cancel
	p.wasRunning = false
	r.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	if !p.m.Running() {
		return
	}
	ctx, done := context.WithTimeout(context.Background(), 10*time.Second)
	defer done()
	if err := p.m.Stop(ctx); err != nil {
		r.log.Error(err, "stopping a pod", "pod", p.String())
		return
	}
	r.log.Info("pod stopped", "pod", p.String())
}

func (r *Runner) stopAll() {
	r.mu.Lock()
	pods := make([]*pod, 0, len(r.pods))
	for _, p := range r.pods {
		pods = append(pods, p)
	}
	r.mu.Unlock()
	for _, p := range pods {
		r.stop(p)
	}
	r.wg.Wait()
}

// firstLine keeps a log line short: a failed start carries etcd's output.
func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// backoff is kubelet's crash-loop backoff, shortened for tests: 0.5 s,
// doubling, at most 4 s.
func backoff(failures int) time.Duration {
	d := 500 * time.Millisecond
	for i := 1; i < failures && d < 4*time.Second; i++ {
		d *= 2
	}
	return min(d, 4*time.Second)
}

// initialCluster renders the pod's --initial-cluster. A new Etcd (no
// observed members, no external members) bootstraps from the whole range
// with state new, as druid does. Otherwise the pod joins: etcd wants the
// cluster's current members plus the joiner, so the list is the observed
// members (the pod's own entry under its name, even while etcd lists it
// unnamed) plus the pod if it is missing, or the external members plus the
// pod before anything was observed.
func (r *Runner) initialCluster(e *v1alpha1.Etcd, p *pod) (string, localetcd.ClusterState) {
	var observed []v1alpha1.ObservedMember
	if e.Status.Membership != nil {
		observed = e.Status.Membership.Members
	}
	if len(observed) == 0 && len(e.Spec.ExternalMembers) == 0 && !r.hasData(e) {
		return members.InitialCluster(e, r.peerURLsOf(e)), localetcd.ClusterStateNew
	}
	var peers []members.Peer
	self := false
	for _, m := range observed {
		name := m.Name
		if slices.Contains(m.PeerURLs, p.m.PeerURL) {
			name, self = p.Member, true
		}
		if name == "" {
			continue // another unstarted learner: etcd allows one, so this start fails and retries
		}
		peers = append(peers, members.Peer{Name: name, PeerURLs: m.PeerURLs})
	}
	if len(observed) == 0 {
		for _, x := range e.Spec.ExternalMembers {
			peers = append(peers, members.Peer{Name: x.Name, PeerURLs: x.PeerURLs})
		}
	}
	if !self {
		peers = append(peers, members.Peer{Name: p.Member, PeerURLs: []string{p.m.PeerURL}})
	}
	return members.FormatInitialCluster(peers), localetcd.ClusterStateExisting
}

// hasData says whether a pod of e has etcd data: then e's cluster exists,
// whatever its status says (others can drop status.membership), and no pod
// bootstraps a new one.
func (r *Runner) hasData(e *v1alpha1.Etcd) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.pods {
		if p.Namespace != e.Namespace || p.Etcd != e.Name {
			continue
		}
		if _, err := os.Stat(filepath.Join(p.m.DataDir, "member", "wal")); err == nil {
			return true
		}
	}
	return false
}

// needsFreshData says whether the pod must start on an empty data dir: its
// member is not in the cluster (not added yet, or removed), or was added
// again under a new ID, or an earlier attempt left a data dir without a WAL.
func (r *Runner) needsFreshData(e *v1alpha1.Etcd, p *pod, state localetcd.ClusterState) bool {
	if _, err := os.Stat(filepath.Join(p.m.DataDir, "member", "wal")); err != nil {
		return true
	}
	if state == localetcd.ClusterStateNew {
		return false
	}
	if e.Status.Membership == nil || len(e.Status.Membership.Members) == 0 {
		return false // no record says its member is gone: its data stays
	}
	var observed *v1alpha1.ObservedMember
	if e.Status.Membership != nil {
		for i, m := range e.Status.Membership.Members {
			if m.Name == p.Member || slices.Contains(m.PeerURLs, p.m.PeerURL) {
				observed = &e.Status.Membership.Members[i]
			}
		}
	}
	if observed == nil {
		return true
	}
	return p.dataID != "" && !strings.EqualFold(p.dataID, observed.ID)
}

// observedID is the member ID status.membership shows for the pod's member.
func observedID(e *v1alpha1.Etcd, p *pod) string {
	if e.Status.Membership == nil {
		return ""
	}
	for _, m := range e.Status.Membership.Members {
		if m.Name == p.Member {
			return m.ID
		}
	}
	return ""
}

func (r *Runner) peerURLsOf(e *v1alpha1.Etcd) members.LocalPeerURLs {
	return func(memberName, podName string) []string {
		urls, err := r.PeerURLs(e, memberName, podName)
		if err != nil {
			r.log.Error(err, "reserving a pod for the initial cluster")
		}
		return urls
	}
}

// newSidecar builds a pod's sidecar as its pod would run it: the local
// member first, then the client URLs of the Etcd's other pods and external
// members, used while the local member is a learner.
func (r *Runner) newSidecar(m *localetcd.Member) (http.Handler, error) {
	r.mu.Lock()
	var self *pod
	for _, p := range r.pods {
		if p.m == m {
			self = p
		}
	}
	var peers []*localetcd.Member
	var external []string
	if self == nil {
		// A member a test started in the runner's runtime beside the pods
		// (an unmanaged member): it learns the voters from the running ones.
		self = &pod{Pod: Pod{Name: m.Name, Member: m.Name}, m: m}
		for _, p := range r.pods {
			peers = append(peers, p.m)
		}
	} else {
		for _, p := range r.pods {
			if p.Namespace == self.Namespace && p.Etcd == self.Etcd {
				peers = append(peers, p.m)
			}
		}
		if e := r.etcds[self.Namespace+"/"+self.Etcd]; e != nil {
			for _, x := range e.Spec.ExternalMembers {
				external = append(external, x.ClientURLs...)
			}
		}
	}
	eps := append(localetcd.SidecarEndpoints(m, peers), external...)
	r.mu.Unlock()
	cfg := sidecar.Config{
		Endpoints:         eps,
		EtcdTLS:           m.ClientTLSConfig(),
		MinLearnerHealthy: r.opts.MinLearnerHealthy,
		Registry:          prometheus.NewRegistry(),
		Logger:            r.opts.Logger.WithName("sidecar").WithValues("pod", self.String()),
	}
	if r.opts.WAN != nil {
		// The sidecar runs in this process but sits in its pod's site: its
		// polls of the other site's members cross the WAN.
		cfg.DialContext = r.opts.WAN.Dialer(r.opts.Site).DialContext
	}
	srv, err := sidecar.New(cfg)
	if err != nil {
		return nil, err
	}
	var h http.Handler = srv
	if r.opts.WrapSidecar != nil {
		h = r.opts.WrapSidecar(self.Pod, h)
	}
	return closingHandler{Handler: h, close: srv.Close}, nil
}

// closingHandler lets the runtime close the sidecar behind a wrapper.
type closingHandler struct {
	http.Handler
	close func() error
}

func (c closingHandler) Close() error { return c.close() }

// ClientTLSConfig is a TLS client configuration that trusts the runner's CA
// and presents a certificate it signed, as the controller needs towards the
// sidecars; nil without a CA.
func ClientTLSConfig(ca *pki.CA, commonName string) (*tls.Config, error) {
	if ca == nil {
		return nil, nil
	}
	pair, err := ca.Issue(commonName, "localhost", "127.0.0.1")
	if err != nil {
		return nil, fmt.Errorf("podrunner: issuing the client certificate %s: %w", commonName, err)
	}
	return ca.ClientConfig(&pair)
}
