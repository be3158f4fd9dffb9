// Package rebalance moves an etcd cluster to a target set of members one
// safe step at a time, without Kubernetes: the planner and the executor of
// the membership controller (internal/planner, internal/sidecarcluster), driven
// by a list of sidecar addresses and the target members. It adds members as
// learners; starting their etcd processes is the operator's job, and while a
// learner waits for that, Run prints what to start and how.
package rebalance

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1/members"
	"github.com/druid-stretch/druid-stretch/internal/peerurl"
	"github.com/druid-stretch/druid-stretch/internal/planner"
	"github.com/druid-stretch/druid-stretch/internal/sidecarcluster"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// DefaultHolder names a rebalance run in the cluster's membership lock and
// retirement records.
const DefaultHolder = "rebalance"

// Config configures a Run.
type Config struct {
	// Spec is where the sidecars are and what the cluster should become.
	Spec Spec
	// Holder names this run in the membership lock and the retirement
	// records (default DefaultHolder). Keep it across runs on one cluster:
	// a run then resumes under its own lock and may re-add members it
	// removed itself.
	Holder string
	// TLS is the client TLS towards the sidecars: their CA and a client
	// certificate, which mutating calls need. Nil for plain http.
	TLS *tls.Config
	// Policy holds the planner's timings: how long a learner must be healthy
	// before its promotion, and how long it may make no progress (an
	// unstarted learner: since it was added) before it is removed again.
	Policy planner.Policy
	// DryRun prints the next step and changes nothing.
	DryRun bool
	// Interval is the pause between two observations while waiting
	// (default 1 s).
	Interval time.Duration
	// MaxRefusals is how often in a row one step may be refused before Run
	// gives up (default 5).
	MaxRefusals int
	// Out receives one line per step, wait and outcome (default discarded).
	Out io.Writer
	// BeforeChange, when set, is called before each change is sent, for
	// instance to route clients away from a member about to be removed:
	// etcd 3.6 must not serve a request while it applies its own removal.
	BeforeChange func(ctx context.Context, step planner.Step)
	// Membership tunes the sidecar calls (timeouts, lock TTL); its Holder,
	// TLS and Logger are set from the fields here.
	Membership sidecarcluster.Config
	// Logger receives one structured line per sidecar call that changes
	// something.
	Logger logr.Logger
}

// StepRecord is one change Run sent.
type StepRecord struct {
	// Step is the planner's step.
	Step planner.Step
	// From summarizes the membership the step was planned from.
	From string
	// Outcome, Reason and Err are how it ended.
	Outcome sidecarcluster.Outcome
	Reason  string
	Err     error
	// Via is the sidecar it went through; Duration how long the call took.
	Via      string
	Duration time.Duration
}

// Result is what Run did.
type Result struct {
	// Steps are the changes sent, in order (a lock taken is no step).
	Steps []StepRecord
	// Done is true when the target was reached.
	Done bool
	// Final summarizes the membership last observed.
	Final string
	// Next is, for a dry run, the step that would come next.
	Next *planner.Step
}

// Changes are the steps etcd applied, as "Kind member".
func (r Result) Changes() []string {
	var out []string
	for _, s := range r.Steps {
		if s.Outcome == sidecarcluster.Succeeded {
			out = append(out, string(s.Step.Kind)+" "+s.Step.Member)
		}
	}
	return out
}

// ErrLearnerStalled is returned when a learner made no progress within the
// policy's LearnerProgressTimeout and was removed again: most often its etcd
// was never started.
var ErrLearnerStalled = errors.New("learner made no progress")

// runner is the state of one Run.
type runner struct {
	cfg      Config
	c        *sidecarcluster.Cluster
	eps      []sidecarcluster.Endpoint
	progress *sidecarcluster.Progress
	start    time.Time
	res      Result
	// hint orders the next observation from the last one.
	hint sidecarcluster.Hint
	// pending is a change whose outcome is unknown yet.
	pending *sidecarcluster.Pending
	// refusals counts how often in a row refusedStep was refused.
	refusals    int
	refusedStep string
	// lastLine is the last wait line printed, not to repeat it.
	lastLine string
	// unreachable is why the last observation failed (it names every
	// sidecar asked and why); nil once one answered.
	unreachable error
}

// Run moves the cluster to cfg.Spec's target: observe, plan one step,
// execute it, and again, until the planner says Done. It returns an error
// when the target cannot be reached (a bad spec, a target that contradicts
// the cluster, a learner that never started, a step refused again and
// again) or ctx ends, and then gives up the membership lock it took.
func Run(ctx context.Context, cfg Config) (Result, error) {
	if err := cfg.Spec.Validate(); err != nil {
		return Result{}, fmt.Errorf("invalid rebalance spec: %w", err)
	}
	if cfg.Holder == "" {
		cfg.Holder = DefaultHolder
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.MaxRefusals <= 0 {
		cfg.MaxRefusals = 5
	}
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	if cfg.Policy.LearnerProgressTimeout <= 0 {
		cfg.Policy.LearnerProgressTimeout = planner.DefaultPolicy().LearnerProgressTimeout
	}
	mc := cfg.Membership
	mc.Holder, mc.TLS, mc.Logger = cfg.Holder, cfg.TLS, cfg.Logger
	c, err := sidecarcluster.New(mc)
	if err != nil {
		return Result{}, fmt.Errorf("rebalance: %w", err)
	}
	r := &runner{cfg: cfg, c: c, progress: sidecarcluster.NewProgress(nil), start: time.Now()}
	for _, s := range cfg.Spec.Sidecars {
		r.eps = append(r.eps, sidecarcluster.Endpoint{Member: s.Member, URL: strings.TrimSuffix(s.URL, "/")})
	}
	if err = r.loop(ctx); err != nil && !cfg.DryRun && len(r.res.Steps) > 0 {
		r.releaseLock()
	}
	return r.res, err
}

// releaseLock gives the membership lock up after a run that stopped short
// of the target, so that another holder need not wait for it to expire.
func (r *runner) releaseLock() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	obs, err := r.c.Observe(ctx, r.eps, sidecarcluster.Hint{})
	if err == nil {
		err = r.c.ReleaseLock(ctx, obs)
	}
	if err != nil {
		r.print("releasing the membership lock failed (it expires on its own): %v", err)
	}
}

// loop runs rounds until the target is reached or cannot be.
func (r *runner) loop(ctx context.Context) error {
	for {
		if err := ctx.Err(); err != nil {
			if r.unreachable != nil {
				return fmt.Errorf("rebalance stopped before the target was reached (%w) while no sidecar answered: %v", err, r.unreachable)
			}
			return fmt.Errorf("rebalance stopped before the target was reached: %w", err)
		}
		done, err := r.round(ctx)
		if done || err != nil {
			return err
		}
	}
}

// round observes the cluster, plans one step and carries it out: done when
// the target is reached (or, for a dry run, the next step printed).
func (r *runner) round(ctx context.Context) (done bool, err error) {
	obs, err := r.c.Observe(ctx, r.eps, r.hint)
	if err != nil {
		if ctx.Err() != nil {
			return false, nil // loop says why it stopped
		}
		r.unreachable = err
		if r.cfg.DryRun {
			return false, fmt.Errorf("observing the cluster: %w", err)
		}
		r.printOnce("waiting: %v", err)
		r.sleep(ctx, r.cfg.Interval)
		return false, nil
	}
	r.unreachable = nil
	t := r.target(obs)
	plan := r.c.Plan(obs, t, r.progress, r.pending, r.cfg.Policy)
	from := planner.Describe(plan.Input.Members)
	r.res.Final, r.hint = from, hintFrom(plan.Input, t)
	if r.pending != nil {
		if settled, applied := r.c.Settled(*r.pending, obs); settled {
			r.print("  the outcome of %s %s is known now: applied=%t", r.pending.Step.Kind, label(r.pending.Step), applied)
			r.pending = nil
		}
	}

	if len(plan.Unretire) > 0 && !r.cfg.DryRun {
		// Members this holder removed before are wanted again: its own
		// records must go, or the planner refuses to add them.
		if err := r.c.Unretire(ctx, obs, plan); err != nil {
			r.printOnce("waiting: %v", err)
			r.sleep(ctx, r.cfg.Interval)
			return false, nil
		}
		r.print("retirement records of %s deleted: %s may join again", strings.Join(plan.Unretire, ", "), r.cfg.Holder)
		return false, nil
	}

	switch {
	case plan.Step.Kind == planner.Done:
		r.res.Done = true
		if r.cfg.DryRun {
			r.res.Next = &plan.Step
		} else if err := r.c.ReleaseLock(ctx, obs); err != nil {
			r.print("releasing the membership lock failed (it expires on its own): %v", err)
		}
		r.print("done: %s (%d changes in %s)", plan.Step.Reason, len(r.res.Changes()), time.Since(r.start).Round(100*time.Millisecond))
		return true, nil
	case plan.Step.Kind == planner.Wait && fatal(plan.Step):
		return false, fmt.Errorf("the target cannot be reached from this cluster: %s", plan.Step.Reason)
	case r.cfg.DryRun:
		r.res.Next = &plan.Step
		what := "next step: " + plan.Step.String()
		if plan.Step.Kind == planner.Wait {
			what = "next: " + r.waitLine(obs, plan)
		}
		r.print("%s\n  membership: %s", what, from)
		return true, nil
	case plan.Step.Kind == planner.Wait:
		if err := r.c.RenewLock(ctx, obs); err != nil {
			r.print("renewing the membership lock failed: %v", err)
		}
		r.printOnce("%s", r.waitLine(obs, plan))
		r.sleep(ctx, r.cfg.Interval)
		return false, nil
	}
	return false, r.execute(ctx, obs, plan, from)
}

// execute sends one change and reports how it ended; the error ends the run.
func (r *runner) execute(ctx context.Context, obs *sidecarcluster.Observation, plan sidecarcluster.Plan, from string) error {
	if r.cfg.BeforeChange != nil {
		r.cfg.BeforeChange(ctx, plan.Step)
		if plan.ThenRemove != nil {
			// The same call removes this member right after the promotion.
			r.cfg.BeforeChange(ctx, *plan.ThenRemove)
		}
	}
	sent := time.Now()
	res := r.c.Execute(ctx, obs, r.eps, plan)
	took := time.Since(sent)
	if res.Reason == sidecarcluster.ReasonLockAcquired {
		r.print("membership lock taken as %q; planning again under it", r.cfg.Holder)
		return nil
	}
	rec := StepRecord{Step: plan.Step, From: from, Outcome: res.Outcome, Reason: res.Reason, Err: res.Err, Via: res.Via.String(), Duration: took}
	r.res.Steps = append(r.res.Steps, rec)
	r.lastLine = ""
	r.print("step %d: %s\n  membership: %s", len(r.res.Steps), plan.Step, from)
	if res.LockTaken {
		r.print("  membership lock taken as %q with this step: nobody acted since the observation", r.cfg.Holder)
	}
	if res.Outcome == sidecarcluster.Refused {
		if key := string(plan.Step.Kind) + " " + label(plan.Step); key == r.refusedStep {
			r.refusals++
		} else {
			r.refusals, r.refusedStep = 1, key
		}
	} else {
		r.refusals, r.refusedStep = 0, ""
	}
	switch res.Outcome {
	case sidecarcluster.Succeeded:
		r.print("  -> %s via %s in %s", res.Outcome, rec.Via, took.Round(time.Millisecond))
		if plan.Step.Kind == planner.Remove {
			r.forget(plan.Step.Member)
		}
		if then := plan.ThenRemove; then != nil {
			if res.ThenRemoved {
				r.res.Steps = append(r.res.Steps, StepRecord{Step: *then, From: from, Outcome: sidecarcluster.Succeeded, Via: rec.Via, Duration: res.Gap})
				r.print("step %d: %s, in the same call, %s after the promotion", len(r.res.Steps), *then, res.Gap.Round(time.Millisecond))
				r.forget(then.Member)
			} else {
				r.print("  the removal of %s in the same call did not happen (%s); planning again", label(*then), res.ThenRemoveErr)
			}
		}
		if plan.Step.Rule == planner.RuleStuckLearner {
			return fmt.Errorf("%w: %s was removed again after %s without progress (%s); start its etcd when it is added and run rebalance again",
				ErrLearnerStalled, label(plan.Step), r.cfg.Policy.LearnerProgressTimeout, plan.Step.Reason)
		}
	case sidecarcluster.Retry:
		wait := max(res.RetryAfter, 100*time.Millisecond)
		r.print("  -> not now (%s): %v; planning again in %s", res.Reason, res.Err, wait)
		r.sleep(ctx, wait)
	case sidecarcluster.Refused:
		r.print("  -> refused (%s): %v", res.Reason, res.Err)
		if r.refusals >= r.cfg.MaxRefusals {
			return fmt.Errorf("%s %s was refused %d times in a row, last (%s): %w", plan.Step.Kind, label(plan.Step), r.refusals, res.Reason, res.Err)
		}
		r.sleep(ctx, time.Duration(r.refusals)*r.cfg.Interval)
	case sidecarcluster.Uncertain:
		// Nothing else changes until an observation shows the outcome or
		// the settle time has passed (sidecarcluster.Cluster.Plan holds it).
		r.pending = &sidecarcluster.Pending{Step: plan.Step, At: sent.Add(took)}
		r.print("  -> outcome unknown (%s): %v; nothing else changes until it shows", res.Reason, res.Err)
		r.sleep(ctx, r.cfg.Interval)
	}
	return nil
}

// forget stops asking the sidecar of a removed member: its etcd may still
// be applying its own removal, and etcd 3.6 must not serve a request then
// (etcd issue 21966). A removed member never comes back under its name.
func (r *runner) forget(member string) {
	if member == "" {
		return
	}
	r.eps = slices.DeleteFunc(r.eps, func(e sidecarcluster.Endpoint) bool { return e.Member == member })
}

// target is the membership Run moves to: the spec's target members as
// voters, every other named member removed.
func (r *runner) target(obs *sidecarcluster.Observation) sidecarcluster.Target {
	spec := r.cfg.Spec
	t := sidecarcluster.Target{Side: spec.group}
	for _, m := range spec.Target {
		t.Add = append(t.Add, planner.Want{Name: m.Name, PeerURLs: slices.Clone(m.PeerURLs), Side: spec.group(m.Name)})
	}
	for _, m := range obs.List.Members {
		if _, wanted := spec.targetMember(m.Name); m.Name != "" && !wanted {
			t.Remove = append(t.Remove, m.Name)
		}
	}
	return t
}

// hintFrom orders the next observation: healthy voters first, departing
// members last.
func hintFrom(in planner.Observed, t sidecarcluster.Target) sidecarcluster.Hint {
	h := sidecarcluster.Hint{Departing: t.Remove}
	for _, m := range in.Members {
		if m.Healthy && !m.Learner && m.Name != "" {
			h.Healthy = append(h.Healthy, m.Name)
		}
	}
	return h
}

// fatal reports waits that no amount of waiting ends: the target
// contradicts the cluster or itself.
func fatal(s planner.Step) bool {
	return s.Rule == planner.RuleValidTarget || (s.Rule == planner.RuleOwnership && strings.HasPrefix(s.Reason, "RetiredMember"))
}

// waitLine says what Run waits for; for a learner whose etcd does not run
// yet, what the operator has to start.
func (r *runner) waitLine(obs *sidecarcluster.Observation, plan sidecarcluster.Plan) string {
	for _, m := range obs.List.Members {
		if !m.IsLearner || m.Healthy {
			continue
		}
		want, ok := r.wantFor(m)
		if !ok {
			continue
		}
		deadline := ""
		if l, known := r.progress.Learner(m.ID); known {
			deadline = fmt.Sprintf(", or it is removed again at %s", l.LastAdvance.Add(r.cfg.Policy.LearnerProgressTimeout).Format(time.TimeOnly))
		}
		return fmt.Sprintf("waiting for the operator: start etcd member %s with --name=%s --initial-advertise-peer-urls=%s --initial-cluster=%s --initial-cluster-state=existing (learner %s added%s)",
			want.Name, want.Name, strings.Join(want.PeerURLs, ","), InitialCluster(obs.List, want.Name, want.PeerURLs), m.ID, deadline)
	}
	return "waiting: " + plan.Step.Reason
}

// wantFor is the target member an observed member stands for.
func (r *runner) wantFor(m sidecar.Member) (TargetMember, bool) {
	if m.Name != "" {
		return r.cfg.Spec.targetMember(m.Name)
	}
	for _, t := range r.cfg.Spec.Target {
		for _, u := range m.PeerURLs {
			if slices.Contains(t.PeerURLs, u) {
				return t, true
			}
		}
	}
	return TargetMember{}, false
}

// InitialCluster is the --initial-cluster a member joining list's cluster
// starts with: etcd checks that it lists exactly the cluster's members, the
// joining one (name, with peerURLs) among them.
func InitialCluster(list *sidecar.MemberList, name string, peerURLs []string) string {
	var peers []members.Peer
	for _, m := range list.Members {
		if m.Name == name || (m.Name == "" && sharesURL(m.PeerURLs, peerURLs)) {
			continue
		}
		peers = append(peers, members.Peer{Name: m.Name, PeerURLs: m.PeerURLs})
	}
	peers = append(peers, members.Peer{Name: name, PeerURLs: peerURLs})
	return members.FormatInitialCluster(peers)
}

// sharesURL tells whether a and b name a common peer (peerurl.Key).
func sharesURL(a, b []string) bool { return peerurl.Shares(a, b) }

func label(s planner.Step) string {
	if s.Member != "" {
		return s.Member
	}
	return s.ID
}

func (r *runner) print(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	_, _ = fmt.Fprintf(r.cfg.Out, "%7.1fs  %s\n", time.Since(r.start).Seconds(), strings.ReplaceAll(msg, "\n", "\n          "))
}

// printOnce prints a wait line unless it repeats the last one, so that a
// long wait shows as one line rather than one per observation.
func (r *runner) printOnce(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if msg == r.lastLine {
		return
	}
	r.lastLine = msg
	r.print("%s", msg)
}

func (r *runner) sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
