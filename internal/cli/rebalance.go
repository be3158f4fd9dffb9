package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/druid-stretch/druid-stretch/internal/planner"
	"github.com/druid-stretch/druid-stretch/internal/rebalance"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// newRebalanceCommand moves an etcd cluster to a target set of members
// through the members' sidecars, one safe step at a time, without
// Kubernetes.
func newRebalanceCommand() *cobra.Command {
	var (
		file                      string
		sidecars, targets, groups []string
		caFile, certFile, keyFile string
		insecureSkipVerify        bool
		timeout                   time.Duration
		cfg                       rebalance.Config
	)
	cmd := &cobra.Command{
		Use:   "rebalance",
		Short: "Move an etcd cluster to a target set of members, one safe step at a time",
		Long: `Move an etcd cluster to the target members through the druid-stretch
sidecars beside its members: add one target member as a learner, promote it
once caught up, remove one departing member, and so on, moving leadership
before it would be removed, until the cluster is the target. Each step is
printed with the membership it was planned from.

Starting the etcd of a new member is the operator's job: once its learner is
added, the command prints the flags to start it with and waits; a learner that
makes no progress within --learner-progress-timeout is removed again.

  druid-stretch rebalance \
    --sidecar a-0=https://10.0.0.1:8090 --sidecar a-1=https://10.0.0.2:8090 --sidecar a-2=https://10.0.0.3:8090 \
    --sidecar b-0=https://10.0.1.1:8090 --sidecar b-1=https://10.0.1.2:8090 --sidecar b-2=https://10.0.1.3:8090 \
    --target b/b-0=https://10.0.1.1:2380 --target b/b-1=https://10.0.1.2:2380 --target b/b-2=https://10.0.1.3:2380 \
    --group a=a-0,a-1,a-2 --cacert ca.crt --cert client.crt --key client.key

or the same as a file (--file, "-" for stdin, at most 4 MiB): sidecars
[{member, url}], target [{name, peerURLs, group}], groups {group: [members]}.

Every sidecar call has a time limit (--call-timeout) and so has the whole run
(--timeout); a run that reaches it stops, naming the sidecars that did not
answer, and goes on from where it stands when run again.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if timeout <= 0 || cfg.Membership.CallTimeout <= 0 {
				return usageError(fmt.Errorf("--timeout (%s) and --call-timeout (%s) must be positive: every sidecar call and the whole run have a time limit", timeout, cfg.Membership.CallTimeout))
			}
			spec := rebalance.Spec{Groups: map[string][]string{}}
			if file != "" {
				data, err := readInput(cmd, "file", file)
				if err != nil {
					return err
				}
				if spec, err = rebalance.ParseSpec(data, file); err != nil {
					return err
				}
				if spec.Groups == nil {
					spec.Groups = map[string][]string{}
				}
			}
			for _, v := range sidecars {
				s, err := rebalance.ParseSidecar(v)
				if err != nil {
					return err
				}
				spec.Sidecars = append(spec.Sidecars, s)
			}
			for _, v := range targets {
				t, err := rebalance.ParseTarget(v)
				if err != nil {
					return err
				}
				spec.Target = append(spec.Target, t)
			}
			for _, v := range groups {
				if err := rebalance.ParseGroup(v, spec.Groups); err != nil {
					return err
				}
			}
			if caFile != "" || certFile != "" || keyFile != "" || insecureSkipVerify {
				tlsConfig, err := sidecar.EtcdClientTLSConfig(caFile, certFile, keyFile, insecureSkipVerify)
				if err != nil {
					return fmt.Errorf("sidecar client TLS: %w", err)
				}
				cfg.TLS = tlsConfig
			}
			cfg.Spec, cfg.Out = spec, cmd.OutOrStdout()
			// An observation waits for one sidecar at most this long before
			// the next is asked; a sidecar that never answers costs no more.
			cfg.Membership.ObserveTimeout = min(cfg.Membership.CallTimeout, 5*time.Second)
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			_, err := rebalance.Run(ctx, cfg)
			if err != nil && errors.Is(err, context.DeadlineExceeded) && cmd.Context().Err() == nil {
				// Run again to go on from where it stands.
				return notFinished{fmt.Errorf("--timeout %s reached: %w", timeout, err)}
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&file, "file", "", "YAML file with sidecars, target and groups (flags add to it)")
	f.StringArrayVar(&sidecars, "sidecar", nil, "MEMBER=URL of a member's sidecar, today's and the target's (repeat)")
	f.StringArrayVar(&targets, "target", nil, "[GROUP/]NAME=PEERURL[,PEERURL...] of a member the cluster ends with (repeat)")
	f.StringArrayVar(&groups, "group", nil, "GROUP=MEMBER[,MEMBER...]: host group of members, for the tie rule (repeat)")
	f.StringVar(&caFile, "cacert", "", "CA bundle verifying the sidecars' serving certificates")
	f.StringVar(&certFile, "cert", "", "client certificate for the sidecars (mutating calls need one)")
	f.StringVar(&keyFile, "key", "", "key of the client certificate")
	f.BoolVar(&insecureSkipVerify, "insecure-skip-tls-verify", false, "do not verify the sidecars' serving certificates")
	f.StringVar(&cfg.Holder, "holder", rebalance.DefaultHolder, "name of this run in the cluster's membership lock and retirement records")
	f.BoolVar(&cfg.DryRun, "dry-run", false, "print the next step only; change nothing")
	f.DurationVar(&cfg.Policy.LearnerProgressTimeout, "learner-progress-timeout", 5*time.Minute, "remove a learner again that made no progress (was not started) for this long")
	f.DurationVar(&cfg.Policy.MinHealthyFor, "min-learner-healthy", 5*time.Second, "how long etcd's strict reconfiguration check needs a member connected (to the raft transport of the voter that takes the removal) or healthy before it counts it: the voters that stay wait this long before a removal, and a learner before a promotion only when the removal that ends the tie it makes needs it counted (etcd puts no time on a promotion)")
	f.DurationVar(&cfg.Policy.DownVoterGrace, "down-voter-grace", planner.DefaultDownVoterGrace, "how long a departing voter that is down is waited for before it is removed, when its removal would leave fewer voters than the target and no learner can be promoted first")
	f.DurationVar(&cfg.Interval, "interval", time.Second, "pause between observations while waiting")
	f.DurationVar(&timeout, "timeout", time.Hour, "time limit of the whole run; it stops there (exit code 3) and goes on from where it stands when run again")
	f.DurationVar(&cfg.Membership.CallTimeout, "call-timeout", 30*time.Second, "time limit of one sidecar call (an observation asks the next sidecar after at most 5 s)")
	return cmd
}
