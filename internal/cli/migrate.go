package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	move "github.com/druid-stretch/druid-stretch/api/v1alpha1/migration"
	"github.com/druid-stretch/druid-stretch/internal/migration"
)

// newMigrateCommand moves an Etcd live from one Kubernetes cluster to
// another, or aborts such a move.
func newMigrateCommand() *cobra.Command {
	var (
		srcKubeconfig, dstKubeconfig string
		namespace, name              string
		abort, status                bool
		ordinalStart                 int32
		memberNamePrefix             string
		src, dst                     migration.URLTemplates
		stepTimeout                  time.Duration
		switchCommand                string
	)
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Move an etcd cluster live from one Kubernetes cluster to another",
		Long: `Move the etcd cluster of an Etcd live from the source Kubernetes cluster to
the destination: prepare-source, join-destination, retire-source, finish. Each
step sets Etcd spec fields and waits for the membership controllers; running
the command again continues an interrupted move. --abort takes a move back
while the destination does not hold the majority of the voters. --status
prints where a move stands, read from the two Etcds, and changes nothing.

The URL templates say how the other cluster reaches each member; they take
{pod}, {member}, {ordinal}, {name} (the Etcd) and {namespace}, e.g.
  --destination-peer-url-template 'https://{pod}.{name}-peer.{namespace}.seed-b.example:2380'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if namespace == "" || name == "" {
				return errors.New("--namespace and --name are required")
			}
			if status && abort {
				return errors.New("--status changes nothing, --abort takes the move back: choose one")
			}
			for _, t := range []struct {
				side string
				t    migration.URLTemplates
			}{{"source", src}, {"destination", dst}} {
				// --status only reads the two Etcds: it needs no address.
				if err := t.t.Check(); err != nil && !status {
					return fmt.Errorf("--%s-*-url-template: %w", t.side, err)
				}
			}
			srcClient, err := migration.NewClientFromKubeconfig(srcKubeconfig)
			if err != nil {
				return fmt.Errorf("--source-kubeconfig: %w", err)
			}
			dstClient, err := migration.NewClientFromKubeconfig(dstKubeconfig)
			if err != nil {
				return fmt.Errorf("--destination-kubeconfig: %w", err)
			}
			printer := migration.NewProgressPrinter(cmd.OutOrStdout())
			o := migration.Options{
				Source: srcClient, Destination: dstClient, Namespace: namespace, Name: name,
				SourceAddresses: src.Addresses(), DestinationAddresses: dst.Addresses(),
				StepTimeout: stepTimeout, Progress: printer.Print,
			}
			if cmd.Flags().Changed("destination-ordinal-start") {
				o.DestinationOrdinalStart = &ordinalStart
			}
			if memberNamePrefix != "" {
				o.DestinationMemberNamePrefix = &memberNamePrefix
			}
			if switchCommand != "" {
				o.SwitchClients = shellHook("--switch-clients-command", switchCommand, namespace, name, cmd.ErrOrStderr())
			}
			m, err := migration.New(o)
			if err != nil {
				return err
			}
			if status {
				return printStatus(cmd, m)
			}
			if abort {
				return m.Abort(cmd.Context())
			}
			return m.Move(cmd.Context())
		},
	}
	f := cmd.Flags()
	f.StringVar(&srcKubeconfig, "source-kubeconfig", "", "kubeconfig of the source cluster")
	f.StringVar(&dstKubeconfig, "destination-kubeconfig", "", "kubeconfig of the destination cluster")
	f.StringVarP(&namespace, "namespace", "n", "", "namespace of the Etcd (the same in both clusters)")
	f.StringVar(&name, "name", "", "name of the Etcd (the same in both clusters)")
	f.BoolVar(&abort, "abort", false, "take the move back instead (refused once the destination holds the majority)")
	f.BoolVar(&status, "status", false, "print the move's phase and what each controller reports, and change nothing")
	f.Int32Var(&ordinalStart, "destination-ordinal-start", 0, "spec.ordinalStart of the destination Etcd when the move creates it (default: after the source's ordinals)")
	f.StringVar(&memberNamePrefix, "destination-member-name-prefix", "", "spec.memberNamePrefix of the destination Etcd when the move creates it")
	f.StringVar(&src.Peer, "source-peer-url-template", "", "peer URL of a source member as the destination reaches it")
	f.StringVar(&src.Client, "source-client-url-template", "", "client URL of a source member as the destination reaches it")
	f.StringVar(&src.Sidecar, "source-sidecar-url-template", "", "sidecar URL of a source member as the destination's controller reaches it")
	f.StringVar(&dst.Peer, "destination-peer-url-template", "", "peer URL of a destination member as the source reaches it")
	f.StringVar(&dst.Client, "destination-client-url-template", "", "client URL of a destination member as the source reaches it")
	f.StringVar(&dst.Sidecar, "destination-sidecar-url-template", "", "sidecar URL of a destination member as the source's controller reaches it")
	f.DurationVar(&stepTimeout, "step-timeout", 10*time.Minute, "time limit of one step's wait; run again to continue")
	f.StringVar(&switchCommand, "switch-clients-command", "", "shell command run at step switch-clients, once the destination's first member votes and before any source member goes: "+
		"it points the source site's clients at the destination (a shoot's API endpoint at the destination's kube-apiserver) and stops the source's; "+
		"it gets DRUID_STRETCH_NAMESPACE and DRUID_STRETCH_NAME, must be safe to run twice, and a non-zero exit stops the move with nothing changed")
	return cmd
}

// shellHook runs command with sh -c as a step of the move, with its output
// on out, and ends it with the move's context. Its error names the flag,
// the exit status and the command's last line of output.
func shellHook(flag, command, namespace, name string, out io.Writer) func(context.Context) error {
	return func(ctx context.Context) error {
		c := exec.CommandContext(ctx, "/bin/sh", "-c", command)
		c.Env = append(os.Environ(), "DRUID_STRETCH_NAMESPACE="+namespace, "DRUID_STRETCH_NAME="+name)
		var tail lastLine
		c.Stdout = io.MultiWriter(out, &tail)
		c.Stderr = c.Stdout
		// The command and every process it starts form a process group
		// that ends with the move's context, so none outlives the move.
		c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		c.Cancel = func() error { return syscall.Kill(-c.Process.Pid, syscall.SIGKILL) }
		c.WaitDelay = 5 * time.Second
		if err := c.Run(); err != nil {
			if l := tail.String(); l != "" {
				return fmt.Errorf("%s %q: %w: %s", flag, command, err, l)
			}
			return fmt.Errorf("%s %q: %w", flag, command, err)
		}
		return nil
	}
}

// lastLine keeps the last non-empty line written to it.
type lastLine struct {
	buf  []byte
	last string
}

func (l *lastLine) Write(p []byte) (int, error) {
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			break
		}
		if line := strings.TrimSpace(string(l.buf[:i])); line != "" {
			l.last = line
		}
		l.buf = l.buf[i+1:]
	}
	return len(p), nil
}

func (l *lastLine) String() string {
	if line := strings.TrimSpace(string(l.buf)); line != "" {
		return line
	}
	return l.last
}

// printStatus prints the phase of the move, the step that leads out of it,
// and each side's membership as its controller last reported it.
func printStatus(cmd *cobra.Command, m *migration.Mover) error {
	src, dst, p, err := m.Read(cmd.Context())
	if err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	fmt.Fprintln(out, move.Explain(src, dst))
	if next := p.Step(); next != "" {
		fmt.Fprintf(out, "  next step: %s\n", next)
	}
	for _, side := range []struct {
		name string
		e    *v1alpha1.Etcd
	}{{"source", src}, {"destination", dst}} {
		if side.e == nil {
			fmt.Fprintf(out, "  %s: no Etcd\n", side.name)
			continue
		}
		fmt.Fprintf(out, "  %s: replicas %d, %d external members, policy %s; %s\n", side.name, side.e.Spec.Replicas,
			len(side.e.Spec.ExternalMembers), side.e.Spec.GetExternalMembersPolicy(), move.ConditionSummary(side.e))
	}
	return nil
}
