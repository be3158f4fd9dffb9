// Package demo runs a live move of an etcd cluster between two Kubernetes
// clusters on one machine. RunOnSites is the `druid-stretch-dev demo` command
// and Bench the `bench` command: two sites of real parts (test/site:
// the control plane, etcd-druid, etcd-backup-restore, druid-stretch from
// its chart), judged by client-go clients through a kube-apiserver per
// site. Env is a lighter setup for the end-to-end tests of test/e2e: two
// kube-apiservers (envtest), a membership controller for each, a pod runner
// for each that runs real etcd members with their sidecars in its own WAN
// site (the controller sits there too), the link emulator between the
// sites, the project's own retrying etcd client writing and reading
// throughout, and (RehearsalOptions.KubeAPIServers) a shoot kube-apiserver
// per cluster on that cluster's members, with client-go clients through
// both.
package demo

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	membershipctrl "github.com/druid-stretch/druid-stretch/controllers/membership"
	"github.com/druid-stretch/druid-stretch/internal/livemove"
	"github.com/druid-stretch/druid-stretch/internal/testing/linkemu"
	"github.com/druid-stretch/druid-stretch/internal/testing/pki"
	"github.com/druid-stretch/druid-stretch/internal/testing/podrunner"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
)

// Config configures an Env. Zero values take the defaults named.
type Config struct {
	// RTT is the round trip time between the two clusters' sites.
	RTT time.Duration
	// HeartbeatInterval and ElectionTimeout are etcd's; zero scales them to
	// the RTT (HeartbeatTimings).
	HeartbeatInterval, ElectionTimeout time.Duration
	// Namespace and Name name the Etcd in both clusters (defaults
	// "shoot--demo--live" and "etcd-main").
	Namespace, Name string
	// Replicas is the size of the etcd cluster (default 3).
	Replicas int32
	// Dir holds everything the run writes (data dirs, logs); empty: a new
	// temporary folder, removed by Close.
	Dir string
	// ControllerInterval is the controllers' requeue while a move is under
	// way (default 100 ms): the time between one membership step and the
	// next, which is what a tie lasts beyond its removal.
	ControllerInterval time.Duration
	// Logger receives the controllers', runners' and members' logs.
	Logger logr.Logger
}

// HeartbeatTimings scales etcd's heartbeat interval and election timeout to
// an RTT: the heartbeat at least 100 ms and above the RTT, the election
// timeout ten heartbeats (200 ms and 2 s at 180 ms, as measured safe).
func HeartbeatTimings(rtt time.Duration) (heartbeat, election time.Duration) {
	heartbeat = 100 * time.Millisecond
	for heartbeat < rtt {
		heartbeat += 100 * time.Millisecond
	}
	return heartbeat, 10 * heartbeat
}

func (c *Config) setDefaults() {
	if c.HeartbeatInterval <= 0 || c.ElectionTimeout <= 0 {
		c.HeartbeatInterval, c.ElectionTimeout = HeartbeatTimings(c.RTT)
	}
	if c.Namespace == "" {
		c.Namespace = "shoot--demo--live"
	}
	if c.Name == "" {
		c.Name = "etcd-main"
	}
	if c.Replicas <= 0 {
		c.Replicas = 3
	}
	if c.ControllerInterval <= 0 {
		c.ControllerInterval = 100 * time.Millisecond
	}
	if c.Logger.GetSink() == nil {
		c.Logger = logr.Discard()
	}
}

// Sites of the two clusters on the WAN. Each cluster's etcd members, their
// sidecars, its membership controller and its shoot kube-apiserver sit in
// its site; the client workload and the migration adapter (gardenlet's
// part, which talks to both clusters' API servers) sit in the WAN's local
// site, at no distance from either.
const (
	SiteA = "a"
	SiteB = "b"
)

// Cluster is one Kubernetes cluster of the demo.
type Cluster struct {
	// Name is "A" or "B"; Site its WAN site; Identity its controller's
	// name in the membership lock and retirement records.
	Name, Site, Identity string
	// Config reaches its kube-apiserver; Client is an uncached client.
	Config *rest.Config
	Client client.Client
	// Runner runs the etcd members of its Etcd's pods.
	Runner *podrunner.Runner

	env        *envtest.Environment
	runnerStop context.CancelFunc
	runnerDone chan struct{}

	mu         sync.Mutex
	ctrlStop   context.CancelFunc
	ctrlDone   chan error
	ctrlConfig membershipctrl.Options
	log        logr.Logger

	// crash is the failpoint of CrashAfterSteps.
	crash crashPoint
	// sidecarFaults answers in place of the cluster's sidecars
	// (SetSidecarFault).
	sidecarFaults sidecarFault
}

// Env is two clusters, their controllers and pod runners, and the WAN.
type Env struct {
	Config Config
	WAN    *linkemu.WAN
	CA     *pki.CA
	A, B   *Cluster
	// ClientTLS is a client configuration that etcd and the sidecars accept.
	ClientTLS *tls.Config

	dir    string
	ownDir bool
	steps  *stepLog
	// stepsSince scopes Steps to the events of this Env's Etcd (In): the
	// step log is shared by every Etcd the two controllers manage.
	stepsSince time.Time

	lastTies []Tie
	// shoots are the shoot kube-apiservers a Rehearse runs (shared by In).
	shoots *shootSet
}

// Start brings up both clusters. Close ends everything it started, also
// when Start fails half-way.
func Start(ctx context.Context, cfg Config) (_ *Env, err error) {
	cfg.setDefaults()
	e := &Env{Config: cfg, WAN: linkemu.NewWAN(), dir: cfg.Dir, steps: newStepLog(), shoots: newShootSet()}
	defer func() {
		if err != nil {
			err = errors.Join(err, e.Close())
		}
	}()
	if e.dir == "" {
		if e.dir, err = os.MkdirTemp("", "druid-stretch-demo-"); err != nil {
			return nil, fmt.Errorf("creating the demo folder: %w", err)
		}
		e.ownDir = true
	}
	e.WAN.SetDelay(SiteA, SiteB, cfg.RTT/2)
	if e.CA, err = pki.NewCA("druid-stretch demo CA"); err != nil {
		return nil, fmt.Errorf("creating the demo CA: %w", err)
	}
	if e.ClientTLS, err = podrunner.ClientTLSConfig(e.CA, "druid-stretch-demo-client"); err != nil {
		return nil, err
	}
	e.A = &Cluster{Name: "A", Site: SiteA, Identity: "cluster-a"}
	e.B = &Cluster{Name: "B", Site: SiteB, Identity: "cluster-b"}

	// The two kube-apiservers start in parallel: each takes seconds.
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, c := range e.Clusters() {
		wg.Go(func() { errs[i] = e.startAPIServer(c) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	for _, c := range e.Clusters() {
		if err := e.startCluster(ctx, c); err != nil {
			return nil, err
		}
	}
	return e, nil
}

// In returns the environment for another Etcd, name in namespace (created
// in both clusters): the same clusters, controllers, runners and WAN, so
// that several moves (the end-to-end tests) share one setup. Each Etcd
// needs a name of its own, since the runners name members after it. Close
// only the environment Start returned.
func (e *Env) In(ctx context.Context, namespace, name string) (*Env, error) {
	for _, c := range e.Clusters() {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
		if err := c.Client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("creating namespace %s in cluster %s: %w", namespace, c.Name, err)
		}
	}
	in := *e
	in.Config.Namespace, in.Config.Name = namespace, name
	in.ownDir = false
	in.lastTies = nil
	in.stepsSince = time.Now()
	return &in, nil
}

// Clusters are A and B.
func (e *Env) Clusters() []*Cluster { return []*Cluster{e.A, e.B} }

// Dir is the folder holding the run's files.
func (e *Env) Dir() string { return e.dir }

func (e *Env) startAPIServer(c *Cluster) error {
	env, err := testbin.Environment()
	if err != nil {
		return err
	}
	c.env = env
	if c.Config, err = c.env.Start(); err != nil {
		c.env = nil
		return fmt.Errorf("starting the kube-apiserver of cluster %s: %w", c.Name, err)
	}
	if c.Client, err = livemove.NewClient(c.Config); err != nil {
		return err
	}
	return nil
}

func (e *Env) startCluster(ctx context.Context, c *Cluster) error {
	cfg := e.Config
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: cfg.Namespace}}
	if err := c.Client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s in cluster %s: %w", cfg.Namespace, c.Name, err)
	}
	c.log = cfg.Logger.WithValues("cluster", c.Name)
	// The runner serves every namespace, so that tests can move one Etcd
	// per namespace through the same two clusters (In). It reads through
	// an informer cache, as kubelet watches its pods: its reads every
	// 100 ms straight from the kube-apiserver (Etcds, EtcdMemberships,
	// StatefulSets) would each be a quorum read of the cluster's etcd, CPU
	// taken from the moving members on a small machine.
	reads, err := cache.New(c.Config, cache.Options{Scheme: c.Client.Scheme()})
	if err != nil {
		return fmt.Errorf("cluster %s: the pod runner's cache: %w", c.Name, err)
	}
	r, err := podrunner.New(podrunner.Options{
		Client:            reads,
		Dir:               filepath.Join(e.dir, "cluster-"+c.Site),
		CA:                e.CA,
		WAN:               e.WAN,
		Site:              c.Site,
		HeartbeatInterval: cfg.HeartbeatInterval,
		ElectionTimeout:   cfg.ElectionTimeout,
		Resync:            100 * time.Millisecond,
		Logger:            c.log,
		WrapSidecar:       c.sidecarFaults.wrap,
	})
	if err != nil {
		return fmt.Errorf("cluster %s: %w", c.Name, err)
	}
	c.Runner = r
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	c.runnerStop, c.runnerDone = stop, make(chan struct{})
	go func() {
		defer close(c.runnerDone)
		var cached sync.WaitGroup
		cached.Go(func() { _ = reads.Start(runCtx) })
		_ = r.Run(runCtx)
		cached.Wait()
	}()
	mc := e.steps.config(c)
	// The controller runs in this process but sits in its cluster's site:
	// its calls to the other site's sidecars pay the round trip and are
	// cut by a partition, as a seed's controller's would be.
	mc.DialContext = e.WAN.Dialer(c.Site).DialContext
	c.ctrlConfig = membershipctrl.Options{
		ClusterIdentity:  c.Identity,
		SidecarTLS:       e.ClientTLS,
		ProgressInterval: cfg.ControllerInterval,
		Membership:       mc,
		AfterStepSent:    c.crash.afterStepSent(c),
	}
	return c.StartController()
}

// StartController starts the cluster's membership controller (an
// in-process manager); it fails if it runs already.
func (c *Cluster) StartController() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ctrlStop != nil {
		return fmt.Errorf("the controller of cluster %s runs already", c.Name)
	}
	mgr, err := membershipctrl.NewManager(c.Config, membershipctrl.ManagerOptions{
		MetricsBindAddress:     "0",
		HealthProbeBindAddress: "0",
		Resolver:               c.Runner,
		Reconciler:             c.ctrlConfig,
		SkipNameValidation:     true,
		Logger:                 c.log.WithName("controller"),
	})
	if err != nil {
		return fmt.Errorf("the controller of cluster %s: %w", c.Name, err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	c.ctrlStop, c.ctrlDone = stop, done
	return nil
}

// StopController stops the cluster's controller and waits until it has
// stopped, as a crashed or evicted controller pod would.
func (c *Cluster) StopController() error {
	c.mu.Lock()
	stop, done := c.ctrlStop, c.ctrlDone
	c.ctrlStop, c.ctrlDone = nil, nil
	c.mu.Unlock()
	if stop == nil {
		return nil
	}
	stop()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("the controller of cluster %s stopped with: %w", c.Name, err)
	}
	return nil
}

// RestartController stops the controller and starts a new one, with the
// same identity.
func (c *Cluster) RestartController() error {
	if err := c.StopController(); err != nil {
		return err
	}
	return c.StartController()
}

// close ends the controller, the pods and the kube-apiserver.
func (c *Cluster) close() error {
	var errs []error
	errs = append(errs, c.StopController())
	if c.runnerStop != nil {
		c.runnerStop()
		<-c.runnerDone
		errs = append(errs, c.Runner.Close())
	}
	if c.env != nil {
		if err := c.env.Stop(); err != nil {
			errs = append(errs, fmt.Errorf("stopping the kube-apiserver of cluster %s: %w", c.Name, err))
		}
	}
	return errors.Join(errs...)
}

// Close ends every shoot kube-apiserver, controller, member, sidecar,
// kube-apiserver and link, and removes the run's folder when Start made it.
func (e *Env) Close() error {
	// The shoot kube-apiservers first: their etcd members go next.
	errs := []error{e.shoots.stopAll()}
	for _, c := range []*Cluster{e.B, e.A} {
		if c != nil {
			errs = append(errs, c.close())
		}
	}
	if e.WAN != nil {
		errs = append(errs, e.WAN.Close())
	}
	if e.ownDir && e.dir != "" {
		errs = append(errs, os.RemoveAll(e.dir))
	}
	return errors.Join(errs...)
}
