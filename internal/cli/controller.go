package cli

import (
	"flag"
	"fmt"

	"github.com/spf13/cobra"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlzap "sigs.k8s.io/controller-runtime/pkg/log/zap"

	membershipctrl "github.com/druid-stretch/druid-stretch/controllers/membership"
	"github.com/druid-stretch/druid-stretch/controllers/webhook"
	"github.com/druid-stretch/druid-stretch/internal/version"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// newControllerCommand runs the membership controller and, given a sidecar
// image, the admission webhooks, in one manager.
func newControllerCommand() *cobra.Command {
	var (
		mo                        membershipctrl.ManagerOptions
		kubeconfig                string
		caFile, certFile, keyFile string
		sidecarPort               int32
		wo                        webhook.Options
		zapOpts                   ctrlzap.Options
	)
	cmd := &cobra.Command{
		Use:   "controller",
		Short: "Run the membership controller for extended Etcd objects",
		Long: `Run the membership controller: for each Etcd it observes the etcd members
through their sidecars, executes one safe membership step at a time, and
reports status.membership, conditions, events and metrics. With
--sidecar-image the same manager serves the admission webhooks.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := ctrlzap.New(ctrlzap.UseFlagOptions(&zapOpts))
			ctrl.SetLogger(log)
			v := version.Get()
			log.Info("starting druid-stretch controller", "version", v.Version, "commit", v.Commit,
				"goVersion", v.GoVersion, "etcdClientVersion", v.EtcdClientVersion)
			cfg, err := ctrl.GetConfig()
			if kubeconfig != "" {
				cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
			}
			if err != nil {
				return fmt.Errorf("loading the kubeconfig: %w", err)
			}
			if mo.Reconciler.SidecarCAFromEtcd && caFile != "" {
				return fmt.Errorf("--sidecar-ca-file and --sidecar-ca-from-etcd both say which CA verifies the sidecars: give one")
			}
			if mo.Reconciler.SidecarTLS, err = sidecar.EtcdClientTLSConfig(caFile, certFile, keyFile, false); err != nil {
				return fmt.Errorf("sidecar client TLS: %w", err)
			}
			if o := mo.Reconciler.ManagedNamespaces; o.Enabled() {
				log.Info("managing every Etcd of the namespaces matching --manage-etcds-in-namespaces", "selector", o.String())
			}
			mo.Resolver = membershipctrl.DNSResolver{SidecarPort: sidecarPort}
			mo.Reconciler.PodsStartThroughSidecar = wo.SidecarImage != ""
			mo.Logger = log
			mgr, err := membershipctrl.NewManager(cfg, mo)
			if err != nil {
				return err
			}
			if wo.SidecarImage == "" {
				log.Info("no --sidecar-image: the admission webhooks are not served")
			} else {
				// One setting for both: the planner's learner limit and
				// etcd's in the pods the webhook mutates, and the
				// namespaces whose Etcds both manage.
				wo.SidecarPort, wo.EtcdMaxLearners = sidecarPort, mo.Reconciler.MaxLearners
				wo.ManagedNamespaces = mo.Reconciler.ManagedNamespaces
				if err := webhook.SetupWithManager(mgr, wo); err != nil {
					return err
				}
			}
			return mgr.Start(cmd.Context())
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster, $KUBECONFIG or ~/.kube/config)")
	f.StringVar(&mo.MetricsBindAddress, "metrics-bind-address", ":8080", "address of the metrics endpoint (0 turns it off)")
	f.StringVar(&mo.HealthProbeBindAddress, "health-probe-bind-address", ":8081", "address of /healthz and /readyz (0 turns them off)")
	f.BoolVar(&mo.LeaderElection, "leader-elect", true, "let one replica act at a time")
	f.StringVar(&mo.LeaderElectionNamespace, "leader-election-namespace", "", "namespace of the leader election lease (default: the controller's own)")
	f.StringVar(&mo.LeaderElectionID, "leader-election-id", "druid-stretch-membership", "name of the leader election lease; controllers sharing a namespace need different ones")
	f.StringVar(&caFile, "sidecar-ca-file", "", "CA bundle verifying the sidecars' serving certificates (or --sidecar-ca-from-etcd)")
	f.StringVar(&certFile, "sidecar-cert-file", "", "client certificate presented to the sidecars (mutating calls need one)")
	f.StringVar(&keyFile, "sidecar-key-file", "", "key of the client certificate")
	f.Int32Var(&sidecarPort, "sidecar-port", webhook.DefaultSidecarPort, "port the sidecars serve on (also injected by the webhook)")
	f.IntVar(&mo.WebhookPort, "webhook-port", 9443, "port of the admission webhook server")
	f.StringVar(&mo.WebhookCertDir, "webhook-cert-dir", "", "directory with tls.crt and tls.key of the webhook server")
	mo.Reconciler.AddFlags(f)
	wo.AddFlags(f)
	logFlags := flag.NewFlagSet("log", flag.ContinueOnError)
	zapOpts.BindFlags(logFlags)
	f.AddGoFlagSet(logFlags)
	return cmd
}
