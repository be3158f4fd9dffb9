package sidecarcluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/druid-stretch/druid-stretch/internal/planner"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// Outcome is how an executed step ended.
type Outcome string

const (
	// Succeeded: the sidecar applied the step, or found it in place.
	Succeeded Outcome = "Succeeded"
	// Retry: refused for now and nothing changed (a learner not ready, the
	// cluster's strict reconfiguration check, a membership that changed
	// since it was observed, the lock held by another); observe again after
	// RetryAfter.
	Retry Outcome = "Retry"
	// Refused: refused and nothing changed, but trying again will not help
	// without a new plan (a quorum at risk, a name or URL conflict, bad
	// input, no client certificate); it needs attention.
	Refused Outcome = "Refused"
	// Uncertain: the call failed so that its effect is unknown (a 5xx, a
	// timeout, a lost connection). Observe again before anything else; keep
	// the step as the caller's Pending until it settles.
	Uncertain Outcome = "Uncertain"
)

// Reasons this package gives a Result that no sidecar gave.
const (
	// ReasonLockAcquired: the lock was free and is now ours; the step was
	// not sent, because it was planned before the lock was held. Plan again.
	ReasonLockAcquired = "LockAcquired"
	// ReasonNoSidecar: no sidecar other than the step's target answers.
	ReasonNoSidecar = "NoSidecar"
	// ReasonTransport: the sidecar could not be reached or did not answer in
	// time.
	ReasonTransport = "SidecarUnreachable"
	// ReasonNotAChange: Execute was given a Wait or Done step.
	ReasonNotAChange = "NotAChange"
	// ReasonFenced: a newer process of this holder took the membership lock
	// over; this one changes nothing more (sidecar.ReasonStaleToken).
	ReasonFenced = "Fenced"
)

// Result is what Execute did.
type Result struct {
	// Step is the step executed.
	Step    planner.Step
	Outcome Outcome
	// Changed is true when etcd's membership or leadership changed by this
	// call (false for a repeat that found the change in place).
	Changed bool
	// Reason is the sidecar's reason, or one of this package's.
	Reason string
	// Err is the failure, nil on success.
	Err error
	// RetryAfter is the sidecar's hint before trying again.
	RetryAfter time.Duration
	// SidecarFailed is true when the sidecar itself failed: it could not be
	// reached, did not answer in time, or answered 5xx other than etcd's
	// own refusal. The caller reports that sidecar as degraded.
	SidecarFailed bool
	// Via is the sidecar the step was sent through.
	Via Endpoint
	// LockTaken is true when the lock was free at observation and this
	// call took it, found that no holder acted since, and sent the step
	// without planning again.
	LockTaken bool
	// Start and Duration time the step's call.
	Start    time.Time
	Duration time.Duration
	// ThenRemoved is true when a promotion with Plan.ThenRemove also
	// removed that member; ThenRemoveErr says why it did not (the
	// promotion stands). Gap is the time between etcd's answers to the
	// promotion and to the removal.
	ThenRemoved   bool
	ThenRemoveErr string
	Gap           time.Duration
}

// Execute carries out one planned change through a sidecar that is not the
// member the step removes, under the membership lock, sending the
// fingerprint of the observation the plan was made from: the sidecar refuses
// (MembershipChanged) when etcd's membership moved on since.
//
// The lock is taken first. A lock that was not already held when the
// cluster was observed is taken; when it was free then and the records the
// lock's transaction read show that no holder acted since (unchangedSince),
// the step goes out at once (LockTaken). Otherwise it is not sent
// (ReasonLockAcquired, Retry with no delay): the plan was made while another
// holder could still act, so the caller plans again under the lock. A
// held lock is renewed once half of its lease has passed. Before removing
// a member it retires, Execute writes the retirement record.
//
// It runs in three parts: prepare (the sidecar, the lock, the records and
// the drain), send (the one call that changes etcd) and report (the
// Result and the log line).
func (c *Cluster) Execute(ctx context.Context, obs *Observation, endpoints []Endpoint, plan Plan) (res Result) {
	// res is named so that the deferred calls see whatever Result a return
	// statement gives back.
	res = Result{Step: plan.Step, Start: time.Now()}
	defer func() { res.Duration = time.Since(res.Start) }()
	// A change once sent runs until the sidecar answers: cancelling the
	// reconcile (a manager stopping) must not leave its outcome unknown.
	ctx = context.WithoutCancel(ctx)
	p, early := c.prepare(ctx, obs, endpoints, plan, res)
	if p != nil {
		// A drained member's clients come back unless it is gone.
		defer func() { p.drain.end(drainKept(plan, res)) }()
	}
	if early != nil {
		return *early
	}
	res.Via, res.LockTaken = p.via, p.lockTaken
	if c.cfg.OnStep != nil {
		tell := c.tellOnStep(plan.Step, p.then)
		defer func() { tell(&res) }()
	}
	if plan.Step.Kind == planner.MoveLeader {
		var transferee string
		if m := obs.Member(cmp.Or(plan.Step.ID, plan.Step.Member)); m != nil {
			transferee = m.ID
		}
		release := c.holdClients(ctx, servingVoters(obs, endpoints), transferee, onSideOf(plan.Input, plan.Step.ID))
		defer release()
	}
	callStart := time.Now()
	out, err := c.send(ctx, p, plan.Step)
	return c.report(obs, plan, p, res, callStart, out, err)
}

// prepared is a change ready to send: the sidecar it goes through, with
// the lock held and the records written.
type prepared struct {
	via       Endpoint
	cl        *sidecar.Client
	opts      sidecar.CallOptions
	lockTaken bool
	// then is the removal the promotion's call makes too, nil when there
	// is none or its retirement record could not be written.
	then *planner.Step
	// drain holds the clients away from the member the step removes; it
	// is ended when the step ends.
	drain *drain
}

// prepare does what must hold before a change is sent: the sidecar to send
// it through, the membership lock, the retirement records and the drain of
// a voter it removes. A non-nil Result ends the step unsent; a non-nil
// prepared's drain is ended either way.
func (c *Cluster) prepare(ctx context.Context, obs *Observation, endpoints []Endpoint, plan Plan, res Result) (*prepared, *Result) {
	fail := func(r Result) (*prepared, *Result) { return nil, &r }
	if !plan.IsChange() {
		res.Outcome, res.Reason = Refused, ReasonNotAChange
		res.Err = fmt.Errorf("membership: %s is not a change", plan.Step.Kind)
		return fail(res)
	}
	if c.isFenced() {
		res.Outcome, res.Reason = Refused, ReasonFenced
		res.Err = c.fencedError(string(plan.Step.Kind) + " " + stepTarget(plan.Step))
		return fail(res)
	}
	removal := plan.Step
	if plan.ThenRemove != nil {
		removal = *plan.ThenRemove // the same call removes this member
	}
	via, ok := c.route(obs, endpoints, plan, removal)
	if !ok {
		res.Outcome, res.Reason, res.RetryAfter, res.SidecarFailed = Retry, ReasonNoSidecar, time.Second, true
		res.Err = fmt.Errorf("no sidecar other than that of %s answers, and a %s is never sent through the member it removes", stepTarget(plan.Step), plan.Step.Kind)
		return fail(res)
	}
	res.Via = via
	p := &prepared{via: via, cl: c.client(via.URL, via.TLS)}
	if grant, r, ok := c.ensureLock(ctx, p.cl, obs); !ok {
		r.Step, r.Via, r.Start = res.Step, via, res.Start
		return fail(r)
	} else if grant != nil && !unchangedSince(obs, grant) {
		res.Outcome, res.Reason = Retry, ReasonLockAcquired
		res.Err = fmt.Errorf("took the membership lock as %q; planning again under it before %s", c.cfg.Holder, plan.Step.Kind)
		return fail(res)
	} else if grant != nil {
		p.lockTaken, res.LockTaken = true, true
	}
	p.opts = sidecar.CallOptions{Fingerprint: obs.List.Fingerprint, LockHolder: c.cfg.Holder, LockToken: c.token}
	drained := c.startDrain(ctx, obs, endpoints, removal)
	if plan.Retiring {
		if r, ok := c.retire(ctx, obs, p, plan.Step.Member, res); !ok {
			p.drain = (<-drained).d
			return p, &r
		}
	}
	p.then = plan.ThenRemove
	if p.then != nil && plan.ThenRetiring {
		if _, ok := c.retire(ctx, obs, p, p.then.Member, res); !ok {
			p.then = nil // the promotion alone; the removal is planned again
		}
	}
	dr := <-drained
	p.drain = dr.d
	if dr.err != nil && (plan.Step.Kind == planner.Remove || p.then != nil) {
		res.Outcome, res.Reason, res.RetryAfter, res.Err = Retry, ReasonDrainFailed, time.Second, dr.err
		c.cfg.Logger.Info("membership step postponed", "step", string(plan.Step.Kind), "member", stepTarget(plan.Step), "reason", ReasonDrainFailed, "error", dr.err.Error())
		return p, &res
	}
	return p, nil
}

// route picks the sidecar plan's call goes through: never that of the
// member it removes, and the leader's where the plan asks for it.
func (c *Cluster) route(obs *Observation, endpoints []Endpoint, plan Plan, removal planner.Step) (Endpoint, bool) {
	if plan.ThenRemoveAtLeader {
		if e, found := c.leaderEndpoint(obs, endpoints); found {
			return e, true
		}
	}
	return c.via(obs, endpoints, removal, plan.Input, plan.Step.Kind == planner.MoveLeader || plan.ThenRemove != nil)
}

// retire writes the retirement record of member through p's sidecar before
// its removal, unless the observation shows this holder's record already.
// On failure it returns the step's Result.
func (c *Cluster) retire(ctx context.Context, obs *Observation, p *prepared, member string, res Result) (Result, bool) {
	if retiredBy(obs, member, c.cfg.Holder) {
		return Result{}, true
	}
	callCtx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
	_, err := p.cl.Retire(callCtx, member, c.cfg.Holder, p.opts)
	cancel()
	// A record by another holder retires the member just as well.
	if err == nil || sidecar.IsReason(err, sidecar.ReasonRetiredByOther) {
		return Result{}, true
	}
	r := c.classify(err)
	if r.Outcome == Uncertain {
		r.Outcome = Retry // a record, not a membership change
	}
	r.Step, r.Via, r.Start, r.LockTaken = res.Step, p.via, res.Start, p.lockTaken
	r.Err = fmt.Errorf("recording the retirement of %s before removing it: %w", member, err)
	c.noteFailure(p.via, r.Reason == ReasonTransport)
	return r, false
}

// drainResult is a drain started by startDrain.
type drainResult struct {
	d   *drain
	err error
}

// startDrain drains the clients of the voter that removal removes, while
// the caller writes the retirement record: the member to remove serves no
// client by the time it goes, and the removal waits for the longer of the
// two calls, not their sum (each a round trip across sites in a move). A
// learner serves no client's data calls: nothing to drain. (A learner that
// never started has no name yet: it is looked up by ID.) A member drained
// whose removal then does not follow is departing anyway: its clients went
// to the others, and the removal is planned again, with the member counted
// as healthy while its raft is connected (noteDrained), and its drain is
// undone when the step ends without the removal.
func (c *Cluster) startDrain(ctx context.Context, obs *Observation, endpoints []Endpoint, removal planner.Step) <-chan drainResult {
	drained := make(chan drainResult, 1)
	m := obs.Member(cmp.Or(removal.ID, removal.Member))
	if removal.Kind != planner.Remove || (m != nil && m.IsLearner) {
		drained <- drainResult{}
		return drained
	}
	id := removal.ID
	if m != nil {
		id = m.ID
	}
	go func() {
		d, err := c.drainClients(ctx, endpoints, removal.Member, id)
		drained <- drainResult{d, err}
	}()
	return drained
}

// send makes the one sidecar call that changes etcd's membership or
// leadership.
func (c *Cluster) send(ctx context.Context, p *prepared, step planner.Step) (*sidecar.ChangeResult, error) {
	callCtx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
	defer cancel()
	target := cmp.Or(step.ID, step.Member)
	switch step.Kind {
	case planner.AddLearner:
		return p.cl.AddLearner(callCtx, step.Member, step.PeerURLs, p.opts)
	case planner.Promote:
		if p.then != nil {
			return p.cl.PromoteThenRemove(callCtx, target, cmp.Or(p.then.ID, p.then.Member), p.opts)
		}
		return p.cl.Promote(callCtx, target, p.opts)
	case planner.MoveLeader:
		return p.cl.MoveLeader(callCtx, target, p.opts)
	case planner.Remove:
		return p.cl.Remove(callCtx, target, p.opts)
	}
	return nil, fmt.Errorf("membership: %s is not a change", step.Kind)
}

// report makes the Result of a sent change from the sidecar's answer, and
// logs it.
func (c *Cluster) report(obs *Observation, plan Plan, p *prepared, res Result, callStart time.Time, out *sidecar.ChangeResult, err error) Result {
	if err != nil {
		r := c.classify(err)
		r.Step, r.Via, r.Start, r.LockTaken = res.Step, p.via, res.Start, res.LockTaken
		r.Err = fmt.Errorf("%s %s through the sidecar of %s: %w", plan.Step.Kind, stepTarget(plan.Step), p.via, err)
		c.noteFenced(err)
		c.noteFailure(p.via, r.Outcome == Uncertain || r.Reason == ReasonTransport)
		c.cfg.Logger.Info("membership step failed", "step", string(plan.Step.Kind), "member", stepTarget(plan.Step), "via", p.via.String(), "outcome", string(r.Outcome), "reason", r.Reason, "error", err.Error())
		return r
	}
	c.noteFailure(p.via, false)
	res.Outcome, res.Changed = Succeeded, out.Changed
	if then := p.then; then != nil {
		res.ThenRemoved, res.ThenRemoveErr = out.Removed != nil, out.RemoveError
		res.Gap = time.Duration(out.GapSeconds * float64(time.Second))
		if out.Removed != nil {
			c.cfg.Logger.Info("membership step executed", append([]any{"step", string(then.Kind), "member", stepTarget(*then), "via", p.via.String(), "changed", true, "reason", "right after the promotion of " + stepTarget(plan.Step) + ": " + then.Reason}, stepTiming(obs, res.Start, callStart)...)...)
		} else {
			c.cfg.Logger.Info("the removal after the promotion did not happen; it is planned again", "member", stepTarget(*then), "error", out.RemoveError)
		}
	}
	c.cfg.Logger.Info("membership step executed", append([]any{"step", string(plan.Step.Kind), "member", stepTarget(plan.Step), "via", p.via.String(), "changed", out.Changed, "reason", plan.Step.Reason, "lockTaken", res.LockTaken}, stepTiming(obs, res.Start, callStart)...)...)
	return res
}

// tellOnStep tells Config.OnStep that step (and then, the removal its call
// makes too) begins, and returns what tells it how they ended.
func (c *Cluster) tellOnStep(step planner.Step, then *planner.Step) func(res *Result) {
	c.cfg.OnStep(step, nil)
	if then != nil {
		c.cfg.OnStep(*then, nil)
	}
	return func(res *Result) {
		res.Duration = time.Since(res.Start)
		promoted := *res
		promoted.Duration -= res.Gap
		c.cfg.OnStep(step, &promoted)
		if then != nil {
			removed := Result{Step: *then, Outcome: Retry, Start: res.Start.Add(promoted.Duration), Duration: res.Gap, Via: res.Via}
			if res.ThenRemoved {
				removed.Outcome, removed.Changed = Succeeded, true
			}
			c.cfg.OnStep(*then, &removed)
		}
	}
}

// stepTiming are the log values that say where an executed step's time
// went, in seconds: observeSeconds, the observation it was planned from
// (the sidecar's poll of every member included); sinceObservedSeconds,
// from that answer to the step's start (planning, status, admissions);
// prepareSeconds, the drain, the retirement record and the hold before
// the call; callSeconds, the sidecar call itself.
func stepTiming(obs *Observation, start, callStart time.Time) []any {
	secs := func(d time.Duration) float64 { return math.Round(d.Seconds()*1000) / 1000 }
	kv := []any{"observedVia", obs.Via.Member}
	if !obs.Began.IsZero() {
		kv = append(kv, "observeSeconds", secs(obs.At.Sub(obs.Began)))
	}
	return append(kv, "sinceObservedSeconds", secs(start.Sub(obs.At)),
		"prepareSeconds", secs(callStart.Sub(start)), "callSeconds", secs(time.Since(callStart)))
}

// onSideOf tells whether an endpoint's member is on the side of the member
// with ID id, in the planner's view.
func onSideOf(in planner.Observed, id string) func(Endpoint) bool {
	sides := map[string]string{} // member name -> side
	side := ""
	for _, m := range in.Members {
		if m.Name != "" {
			sides[m.Name] = m.Side
		}
		if m.ID == id {
			side = m.Side
		}
	}
	return func(e Endpoint) bool {
		s, ok := sides[e.Member]
		return ok && side != "" && s == side
	}
}

// servingVoters are the endpoints of the voters that may have clients:
// those etcd knows a client URL of. The sidecar of a pod whose etcd is not
// a member yet has no clients, and one still starting may accept a
// connection and answer nothing (a TLS handshake timing out after 10 s,
// all of it before the transfer); a learner has none (no client Service
// lists it), and its sidecar cannot read the membership lock a hold takes
// (etcd serves a learner no such read); nor has a voter that has not
// published itself, such as one promoted right after its snapshot join,
// whose sidecar's lock read waits on its etcd. A hold that does not answer
// is left only after holdCallTimeout, and every gate held before it keeps
// its clients waiting that long. A published voter that did not answer
// the last poll is still held: its clients may reach it when the
// observer does not, and a proposal of theirs the old leader drops fails.
func servingVoters(obs *Observation, endpoints []Endpoint) []Endpoint {
	var out []Endpoint
	for _, e := range endpoints {
		if m := obs.Member(e.Member); m != nil && !m.IsLearner && len(m.ClientURLs) > 0 {
			out = append(out, e)
		}
	}
	return out
}

// via picks the sidecar for a step (s, or the removal of a promotion
// that makes a tie). A removal goes through a follower (removalVia); any
// other step through the leader's sidecar; failing those, the one that
// answered the observation unless it belongs to the member the step
// removes, else the first other endpoint whose member was a healthy voter,
// else any other. atLeader (a leader transfer, a tie) only makes a detour
// through another sidecar worth a log line: it lengthens what the clients
// wait through.
func (c *Cluster) via(obs *Observation, endpoints []Endpoint, s planner.Step, in planner.Observed, atLeader bool) (Endpoint, bool) {
	excluded := func(e Endpoint) bool {
		if s.Kind != planner.Remove {
			return false
		}
		if e.Member != "" && e.Member == s.Member {
			return true
		}
		m := obs.Member(e.Member)
		return m != nil && s.ID != "" && strings.EqualFold(m.ID, s.ID)
	}
	if s.Kind == planner.Remove {
		if e, ok := c.removalVia(obs, endpoints, s, in, excluded); ok {
			return e, true
		}
	}
	// Every other membership change commits at the leader, and only the
	// leader serves MoveLeader: through its own sidecar the call and the
	// checks before it (the lock, the member list) stay on the leader's
	// host instead of crossing to it, and the answer comes as soon as the
	// leader applied the change. At 180 ms RTT the transfer call took
	// 1.1 s through the transferee's sidecar, 0.4 s through the leader's.
	why := "no sidecar of the leader is listed"
	if s.Kind == planner.Remove {
		why = "no sidecar of a healthy follower other than the member removed is listed"
	}
	for _, e := range endpoints {
		m := obs.Member(e.Member)
		switch {
		case e.URL == "" || m == nil || !m.IsLeader || excluded(e):
			continue
		case !m.Healthy:
			why = fmt.Sprintf("leader %s did not answer the observation's poll: %s", e.Member, m.Error)
		case c.erredRecently(e):
			why = fmt.Sprintf("a call to the sidecar of leader %s failed within the last %s", e.Member, c.cfg.FailureMemory)
		default:
			return e, true
		}
	}
	if atLeader {
		// Not an error: the step goes through another sidecar, which
		// costs round trips across sites.
		c.cfg.Logger.Info("the step goes through a sidecar other than the leader's", "step", string(s.Kind), "member", stepTarget(s), "why", why)
	}
	if !excluded(obs.Via) {
		return obs.Via, true
	}
	var fallback *Endpoint
	for i, e := range endpoints {
		if excluded(e) || e.URL == obs.Via.URL || e.URL == "" {
			continue
		}
		if m := obs.Member(e.Member); m != nil && m.Healthy && !m.IsLearner && !c.failedRecently(e) {
			return e, true
		}
		if fallback == nil {
			fallback = &endpoints[i]
		}
	}
	if fallback != nil {
		return *fallback, true
	}
	return Endpoint{}, false
}

// leaderEndpoint is the sidecar of the observed leader, when it answered
// the observation's poll and no call to it failed lately.
func (c *Cluster) leaderEndpoint(obs *Observation, endpoints []Endpoint) (Endpoint, bool) {
	for _, e := range endpoints {
		if m := obs.Member(e.Member); e.URL != "" && m != nil && m.IsLeader && m.Healthy && !c.erredRecently(e) {
			return e, true
		}
	}
	return Endpoint{}, false
}

// removalVia picks the sidecar of a healthy follower for the removal s: a
// voter that is neither the member removed nor the leader, and whose
// sidecar did not fail lately. The sidecar sends the removal through its
// own member, whose strict reconfiguration check (etcd's 5 s) decides it.
// After a snapshot join the leader re-dates a new voter's connected-since
// time, a follower does not: a removal refused through the leader for 5 s
// was taken through a follower 0.2 s later. Among followers, one on the
// side of the member removed (the departing side, where the leader still
// is until the majority has moved, so the removal's commit does not cross
// the link twice), then one on the caller's side (Config.LocalSide, one
// hop less for the call). Never the member removed: it answers "server
// stopped", and must not be asked anything while it applies its removal
// (etcd issue 21966). ok is false when no follower qualifies; the removal
// then goes through the leader.
func (c *Cluster) removalVia(obs *Observation, endpoints []Endpoint, s planner.Step, in planner.Observed, excluded func(Endpoint) bool) (Endpoint, bool) {
	sides := map[string]string{} // member ID -> side
	for _, m := range in.Members {
		sides[strings.ToLower(m.ID)] = m.Side
	}
	targetSide := ""
	if m := obs.Member(cmp.Or(s.ID, s.Member)); m != nil {
		targetSide = sides[strings.ToLower(m.ID)]
	}
	best, bestScore := -1, -1
	for i, e := range endpoints {
		m := obs.Member(e.Member)
		if e.URL == "" || m == nil || excluded(e) || m.IsLeader || m.IsLearner || !m.Healthy || c.failedRecently(e) {
			continue
		}
		side, score := sides[strings.ToLower(m.ID)], 0
		if side != "" && side == targetSide {
			score += 2
		}
		if side != "" && side == c.cfg.LocalSide {
			score++
		}
		if score > bestScore {
			best, bestScore = i, score
		}
	}
	if best < 0 {
		return Endpoint{}, false
	}
	return endpoints[best], true
}

// ensureLock makes sure this holder holds the lock with at least half its
// lease left. grant is the sidecar's answer when the lock was not held at
// observation time and is now, nil when it was held; ok is false when it
// could not be taken (the Result says why).
func (c *Cluster) ensureLock(ctx context.Context, cl *sidecar.Client, obs *Observation) (grant *sidecar.LockGrant, r Result, ok bool) {
	held := obs.LockedBy(c.cfg.Holder, c.token)
	if held && time.Duration(obs.List.Lock.ExpiresInSeconds)*time.Second > c.cfg.LockTTL/2 {
		return nil, Result{}, true
	}
	callCtx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
	defer cancel()
	g, err := cl.AcquireLock(callCtx, c.cfg.Holder, c.token, c.cfg.LockTTL)
	if err != nil {
		c.noteFenced(err)
		r := c.classify(err)
		if r.Outcome == Uncertain {
			r.Outcome = Retry // a lock, not a membership change
		}
		r.Err = fmt.Errorf("taking the membership lock as %q: %w", c.cfg.Holder, err)
		return nil, r, false
	}
	if held {
		return nil, Result{}, true
	}
	return g, Result{}, true
}

// unchangedSince tells whether a plan made from obs still stands once the
// lock is taken: the lock was free at observation (nobody could have had a
// change under way) and the step and retirement records the lock's
// transaction read are the observation's, so no holder acted in between.
// Otherwise the caller plans again under the lock. What the records do not
// cover, a membership change made around the sidecars, the change's
// fingerprint does: the sidecar refuses it (MembershipChanged).
func unchangedSince(obs *Observation, g *sidecar.LockGrant) bool {
	if obs.List.Lock != nil || g.Retired == nil || !slices.Equal(g.Retired, obs.List.Retired) {
		return false
	}
	if g.Step == nil || obs.List.Step == nil {
		return g.Step == nil && obs.List.Step == nil
	}
	return *g.Step == *obs.List.Step
}

// RenewLock renews the lock when this holder held it at observation time
// and half of its lease has passed, so that a holder waiting between two
// steps (for a learner to catch up) keeps the cluster to itself.
func (c *Cluster) RenewLock(ctx context.Context, obs *Observation) error {
	if !obs.LockedBy(c.cfg.Holder, c.token) || time.Duration(obs.List.Lock.ExpiresInSeconds)*time.Second > c.cfg.LockTTL/2 {
		return nil
	}
	callCtx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
	defer cancel()
	if _, err := c.client(obs.Via.URL, obs.Via.TLS).AcquireLock(callCtx, c.cfg.Holder, c.token, c.cfg.LockTTL); err != nil {
		c.noteFenced(err)
		return fmt.Errorf("renewing the membership lock as %q through the sidecar of %s: %w", c.cfg.Holder, obs.Via, err)
	}
	return nil
}

// ReleaseLock gives the lock up when this holder held it at observation
// time: the target is reached, or the controller waits for the other one,
// which may act meanwhile. A lock that an earlier process of this holder
// left (a controller that died holding it) is taken over and released, so
// the other controller need not wait for its lease to run out.
func (c *Cluster) ReleaseLock(ctx context.Context, obs *Observation) error {
	l := obs.List.Lock
	if l == nil || l.Holder != c.cfg.Holder || c.isFenced() {
		return nil
	}
	callCtx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
	defer cancel()
	cl := c.client(obs.Via.URL, obs.Via.TLS)
	if l.Token != c.token {
		if _, err := cl.AcquireLock(callCtx, c.cfg.Holder, c.token, c.cfg.LockTTL); err != nil {
			c.noteFenced(err)
			return fmt.Errorf("taking over the membership lock that an earlier process of %q left, to release it: %w", c.cfg.Holder, err)
		}
	}
	if err := cl.ReleaseLock(callCtx, c.cfg.Holder, c.token); err != nil {
		return fmt.Errorf("releasing the membership lock of %q through the sidecar of %s: %w", c.cfg.Holder, obs.Via, err)
	}
	return nil
}

// Unretire deletes this holder's retirement records of plan.Unretire (the
// target wants those members again, e.g. after an aborted move), under the
// lock, through the sidecar that answered the observation.
func (c *Cluster) Unretire(ctx context.Context, obs *Observation, plan Plan) error {
	if len(plan.Unretire) == 0 {
		return nil
	}
	if c.isFenced() {
		return c.fencedError("deleting retirement records")
	}
	cl := c.client(obs.Via.URL, obs.Via.TLS)
	if _, r, ok := c.ensureLock(ctx, cl, obs); !ok {
		return r.Err
	}
	for _, name := range plan.Unretire {
		callCtx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
		_, err := cl.Unretire(callCtx, name, sidecar.CallOptions{LockHolder: c.cfg.Holder, LockToken: c.token})
		cancel()
		if err != nil {
			return fmt.Errorf("deleting the retirement record of %s through the sidecar of %s: %w", name, obs.Via, err)
		}
		c.cfg.Logger.Info("retirement record deleted; the member may join again", "member", name, "holder", c.cfg.Holder)
	}
	return nil
}

// classify maps a failed call onto an Outcome: refusals that change nothing
// and clear up on their own are Retry, other refusals are Refused, and
// anything that may have been applied (a 5xx, a timeout, a dropped
// connection) is Uncertain.
func (c *Cluster) classify(err error) Result {
	var se *sidecar.Error
	if errors.As(err, &se) {
		r := Result{Reason: se.Reason, RetryAfter: se.RetryAfter, Err: err}
		switch {
		case slices.Contains(retryReasons, se.Reason):
			r.Outcome = Retry
			if r.RetryAfter <= 0 {
				r.RetryAfter = time.Second
			}
		case se.StatusCode >= 500:
			r.Outcome, r.SidecarFailed = Uncertain, true
		default:
			r.Outcome = Refused
		}
		return r
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		// The request never left: nothing can have changed.
		return Result{Outcome: Retry, Reason: ReasonTransport, RetryAfter: time.Second, Err: err, SidecarFailed: true}
	}
	return Result{Outcome: Uncertain, Reason: ReasonTransport, Err: err, SidecarFailed: true}
}

// retryReasons are the sidecar's refusals that change nothing and pass by
// themselves.
var retryReasons = []string{
	sidecar.ReasonLearnerNotReady,
	sidecar.ReasonUnhealthyCluster,
	sidecar.ReasonMembershipChanged,
	sidecar.ReasonLockHeld,
	sidecar.ReasonLockNotHeld,
	sidecar.ReasonMemberUnhealthy,
	sidecar.ReasonNotReady,
	sidecar.ReasonLockExpiring,
	sidecar.ReasonChangeInFlight,
	// etcd refused the change's record: nothing was sent, and the move
	// goes on once an operator disarmed the alarm.
	sidecar.ReasonNoSpace,
	// etcd holds as many learners as its --max-learners allows; the
	// controller plans within that limit from then on.
	sidecar.ReasonTooManyLearners,
}

// noteFenced remembers a StaleToken refusal: a newer process of this
// holder took the lock over, and taking it back would only make the two
// take turns.
func (c *Cluster) noteFenced(err error) {
	if !sidecar.IsReason(err, sidecar.ReasonStaleToken) {
		return
	}
	c.mu.Lock()
	c.fenced = true
	c.mu.Unlock()
	c.cfg.Logger.Info("fenced off: a newer process of this holder took the membership lock over; this one changes nothing more",
		"holder", c.cfg.Holder, "token", c.token, "error", err.Error())
}

// fencedError says why a fenced Cluster did not do what.
func (c *Cluster) fencedError(what string) error {
	return fmt.Errorf("%s not done: a newer process of %q took the membership lock over from this one (token %q), which changes nothing more; restart it to let it act again",
		what, c.cfg.Holder, c.token)
}

// isFenced reports whether a newer process of this holder fenced this
// Cluster off.
func (c *Cluster) isFenced() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.fenced
}

// retiredBy reports whether the observation shows holder's retirement
// record of member: the record is written once, not before every attempt.
func retiredBy(obs *Observation, member, holder string) bool {
	for _, r := range obs.List.Retired {
		if r.Name == member && r.By == holder {
			return true
		}
	}
	return false
}
