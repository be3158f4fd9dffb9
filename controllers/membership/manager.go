package membership

import (
	"context"
	"fmt"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	stretchv1alpha1 "github.com/druid-stretch/druid-stretch/api/stretch/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/controllers/memberlease"
)

// ManagerOptions configure the controller's manager.
type ManagerOptions struct {
	// MetricsBindAddress serves /metrics ("0" turns it off).
	MetricsBindAddress string
	// HealthProbeBindAddress serves /healthz and /readyz ("0" turns it off).
	HealthProbeBindAddress string
	// LeaderElection lets one replica of the controller act at a time.
	LeaderElection bool
	// LeaderElectionNamespace holds the election lease (default: the
	// namespace the controller runs in).
	LeaderElectionNamespace string
	// LeaderElectionID names the lease (default druid-stretch-membership).
	LeaderElectionID string
	// WebhookHost, WebhookPort and WebhookCertDir configure the webhook
	// server (an empty host means every interface); it only serves once
	// webhooks are registered on it (controllers/webhook).
	WebhookHost    string
	WebhookPort    int
	WebhookCertDir string
	// Resolver reaches the local members (default DNSResolver on
	// webhook.DefaultSidecarPort).
	Resolver Resolver
	// Reconciler configures the membership controller. An empty
	// ClusterIdentity is filled with the UID of the kube-system namespace,
	// which stays the same for the life of a Kubernetes cluster.
	Reconciler Options
	// Namespaces limits the controller to Etcds in these namespaces; empty
	// for all.
	Namespaces []string
	// SkipNameValidation allows several managers in one process (tests).
	SkipNameValidation bool
	// Logger is the manager's logger.
	Logger logr.Logger
}

// Scheme is the scheme of the controller: Kubernetes' built-in types, the
// extended Etcd and the EtcdMembership.
func Scheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := stretchv1alpha1.AddToScheme(s); err != nil {
		return nil, err
	}
	return s, nil
}

// NewManager builds the controller's manager: leader election, health and
// readiness probes, the metrics endpoint, the membership controller and the
// member lease bridge (controllers/memberlease).
// Webhooks are registered on it separately (SetupWebhooks).
func NewManager(cfg *rest.Config, o ManagerOptions) (manager.Manager, error) {
	scheme, err := Scheme()
	if err != nil {
		return nil, fmt.Errorf("building the scheme: %w", err)
	}
	if o.LeaderElectionID == "" {
		o.LeaderElectionID = "druid-stretch-membership"
	}
	mo := ctrl.Options{
		Scheme:                        scheme,
		Logger:                        o.Logger,
		Metrics:                       metricsserver.Options{BindAddress: o.MetricsBindAddress},
		HealthProbeBindAddress:        o.HealthProbeBindAddress,
		LeaderElection:                o.LeaderElection,
		LeaderElectionNamespace:       o.LeaderElectionNamespace,
		LeaderElectionID:              o.LeaderElectionID,
		LeaderElectionReleaseOnCancel: true,
		WebhookServer:                 webhook.NewServer(webhook.Options{Host: o.WebhookHost, Port: o.WebhookPort, CertDir: o.WebhookCertDir}),
	}
	// The member lease bridge reads druid's member leases only: a seed has
	// a Lease per node and per controller besides, which the cache need not
	// hold.
	mo.Cache.ByObject = map[client.Object]cache.ByObject{
		&coordinationv1.Lease{}: {Label: memberlease.Selector()},
		// Only the slices of the external members' peer names (peernames.go):
		// a seed has a slice per Service.
		&discoveryv1.EndpointSlice{}: {Label: peerNamesSelector()},
	}
	if len(o.Namespaces) > 0 {
		mo.Cache.DefaultNamespaces = map[string]cache.Config{}
		for _, ns := range o.Namespaces {
			mo.Cache.DefaultNamespaces[ns] = cache.Config{}
		}
	}
	if o.SkipNameValidation {
		mo.Controller = config.Controller{SkipNameValidation: ptr.To(true)}
	}
	mgr, err := ctrl.NewManager(cfg, mo)
	if err != nil {
		return nil, fmt.Errorf("creating the manager: %w", err)
	}
	if o.Reconciler.ClusterIdentity == "" {
		if o.Reconciler.ClusterIdentity, err = clusterIdentity(mgr.GetAPIReader()); err != nil {
			return nil, err
		}
	}
	if o.Resolver == nil {
		o.Resolver = DNSResolver{}
	}
	if o.Reconciler.Membership.Logger.GetSink() == nil {
		o.Reconciler.Membership.Logger = mgr.GetLogger().WithName("membership")
	}
	metrics, err := NewMetrics(crmetrics.Registry)
	if err != nil {
		return nil, err
	}
	r, err := NewReconciler(Dependencies{
		Client:    mgr.GetClient(),
		APIReader: mgr.GetAPIReader(),
		Resolver:  o.Resolver,
		Recorder:  mgr.GetEventRecorder("druid-stretch-membership"),
		Metrics:   metrics,
	}, o.Reconciler)
	if err != nil {
		return nil, err
	}
	if err := r.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("setting up the membership controller: %w", err)
	}
	bridge := &memberlease.Reconciler{Client: mgr.GetClient(), Log: mgr.GetLogger().WithName("member-lease-bridge")}
	if err := bridge.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("setting up the member lease bridge: %w", err)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return nil, fmt.Errorf("adding the health check: %w", err)
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return nil, fmt.Errorf("adding the readiness check: %w", err)
	}
	return mgr, nil
}

// clusterIdentity is the UID of the kube-system namespace: it names a
// Kubernetes cluster for its whole life, so a restarted controller finds its
// own lock and retirement records.
func clusterIdentity(r client.Reader) (string, error) {
	var ns corev1.Namespace
	if err := r.Get(context.Background(), client.ObjectKey{Name: "kube-system"}, &ns); err != nil {
		return "", fmt.Errorf("reading the kube-system namespace for a default cluster identity (or set --cluster-identity): %w", err)
	}
	return "cluster-" + string(ns.UID), nil
}
