// Package livemove runs a live move of an etcd cluster between two
// Kubernetes clusters: the steps of the gardenlet adapter
// (api/v1alpha1/migration) in order, against the source and the destination
// API servers, with a wait on the controllers' status after each, time
// limits, and progress events. It keeps no state of its own: every run reads
// the phase from the two Etcd objects and continues from there, so a move
// interrupted anywhere (a crash, Ctrl-C, a time limit) resumes by running it
// again.
package livemove

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/go-logr/logr"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/members"
	move "github.com/druid-stretch/druid-stretch/api/v1alpha1/migration"
	"github.com/druid-stretch/druid-stretch/internal/etcdview"
)

// Options configure a Mover.
type Options struct {
	// Source and Destination are clients of the two API servers, with the
	// v1alpha1 scheme. Use clients that read from the API server, not a
	// cache: each wait must see the status the controllers just wrote.
	Source, Destination client.Client
	// Namespace and Name name the Etcd in both clusters.
	Namespace, Name string

	// DestinationOrdinalStart is the destination's spec.ordinalStart when the
	// move creates the destination Etcd; default: right after the source's
	// range, so member names stay unique.
	DestinationOrdinalStart *int32
	// DestinationMemberNamePrefix, when set, is the destination's
	// spec.memberNamePrefix when the move creates it.
	DestinationMemberNamePrefix *string

	// SourceAddresses and DestinationAddresses give the URLs under which the
	// other cluster reaches each member. Required.
	SourceAddresses, DestinationAddresses move.Addresses

	// StepTimeout bounds the wait of one step (default 10 minutes); an
	// interrupted move continues when run again.
	StepTimeout time.Duration
	// PollInterval is how often the two Etcd objects are read while waiting
	// (default 200 ms).
	PollInterval time.Duration
	// SwitchClients, when set, moves the clients of the source site to the
	// destination once the destination has joined and before any source
	// member goes: gardenlet points the shoot's API endpoint at the
	// destination's kube-apiserver (waiting for it to serve, on the
	// destination's client Service) and stops the source's, whose only
	// etcd endpoint is the source's client Service. The source's clients
	// then never see a member removed or leadership moved; the
	// destination's see the one leader transfer, which their members'
	// client gates hold them through. Retire-source starts only after it
	// returned nil. It runs again when a Mover resumes a move that had
	// not started retire-source, so it must be safe to repeat. Unset:
	// retire-source follows the join at once.
	SwitchClients func(ctx context.Context) error
	// HoldSource, when above 0 (with SwitchClients), turns the order
	// around: retire-source runs first and the destination keeps that many
	// source members voting for the source site's clients (phase
	// SourceHeld, spec.retainedExternalMembers); SwitchClients runs once
	// the destination holds the majority, and the held members go after
	// it. The destination's kube-apiserver then starts on a majority inside
	// its own site, where every quorum read of its start stays local, while
	// the source's clients, already serving, meet the removals of their
	// members and the leader transfer, which their client gates hold them
	// through. It must be below the source's replica count.
	HoldSource int32
	// GEP39, when set, makes the move GEP-39's: the stages gardenlet runs
	// (move.Stage), each a write of druid's own fields, instead of
	// druid-stretch's steps; the destination gets a member name prefix and
	// ordinals from 0. HoldSource and the ordinal start do not apply.
	GEP39 *GEP39
	// Progress, when set, receives every event, in order, from the
	// goroutine that runs the move: keep it quick.
	Progress func(Event)
	// Logger receives the same events as log lines.
	Logger logr.Logger
}

// EventKind says what an Event reports.
type EventKind string

// The kinds of events.
const (
	// StepStarted: the step's fields are about to be written.
	StepStarted EventKind = "StepStarted"
	// StepWaiting: the step's fields are written; the controllers work.
	// Sent once when the wait starts and whenever the phase or the
	// controllers' report changes.
	StepWaiting EventKind = "StepWaiting"
	// StepDone: the step's wait ended.
	StepDone EventKind = "StepDone"
	// WriteWaiting: the API server could not admit a write of the step for
	// a passing reason (a webhook it could not call, its own restart); the
	// write is tried again. Message says which API server and why.
	WriteWaiting EventKind = "WriteWaiting"
)

// Event is one step of progress.
type Event struct {
	Kind EventKind
	Step move.Step
	// Phase is the phase read from the two objects.
	Phase move.MovePhase
	// At is when the event happened; Duration is the step's, for StepDone.
	At       time.Time
	Duration time.Duration
	// Source and Destination are the objects as last read (Destination nil
	// before it exists). Do not modify them.
	Source, Destination *v1alpha1.Etcd
	// Message explains the phase (move.Explain).
	Message string
}

// Mover moves one Etcd.
type Mover struct {
	o Options
	// step is the step under way, for the events of its writes.
	step move.Step
	// switched: this Mover ran SwitchClients successfully.
	switched bool
}

// New checks the options.
func New(o Options) (*Mover, error) {
	var errs []error
	if o.Source == nil || o.Destination == nil {
		errs = append(errs, errors.New("migration: both the source and the destination client are required"))
	}
	if o.Namespace == "" || o.Name == "" {
		errs = append(errs, fmt.Errorf("migration: the Etcd's namespace and name are required, got %q/%q", o.Namespace, o.Name))
	}
	if o.SourceAddresses == nil || o.DestinationAddresses == nil {
		errs = append(errs, errors.New("migration: SourceAddresses and DestinationAddresses are required: the other cluster reaches each member through them"))
	}
	switch {
	case o.HoldSource < 0:
		errs = append(errs, fmt.Errorf("migration: HoldSource is %d: want 0 (switch the clients first) or the number of source members to hold", o.HoldSource))
	case o.HoldSource > 0 && o.SwitchClients == nil:
		errs = append(errs, fmt.Errorf("migration: HoldSource is %d, but there is no SwitchClients: held source members are kept for clients that the move switches", o.HoldSource))
	}
	if o.GEP39 != nil {
		if err := o.GEP39.check(); err != nil {
			errs = append(errs, err)
		}
		if o.HoldSource > 0 || o.DestinationOrdinalStart != nil || o.DestinationMemberNamePrefix != nil {
			errs = append(errs, errors.New("migration: a GEP-39 move takes its destination's names from GEP39.DestinationPrefix and holds no source member: leave HoldSource, DestinationOrdinalStart and DestinationMemberNamePrefix unset"))
		}
	}
	if o.DestinationOrdinalStart != nil && *o.DestinationOrdinalStart < 0 {
		errs = append(errs, fmt.Errorf("migration: the destination ordinal start must not be negative, got %d", *o.DestinationOrdinalStart))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if o.StepTimeout <= 0 {
		o.StepTimeout = 10 * time.Minute
	}
	if o.PollInterval <= 0 {
		o.PollInterval = 200 * time.Millisecond
	}
	if o.Logger.GetSink() == nil {
		o.Logger = logr.Discard()
	}
	return &Mover{o: o}, nil
}

// Read returns the two Etcd objects (dst nil when the destination does not
// exist) and the phase they are in.
func (m *Mover) Read(ctx context.Context) (src, dst *v1alpha1.Etcd, p move.MovePhase, err error) {
	key := client.ObjectKey{Namespace: m.o.Namespace, Name: m.o.Name}
	if src, err = view(ctx, m.o.Source, key, "source"); err != nil {
		return nil, nil, "", err
	}
	if dst, err = view(ctx, m.o.Destination, key, "destination"); err != nil {
		return nil, nil, "", err
	}
	return src, dst, move.Phase(src, dst), nil
}

// view reads the Etcd key with its EtcdMembership (etcdview), nil when the
// Etcd does not exist.
func view(ctx context.Context, c client.Client, key client.ObjectKey, side string) (*v1alpha1.Etcd, error) {
	p, err := etcdview.Get(ctx, c, key)
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading the %s Etcd %s: %w", side, key, err)
	}
	return p.View, nil
}

// Move runs the move from wherever it stands to its end.
func (m *Mover) Move(ctx context.Context) error {
	if m.o.GEP39 != nil {
		return m.moveGEP39(ctx)
	}
	for {
		src, dst, p, err := m.Read(ctx)
		if err != nil {
			return err
		}
		if err := m.checkHold(src, p); err != nil {
			return err
		}
		var step func(context.Context, *v1alpha1.Etcd, *v1alpha1.Etcd) error
		switch p {
		case move.PhaseCompleted:
			return nil
		case move.PhaseAborting, move.PhaseAborted:
			return fmt.Errorf("migration: the move of %s/%s was aborted (%s); run the abort to its end, then delete the destination Etcd before moving again",
				m.o.Namespace, m.o.Name, move.Explain(src, dst))
		case move.PhaseInconsistent:
			return fmt.Errorf("migration: refusing to change %s/%s: %s", m.o.Namespace, m.o.Name, move.Explain(src, dst))
		case move.PhaseNotStarted, move.PhasePreparingSource:
			step = m.prepareSource
		case move.PhaseSourcePrepared, move.PhaseJoiningDestination:
			step = m.joinDestination
		case move.PhaseDestinationJoined:
			step = m.retireSource
			if m.o.SwitchClients != nil && !m.switched && m.o.HoldSource == 0 {
				if err := m.run(ctx, move.StepSwitchClients, src, dst, m.switchClients); err != nil {
					return err
				}
			}
		case move.PhaseRetiringSource:
			step = m.retireSource
		case move.PhaseSourceHeld:
			step = m.releaseSource
		case move.PhaseSourceRetired, move.PhaseFinishing:
			step = m.finish
		default:
			return fmt.Errorf("migration: unknown phase %q", p)
		}
		if err := m.run(ctx, p.Step(), src, dst, step); err != nil {
			return err
		}
	}
}

// Abort takes the move back: the destination's members leave, the source's
// come back, and the source forgets the destination. It refuses once the
// destination holds the majority of the voters.
func (m *Mover) Abort(ctx context.Context) error {
	src, dst, p, err := m.Read(ctx)
	if err != nil {
		return err
	}
	switch p {
	case move.PhaseNotStarted, move.PhaseAborted:
		return nil
	}
	if err := move.CanAbort(src, dst); err != nil {
		return err
	}
	return m.run(ctx, move.StepAbort, src, dst, m.abort)
}

// Where says where the move of src to dst stands, as --status prints it:
// the phase, why (move.Explain), and the step that leads out of it; for a
// GEP-39 move the stage under way or next is both phase and step
// (move.StageOf), "Completed" once none is left.
func (m *Mover) Where(src, dst *v1alpha1.Etcd) (phase, why, next string) {
	if m.o.GEP39 != nil {
		stage, _ := move.StageOf(src, dst)
		if stage == "" {
			return string(move.PhaseCompleted), m.explain(src, dst), ""
		}
		return string(stage), m.explain(src, dst), string(stage)
	}
	p := move.Phase(src, dst)
	return string(p), move.Explain(src, dst), string(p.Step())
}

// explain says where the move stands: move.Explain, or for a GEP-39 move
// its stage (move.StageOf).
func (m *Mover) explain(src, dst *v1alpha1.Etcd) string {
	if m.o.GEP39 != nil {
		stage, why := move.StageOf(src, dst)
		if stage == "" {
			stage = "done"
		}
		return string(stage) + ": " + why
	}
	return move.Explain(src, dst)
}

// run runs one step with its events and its time limit.
func (m *Mover) run(ctx context.Context, s move.Step, src, dst *v1alpha1.Etcd, step func(context.Context, *v1alpha1.Etcd, *v1alpha1.Etcd) error) error {
	start := time.Now()
	m.step = s
	m.emit(Event{Kind: StepStarted, Step: s, Phase: move.Phase(src, dst), At: start, Source: src, Destination: dst, Message: m.explain(src, dst)})
	ctx, cancel := context.WithTimeout(ctx, m.o.StepTimeout)
	defer cancel()
	if err := step(ctx, src, dst); err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("migration: step %s did not finish within %s (run the move again to continue): %w", s, m.o.StepTimeout, err)
		}
		return fmt.Errorf("migration: step %s: %w", s, err)
	}
	src, dst, p, err := m.Read(context.WithoutCancel(ctx))
	if err != nil {
		return err
	}
	m.emit(Event{Kind: StepDone, Step: s, Phase: p, At: time.Now(), Duration: time.Since(start), Source: src, Destination: dst, Message: m.explain(src, dst)})
	return nil
}

func (m *Mover) emit(e Event) {
	m.o.Logger.Info("migration "+string(e.Kind), "step", string(e.Step), "phase", string(e.Phase), "duration", e.Duration.String(), "message", e.Message)
	if m.o.Progress != nil {
		m.o.Progress(e)
	}
}

// destinationTemplate is the destination as the move creates it: its final
// replica count, its ordinal range (or member name prefix), druid's spec
// copied from the source. An existing destination keeps its own spec.
func (m *Mover) destinationTemplate(src, dst *v1alpha1.Etcd, replicas int32) (*v1alpha1.Etcd, error) {
	var t *v1alpha1.Etcd
	if dst != nil {
		t = dst.DeepCopy()
	} else {
		start := int32(members.LocalOrdinals(src).End)
		if m.o.DestinationOrdinalStart != nil {
			start = *m.o.DestinationOrdinalStart
		}
		t = move.NewDestination(src, start)
		if m.o.DestinationMemberNamePrefix != nil {
			p := *m.o.DestinationMemberNamePrefix
			t.Spec.MemberNamePrefix = &p
		}
	}
	t.Spec.Replicas = replicas
	if err := move.CheckNames(src, t); err != nil {
		return nil, err
	}
	return t, nil
}

func (m *Mover) prepareSource(ctx context.Context, src, dst *v1alpha1.Etcd) error {
	if src.Spec.Replicas < 1 {
		return fmt.Errorf("the source Etcd %s/%s has no replicas to move", src.Namespace, src.Name)
	}
	t, err := m.destinationTemplate(src, dst, src.Spec.Replicas)
	if err != nil {
		return err
	}
	dstMembers, err := move.ExternalMembers(t, m.o.DestinationAddresses)
	if err != nil {
		return err
	}
	if err := m.patch(ctx, m.o.Source, "source", func(e *v1alpha1.Etcd) { move.PrepareSource(e, dstMembers) }); err != nil {
		return err
	}
	return m.wait(ctx, move.StepPrepareSource, func(src, _ *v1alpha1.Etcd) bool { return move.Converged(src) })
}

func (m *Mover) joinDestination(ctx context.Context, src, dst *v1alpha1.Etcd) error {
	srcMembers, err := move.ExternalMembers(src, m.o.SourceAddresses)
	if err != nil {
		return err
	}
	if err := checkObservedPeerURLs(src, srcMembers); err != nil {
		return err
	}
	join := func(e *v1alpha1.Etcd) {
		if m.ClientSwitch() == SwitchWhenHeld {
			// The held order has no switch before retire-source to warm
			// the destination in: it warms at the join. The further
			// members' pods then start beside the first one's instead of
			// one after another during retire-source, and their learners
			// catch up while the first member joins; without a vote they
			// change no quorum, and RetireSource promotes them.
			move.WarmDestination(e, int32(len(src.Spec.ExternalMembers)))
		}
		move.JoinDestination(e, srcMembers)
	}
	if dst == nil {
		t, err := m.destinationTemplate(src, nil, src.Spec.Replicas)
		if err != nil {
			return err
		}
		join(t)
		if err := move.Advertise(t, m.o.DestinationAddresses); err != nil {
			return err
		}
		if err := m.create(ctx, t); err != nil {
			return err
		}
	}
	if err := m.patchAdvertised(ctx, join); err != nil {
		return err
	}
	return m.wait(ctx, move.StepJoinDestination, func(_, dst *v1alpha1.Etcd) bool { return move.DestinationJoined(dst) })
}

// checkObservedPeerURLs refuses source addresses whose peer URLs are none
// of the ones etcd knows the members by: the destination would add nobody,
// but it would not recognise the source's members either. A member may
// advertise more URLs than the other cluster uses (druid always advertises
// its in-cluster name first, then spec.etcd.additionalAdvertisePeerURLs);
// one in common identifies it, as the planner matches members.
func checkObservedPeerURLs(src *v1alpha1.Etcd, listed []v1alpha1.ExternalMember) error {
	if src.Status.Membership == nil {
		return nil
	}
	for _, x := range listed {
		for _, o := range src.Status.Membership.Members {
			if o.Name == x.Name && !slices.ContainsFunc(x.PeerURLs, func(u string) bool { return slices.Contains(o.PeerURLs, u) }) {
				return fmt.Errorf("the source addresses give member %s the peer URLs %v, but etcd knows it by %v: fix the source peer URL template, or advertise that URL (spec.etcd.additionalAdvertisePeerURLs)", x.Name, x.PeerURLs, o.PeerURLs)
			}
		}
	}
	return nil
}

func (m *Mover) retireSource(ctx context.Context, src, _ *v1alpha1.Etcd) error {
	// The source lists every destination member: their number is the
	// destination's final size, whatever it has now.
	n := int32(len(src.Spec.ExternalMembers))
	// Without HoldSource no source member is held back: the clients were
	// switched before.
	hold := m.o.HoldSource
	if err := m.checkHold(src, move.PhaseDestinationJoined); err != nil {
		return err
	}
	if err := m.patchAdvertised(ctx, func(e *v1alpha1.Etcd) { move.RetireSource(e, n, hold) }); err != nil {
		return err
	}
	return m.wait(ctx, move.StepRetireSource, func(_, dst *v1alpha1.Etcd) bool { return move.SourceRetired(dst) || move.SourceHeld(dst) })
}

// DefaultHoldSource is the source members a move that switches the
// clients holds unless told otherwise (the migrate command's, the demo's
// and the bench's --hold-source): the destination's kube-apiserver then
// starts on a quorum inside its own site instead of reading across the
// sites.
const DefaultHoldSource int32 = 1

// checkHold refuses a HoldSource that would hold every member of the
// source src, while the move in phase p has not retired any: the
// destination could never take the majority. Checked before the first
// step too, so that a source too small for the hold (a one-member source
// and the migrate command's default) is refused before anything changes
// rather than once the destination has joined.
func (m *Mover) checkHold(src *v1alpha1.Etcd, p move.MovePhase) error {
	hold := m.o.HoldSource
	if hold <= 0 || src == nil || m.o.GEP39 != nil {
		return nil
	}
	switch p {
	case move.PhaseNotStarted, move.PhasePreparingSource, move.PhaseSourcePrepared, move.PhaseJoiningDestination, move.PhaseDestinationJoined:
	default:
		return nil
	}
	if hold >= src.Spec.Replicas {
		return fmt.Errorf("migration: HoldSource %d (the migrate command's --hold-source) would hold every one of the source's %d members, and the destination could never take the majority: hold fewer (0 switches the clients before any source member goes)", hold, src.Spec.Replicas)
	}
	return nil
}

// switchClients runs the caller's switch of the source site's clients.
// From a joined destination it first warms it (move.WarmDestination): the
// destination's further members join as learners and catch up while the
// switch runs (the destination's kube-apiserver starting takes a minute at
// 180 ms RTT), so that retire-source finds them ready instead of adding
// them one after another. Without a vote they change no quorum, and
// kube-apiservers do not reach them (a learner is not ready, so no client
// Service lists it).
func (m *Mover) switchClients(ctx context.Context, src, dst *v1alpha1.Etcd) error {
	if move.Phase(src, dst) == move.PhaseDestinationJoined {
		n := int32(len(src.Spec.ExternalMembers))
		if err := m.patchAdvertised(ctx, func(e *v1alpha1.Etcd) { move.WarmDestination(e, n) }); err != nil {
			return err
		}
	}
	if err := m.o.SwitchClients(ctx); err != nil {
		return fmt.Errorf("migration: switching the source site's clients to the destination: %w", err)
	}
	m.switched = true
	return nil
}

// releaseSource lets the destination remove the source members it holds
// (spec.retainedExternalMembers, set by an operator or by an earlier
// version of this adapter), after the caller's switch of the source site's
// clients if this Mover has not run it yet.
func (m *Mover) releaseSource(ctx context.Context, src, dst *v1alpha1.Etcd) error {
	if m.o.SwitchClients != nil && !m.switched {
		if err := m.switchClients(ctx, src, dst); err != nil {
			return err
		}
	}
	if err := m.patch(ctx, m.o.Destination, "destination", move.ReleaseSource); err != nil {
		return err
	}
	return m.wait(ctx, move.StepSwitchClients, func(_, dst *v1alpha1.Etcd) bool { return move.SourceRetired(dst) })
}

func (m *Mover) finish(ctx context.Context, src, dst *v1alpha1.Etcd) error {
	if src != nil && len(src.Spec.ExternalMembers) > 0 {
		// The source keeps the destination's members listed until its
		// controller saw replicas 0: it observes the cluster through them.
		if err := m.patch(ctx, m.o.Source, "source", move.FinishSource); err != nil {
			return err
		}
		if err := m.wait(ctx, move.StepFinish, func(src, _ *v1alpha1.Etcd) bool { return src == nil || move.Converged(src) }); err != nil {
			return err
		}
		if err := m.patch(ctx, m.o.Source, "source", move.ForgetExternalMembers); err != nil {
			return err
		}
	}
	if err := m.patch(ctx, m.o.Destination, "destination", move.FinishDestination); err != nil {
		return err
	}
	return m.wait(ctx, move.StepFinish, func(src, dst *v1alpha1.Etcd) bool { return move.Phase(src, dst) == move.PhaseCompleted })
}

func (m *Mover) abort(ctx context.Context, src, dst *v1alpha1.Etcd) error {
	joined := dst != nil && len(dst.Spec.ExternalMembers) > 0
	if joined {
		if err := m.patch(ctx, m.o.Destination, "destination", move.AbortDestination); err != nil {
			return err
		}
		err := m.wait(ctx, move.StepAbort, func(src, dst *v1alpha1.Etcd) bool {
			_, d, _ := move.Voters(src, dst)
			return d == 0 && move.Converged(dst) && move.SourceRestored(src)
		})
		if err != nil {
			return err
		}
	}
	if err := m.patch(ctx, m.o.Source, "source", move.ForgetExternalMembers); err != nil {
		return err
	}
	return m.wait(ctx, move.StepAbort, func(src, dst *v1alpha1.Etcd) bool {
		p := move.Phase(src, dst)
		return p == move.PhaseAborted || (!joined && p == move.PhaseNotStarted && move.Converged(src))
	})
}

// patchAdvertised changes the destination's spec with mutate, and makes its
// members advertise the URLs under which the source reaches them for the
// replicas mutate sets (move.Advertise).
func (m *Mover) patchAdvertised(ctx context.Context, mutate func(*v1alpha1.Etcd)) error {
	var advErr error
	err := m.patch(ctx, m.o.Destination, "destination", func(e *v1alpha1.Etcd) {
		mutate(e)
		advErr = move.Advertise(e, m.o.DestinationAddresses)
	})
	return errors.Join(advErr, err)
}

// patchBackoff spaces the tries of a patch over about 5 s. druid and the
// membership controllers write an Etcd's status several times a second
// while a move runs, and each write makes a patch guarded by the
// resourceVersion conflict; client-go's DefaultRetry (five tries within
// 50 ms) gave up on real sites at 0 ms RTT.
var patchBackoff = wait.Backoff{Steps: 12, Duration: 20 * time.Millisecond, Factor: 1.5, Jitter: 0.5}

// patch changes the spec of the Etcd in one cluster with a merge patch
// guarded by its resourceVersion, again on conflict: a concurrent writer's
// change is never overwritten. A patch that changes the spec asks druid to
// reconcile it, as gardenlet does.
func (m *Mover) patch(ctx context.Context, c client.Client, side string, mutate func(*v1alpha1.Etcd)) error {
	key := client.ObjectKey{Namespace: m.o.Namespace, Name: m.o.Name}
	err := m.admitted(ctx, side, func() error {
		return retry.RetryOnConflict(patchBackoff, func() error {
			p, err := etcdview.Get(ctx, c, key)
			if err != nil {
				return err
			}
			e := p.View.DeepCopy()
			mutate(e)
			if !apiequality.Semantic.DeepEqual(p.View.Spec, e.Spec) {
				move.RequestDruidReconcile(e)
			}
			return etcdview.Apply(ctx, c, p, e)
		})
	})
	if err != nil {
		return fmt.Errorf("patching the %s Etcd %s: %w", side, key, err)
	}
	return nil
}

// create creates the destination Etcd t with its EtcdMembership; one that
// exists already is left as it is (a resumed move).
func (m *Mover) create(ctx context.Context, t *v1alpha1.Etcd) error {
	err := m.admitted(ctx, "destination", func() error {
		if err := etcdview.Create(ctx, m.o.Destination, t); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("creating the destination Etcd %s/%s: %w", t.Namespace, t.Name, err)
	}
	return nil
}

// timedOut is the error of a write still not admitted at the step's time
// limit: the deadline (exit 3, resumable) and the last passing failure.
func timedOut(ctx context.Context, side string, last error) error {
	return fmt.Errorf("the %s API server did not admit the write before the step's time limit: %w; its last answer: %v", side, ctx.Err(), last)
}

// admitBackoff spaces the tries of a write that the API server could not
// admit for a passing reason, up to one every 5 s, for as long as the
// step's time limit allows.
var admitBackoff = wait.Backoff{Duration: 250 * time.Millisecond, Factor: 2, Jitter: 0.2, Steps: math.MaxInt32, Cap: 5 * time.Second}

// passing says whether err is a failure that goes by itself: the API
// server could not call an admission webhook (druid-stretch's webhook
// restarting with its controller: "failed calling webhook", an internal
// error), or the API server is restarting, overloaded or timed out. A
// refusal (a webhook's or the API's validation, a forbidden write) is not:
// it needs someone to change something.
func passing(err error) bool {
	return apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err) || apierrors.IsServerTimeout(err) ||
		apierrors.IsTimeout(err) || apierrors.IsTooManyRequests(err) ||
		utilnet.IsConnectionRefused(err) || utilnet.IsConnectionReset(err) || utilnet.IsProbableEOF(err)
}

// admitted runs write until the API server admits it: again after a
// passing failure, each time saying what it waits for (a WriteWaiting
// event and a log line), until the step's time limit, whose error then
// names the last failure. Any other error ends it at once. Every write is
// guarded by its object's resourceVersion, so a try the API server did
// apply before it failed is not applied twice.
func (m *Mover) admitted(ctx context.Context, side string, write func() error) error {
	backoff := admitBackoff
	var last error // the last passing failure
	for {
		err := write()
		switch {
		case err == nil:
			return nil
		case passing(err):
			last = err
		case ctx.Err() == nil || last == nil:
			return err
		}
		// A try that the step's time limit cut short says nothing new: the
		// error names the failure waited for.
		if ctx.Err() != nil {
			return timedOut(ctx, side, last)
		}
		delay := backoff.Step()
		m.emit(Event{Kind: WriteWaiting, Step: m.step, At: time.Now(),
			Message: fmt.Sprintf("waiting for the %s API server to admit a write, trying again in %s: %v", side, delay.Round(time.Millisecond), err)})
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return timedOut(ctx, side, last)
		case <-t.C:
		}
	}
}

// wait polls the two objects until done holds, emitting StepWaiting when
// what the controllers report changes. At its time limit it fails with the
// phase and the controllers' last report.
func (m *Mover) wait(ctx context.Context, s move.Step, done func(src, dst *v1alpha1.Etcd) bool) error {
	t := time.NewTicker(m.o.PollInterval)
	defer t.Stop()
	var last string
	// The error at the time limit explains the last pair read, not the
	// read the deadline itself cut short (which has neither object).
	var seenSrc, seenDst *v1alpha1.Etcd
	read := false
	var readErr error
	for {
		src, dst, p, err := m.Read(ctx)
		if err != nil && ctx.Err() == nil {
			readErr = err
			m.o.Logger.Info("reading the Etcd objects failed; trying again", "error", err.Error())
		}
		if err == nil {
			if done(src, dst) {
				return nil
			}
			seenSrc, seenDst, read = src, dst, true
			if key := waitKey(p, src, dst); key != last {
				last = key
				m.emit(Event{Kind: StepWaiting, Step: s, Phase: p, At: time.Now(), Source: src, Destination: dst, Message: m.explain(src, dst)})
			}
		}
		select {
		case <-ctx.Done():
			if !read {
				return fmt.Errorf("waiting for step %s: no read of the Etcd objects succeeded (last: %v): %w", s, readErr, ctx.Err())
			}
			return fmt.Errorf("waiting in %s: %w", m.explain(seenSrc, seenDst), ctx.Err())
		case <-t.C:
		}
	}
}

// waitKey is what a StepWaiting event reports, without the parts of the
// controllers' messages that change on every poll (how long a learner has
// been healthy): the phase, each side's membership phase and condition
// reasons, and the members' roles.
func waitKey(p move.MovePhase, src, dst *v1alpha1.Etcd) string {
	key := string(p)
	for _, e := range []*v1alpha1.Etcd{src, dst} {
		if e == nil || e.Status.Membership == nil {
			key += "|-"
			continue
		}
		key += "|" + string(e.Status.Membership.Phase)
		for _, c := range e.Status.Membership.Conditions {
			key += "," + c.Type + "=" + string(c.Status) + "/" + c.Reason
		}
	}
	return key + "|" + Roles(src, dst)
}
