package membership

import (
	"time"

	"github.com/spf13/pflag"

	"github.com/druid-stretch/druid-stretch/internal/planner"
)

// AddFlags binds the reconciler's settings to the controller's command-line
// flags (the chart's controller values), with the Options defaults: the
// shipped command and the test sites parse the same flags.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.ClusterIdentity, "cluster-identity", o.ClusterIdentity,
		"names this controller in each etcd cluster's membership lock and retirement records; the same across restarts (default: the kube-system namespace UID)")
	fs.DurationVar(&o.LearnerProgressTimeout, "learner-progress-timeout", 5*time.Minute,
		"remove a learner again that made no progress for this long")
	fs.DurationVar(&o.MinLearnerHealthy, "min-learner-healthy", 5*time.Second,
		"how long etcd's strict reconfiguration check needs a member connected (to the raft transport of the voter that takes the removal) or healthy before it counts it: the voters that stay wait this long before a removal, and a learner before a promotion only when the removal that ends the tie it makes needs it counted (etcd puts no time on a promotion)")
	fs.DurationVar(&o.DownVoterGrace, "down-voter-grace", planner.DefaultDownVoterGrace,
		"how long a departing voter that is down is waited for before it is removed, when its removal would leave fewer voters than the target and no learner can be promoted first (its pod may be recreated)")
	fs.DurationVar(&o.ProgressInterval, "progress-interval", DefaultProgressInterval,
		"how often an Etcd whose membership changes is observed again while a step waits (a learner starting, catching up or settling): the longest such a wait's end goes unseen")
	fs.IntVar(&o.MaxLearners, "max-learners", DefaultMaxLearners,
		"learners that catch up at once; above 1 the webhook also sets etcd's max-learners (etcd's own default is 1) to it in the pods of the Etcds it manages")
	fs.BoolVar(&o.SidecarCAFromEtcd, "sidecar-ca-from-etcd", false,
		"verify each Etcd's sidecars with the CA of its own spec.backup.tls.tlsCASecretRef (read from the Etcd's namespace; one CA per shoot) in place of --sidecar-ca-file")
	fs.Var(&o.ManagedNamespaces, "manage-etcds-in-namespaces",
		"label selector of namespaces whose every Etcd druid-stretch manages, with an EtcdMembership of ordinalStart 0 created for each that has none (on a seed: gardener.cloud/role=shoot); empty manages only Etcds with an EtcdMembership. The webhook uses the same selector")
}
