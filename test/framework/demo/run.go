package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	move "github.com/druid-stretch/druid-stretch/api/v1alpha1/migration"
	"github.com/druid-stretch/druid-stretch/internal/livemove"
	"github.com/druid-stretch/druid-stretch/internal/testing/localetcd"
	"github.com/druid-stretch/druid-stretch/internal/testing/workload"
	"github.com/druid-stretch/druid-stretch/test/framework/report"
)

// RehearsalOptions configure Rehearse.
type RehearsalOptions struct {
	// Workload configures the client traffic (its endpoints and TLS are
	// filled in).
	Workload workload.Options
	// Before and After are the traffic's baselines around the move.
	Before, After time.Duration
	// Abort aborts the move instead of finishing it, once AbortWhen holds
	// (default: in phase DestinationJoined).
	Abort     bool
	AbortWhen func(src, dst *v1alpha1.Etcd) bool
	// OnProgress sees every event of the move (fault injection in tests).
	OnProgress func(livemove.Event)
	// OnTraffic, when set, is given the client traffic once it runs.
	OnTraffic func(*Traffic)
	// KubeAPIServers judges the move through real kube-apiservers too: a
	// shoot kube-apiserver per cluster on that cluster's members of the
	// Etcd (B's once one of them serves), client-go clients through both
	// for the whole move, A's clients switched to B's kube-apiserver and
	// A's stopped before any source member goes (the Mover's
	// SwitchClients). An aborted move keeps the shoot at the source: B's
	// clients move to A's kube-apiserver before the abort, and B's stops
	// meanwhile.
	// Their figures and verdicts go into the report (KubeAPIServers,
	// APIHistory).
	KubeAPIServers bool
	// ReadyzExclude names the /readyz checks that the clients' readiness
	// gate of those kube-apiservers leaves out (apiload.Options): the tests
	// leave out apiload.RBACBootstrapCheck, the demo nothing.
	ReadyzExclude []string
}

// Rehearse runs the client traffic, moves the Etcd from A to B (or aborts
// the move) while it runs, and returns the report of the run. The Etcd must
// exist in A (CreateSource).
func (e *Env) Rehearse(ctx context.Context, out io.Writer, o RehearsalOptions) (report.Report, error) {
	var rep report.Report
	src, _, err := e.Read(ctx)
	if err != nil {
		return rep, err
	}
	if src == nil {
		return rep, errors.New("there is no Etcd in cluster A to move")
	}
	if src.Status.Membership == nil {
		return rep, errors.New("the Etcd in cluster A has not been observed yet")
	}
	ties := NewTieTracker(src.Status.Membership.Voters(), e.SideOf)
	// The IDs of every member the cluster had during the run, to pick its
	// role changes out of the members' logs.
	ids := idSet{}
	for _, m := range src.Status.Membership.Members {
		ids.add(m.ID)
	}

	traffic, err := e.StartTraffic(ctx, o.Workload)
	if err != nil {
		return rep, err
	}
	defer func() { _ = traffic.Close() }()
	wl := traffic.Workload
	if o.OnTraffic != nil {
		o.OnTraffic(traffic)
	}
	show := newLiveView(out, e, wl)
	defer show.stop()
	var shoot *shootLoad
	if o.KubeAPIServers {
		if shoot, err = e.startShootLoad(ctx, show, o.ReadyzExclude); err != nil {
			return rep, err
		}
		defer func() { _ = shoot.close() }()
	}
	mark := func(name string, at time.Time) {
		wl.MarkAt(name, at)
		if shoot != nil {
			shoot.mark(name)
		}
	}

	if err := sleep(ctx, o.Before); err != nil {
		return rep, err
	}
	stopTies := e.OnStep(ties.Observe)
	defer stopTies()
	var stepsMu sync.Mutex
	var steps []report.Step
	stopMarks := e.OnStep(func(ev StepEvent) {
		if !ev.Done() {
			return
		}
		stepsMu.Lock()
		ids.add(ev.ID)
		stepsMu.Unlock()
		if ev.Applied() {
			name := fmt.Sprintf("%s: %s", ev.Cluster, ev)
			mark(name, ev.Start)
			stepsMu.Lock()
			steps = append(steps, report.Step{Name: name, AtSeconds: wl.Since(ev.Start).Seconds(), At: ev.Start, DurationSeconds: ev.End.Sub(ev.Start).Seconds()})
			stepsMu.Unlock()
		}
		show.step(ev)
	})
	defer stopMarks()

	wl.MarkPhase("during")
	if shoot != nil {
		shoot.load.MarkPhase("during")
	}
	moveStart := time.Now()
	mo := livemove.Options{Progress: func(ev livemove.Event) {
		if ev.Kind == livemove.StepStarted {
			mark(string(ev.Step), ev.At)
			stepsMu.Lock()
			steps = append(steps, report.Step{Name: string(ev.Step), AtSeconds: wl.Since(ev.At).Seconds(), At: ev.At})
			stepsMu.Unlock()
		}
		show.migration(ev)
		if o.OnProgress != nil {
			o.OnProgress(ev)
		}
	}, Logger: e.Config.Logger.WithName("migration")}
	var beforeAbort func(context.Context) error
	if shoot != nil {
		if o.Abort {
			beforeAbort = shoot.keepAtSource
		} else {
			mo.SwitchClients = shoot.switchClients
		}
	}
	mover, err := e.Mover(mo)
	if err != nil {
		return rep, err
	}
	if o.Abort {
		err = e.abortWhen(ctx, mover, o.AbortWhen, beforeAbort)
	} else {
		err = mover.Move(ctx)
	}
	if err != nil {
		return rep, err
	}
	moveTime := time.Since(moveStart)
	wl.MarkPhase("after")
	if shoot != nil {
		shoot.load.MarkPhase("after")
	}
	if err := sleep(ctx, o.After); err != nil {
		return rep, err
	}
	show.stop()
	traffic.Stop()
	_, _ = fmt.Fprintln(out, "checking the recorded history: reading back every acknowledged write, linearizability (porcupine) ...")
	fig, _, err := wl.Verify(ctx, workload.VerifyOptions{LinearizabilityTimeout: 3 * time.Minute})
	if err != nil {
		return rep, fmt.Errorf("checking the history: %w", err)
	}
	rep = report.FromFigures(fig)
	if shoot != nil {
		_, _ = fmt.Fprintln(out, "checking the kube-apiservers' history: lost acknowledged writes, linearizability (porcupine) ...")
		res, err := shoot.results(ctx)
		if err != nil {
			return rep, fmt.Errorf("checking the kube-apiservers' history: %w", err)
		}
		rep.AddKubeAPIServers(res, res.StartedAt.Sub(rep.StartedAt))
	}
	what := "live move"
	if o.Abort {
		what = "aborted move"
	}
	rep.Title = fmt.Sprintf("druid-stretch %s of Etcd %s/%s from cluster A to cluster B", what, e.Config.Namespace, e.Config.Name)
	rep.RTTMs = float64(e.Config.RTT) / float64(time.Millisecond)
	rep.MigrationSeconds = moveTime.Seconds()
	rep.TieSeconds = ties.Total().Seconds()
	stepsMu.Lock()
	rep.Steps = steps
	stepsMu.Unlock()
	if rep.NoLeaderSeconds, err = e.noLeaderTime(ctx, ids, fig.StartedAt, fig.StartedAt.Add(fig.Duration)); err != nil {
		return rep, err
	}
	e.lastTies = ties.Ties()
	return rep, nil
}

// noLeaderTime is the time in [from, to] in which no member of the
// Etcd's cluster (ids, plus the members both Etcds list now) was leader.
func (e *Env) noLeaderTime(ctx context.Context, ids idSet, from, to time.Time) (float64, error) {
	src, dst, err := e.Read(ctx)
	if err != nil {
		return 0, err
	}
	for _, x := range []*v1alpha1.Etcd{src, dst} {
		if x != nil && x.Status.Membership != nil {
			for _, m := range x.Status.Membership.Members {
				ids.add(m.ID)
			}
		}
	}
	var all []*localetcd.Member
	for _, c := range e.Clusters() {
		all = append(all, c.Runner.Runtime().Members()...)
	}
	evs, err := readLeaderEvents(all, ids)
	if err != nil {
		return 0, err
	}
	return leaderless(evs, from, to).Seconds(), nil
}

// abortWhen runs the move until when holds, then aborts it, after before
// (when set) returned nil.
func (e *Env) abortWhen(ctx context.Context, mover *livemove.Mover, when func(src, dst *v1alpha1.Etcd) bool, before func(context.Context) error) error {
	if when == nil {
		when = func(src, dst *v1alpha1.Etcd) bool { return move.Phase(src, dst) == move.PhaseDestinationJoined }
	}
	moveCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- mover.Move(moveCtx) }()
	werr := e.WaitFor(ctx, 5*time.Minute, "the moment to abort", when)
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	if werr != nil {
		return werr
	}
	if before != nil {
		if err := before(ctx); err != nil {
			return fmt.Errorf("before the abort: %w", err)
		}
	}
	return mover.Abort(ctx)
}

// LastTies are the ties of the last Rehearse.
func (e *Env) LastTies() []Tie { return e.lastTies }

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// trafficQuiet is the longest the live view goes without a traffic line.
const trafficQuiet = 10 * time.Second

// liveView prints the progress: the migration's steps, the controllers'
// membership steps, the members whenever their roles change, and the
// traffic when it has news (see run).
type liveView struct {
	out   io.Writer
	env   *Env
	wl    *workload.Workload
	start time.Time

	mu      sync.Mutex
	phase   string // the migration step under way
	stopped bool
	quit    chan struct{}
	done    chan struct{}
}

func newLiveView(out io.Writer, env *Env, wl *workload.Workload) *liveView {
	v := &liveView{out: out, env: env, wl: wl, start: wl.StartedAt(), phase: "before the move", quit: make(chan struct{}), done: make(chan struct{})}
	go v.run()
	return v
}

func (v *liveView) printf(format string, args ...any) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.stopped {
		_, _ = fmt.Fprintf(v.out, "%7.2fs  "+format+"\n", append([]any{time.Since(v.start).Seconds()}, args...)...)
	}
}

func (v *liveView) run() {
	defer close(v.done)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var (
		last          string
		printedStep   string
		printedFailed int64
		printedAt     time.Time
	)
	for {
		select {
		case <-v.quit:
			return
		case <-t.C:
		}
		s := v.wl.Live()
		v.mu.Lock()
		step := v.phase
		v.mu.Unlock()
		// The traffic line is checked every second but printed only when
		// it says something new: a step began, a request failed, writes
		// stall, or trafficQuiet passed. A test's log then keeps the
		// moments that matter within the first screens.
		if step != printedStep || s.Failed != printedFailed || s.SinceLastAcknowledgedWrite >= time.Second || time.Since(printedAt) >= trafficQuiet {
			printedStep, printedFailed, printedAt = step, s.Failed, time.Now()
			v.printf("[%s] writes %d, failed %d, retries %d, last write %s (%s ago)", step, s.Writes, s.Failed, s.Retries,
				s.LastWriteLatency.Round(100*time.Microsecond), s.SinceLastAcknowledgedWrite.Round(time.Millisecond))
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		src, dst, err := v.env.Read(ctx)
		cancel()
		if err == nil {
			if roles := livemove.Roles(src, dst); roles != last && roles != "" {
				last = roles
				v.printf("members: %s", roles)
			}
		}
	}
}

func (v *liveView) migration(ev livemove.Event) {
	switch ev.Kind {
	case livemove.StepStarted:
		v.mu.Lock()
		v.phase = string(ev.Step)
		v.mu.Unlock()
		v.printf("== step %s (%s)", ev.Step, ev.Phase)
	case livemove.StepDone:
		v.printf("== step %s done in %.2fs: %s", ev.Step, ev.Duration.Seconds(), ev.Phase)
	}
}

func (v *liveView) step(ev StepEvent) {
	outcome := string(ev.Outcome)
	if ev.Applied() {
		outcome = "done"
	}
	v.printf("   controller %s: %s, %s in %.2fs", ev.Cluster, ev, strings.ToLower(outcome), ev.End.Sub(ev.Start).Seconds())
}

func (v *liveView) stop() {
	v.mu.Lock()
	if v.stopped {
		v.mu.Unlock()
		return
	}
	v.stopped = true
	v.mu.Unlock()
	close(v.quit)
	<-v.done
}
