package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	move "github.com/druid-stretch/druid-stretch/api/v1alpha1/migration"
	"github.com/druid-stretch/druid-stretch/internal/livemove"
)

// migrateFlags are the migrate command's flags.
type migrateFlags struct {
	srcKubeconfig, dstKubeconfig string
	srcContext, dstContext       string
	namespace, name              string
	abort, status, dryRun, wait  bool
	output                       string
	ordinalStart                 int32
	memberNamePrefix             string
	src, dst                     livemove.URLTemplates
	stepTimeout                  time.Duration
	switchCommand                string
	holdSource                   int32
	gep39                        bool
	sourceClientEndpoints        []string
}

// newMigrateCommand moves an Etcd live from one Kubernetes cluster to
// another, or aborts such a move.
func newMigrateCommand() *cobra.Command {
	m := &migrateFlags{}
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Move an etcd cluster live from one Kubernetes cluster to another",
		Long: `Move the etcd cluster of an Etcd live from the source Kubernetes cluster to
the destination: prepare-source, join-destination, retire-source, finish. Each
step sets Etcd spec fields and waits for the membership controllers; running
the command again continues an interrupted move. --abort takes a move back
while the destination does not hold the majority of the voters. --status
prints where a move stands, read from the two Etcds, and changes nothing;
--dry-run prints that and the steps the move (or the abort) would take from
there, and changes nothing.

The two clusters are two kubeconfigs (--source-kubeconfig,
--destination-kubeconfig) or two contexts (--source-context,
--destination-context) of one, as kubectl takes them; an empty kubeconfig
follows kubectl's rules ($KUBECONFIG, then ~/.kube/config).

Exit codes: 0 done (or, with --wait=false, the next step started); 1 failed;
2 called wrongly (a bad flag or combination); 3 not finished: a step did not
finish within --step-timeout, run the command again to continue.

The URL templates say how the other cluster reaches each member; they take
{pod}, {member}, {ordinal}, {name} (the Etcd) and {namespace}, e.g.
  --destination-peer-url-template 'https://{pod}.{name}-peer.{namespace}.seed-b.example:2380'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := m.check(cmd); err != nil {
				return usageError(err)
			}
			return m.run(cmd)
		},
	}
	f := cmd.Flags()
	f.StringVar(&m.srcKubeconfig, "source-kubeconfig", "", "kubeconfig of the source cluster")
	f.StringVar(&m.dstKubeconfig, "destination-kubeconfig", "", "kubeconfig of the destination cluster")
	f.StringVar(&m.srcContext, "source-context", "", "kubeconfig context of the source cluster (default: the kubeconfig's current context)")
	f.StringVar(&m.dstContext, "destination-context", "", "kubeconfig context of the destination cluster (default: the kubeconfig's current context)")
	f.StringVarP(&m.output, "output", "o", "table", "output of --status, --dry-run and the end of a move: table, json or yaml (with json or yaml the progress goes to stderr)")
	f.BoolVar(&m.dryRun, "dry-run", false, "print where the move stands and the steps it (or --abort) would take from there, and change nothing")
	f.BoolVar(&m.wait, "wait", true, "wait for every step, showing the progress (a bar on a terminal); --wait=false starts the next step and returns")
	f.StringVarP(&m.namespace, "namespace", "n", "", "namespace of the Etcd (the same in both clusters)")
	f.StringVar(&m.name, "name", "", "name of the Etcd (the same in both clusters)")
	f.BoolVar(&m.abort, "abort", false, "take the move back instead (refused once the destination holds the majority)")
	f.BoolVar(&m.status, "status", false, "print the move's phase and what each controller reports, and change nothing")
	f.Int32Var(&m.ordinalStart, "destination-ordinal-start", 0, "spec.ordinalStart of the destination Etcd when the move creates it (default: after the source's ordinals)")
	f.StringVar(&m.memberNamePrefix, "destination-member-name-prefix", "", "spec.memberNamePrefix of the destination Etcd when the move creates it")
	f.StringVar(&m.src.Peer, "source-peer-url-template", "", "peer URL of a source member as the destination reaches it")
	f.StringVar(&m.src.Client, "source-client-url-template", "", "client URL of a source member as the destination reaches it")
	f.StringVar(&m.src.Sidecar, "source-sidecar-url-template", "", "sidecar URL of a source member as the destination's controller reaches it")
	f.StringVar(&m.dst.Peer, "destination-peer-url-template", "", "peer URL of a destination member as the source reaches it")
	f.StringVar(&m.dst.Client, "destination-client-url-template", "", "client URL of a destination member as the source reaches it")
	f.StringVar(&m.dst.Sidecar, "destination-sidecar-url-template", "", "sidecar URL of a destination member as the source's controller reaches it")
	f.DurationVar(&m.stepTimeout, "step-timeout", 10*time.Minute, "time limit of one step's wait; run again to continue")
	f.StringVar(&m.switchCommand, "switch-clients-command", "", "shell command run at step switch-clients, once the destination's first member votes and before any source member goes: "+
		"it points the source site's clients at the destination (a shoot's API endpoint at the destination's kube-apiserver) and stops the source's; "+
		"it gets DRUID_STRETCH_NAMESPACE and DRUID_STRETCH_NAME, must be safe to run twice, and a non-zero exit stops the move with nothing changed")
	f.BoolVar(&m.gep39, "gep39", false, "move as Gardener's GEP-39 does: write only druid's own Etcd fields, stage by stage (SourceEtcdPreparedForPeerJoin, DestinationEtcdPeersJoined, "+
		"EtcdMigrationComplete, SourceSeedCleanup); the destination gets --destination-member-name-prefix, ordinals from 0 and spec.etcd.bootstrapWithExistingCluster")
	f.StringSliceVar(&m.sourceClientEndpoints, "source-client-endpoints", nil, "with --gep39: the source's client endpoints as the destination reaches them (spec.etcd.bootstrapWithExistingCluster.clientEndpoints)")
	f.Int32Var(&m.holdSource, "hold-source", livemove.DefaultHoldSource, "with --switch-clients-command: run retire-source first, holding this many source members for the source site's clients, "+
		"and the command once the destination holds the majority; the held members go after it. The destination's kube-apiserver then starts on a quorum in its own site "+
		"instead of reading across the sites, and the source's clients meet the removals and the leader transfer, through their members' client gates. "+
		"0 runs the command before any source member goes; a source of one member needs 0. Without --switch-clients-command (and with --gep39) nothing is held")
	return cmd
}

// check refuses a wrong flag or combination of flags, and drops
// --hold-source's default where nothing can be held.
func (m *migrateFlags) check(cmd *cobra.Command) error {
	if m.namespace == "" || m.name == "" {
		return errors.New("--namespace and --name are required")
	}
	if m.status && m.abort {
		return errors.New("--status changes nothing, --abort takes the move back: choose one")
	}
	if m.status && m.dryRun {
		return errors.New("--status and --dry-run both change nothing: choose one")
	}
	if !slices.Contains([]string{"table", "json", "yaml"}, m.output) {
		return fmt.Errorf("-o %q: want table, json or yaml", m.output)
	}
	if !cmd.Flags().Changed("hold-source") && (m.switchCommand == "" || m.gep39) {
		// The held order needs the switch command; GEP-39's stages hold
		// no member.
		m.holdSource = 0
	}
	if m.holdSource < 0 {
		return fmt.Errorf("--hold-source %d: want 0 (switch the clients first) or the number of source members to hold", m.holdSource)
	}
	if m.holdSource != 0 && m.switchCommand == "" {
		return fmt.Errorf("--hold-source %d needs --switch-clients-command: the held source members stay for the clients that command switches", m.holdSource)
	}
	if m.gep39 {
		switch {
		case m.memberNamePrefix == "" || len(m.sourceClientEndpoints) == 0:
			return errors.New("--gep39 needs --destination-member-name-prefix (gardenlet uses the destination seed's name) and --source-client-endpoints")
		case m.abort || m.dryRun || m.holdSource != 0 || cmd.Flags().Changed("destination-ordinal-start"):
			return errors.New("--gep39 runs GEP-39's stages forward only: --abort, --dry-run, --hold-source and --destination-ordinal-start do not apply")
		}
	}
	for _, t := range []struct {
		side string
		t    livemove.URLTemplates
	}{{"source", m.src}, {"destination", m.dst}} {
		// --status and --dry-run only read the two Etcds: they need no
		// address.
		if err := t.t.Check(); err != nil && !m.status && !m.dryRun {
			return fmt.Errorf("--%s-*-url-template: %w", t.side, err)
		}
	}
	return nil
}

// options are the mover's options from the flags, with the clients of
// the two clusters.
func (m *migrateFlags) options(cmd *cobra.Command) (livemove.Options, error) {
	srcClient, err := livemove.NewClientFromKubeconfigContext(m.srcKubeconfig, m.srcContext)
	if err != nil {
		return livemove.Options{}, fmt.Errorf("the source cluster (--source-kubeconfig, --source-context): %w", err)
	}
	dstClient, err := livemove.NewClientFromKubeconfigContext(m.dstKubeconfig, m.dstContext)
	if err != nil {
		return livemove.Options{}, fmt.Errorf("the destination cluster (--destination-kubeconfig, --destination-context): %w", err)
	}
	o := livemove.Options{
		Source: srcClient, Destination: dstClient, Namespace: m.namespace, Name: m.name,
		SourceAddresses: m.src.Addresses(), DestinationAddresses: m.dst.Addresses(),
		StepTimeout: m.stepTimeout, HoldSource: m.holdSource,
	}
	switch {
	case m.gep39:
		o.GEP39 = &livemove.GEP39{DestinationPrefix: m.memberNamePrefix, SourceClientEndpoints: m.sourceClientEndpoints}
	default:
		if cmd.Flags().Changed("destination-ordinal-start") {
			o.DestinationOrdinalStart = &m.ordinalStart
		}
		if m.memberNamePrefix != "" {
			o.DestinationMemberNamePrefix = &m.memberNamePrefix
		}
	}
	if m.switchCommand != "" {
		o.SwitchClients = shellHook("--switch-clients-command", m.switchCommand, m.namespace, m.name, cmd.ErrOrStderr())
	}
	return o, nil
}

// run prints where the move stands (--status, --dry-run), or moves (or
// aborts) with the progress shown.
func (m *migrateFlags) run(cmd *cobra.Command) error {
	o, err := m.options(cmd)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(cmd.Context())
	defer cancel()
	progress := &moveProgress{cmd: cmd, table: m.output == "table", wait: m.wait, stop: cancel}
	o.Progress = progress.print
	mover, err := livemove.New(o)
	if err != nil {
		return err
	}
	if m.status || m.dryRun {
		return printReport(cmd, mover, m.output, m.dryRun, m.abort)
	}
	if err := progress.begin(ctx, mover, m.abort); err != nil {
		return err
	}
	if m.abort {
		err = mover.Abort(ctx)
	} else {
		err = mover.Move(ctx)
	}
	progress.end()
	switch {
	case progress.stopped && errors.Is(err, context.Canceled) && cmd.Context().Err() == nil:
		state := "started"
		if progress.lastKind == livemove.StepDone {
			state = "done"
		}
		_, _ = fmt.Fprintf(cmd.ErrOrStderr(), "step %s %s; not waiting (--wait=false): run again to continue, or --status to see where it stands\n", progress.last, state)
		return nil
	case errors.Is(err, context.DeadlineExceeded):
		return notFinished{err}
	case err != nil:
		return err
	}
	if m.output != "table" {
		return printReport(cmd, mover, m.output, false, m.abort)
	}
	return nil
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

// printReport prints where the move stands (the phase, the step that leads
// out of it, each side's membership as its controller last reported it)
// and, for a dry run, the steps the move or the abort would take from there.
func printReport(cmd *cobra.Command, m *livemove.Mover, output string, dryRun, abort bool) error {
	src, dst, p, err := m.Read(cmd.Context())
	if err != nil {
		return err
	}
	phase, why, next := m.Where(src, dst)
	r := moveReport{Phase: phase, Explanation: why, NextStep: next, DryRun: dryRun,
		Source: sideReportOf(src), Destination: sideReportOf(dst)}
	if dryRun {
		steps := livemove.Remaining(p, m.ClientSwitch())
		if abort {
			steps = livemove.RemainingAbort(p)
		}
		if steps == nil {
			what := "move"
			if abort {
				what = "abort"
			}
			r.Refused = fmt.Sprintf("the %s does not continue from phase %s", what, p)
		}
		for _, s := range steps {
			r.Steps = append(r.Steps, plannedStep{Step: string(s), Does: livemove.Describe(s)})
		}
	}
	out := cmd.OutOrStdout()
	if output != "table" {
		return printStructured(out, output, r)
	}
	_, _ = fmt.Fprintln(out, r.Explanation)
	if r.NextStep != "" {
		_, _ = fmt.Fprintf(out, "  next step: %s\n", r.NextStep)
	}
	for _, side := range []struct {
		name string
		r    *sideReport
	}{{"source", r.Source}, {"destination", r.Destination}} {
		if side.r == nil {
			_, _ = fmt.Fprintf(out, "  %s: no Etcd\n", side.name)
			continue
		}
		_, _ = fmt.Fprintf(out, "  %s: replicas %d, %d external members, policy %s; %s\n", side.name, side.r.Replicas,
			side.r.ExternalMembers, side.r.Policy, side.r.Membership)
	}
	if dryRun {
		switch {
		case r.Refused != "":
			_, _ = fmt.Fprintf(out, "dry run: %s\n", r.Refused)
		case len(r.Steps) == 0:
			_, _ = fmt.Fprintln(out, "dry run: nothing left to do")
		default:
			_, _ = fmt.Fprintln(out, "dry run: the steps from here, nothing was changed:")
			for i, s := range r.Steps {
				_, _ = fmt.Fprintf(out, "  %d. %-16s %s\n", i+1, s.Step, s.Does)
			}
		}
	}
	return nil
}

// moveReport is what --status, --dry-run and the end of a move print with
// -o json or yaml.
type moveReport struct {
	Phase       string `json:"phase"`
	Explanation string `json:"explanation"`
	NextStep    string `json:"nextStep,omitempty"`
	DryRun      bool   `json:"dryRun,omitempty"`
	// Steps are a dry run's steps from here, in order.
	Steps []plannedStep `json:"steps,omitempty"`
	// Refused says why a dry run has no steps: the move or the abort does
	// not continue from this phase.
	Refused     string      `json:"refused,omitempty"`
	Source      *sideReport `json:"source"`
	Destination *sideReport `json:"destination"`
}

type plannedStep struct {
	Step string `json:"step"`
	Does string `json:"does"`
}

// sideReport is one Etcd of the move.
type sideReport struct {
	Replicas        int32  `json:"replicas"`
	ExternalMembers int    `json:"externalMembers"`
	Policy          string `json:"policy"`
	// Membership sums up what the side's controller reports.
	Membership string `json:"membership"`
}

func sideReportOf(e *v1alpha1.Etcd) *sideReport {
	if e == nil {
		return nil
	}
	return &sideReport{Replicas: e.Spec.Replicas, ExternalMembers: len(e.Spec.ExternalMembers),
		Policy: string(e.Spec.GetExternalMembersPolicy()), Membership: move.ConditionSummary(e)}
}

// notFinished is a move that stopped with a step still under way; the
// process exits ExitNotFinished.
type notFinished struct{ error }

func (n notFinished) Unwrap() error { return n.error }

// moveProgress shows a running move: a bar on a terminal with -o table,
// else the progress printer's lines (on stderr with -o json or yaml, so
// stdout stays the report). Without wait, it stops the move once the next
// step's fields are written.
type moveProgress struct {
	cmd   *cobra.Command
	table bool
	wait  bool
	stop  context.CancelFunc

	bar      *livemove.ProgressBar
	lines    *livemove.ProgressPrinter
	last     move.Step
	lastKind livemove.EventKind
	stopped  bool
}

// begin picks the display, once the phase the move starts from is known.
func (p *moveProgress) begin(ctx context.Context, m *livemove.Mover, abort bool) error {
	out := p.cmd.OutOrStdout()
	if !p.table {
		out = p.cmd.ErrOrStderr()
	}
	if f, ok := out.(*os.File); ok && p.table && term.IsTerminal(int(f.Fd())) {
		_, _, phase, err := m.Read(ctx)
		if err != nil {
			return err
		}
		steps := m.RemainingSteps(phase)
		if abort {
			steps = livemove.RemainingAbort(phase)
		}
		p.bar = livemove.NewProgressBar(out, steps)
		return nil
	}
	p.lines = livemove.NewProgressPrinter(out)
	return nil
}

func (p *moveProgress) print(e livemove.Event) {
	switch {
	case p.bar != nil:
		p.bar.Print(e)
	case p.lines != nil:
		p.lines.Print(e)
	}
	p.last, p.lastKind = e.Step, e.Kind
	// A step has written its fields once it waits or is done.
	if !p.wait && (e.Kind == livemove.StepWaiting || e.Kind == livemove.StepDone) {
		p.stopped = true
		p.stop()
	}
}

func (p *moveProgress) end() {
	if p.bar != nil {
		p.bar.Close()
	}
}
