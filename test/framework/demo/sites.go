package demo

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap/zapcore"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlzap "sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
	"github.com/druid-stretch/druid-stretch/internal/testing/workload"
	"github.com/druid-stretch/druid-stretch/test/framework/baseline"
	"github.com/druid-stretch/druid-stretch/test/framework/report"
	"github.com/druid-stretch/druid-stretch/test/site"
)

// SiteOptions configure RunOnSites.
type SiteOptions struct {
	// RTT is the round trip between the two sites (0: none; the demo
	// command's default is site.DefaultMoveRTT).
	RTT time.Duration
	// PreloadKeys keys of PreloadValueSize bytes are written through the
	// own etcd client before the move, so that joining members have data
	// to catch up on.
	PreloadKeys, PreloadValueSize int
	// Before and After are how long the traffic runs before the move and
	// after it (defaults 5 s each), the baselines of the report.
	Before, After time.Duration
	// ReportPath receives the report as JSON; PlotPath the plot as SVG.
	// Empty: not written.
	ReportPath, PlotPath string
	// Dir holds the two sites' folders (logs, the pods' files). Empty: a
	// temporary folder, removed afterwards unless KeepDir.
	Dir     string
	KeepDir bool
	// Out receives the progress and the report (default os.Stdout).
	Out io.Writer
	// MaxLearners is druid-stretch's controller.maxLearners on both sites
	// (0: the chart's default): above 1 the destination's members join as
	// learners side by side.
	MaxLearners int
	// HoldSource is the move's HoldSource (0: the clients switch before
	// any source member goes; above 0: the destination takes the majority
	// first and holds that many source members for the source's clients
	// until they are switched).
	HoldSource int32
	// GEP39 makes the move GEP-39's: the adapter writes druid's own fields
	// only, stage by stage (site.LiveMoveOptions.GEP39).
	GEP39 bool
	// Baseline also runs the hand-scripted clientv3 move (package
	// baseline) on the same two sites after the product's move, with the
	// same preload, and puts its figures into the report.
	Baseline bool
}

// removeLogs removes the demo's temporary folder after a run that kept
// every guarantee, and keeps it, saying so, after one that failed or broke
// one: its logs are what explains it.
func removeLogs(out io.Writer, dir string, runErr error, rep report.Report) error {
	if runErr != nil || len(rep.Broken()) > 0 {
		_, _ = fmt.Fprintf(out, "the logs are kept for a look at what went wrong: %s (remove it when done)\n", dir)
		return nil
	}
	_, _ = fmt.Fprintf(out, "removed the logs' folder %s (--keep or --dir keeps it)\n", dir)
	return os.RemoveAll(dir)
}

// RunOnSites is the demo on real sites: two Kubernetes clusters of real
// parts on this machine (the control plane, etcd-druid, etcd-backup-
// restore in druid's pods, druid-stretch installed from its chart, a node
// stand-in running the pods), peered RTT apart. It creates a shoot's
// etcd-main in site A, runs a shoot kube-apiserver per site with client-go
// clients through it (and the project's own etcd client as a second
// check), moves the Etcd to site B with the migration adapter as gardenlet
// drives it, and reports what the clients saw. It needs root (the pods get
// network namespaces and chroots). Every process it started has ended when
// it returns, also on error and when ctx is cancelled (Ctrl-C).
func RunOnSites(ctx context.Context, o SiteOptions) (rep report.Report, err error) {
	if o.Out == nil {
		o.Out = os.Stdout
	}
	out := o.Out
	rtt := o.RTT
	if rtt < 0 {
		return rep, fmt.Errorf("--rtt %s: the round trip between the sites must be 0 or more", rtt)
	}
	if os.Geteuid() != 0 {
		return rep, errors.New("the demo runs two real sites, whose pods get network namespaces and chroots: run it as root")
	}
	start := time.Now()
	_, _ = fmt.Fprintln(out, "druid-stretch-dev demo: a live move of a shoot's etcd between two Kubernetes clusters of real parts")
	if err := testbin.Ensure(ctx, out); err != nil {
		return rep, err
	}
	dirGiven := o.Dir != ""
	if !dirGiven {
		if o.Dir, err = os.MkdirTemp("", "druid-stretch-demo-"); err != nil {
			return rep, err
		}
		if !o.KeepDir {
			defer func() { err = errors.Join(err, removeLogs(o.Out, o.Dir, err, rep)) }()
		}
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return rep, err
	}
	logFile, err := os.Create(filepath.Join(o.Dir, "demo.log"))
	if err != nil {
		return rep, fmt.Errorf("creating the log file: %w", err)
	}
	defer func() { _ = logFile.Close() }()
	// Milliseconds: a step's timeline is read from these lines.
	log := ctrlzap.New(ctrlzap.WriteTo(logFile), ctrlzap.Level(zapcore.InfoLevel), func(o *ctrlzap.Options) { o.TimeEncoder = zapcore.RFC3339NanoTimeEncoder })
	ctrl.SetLogger(log)
	// client-go logs through klog; its shutdown chatter belongs in the log
	// file, not between the figures.
	klog.SetLogger(log.WithName("client-go"))
	kept := "kept"
	if !o.KeepDir && !dirGiven {
		kept = "removed at the end unless a guarantee broke; --keep keeps them"
	}
	_, _ = fmt.Fprintf(out, "  RTT %s between the sites, %d keys of %d bytes preloaded; files and logs (%s): %s\n", rtt, o.PreloadKeys, max(o.PreloadValueSize, 0), kept, o.Dir)

	_, _ = fmt.Fprintln(out, "starting sites A and B (control plane, etcd-druid, druid-stretch, a node stand-in each) ...")
	opts := site.MoveSiteOptions(o.Dir)
	for i := range opts {
		opts[i].Logger = log.WithName(opts[i].ClusterIdentity)
		opts[i].MaxLearners = o.MaxLearners
	}
	startCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	sites, err := site.StartSites(startCtx, opts...)
	cancel()
	if err != nil {
		return rep, err
	}
	defer func() {
		_, _ = fmt.Fprintln(out, "stopping both sites ...")
		for _, s := range sites {
			err = errors.Join(err, s.Stop())
		}
	}()
	mv, err := site.NewLiveMove(ctx, sites[0], sites[1], site.LiveMoveOptions{
		RTT:      rtt,
		Workload: workload.Options{PreloadKeys: o.PreloadKeys, PreloadValueSize: o.PreloadValueSize},
		Before:   o.Before, After: o.After,
		HoldSource: o.HoldSource,
		GEP39:      o.GEP39,
		Out:        out,
	})
	if err != nil {
		return rep, err
	}
	_, _ = fmt.Fprintf(out, "sites up after %.0f s; creating Etcd %s in site A (druid's StatefulSet, the sidecar injected) ...\n", time.Since(start).Seconds(), mv.Key())
	if err := mv.CreateSource(ctx); err != nil {
		return rep, err
	}
	_, _ = fmt.Fprintf(out, "druid reports the Etcd Ready in site A after %.0f s\n", time.Since(start).Seconds())
	run, err := mv.Run(ctx)
	if err != nil {
		return rep, err
	}

	rep = report.FromAPILoad(run.API)
	rep.Title = fmt.Sprintf("live move of %s from %s to %s (real etcd-druid sites)", mv.Key(), site.SourceIdentity, site.DestinationIdentity)
	rep.RTTMs = float64(rtt) / float64(time.Millisecond)
	rep.HeldSourceMembers = int(o.HoldSource)
	rep.MigrationSeconds = run.MoveTook.Seconds()
	rep.TieSeconds = run.TieSeconds
	rep.EtcdCrashes = run.EtcdCrashes
	transitions := run.Membership.TimedTransitions()
	rep.MembershipSeconds = membershipPart(transitions).Seconds()
	rep.Steps = timeline(rep.Steps, rep.StartedAt, transitions, run.CompactionJobs, run.Progress)
	ownOffset := run.Own.StartedAt.Sub(rep.StartedAt)
	rep.AddOwnClient(run.Own, ownOffset)
	if rep.NoLeaderSeconds, err = noLeaderOnSites(sites, run); err != nil {
		return rep, err
	}
	if o.Baseline {
		_, _ = fmt.Fprintln(out, "the hand-scripted baseline: a plain clientv3 move of three new etcd members from site A to site B ...")
		if rep.Baseline, err = runBaseline(ctx, sites[0], sites[1], o); err != nil {
			return rep, err
		}
	}
	_, _ = fmt.Fprintln(out)
	if err := rep.WriteText(out); err != nil {
		return rep, err
	}
	if o.ReportPath != "" {
		if err := rep.WriteJSON(o.ReportPath); err != nil {
			return rep, err
		}
		_, _ = fmt.Fprintf(out, "report written to %s\n", o.ReportPath)
	}
	if o.PlotPath != "" {
		if err := report.PlotRunSVG(o.PlotPath, report.RunPlot{
			Requests: run.APIRequests, Servers: run.API.Servers,
			Own: run.Own.Series, OwnOffset: ownOffset,
			Marks: report.Markers(slices.DeleteFunc(slices.Clone(rep.Steps), func(s report.Step) bool { return strings.HasPrefix(s.Name, progressPrefix) })),
		}); err != nil {
			return rep, err
		}
		_, _ = fmt.Fprintf(out, "plot written to %s\n", o.PlotPath)
	}
	return rep, nil
}

// timeline merges each step's start and end mark into one step with its
// duration, and adds the membership changes the polls saw ("etcd: promote
// etcd-main-3"), druid's compaction Jobs (from their creation, lasting
// until they ended) and what the membership controllers reported for
// minProgress or longer (the step under way, or what it waited for, such
// as etcd's 5 s strict reconfiguration check: what a step's time went
// on), all in time order on the clock that starts at start.
func timeline(marks []report.Step, start time.Time, changes []site.Transition, jobs []site.CompactionJob, progress []site.Progress) []report.Step {
	out := make([]report.Step, 0, len(marks)+len(changes))
	open := map[string]int{} // step name -> its index in out
	for _, m := range marks {
		if name, ok := strings.CutSuffix(m.Name, site.StepDoneSuffix); ok {
			if i, ok := open[name]; ok {
				out[i].DurationSeconds = m.AtSeconds - out[i].AtSeconds
				delete(open, name)
				continue
			}
		}
		open[m.Name] = len(out)
		out = append(out, m)
	}
	for _, c := range changes {
		out = append(out, report.Step{Name: "etcd: " + c.Change, AtSeconds: c.At.Sub(start).Seconds(), At: c.At})
	}
	for _, j := range jobs {
		outcome := "not ended"
		switch {
		case j.Succeeded:
			outcome = "completed"
		case j.Failed:
			outcome = "FAILED (" + j.Reason + ")"
		}
		s := report.Step{Name: fmt.Sprintf("druid: compaction Job in %s, %s", j.Site, outcome), AtSeconds: j.Created.Sub(start).Seconds(), At: j.Created}
		if !j.Ended.IsZero() {
			s.DurationSeconds = j.Ended.Sub(j.Created).Seconds()
		}
		out = append(out, s)
	}
	for _, p := range progress {
		if d := p.End.Sub(p.Start); d >= minProgress {
			out = append(out, report.Step{Name: fmt.Sprintf("%s%s: %s", progressPrefix, p.Site, p.Message), AtSeconds: p.Start.Sub(start).Seconds(), At: p.Start, DurationSeconds: d.Seconds()})
		}
	}
	slices.SortStableFunc(out, func(a, b report.Step) int { return cmp.Compare(a.AtSeconds, b.AtSeconds) })
	return out
}

// progressPrefix begins the name of a controller's report in a timeline;
// the plot marks the steps and changes only.
const progressPrefix = "controller in "

// minProgress is the shortest report of a controller a timeline lists:
// the controllers look again at a changing membership every 250 ms, and
// shorter ones are the steps' own round trips.
const minProgress = 500 * time.Millisecond

// membershipPart is the time from the first add to the last removal the
// member list showed; 0 without both.
func membershipPart(changes []site.Transition) time.Duration {
	var first, last time.Time
	for _, t := range changes {
		for _, c := range t.Changes {
			switch {
			case c.Kind == site.ConfChangeAdd && first.IsZero():
				first = t.At
			case c.Kind == site.ConfChangeRemove:
				last = t.At
			}
		}
	}
	if first.IsZero() || !last.After(first) {
		return 0
	}
	return last.Sub(first)
}

// noLeaderOnSites is the time during the move in which no member was
// leader, from the etcd logs of every pod of both sites, filtered by the
// IDs of the members the cluster had.
func noLeaderOnSites(sites []*site.Site, run *site.LiveMoveRun) (float64, error) {
	ids := idSet{}
	for _, list := range run.Membership.Snapshot() {
		for _, m := range list {
			ids.add(strconv.FormatUint(m.ID, 16))
		}
	}
	var logs []string
	for _, s := range sites {
		l, err := s.EtcdLogs()
		if err != nil {
			return 0, err
		}
		logs = append(logs, l...)
	}
	evs, err := readLeaderEventsFrom(logs, ids)
	if err != nil {
		return 0, err
	}
	return leaderless(evs, run.MoveStarted, run.MoveStarted.Add(run.MoveTook)).Seconds(), nil
}

// runBaseline runs the hand-scripted move in pods of a and b, with the
// product's preload, and returns its figures.
func runBaseline(ctx context.Context, a, b *site.Site, o SiteOptions) (*report.Baseline, error) {
	res, err := baseline.Run(ctx, baseline.Options{
		A: a.Network, B: b.Network, Dir: filepath.Join(o.Dir, "baseline"),
		PreloadKeys: o.PreloadKeys, ValueSize: o.PreloadValueSize,
	})
	if err != nil {
		return nil, err
	}
	out := &report.Baseline{
		MoveSeconds: res.Move.Seconds(), TieSeconds: res.Tie.Seconds(),
		Writes: res.Writes, FailedWrites: res.Failed, LostWrites: res.Lost,
		MaxWriteGapMs: float64(res.MaxWriteGap) / float64(time.Millisecond),
	}
	for _, s := range res.Steps {
		out.Steps = append(out.Steps, report.Step{Name: s.Name, AtSeconds: s.At.Seconds(), DurationSeconds: s.Took.Seconds()})
	}
	return out, nil
}
