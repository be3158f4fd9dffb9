// Package site starts a real test site: one Kubernetes cluster made of the
// real parts an etcd-druid operator runs, on this machine, for the tests.
//
//   - etcd and kube-apiserver (envtest), with the ServiceAccount admission
//     plugin on, as in every real cluster;
//   - the real kube-controller-manager (StatefulSet, PersistentVolume binder,
//     garbage collector, root CA publisher, EndpointSlice and the rest of its
//     default controllers) and the real kube-scheduler;
//   - a default StorageClass served by a hostPath provisioner
//     (sig-storage-lib-external-provisioner);
//   - the real etcd-druid manager, configured by its own Helm chart (the
//     operator configuration and RBAC the chart renders);
//   - a node stand-in (test/infrastructure/podhost) where kubelet would be, one per
//     node (Options.Nodes; one node by default), all on one pod network:
//     every Pod bound to a node runs as sandboxed host processes, from the
//     Pod as the API server holds it, each pod in a network namespace of
//     its own (test/infrastructure/podnet). Image references map to local binaries:
//     the real etcdbrctl, the etcd-wrapper stand-in, the druid-stretch
//     binary;
//   - optionally druid-stretch, installed from its chart: the extended Etcd
//     CRD, the chart's RBAC and webhook configurations, and the controller
//     with its webhooks running in this process.
//
// Every process the site starts dies with it, on every exit path. What the
// site does not reproduce, and why, is listed in docs/sites.md.
package site

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/druid-stretch/druid-stretch/controllers/membership"
	"github.com/druid-stretch/druid-stretch/internal/planner"
	"github.com/druid-stretch/druid-stretch/internal/sidecarcluster"
	"github.com/druid-stretch/druid-stretch/internal/testing/pki"
	"github.com/druid-stretch/druid-stretch/test/infrastructure/podhost"
	"github.com/druid-stretch/druid-stretch/test/infrastructure/podnet"
)

// ClusterDomain is the DNS domain of every site.
const ClusterDomain = "cluster.local"

// Options configure a site.
type Options struct {
	// Dir holds everything the site writes: certificates, kubeconfigs,
	// logs/ (one file per process), the nodes' pods (node/ for a site of
	// one node, nodes/<name>/ for each of several) and hostpath/ (the
	// nodes' hostPath volumes and the provisioner's volumes). Required.
	Dir string
	// Nodes are the site's nodes, each a node stand-in on the site's one
	// pod network and hostPath root (default: the one node NodeName,
	// unlabelled). Pods go where the scheduler binds them; cordon a node
	// (spec.unschedulable) or label it to steer them.
	Nodes []NodeOptions
	// DruidStretch installs druid-stretch besides druid.
	DruidStretch bool
	// CompactionEventsThreshold is druid's
	// operatorConfig.controllers.compaction.eventsThreshold: the etcd
	// revisions since the last full snapshot (the delta snapshot lease's
	// revision minus the full one's) at which druid's compaction
	// controller starts a compaction Job. 0: the chart's default,
	// 1,000,000, which a test's traffic never reaches.
	CompactionEventsThreshold int64
	// MaxLearners is the chart's controller.maxLearners (0: the chart's
	// default): the learners the controller adds at once, and etcd's
	// max-learners in the pods of the Etcds druid-stretch manages.
	MaxLearners int
	// ClusterIdentity names the site's druid-stretch controller in the
	// membership lock and retirement records (default "site"); peered
	// sites need distinct ones, as two seeds have.
	ClusterIdentity string
	// PodCIDR is the pod network (default podnet.DefaultCIDR); peered sites
	// need distinct ones.
	PodCIDR string
	// Domain, when set, is the site's external DNS zone: every StatefulSet
	// pod is also <pod>.<namespace>.<Domain>, the name peered sites reach
	// it by (as a seed's external DNS names a shoot's etcd members).
	Domain string
	// Logger receives the site's own events (the node stand-in, the
	// in-process controller).
	Logger logr.Logger
	// OnStep, when set, is told about each membership change the site's
	// druid-stretch controller sends (sidecarcluster.Config.OnStep of
	// internal/sidecarcluster: a nil result right before the sidecar call, the
	// call's result right after it), on the controller's goroutine: a test
	// acts at a step's exact moment with it, not at a poll's.
	OnStep func(step planner.Step, res *sidecarcluster.Result)
	// StretchCA is druid-stretch's client CA, which signs the site's
	// controller's client certificate towards the sidecars and which
	// InstallShootTLS places beside each shoot's Secrets (default: one of
	// the site's own). Sites whose controllers call each other's sidecars
	// (a move's) share one, as the seeds of one landscape do.
	StretchCA *pki.CA
}

// Site is a running site.
type Site struct {
	// Dir is Options.Dir.
	Dir string
	// Config is an admin (system:masters) client configuration.
	Config *rest.Config
	// Client is an admin client whose scheme knows the extended Etcd.
	Client client.Client
	// AdminKubeconfig is the path of an admin kubeconfig (kubectl
	// --kubeconfig), under Dir/pki.
	AdminKubeconfig string
	// Kube is an admin clientset.
	Kube kubernetes.Interface
	// Network is the pod network.
	Network *podnet.Network
	// Nodes are the site's nodes, in Options.Nodes order.
	Nodes []*Node
	// Node is the first node's stand-in (Nodes[0].Host), the only one of
	// a site of one node.
	Node *podhost.Host
	// HostPathRoot is where the nodes' hostPath volumes live: a Pod's
	// hostPath /a/b is HostPathRoot/a/b here, on every node.
	HostPathRoot string

	opts Options
	env  *envtest.Environment
	log  logr.Logger
	// stretchCA is Options.StretchCA or the site's own.
	stretchCA *pki.CA
	// shoots are the shoots' TLS installed (InstallShootTLS).
	shoots shootTrust
	// druid is the etcd-druid manager's process and how to start it
	// again (RestartDruid); stretch the in-process druid-stretch
	// controller (RestartDruidStretch), nil without one.
	druid   *druidProcess
	stretch *stretchController
	// peerings are the links to the sites this one is peered with (Peer),
	// for Partition.
	peerings map[*Site]*podnet.Peering

	mu    sync.Mutex
	stops []func() error
}

// Start starts a site; on error, everything already started is stopped.
func Start(ctx context.Context, opts Options) (s *Site, err error) {
	if opts.Dir == "" {
		return nil, errors.New("site: Options.Dir is required")
	}
	if opts.CompactionEventsThreshold < 0 {
		return nil, fmt.Errorf("site: Options.CompactionEventsThreshold is %d: want 0 (the chart's default) or more", opts.CompactionEventsThreshold)
	}
	if opts.MaxLearners < 0 {
		return nil, fmt.Errorf("site: Options.MaxLearners is %d: want 0 (the chart's default) or more", opts.MaxLearners)
	}
	// started, not the named result: every error return below sets the
	// result to nil before this deferred Stop runs.
	started := &Site{Dir: opts.Dir, opts: opts, log: opts.Logger.WithName("site"), HostPathRoot: filepath.Join(opts.Dir, "hostpath")}
	s = started
	if s.stretchCA = opts.StretchCA; s.stretchCA == nil {
		if s.stretchCA, err = pki.NewCA("druid-stretch-client-ca"); err != nil {
			return nil, err
		}
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, started.Stop())
			s = nil
		}
	}()
	for _, d := range []string{"logs", "hostpath"} {
		if err := os.MkdirAll(filepath.Join(s.Dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	steps := []struct {
		what string
		run  func(context.Context) error
	}{
		{"the control plane", s.startControlPlane},
		{"the storage provisioner", s.startProvisioner},
		{"the node stand-ins", s.startNodes},
		{"etcd-druid", s.startDruid},
	}
	if opts.DruidStretch {
		steps = append(steps, struct {
			what string
			run  func(context.Context) error
		}{"druid-stretch", s.startDruidStretch})
	}
	for _, step := range steps {
		if err := step.run(ctx); err != nil {
			return nil, fmt.Errorf("site: starting %s: %w", step.what, err)
		}
	}
	return s, nil
}

// onStop registers fn to run at Stop, before everything registered earlier.
func (s *Site) onStop(fn func() error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stops = append(s.stops, fn)
}

// Stop stops everything in the reverse order of its start: druid-stretch,
// druid, the nodes (their pods get their grace period), the provisioner, the
// control plane. It is safe to call twice.
func (s *Site) Stop() error {
	s.mu.Lock()
	stops := s.stops
	s.stops = nil
	s.mu.Unlock()
	var errs []error
	for i := len(stops) - 1; i >= 0; i-- {
		errs = append(errs, stops[i]())
	}
	return errors.Join(errs...)
}

// Peer connects the pod networks of two sites (see podnet.Peer): each
// reaches the other's pods by IP and by the names under the other's
// Domain, rtt apart (every packet between them waits half of it each way,
// as between two regions). The peering ends when either site stops.
func Peer(a, b *Site, rtt time.Duration) error {
	p, err := podnet.Peer(a.Network, b.Network)
	if err != nil {
		return err
	}
	p.SetDelay(rtt / 2)
	a.addPeering(b, p)
	b.addPeering(a, p)
	a.onStop(p.Close)
	b.onStop(p.Close)
	return nil
}

// DialContext dials addr in the pod network, as a pod of the site would: a
// name is a pod's or a Service's DNS name, and a name ending in ".svc" gets
// the cluster domain, as a pod's resolver search path adds it. It fits
// http.Transport.DialContext and, wrapped, grpc.WithContextDialer.
func (s *Site) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(addr)
	if err == nil && strings.HasSuffix(host, ".svc") {
		addr = net.JoinHostPort(host+"."+ClusterDomain, port)
	}
	return s.Network.DialContext(ctx, network, addr)
}

// newClients fills Client and Kube from Config.
func (s *Site) newClients() error {
	scheme, err := membership.Scheme()
	if err != nil {
		return err
	}
	if s.Client, err = client.New(s.Config, client.Options{Scheme: scheme}); err != nil {
		return err
	}
	s.Kube, err = kubernetes.NewForConfig(s.Config)
	return err
}
