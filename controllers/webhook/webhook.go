// Package webhook holds druid-stretch's admission webhooks: a mutating one
// that puts druid's StatefulSet of an extended Etcd on the Etcd's pod window
// (spec.ordinals.start and spec.replicas) and injects the membership sidecar,
// and a validating one that checks the Etcd extension with the Go validation
// of api/v1alpha1/validation. Both are served by the controller manager's
// webhook server; the Helm chart's webhook configurations name the paths
// below.
package webhook

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/pflag"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	stretchv1alpha1 "github.com/druid-stretch/druid-stretch/api/stretch/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/internal/etcdview"
)

// The webhook paths; the chart's webhook configurations use them verbatim.
const (
	// StatefulSetMutatorPath serves the mutating webhook on apps/v1
	// StatefulSets.
	StatefulSetMutatorPath = "/mutate-apps-v1-statefulset"
	// EtcdValidatorPath serves the validating webhook on Etcds.
	EtcdValidatorPath = "/validate-druid-gardener-cloud-v1alpha1-etcd"
	// EtcdMembershipValidatorPath serves the validating webhook on
	// EtcdMemberships.
	EtcdMembershipValidatorPath = "/validate-druid-stretch-druid-gardener-cloud-v1alpha1-etcdmembership"
	// EtcdDeletionValidatorPath serves the validating webhook on Etcd
	// deletions.
	EtcdDeletionValidatorPath = "/validate-druid-gardener-cloud-v1alpha1-etcd-delete"
	// EtcdScaleValidatorPath serves the validating webhook on the scale
	// subresource of Etcds.
	EtcdScaleValidatorPath = "/validate-druid-gardener-cloud-v1alpha1-etcd-scale"
)

// DefaultSidecarPort is the port the injected sidecar serves on: clear of
// druid's ports (etcd 2379/2380, backup-restore 8080, etcd-wrapper 9095).
const DefaultSidecarPort int32 = 8090

// Options say what the StatefulSet webhook injects.
type Options struct {
	// SidecarImage is the druid-stretch image; its entrypoint is the
	// druid-stretch binary, so the container's args start with "sidecar".
	// Required.
	SidecarImage string
	// SidecarImagePullPolicy defaults to IfNotPresent.
	SidecarImagePullPolicy corev1.PullPolicy
	// SidecarPort is the port the sidecar serves on (default 8090). The
	// controller dials the same port, so the controller command passes its
	// one --sidecar-port flag here.
	SidecarPort int32
	// SidecarResources are the sidecar container's requests and limits.
	SidecarResources corev1.ResourceRequirements
	// SidecarClientCASecretName, when set, names a Secret (key ca.crt) in
	// each Etcd's namespace holding the CA that signs the controller's client
	// certificate; empty means the Etcd's spec.backup.tls.tlsCASecretRef.
	SidecarClientCASecretName string
	// SidecarAllowedClients are the client certificate identities (common
	// name or SAN) that may change membership through every injected
	// sidecar: this cluster's controller, and the other clusters' during a
	// live move. An Etcd adds its own with
	// v1alpha1.SidecarAllowedClientsAnnotation. A sidecar serving TLS is
	// injected only with at least one.
	SidecarAllowedClients []string
	// ClientGateBackendPort, when not 0, puts the sidecar's client gate in
	// front of etcd's client port in the pods of the Etcds druid-stretch
	// manages: etcd listens on 127.0.0.1 at this port, the sidecar's gate
	// on etcd's client port, so that the controller can drain a member's
	// clients before removing it and hold them during a leader transfer
	// (internal/clientgate). With client TLS the gate serves with etcd's
	// own server certificate and requires client certificates of etcd's
	// CA, as etcd does.
	ClientGateBackendPort int32
	// EtcdMaxLearners, when above 1, is etcd's max-learners in the pods of
	// the Etcds druid-stretch manages: the sidecar sets it in the
	// configuration it serves to etcd-wrapper (druid's has no such key),
	// so that a move can let several learners catch up at once. The
	// controller command sets it from its own --max-learners.
	EtcdMaxLearners int
	// ManagedNamespaces opts in the Etcds of the namespaces it matches, as
	// the controller does (etcdview.NamespaceOptIn): their StatefulSets get
	// the sidecar from their first pod on, before the controller has
	// written their EtcdMembership. The controller command sets it from
	// its own --manage-etcds-in-namespaces.
	ManagedNamespaces etcdview.NamespaceOptIn
	// MembershipStatusWriters are user names (e.g.
	// system:serviceaccount:<namespace>:<name>) that may change
	// status.membership of an EtcdMembership besides the identity the
	// webhook's own process runs as, which is the controller's (see
	// EtcdMembershipValidator).
	MembershipStatusWriters []string
}

// AddFlags registers the webhook's flags on fs. --sidecar-port is not among
// them: the controller needs that port as well and owns the flag.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	if o.SidecarImagePullPolicy == "" {
		o.SidecarImagePullPolicy = corev1.PullIfNotPresent
	}
	fs.StringVar(&o.SidecarImage, "sidecar-image", o.SidecarImage,
		"image of the membership sidecar the StatefulSet webhook injects (its entrypoint is the druid-stretch binary)")
	fs.StringVar((*string)(&o.SidecarImagePullPolicy), "sidecar-image-pull-policy", string(o.SidecarImagePullPolicy),
		"image pull policy of the injected sidecar: Always, IfNotPresent or Never")
	fs.StringVar(&o.SidecarClientCASecretName, "sidecar-client-ca-secret-name", o.SidecarClientCASecretName,
		"Secret (key ca.crt) in each Etcd's namespace with the CA of the controller's client certificate; empty uses the Etcd's spec.backup.tls.tlsCASecretRef")
	fs.Var((*v1alpha1.AllowedClients)(&o.SidecarAllowedClients), "sidecar-allowed-clients",
		"client certificate identities (common name or SAN) that may change membership through the injected sidecars; an Etcd adds its own with the annotation "+v1alpha1.SidecarAllowedClientsAnnotation)
	fs.Int32Var(&o.ClientGateBackendPort, "client-gate-backend-port", o.ClientGateBackendPort,
		"when not 0, etcd listens on 127.0.0.1 at this port and the sidecar's client gate serves etcd's client port (with etcd's own certificate and client CA when its client URLs are TLS), so member removals and leader transfers fail no client call")
	fs.StringSliceVar(&o.MembershipStatusWriters, "membership-status-writers", o.MembershipStatusWriters,
		"user names that may change status.membership of an EtcdMembership besides this process's own identity (the controller's); the EtcdMembership webhook refuses everyone else's, since spec transitions are judged by it")
	if o.SidecarResources.Requests == nil {
		o.SidecarResources.Requests = corev1.ResourceList{}
	}
	if o.SidecarResources.Limits == nil {
		o.SidecarResources.Limits = corev1.ResourceList{}
	}
	fs.Var(quantityFlag{o.SidecarResources.Requests, corev1.ResourceCPU}, "sidecar-resources-requests-cpu", "CPU request of the injected sidecar, e.g. 20m")
	fs.Var(quantityFlag{o.SidecarResources.Requests, corev1.ResourceMemory}, "sidecar-resources-requests-memory", "memory request of the injected sidecar, e.g. 32Mi")
	fs.Var(quantityFlag{o.SidecarResources.Limits, corev1.ResourceCPU}, "sidecar-resources-limits-cpu", "CPU limit of the injected sidecar")
	fs.Var(quantityFlag{o.SidecarResources.Limits, corev1.ResourceMemory}, "sidecar-resources-limits-memory", "memory limit of the injected sidecar, e.g. 128Mi")
}

// quantityFlag sets one resource of a ResourceList from a flag.
type quantityFlag struct {
	list corev1.ResourceList
	name corev1.ResourceName
}

func (f quantityFlag) String() string {
	if f.list == nil {
		return ""
	}
	if q, ok := f.list[f.name]; ok {
		return q.String()
	}
	return ""
}

func (f quantityFlag) Set(s string) error {
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return fmt.Errorf("%q is not a Kubernetes quantity (e.g. 20m, 64Mi): %w", s, err)
	}
	f.list[f.name] = q
	return nil
}

func (f quantityFlag) Type() string { return "quantity" }

// validate checks the options and fills the defaults.
func (o *Options) validate() error {
	var errs []error
	if o.SidecarImage == "" {
		errs = append(errs, errors.New("the sidecar image is empty (--sidecar-image): the StatefulSet webhook has nothing to inject"))
	}
	switch o.SidecarImagePullPolicy {
	case "":
		o.SidecarImagePullPolicy = corev1.PullIfNotPresent
	case corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever:
	default:
		errs = append(errs, fmt.Errorf("sidecar image pull policy %q (--sidecar-image-pull-policy) is not Always, IfNotPresent or Never", o.SidecarImagePullPolicy))
	}
	if o.SidecarPort == 0 {
		o.SidecarPort = DefaultSidecarPort
	}
	if o.SidecarPort < 1 || o.SidecarPort > 65535 {
		errs = append(errs, fmt.Errorf("sidecar port %d (--sidecar-port) is not in 1-65535", o.SidecarPort))
	}
	if p := o.ClientGateBackendPort; p < 0 || p > 65535 || (p != 0 && p == o.SidecarPort) {
		errs = append(errs, fmt.Errorf("client gate backend port %d (--client-gate-backend-port) is not 0 (no gate) or a port in 1-65535 other than the sidecar's", p))
	}
	if o.EtcdMaxLearners < 0 {
		errs = append(errs, fmt.Errorf("etcd's max-learners %d (the controller's --max-learners) is negative", o.EtcdMaxLearners))
	}
	if n := o.SidecarClientCASecretName; n != "" {
		for _, msg := range validation.IsDNS1123Subdomain(n) {
			errs = append(errs, fmt.Errorf("sidecar client CA Secret name %q (--sidecar-client-ca-secret-name): %s", n, msg))
		}
	}
	// Each is passed on in the sidecars' --allowed-client, which parses it
	// with the same function.
	for _, c := range o.SidecarAllowedClients {
		if ids, err := v1alpha1.ParseAllowedClients(c); err != nil || len(ids) != 1 {
			errs = append(errs, fmt.Errorf("sidecar allowed client %q (--sidecar-allowed-clients): want one certificate identity (common name or SAN), without blanks or commas", c))
		}
	}
	for _, w := range o.MembershipStatusWriters {
		if w == "" {
			errs = append(errs, errors.New("an empty user name in --membership-status-writers: want user names such as system:serviceaccount:<namespace>:<name>"))
		}
	}
	for name, list := range map[string]corev1.ResourceList{"requests": o.SidecarResources.Requests, "limits": o.SidecarResources.Limits} {
		for r, q := range list {
			if q.Sign() < 0 {
				errs = append(errs, fmt.Errorf("sidecar %s %s %s (--sidecar-resources-%s-%s) is negative", r, name, q.String(), name, r))
			}
		}
	}
	return errors.Join(errs...)
}

// SetupWithManager registers the webhooks on the manager's webhook server.
// The StatefulSet webhook reads the owner Etcd through the manager's API
// reader, not its cache: the pod window depends on status.membership, which
// the controller has just written when a removal frees a pod.
func SetupWithManager(mgr ctrl.Manager, opts Options) error {
	if err := opts.validate(); err != nil {
		return fmt.Errorf("admission webhooks: %w", err)
	}
	decoder := admission.NewDecoder(mgr.GetScheme())
	if !mgr.GetScheme().Recognizes(v1alpha1.GroupVersion.WithKind("Etcd")) {
		return errors.New("admission webhooks: the manager's scheme lacks the extended Etcd; add api/v1alpha1.AddToScheme")
	}
	if !mgr.GetScheme().Recognizes(stretchv1alpha1.GroupVersion.WithKind("EtcdMembership")) {
		return errors.New("admission webhooks: the manager's scheme lacks the EtcdMembership; add api/stretch/v1alpha1.AddToScheme")
	}
	if !mgr.GetScheme().Recognizes(appsv1.SchemeGroupVersion.WithKind("StatefulSet")) {
		return errors.New("admission webhooks: the manager's scheme lacks apps/v1 StatefulSet; add client-go's scheme")
	}
	srv := mgr.GetWebhookServer()
	srv.Register(StatefulSetMutatorPath, &admission.Webhook{Handler: &StatefulSetMutator{
		Reader:  mgr.GetAPIReader(),
		Decoder: decoder,
		Options: opts,
	}})
	srv.Register(EtcdValidatorPath, &admission.Webhook{Handler: &EtcdValidator{Reader: mgr.GetAPIReader(), Decoder: decoder}})
	self, err := UserName(mgr.GetConfig())
	if err != nil {
		// Fail closed: without it the webhook cannot tell the controller's
		// status writes from anyone else's.
		return fmt.Errorf("admission webhooks: %w", err)
	}
	writers := append([]string{self}, opts.MembershipStatusWriters...)
	srv.Register(EtcdMembershipValidatorPath, &admission.Webhook{Handler: &EtcdMembershipValidator{Reader: mgr.GetAPIReader(), Decoder: decoder, StatusWriters: writers}})
	srv.Register(EtcdDeletionValidatorPath, &admission.Webhook{Handler: &EtcdDeletionValidator{Reader: mgr.GetAPIReader(), Decoder: decoder}})
	srv.Register(EtcdScaleValidatorPath, &admission.Webhook{Handler: &EtcdScaleValidator{Reader: mgr.GetAPIReader()}})
	// The kube-apiserver calls the webhooks as soon as a Service endpoint is
	// ready: not ready until the server answers TLS handshakes.
	if err := mgr.AddReadyzCheck("webhook-server", srv.StartedChecker()); err != nil {
		return fmt.Errorf("admission webhooks: adding the readiness check: %w", err)
	}
	return nil
}

// UserName is the user name the API server knows cfg's credentials by
// (a SelfSubjectReview): for the manager's, in the chart, the controller's
// service account.
func UserName(cfg *rest.Config) (string, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return "", fmt.Errorf("a client to learn its own user name: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("learning its own user name (SelfSubjectReview); the controller's alone may write status.membership: %w", err)
	}
	if r.Status.UserInfo.Username == "" {
		return "", errors.New("the API server's SelfSubjectReview names no user for these credentials")
	}
	return r.Status.UserInfo.Username, nil
}
