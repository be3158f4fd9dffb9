// Package membership is the membership controller: for each extended Etcd it
// observes the etcd cluster through the members' sidecars, plans the one next
// safe step toward the members the spec asks for (internal/planner), executes
// it through a sidecar under the cluster's membership lock
// (internal/sidecarcluster), and reports in status.membership, conditions, events
// and metrics. Every reconcile observes and decides anew, so a controller
// that dies mid-step resumes where the cluster is, not where it was.
package membership

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	stretchv1alpha1 "github.com/druid-stretch/druid-stretch/api/stretch/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/members"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/validation"
	"github.com/druid-stretch/druid-stretch/controllers/webhook"
	"github.com/druid-stretch/druid-stretch/internal/etcdview"
	"github.com/druid-stretch/druid-stretch/internal/planner"
	"github.com/druid-stretch/druid-stretch/internal/sidecarcluster"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// Options configure the Reconciler. Zero durations take the defaults named.
type Options struct {
	// ClusterIdentity names this controller in the membership lock and in
	// the retirement records: one name per Kubernetes cluster, the same
	// across restarts. Required.
	ClusterIdentity string
	// SidecarTLS is the client TLS towards the sidecars: the client
	// certificate, and the CA of their serving certificates unless
	// SidecarCAFromEtcd.
	SidecarTLS *tls.Config
	// SidecarCAFromEtcd verifies each Etcd's sidecars with its own CA, the
	// one of its spec.backup.tls.tlsCASecretRef, in place of SidecarTLS's
	// roots: one CA per shoot, as a Gardener seed runs them.
	SidecarCAFromEtcd bool
	// PodsStartThroughSidecar says that this process's admission webhook
	// interposes the sidecar in the pods of the Etcds it manages, so a
	// member is added once its pod waits for it (WaitingForPod). Until
	// druid has created an Etcd's StatefulSet no pod can wait: its members
	// are held. Without it, the StatefulSet's pod template alone tells.
	PodsStartThroughSidecar bool
	// LearnerProgressTimeout is how long a learner may make no progress
	// before it is removed again (default 5 m); a learner removed so waits
	// as long before it is added again.
	LearnerProgressTimeout time.Duration
	// MinLearnerHealthy is how long etcd's strict reconfiguration check
	// needs a member connected or healthy before it counts it for a
	// removal (default 5 s, etcd's HealthInterval): the planner's
	// Policy.MinHealthyFor. A promotion waits for it only when the removal
	// that ends the tie it makes needs the new voter counted.
	MinLearnerHealthy time.Duration
	// DownVoterGrace is how long a departing voter that is down is waited
	// for when removing it would leave fewer voters than the target and no
	// learner can be promoted first (default planner.DefaultDownVoterGrace):
	// its pod may be recreated.
	DownVoterGrace time.Duration
	// MaxLearners is how many learners the planner lets catch up at once
	// (default 1, what etcd accepts without --max-learners; the controller
	// command's default is DefaultMaxLearners, and the command gives its
	// webhook the same, which sets it in the etcd members' pods). Set it to
	// the etcd members' --max-learners: above 1, a move adds the members
	// it still needs side by side before promoting them one by one. When
	// etcd refuses a learner for its limit, the controller plans with the
	// learners it had, for that Etcd until the process restarts, and says
	// so in an event.
	MaxLearners int
	// ProgressInterval is the requeue while steps are under way (default
	// DefaultProgressInterval): the longest a wait that ends by itself goes
	// unobserved. One whose end the planner knows (Step.ReadyIn) is looked
	// at again then, and after a change the next step is planned at once.
	ProgressInterval time.Duration
	// ConvergedInterval is the requeue once converged (default 30 s).
	ConvergedInterval time.Duration
	// MaxBackoff caps the requeue after failures (default 30 s).
	MaxBackoff time.Duration
	// Membership tunes the sidecar calls (timeouts, lock TTL, settle time);
	// its Holder and TLS are set from the fields above.
	Membership sidecarcluster.Config
	// MaxConcurrentReconciles is how many Etcds are reconciled at once
	// (default 4).
	MaxConcurrentReconciles int
	// LookupHost resolves the external members' peer hosts for the
	// EndpointSlice of their in-cluster peer names (syncPeerNames; default
	// net.DefaultResolver.LookupHost, the controller pod's cluster DNS).
	LookupHost func(ctx context.Context, host string) ([]string, error)
	// ManagedNamespaces opts in every Etcd of the namespaces it matches
	// (--manage-etcds-in-namespaces): one without an EtcdMembership gets
	// one with ordinalStart 0, so that gardenlet's Etcds need no object of
	// druid-stretch's for a live move. The webhook needs the same selector.
	ManagedNamespaces etcdview.NamespaceOptIn
	// AfterStepSent is a failpoint for fault-injection tests: when set, it is
	// called once a change's sidecar call returned, before anything is
	// reported. Returning true ends the reconcile as if the process died
	// right there: no status, no event, no metric. The step's record in
	// etcd (the sidecar's) is all a successor finds.
	AfterStepSent func(step planner.Step, res sidecarcluster.Result) bool
}

// DefaultProgressInterval is Options.ProgressInterval's default. A move
// waits on its members a dozen times (a learner starting its etcd, not
// answering yet after its snapshot, settling for etcd's 5 s), and each
// wait's end goes unseen for half this on average: at 1 s, the waits of a
// move at 180 ms RTT were looked at every 1.25 s. Each look is one
// observation through a sidecar, and only an Etcd whose membership is
// changing is looked at this often.
const DefaultProgressInterval = 250 * time.Millisecond

// DefaultMaxLearners is the controller command's --max-learners (and the
// chart's controller.maxLearners): a three-member destination joins side
// by side instead of one member after another, each start and snapshot
// overlapping the others'. etcd's own default is 1; the command's webhook
// raises it in the pods of the Etcds druid-stretch manages, and an etcd
// that still refuses the second learner makes the controller plan with its
// limit (an event says so).
const DefaultMaxLearners = 3

func (o *Options) setDefaults() {
	if o.LearnerProgressTimeout <= 0 {
		o.LearnerProgressTimeout = 5 * time.Minute
	}
	if o.MinLearnerHealthy <= 0 {
		o.MinLearnerHealthy = 5 * time.Second
	}
	if o.DownVoterGrace <= 0 {
		o.DownVoterGrace = planner.DefaultDownVoterGrace
	}
	if o.MaxLearners <= 0 {
		o.MaxLearners = 1
	}
	if o.ProgressInterval <= 0 {
		o.ProgressInterval = DefaultProgressInterval
	}
	if o.ConvergedInterval <= 0 {
		o.ConvergedInterval = 30 * time.Second
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = 30 * time.Second
	}
	if o.MaxConcurrentReconciles <= 0 {
		o.MaxConcurrentReconciles = 4
	}
	if o.LookupHost == nil {
		o.LookupHost = net.DefaultResolver.LookupHost
	}
}

// Dependencies are what the Reconciler talks to.
type Dependencies struct {
	// Client writes status (the manager's client).
	Client client.Client
	// APIReader reads Etcd objects straight from the API server (the
	// manager's GetAPIReader): a reconcile that follows its predecessor by
	// a second must see the status that one wrote, and a cache may lag.
	APIReader client.Reader
	// Resolver reaches the local members.
	Resolver Resolver
	// Recorder emits an Event per step.
	Recorder events.EventRecorder
	// Metrics are the controller's metrics.
	Metrics *Metrics
}

// Reconciler is the membership controller.
type Reconciler struct {
	client   client.Client
	reader   client.Reader
	resolver Resolver
	recorder events.EventRecorder
	metrics  *Metrics
	opts     Options
	cluster  *sidecarcluster.Cluster

	// started is when this process's reconciler began: a lastStep older
	// than that was written by an earlier process.
	started time.Time

	mu       sync.Mutex
	failures map[types.NamespacedName]int
	tieSince map[types.NamespacedName]time.Time
	// learnerCap is the learner limit etcd enforced for an Etcd, learned
	// from its refusal (ErrTooManyLearners), when below MaxLearners.
	learnerCap map[types.NamespacedName]int
	// waiting is the wait last logged per Etcd (logWait), cleared by any
	// other step.
	waiting map[types.NamespacedName]string
	// cas are the Etcds' sidecar CAs (SidecarCAFromEtcd).
	cas sidecarCAs
	// tlsChecks are the Etcds' last checks of their TLS Secrets
	// (SidecarCAFromEtcd).
	tlsChecks tlsChecks
}

// NewReconciler returns the controller; register it with SetupWithManager.
func NewReconciler(d Dependencies, o Options) (*Reconciler, error) {
	o.setDefaults()
	if o.ClusterIdentity == "" {
		return nil, errors.New("membership controller: the cluster identity is empty; it names this controller in the membership lock")
	}
	if d.Client == nil || d.APIReader == nil || d.Resolver == nil || d.Recorder == nil || d.Metrics == nil {
		return nil, errors.New("membership controller: client, API reader, resolver, event recorder and metrics are all required")
	}
	mc := o.Membership
	mc.Holder, mc.TLS, mc.LocalSide = o.ClusterIdentity, o.SidecarTLS, sideLocal
	cluster, err := sidecarcluster.New(mc)
	if err != nil {
		return nil, fmt.Errorf("membership controller: %w", err)
	}
	return &Reconciler{
		client: d.Client, reader: d.APIReader, resolver: d.Resolver, recorder: d.Recorder, metrics: d.Metrics, opts: o, cluster: cluster,
		started:  time.Now(),
		failures: map[types.NamespacedName]int{}, tieSince: map[types.NamespacedName]time.Time{}, learnerCap: map[types.NamespacedName]int{},
		waiting: map[types.NamespacedName]string{},
	}, nil
}

// SetupWithManager watches Etcd and EtcdMembership objects. Status updates
// do not trigger a reconcile (the controller writes them itself); the
// requeue intervals do.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("etcd-membership").
		For(&v1alpha1.Etcd{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		// An EtcdMembership has its Etcd's name: a change of its spec is
		// a change of that Etcd's.
		Watches(&stretchv1alpha1.EtcdMembership{}, &handler.EnqueueRequestForObject{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		WithOptions(controller.Options{MaxConcurrentReconciles: r.opts.MaxConcurrentReconciles}).
		Complete(r)
}

// Reconcile runs one round for one Etcd: observe, plan, execute at most one
// step, and write status.membership on every return path.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, retErr error) {
	p, err := etcdview.Get(ctx, r.reader, req.NamespacedName)
	if err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.NamespacedName)
			return ctrl.Result{}, etcdview.Detached(ctx, r.client, req.NamespacedName)
		}
		return ctrl.Result{}, err
	}
	// sts is nil until druid has created the Etcd's StatefulSet.
	sts, err := r.statefulSet(ctx, p.View)
	if err != nil {
		return ctrl.Result{}, err
	}
	// An Etcd whose StatefulSet runs on another pod window of
	// druid-stretch's than druid's own and whose fields are gone is lost
	// state, reported below, never opted in from ordinalStart 0 (a move
	// would undo itself).
	if webhook.NamespaceMayOptIn(sts, p.Etcd) {
		if err := r.opts.ManagedNamespaces.Apply(ctx, r.reader, p); err != nil {
			return ctrl.Result{}, err
		}
	}
	e := p.View
	if !e.DeletionTimestamp.IsZero() {
		// druid tears the cluster down; removing members one by one first
		// would only slow that down.
		return ctrl.Result{}, nil
	}
	// Before anything is planned: an Etcd that carries druid-stretch's
	// fields inline has them copied into its EtcdMembership, where druid's
	// own CRD cannot prune them; one its namespace opts in gets its
	// EtcdMembership.
	if _, err := etcdview.Adopt(ctx, r.client, p); err != nil {
		return ctrl.Result{}, err
	}
	ctx = context.WithValue(ctx, relatedKey{}, p.Membership)
	r.metrics.ExtensionLost.DeleteLabelValues(e.Namespace, e.Name) // set again below while the fields are gone
	if !e.UsesExtension() {
		if w, ok := podWindowOf(sts); ok {
			// Planned without its fields, the Etcd would read as druid's
			// ordinals 0..replicas-1, and a move would undo itself.
			r.extensionLost(ctx, e, w)
			return ctrl.Result{RequeueAfter: r.opts.ConvergedInterval}, nil
		}
		if e.Status.Membership == nil {
			// A plain Etcd is druid's alone: it has no sidecars to ask. One
			// that used the extension before keeps being observed.
			return ctrl.Result{}, nil
		}
	}
	s := newScope(e, r.opts.ClusterIdentity)
	s.sts, s.running = sts, members.RunningOrdinals(sts)
	s.invalid = bootstrapConflicts(p)
	if err := r.completeBootstrap(e); err != nil {
		s.invalid = append(s.invalid, field.Invalid(field.NewPath("spec", "etcd", "bootstrapWithExistingCluster", "members"), nil, err.Error()))
	}
	defer func() {
		if s.died {
			return
		}
		s.finish()
		r.metrics.ObserveStatus(s.etcd)
		if err := etcdview.WriteStatus(ctx, r.client, p); err != nil {
			if !apierrors.IsNotFound(err) {
				retErr = errors.Join(retErr, err)
			}
			return
		}
		r.syncPodWindow(ctx, s.etcd, s.podWindow())
	}()
	return r.reconcile(logf.IntoContext(ctx, logf.FromContext(ctx).WithValues("etcd", req.NamespacedName)), s)
}

func (r *Reconciler) reconcile(ctx context.Context, s *scope) (ctrl.Result, error) {
	e, key := s.etcd, types.NamespacedName{Namespace: s.etcd.Namespace, Name: s.etcd.Name}
	if errs := append(validation.ValidateEtcd(e), s.invalid...); len(errs) > 0 {
		s.blocked(reasonInvalidSpec, "the spec is invalid, so no member is changed: "+errs.ToAggregate().Error())
		return ctrl.Result{RequeueAfter: r.opts.ConvergedInterval}, nil
	}
	if members.Hibernated(e) {
		// The pods are going away (members.PodWindow is empty): asking
		// their sidecars would only report an unreachable cluster. A
		// hibernated Etcd lists no external member: its slice of their peer
		// names goes (the source after a move).
		r.syncPeerNames(ctx, e, nil)
		s.scaledToZero()
		return ctrl.Result{RequeueAfter: r.opts.ConvergedInterval}, nil
	}
	sidecarTLS, err := r.sidecarTLS(ctx, e)
	if err != nil {
		s.blocked(reasonSidecarCA, err.Error()+"; no sidecar is called, so no member is changed")
		return r.backoff(key, 0), nil
	}
	if err := r.checkTLSSecrets(ctx, e); err != nil {
		s.blocked(reasonTLSSecretInvalid, strings.ReplaceAll(err.Error(), "\n", "; ")+"; no sidecar is called, so no member is added, started or changed with them")
		return r.backoff(key, 0), nil
	}
	eps, hint, err := r.reach(e, s.running, sidecarTLS)
	if err != nil {
		s.blocked(reasonResolverFailed, err.Error())
		return r.backoff(key, 0), nil
	}
	obs, err := r.cluster.Observe(ctx, eps, hint)
	if err != nil {
		if ctx.Err() != nil {
			return ctrl.Result{}, ctx.Err()
		}
		switch started, detail, berr := r.bootstrap(ctx, e, s.sts, sidecarTLS); {
		case berr != nil:
			s.blocked(v1alpha1.ReasonBootstrapping, berr.Error())
			return r.backoff(key, 0), nil
		case started:
			r.event(ctx, e, corev1.EventTypeNormal, v1alpha1.ReasonBootstrapping, "Bootstrap", "no cluster existed: the pods start a new one with the initial cluster %s", detail)
			s.reconfiguring(v1alpha1.ReasonBootstrapping, "the pods start a new etcd cluster: "+detail)
			return ctrl.Result{RequeueAfter: r.opts.ProgressInterval}, nil
		default:
			logf.FromContext(ctx).V(1).Info("not bootstrapping", "why", detail)
		}
		s.unreachable(err)
		return r.backoff(key, 0), nil
	}
	if unknown := unknownSourceMembers(e, obs); len(unknown) > 0 {
		s.blocked(reasonInvalidSpec, fmt.Sprintf("the cluster the sidecars reach has no member like %s: the Etcd names a cluster to join that is not this one, so no member is added", strings.Join(unknown, "; ")))
		return ctrl.Result{RequeueAfter: r.opts.ConvergedInterval}, nil
	}
	// Which sidecar's view the plan below rests on: a voter's transport
	// evidence (how long it has had a member connected) is its own.
	ctx = logf.IntoContext(ctx, logf.FromContext(ctx).WithValues("observedVia", obs.Via.Member))
	s.adoptRecordedStep(obs.List.Step, r.cluster.Holder(), r.cluster.Token(), r.started)
	// Before admitting a learner: its etcd resolves these names as it starts.
	r.syncPeerNames(ctx, e, obs)
	r.admitLearners(ctx, e, s.running, obs, sidecarTLS)
	r.nameUnstartedLearner(e, s.st.LastStep, obs)
	t, err := r.target(e, s.running, obs)
	if err != nil {
		s.blocked(reasonResolverFailed, err.Error())
		return r.backoff(key, 0), nil
	}
	if err := r.notePodsWaiting(ctx, e, s, obs, &t, sidecarTLS); err != nil {
		s.blocked(reasonResolverFailed, err.Error())
		return r.backoff(key, 0), nil
	}
	progress := sidecarcluster.NewProgress(learnersFromStatus(s.st.Learners))
	pending := pendingStep(s.st.LastStep, &t)
	plan := r.cluster.Plan(obs, t, progress, pending, planner.Policy{
		MinHealthyFor:          r.opts.MinLearnerHealthy,
		DownVoterGrace:         r.opts.DownVoterGrace,
		LearnerProgressTimeout: r.opts.LearnerProgressTimeout,
		MaxLearners:            r.maxLearners(key),
	})
	s.observed(obs, t, progress, plan.Input)
	r.metrics.ObserveLearners(key, obs.List)
	if pending != nil {
		if settled, applied := r.cluster.Settled(*pending, obs); settled {
			s.settle(applied)
		}
	}
	// An observation only ends a tie: it is timed from the change that made
	// it, which this controller's own steps report. A tie that another
	// controller made and ended between two of this one's observations
	// (seconds apart, up to a backoff) would otherwise be timed by them.
	if !sidecarcluster.Tie(plan.Input.Members) {
		r.noteTie(key, false, obs.At)
	}
	r.holdStalledLearner(s, &plan)

	if len(plan.Unretire) > 0 {
		if err := r.cluster.Unretire(ctx, obs, plan); err != nil {
			s.degraded(reasonRetirementRecords, fmt.Sprintf("the target wants %s again, but deleting this controller's retirement records failed: %v", strings.Join(plan.Unretire, ", "), err))
			return r.backoff(key, 0), nil
		}
		r.event(ctx, e, corev1.EventTypeNormal, "RetirementWithdrawn", "Unretire", "%s may join again: %s no longer retires it", strings.Join(plan.Unretire, ", "), r.opts.ClusterIdentity)
		return ctrl.Result{RequeueAfter: time.Millisecond}, nil
	}

	switch plan.Step.Kind {
	case planner.Done:
		if err := r.cluster.ReleaseLock(ctx, obs); err != nil {
			logf.FromContext(ctx).Info("releasing the membership lock failed; it expires on its own", "error", err.Error())
		}
		r.resetFailures(key)
		s.converged(plan.Step.Reason)
		return ctrl.Result{RequeueAfter: r.convergedPoll(e, obs)}, nil
	case planner.Wait:
		r.logWait(ctx, key, plan)
		word := waitWord(plan.Step.Reason)
		if plan.Step.Rule == planner.RuleTargetSize {
			// The members this controller waits for are the other
			// controller's to add (an aborted move's source): it needs the
			// lock for that.
			if err := r.cluster.ReleaseLock(ctx, obs); err != nil {
				logf.FromContext(ctx).Info("releasing the membership lock failed; it expires on its own", "error", err.Error())
			}
			s.reconfiguring(word, plan.Step.Reason)
			return ctrl.Result{RequeueAfter: r.opts.ProgressInterval}, nil
		}
		if err := r.cluster.RenewLock(ctx, obs); err != nil {
			logf.FromContext(ctx).Info("renewing the membership lock failed", "error", err.Error())
		}
		switch word {
		case v1alpha1.ReasonWaitingForLearner, v1alpha1.ReasonWaitingForMemberStart, v1alpha1.ReasonWaitingForPod, reasonOutcomeUncertain, sidecarcluster.ReasonChangeInFlight:
			// Progress comes within seconds, by itself: poll for it at the
			// progress interval, not with the failure backoff, and do not
			// call the Etcd degraded meanwhile.
			s.reconfiguring(word, plan.Step.Reason)
			return ctrl.Result{RequeueAfter: r.pollAfter(plan.Step)}, nil
		}
		if word == v1alpha1.ReasonWaitingForDownVoter {
			// It ends by itself, when the voter's pod is back or the grace
			// runs out: poll for it, and call the Etcd degraded meanwhile,
			// since one of its voters is down.
			s.blocked(word, plan.Step.Reason)
			return ctrl.Result{RequeueAfter: r.pollAfter(plan.Step)}, nil
		}
		if plan.Step.Rule == planner.RuleQuorum && plan.Step.ReadyIn > 0 {
			// Voters promoted moments ago settle in etcd's strict
			// reconfiguration count: the removal waiting for them comes
			// by itself, and no quorum is at risk.
			s.reconfiguring(v1alpha1.ReasonWaitingForVoters, plan.Step.Reason)
			return ctrl.Result{RequeueAfter: r.pollAfter(plan.Step)}, nil
		}
		s.blocked(conditionReason(word), plan.Step.Reason)
		return r.backoff(key, 0), nil
	}
	r.logWait(ctx, key, plan)
	return r.execute(ctx, s, key, obs, eps, plan, progress)
}

// durations are the figures a wait's reason updates on every poll.
var durations = regexp.MustCompile(`[0-9][0-9.]*(ns|µs|ms|s|m|h)`)

// logWait logs a wait when it begins or its cause changes, so that the log
// tells where a reconfiguration spent its time between the steps it
// executed; status.conditions keeps only the latest. A wait's figures
// (how long a member has been connected, and so on) change on every poll
// and do not count as a new wait. The members as the planner saw them go
// with it: they are what the wait can be checked against.
func (r *Reconciler) logWait(ctx context.Context, key types.NamespacedName, plan sidecarcluster.Plan) {
	s := plan.Step
	r.mu.Lock()
	defer r.mu.Unlock()
	if s.Kind != planner.Wait {
		delete(r.waiting, key)
		return
	}
	cause := s.Rule + " " + durations.ReplaceAllString(s.Reason, "")
	if r.waiting[key] == cause {
		return
	}
	r.waiting[key] = cause
	logf.FromContext(ctx).Info("membership step waits", "rule", s.Rule, "reason", s.Reason, "members", planner.Detail(plan.Input.Members))
}

// execute runs one change and reports it.
func (r *Reconciler) execute(ctx context.Context, s *scope, key types.NamespacedName, obs *sidecarcluster.Observation, eps []sidecarcluster.Endpoint, plan sidecarcluster.Plan, progress *sidecarcluster.Progress) (ctrl.Result, error) {
	step := plan.Step
	res := r.cluster.Execute(ctx, obs, eps, plan)
	if r.opts.AfterStepSent != nil && res.Reason != sidecarcluster.ReasonLockAcquired && r.opts.AfterStepSent(step, res) {
		s.died = true
		return ctrl.Result{}, nil
	}
	if res.Reason == sidecarcluster.ReasonLockAcquired {
		s.reconfiguring(v1alpha1.ReasonWaitingForLock, "took the membership lock; planning again under it")
		return ctrl.Result{RequeueAfter: time.Millisecond}, nil
	}
	end := res.Start.Add(res.Duration)
	r.metrics.ObserveStep(key, res)
	stalled := step.Rule == planner.RuleStuckLearner
	switch res.Outcome {
	case sidecarcluster.Succeeded:
		r.resetFailures(key)
		if step.Kind == planner.Promote && res.Changed {
			if l, ok := progress.Learner(step.ID); ok {
				r.metrics.LearnerCatchUp.Observe(end.Sub(l.FirstSeen).Seconds())
			}
		}
		after := project(plan.Input.Members, step)
		if res.ThenRemoved {
			// The promotion made a tie and the removal right after it
			// ended it, in one sidecar call.
			r.noteTie(key, sidecarcluster.Tie(after), end.Add(-res.Gap))
			after = project(after, *plan.ThenRemove)
		}
		r.noteTie(key, sidecarcluster.Tie(after), end)
		s.stepDone(step, res, stalled)
		if stalled {
			r.event(ctx, s.etcd, corev1.EventTypeWarning, v1alpha1.ReasonLearnerStalled, string(step.Kind), "removed learner %s: %s; it is added again after %s", stepLabel(step), step.Reason, r.opts.LearnerProgressTimeout)
		} else {
			r.event(ctx, s.etcd, corev1.EventTypeNormal, stepEventReason(step.Kind), string(step.Kind), "%s %s: %s (through %s)", step.Kind, stepLabel(step), step.Reason, res.Via)
		}
		if res.ThenRemoved {
			then := *plan.ThenRemove
			r.metrics.Steps.WithLabelValues(string(then.Kind), string(res.Outcome)).Inc()
			r.event(ctx, s.etcd, corev1.EventTypeNormal, stepEventReason(then.Kind), string(then.Kind), "%s %s right after the promotion, %.3f s later: %s (through %s)", then.Kind, stepLabel(then), res.Gap.Seconds(), then.Reason, res.Via)
		}
		// etcd applied the change before the sidecar answered: plan the
		// next one from a fresh observation now, not after the progress
		// interval. A learner just added is admitted by that reconcile
		// (its pod waits for it to start etcd); a transfer is made for the
		// change right behind it (rule 5's removal of the old leader, rule
		// 6's change that makes a tie only the leader's removal could
		// end); after the removal that ended a tie the leader may sit on
		// the side that lost the majority, where a cut between the sides
		// costs the other side an election, until the transfer planned
		// next. A next step that has to wait polls at its own pace. A step
		// that changed nothing (etcd had it already) is not repeated at
		// once: an observation that lags would plan it again.
		if !res.Changed && !res.ThenRemoved {
			return ctrl.Result{RequeueAfter: r.opts.ProgressInterval}, nil
		}
		return ctrl.Result{RequeueAfter: time.Millisecond}, nil
	case sidecarcluster.Retry:
		if res.Reason == sidecar.ReasonTooManyLearners {
			// etcd's --max-learners is lower than MaxLearners: nothing
			// changed, and no step failed; plan within etcd's limit.
			n := learners(obs)
			r.capLearners(key, n)
			s.reconfiguring(v1alpha1.ReasonWaitingForLearner, fmt.Sprintf("etcd refused %s %s: it accepts %d learners at a time (its --max-learners), fewer than the controller's --max-learners %d; planning with %d", step.Kind, stepLabel(step), n, r.opts.MaxLearners, n))
			r.event(ctx, s.etcd, corev1.EventTypeNormal, reasonLearnerLimit, string(step.Kind), "etcd accepts %d learners at a time (--max-learners), fewer than the controller's %d; the move goes on with %d", n, r.opts.MaxLearners, n)
			return ctrl.Result{RequeueAfter: time.Millisecond}, nil
		}
		s.stepRefused(step, res, false)
		switch res.Reason {
		case sidecar.ReasonMembershipChanged:
			return ctrl.Result{RequeueAfter: time.Millisecond}, nil
		case sidecar.ReasonLearnerNotReady:
			// The learner catches up (etcd's leader found its log behind:
			// a snapshot join takes seconds at a WAN's round trip), or the
			// sidecar saw its connection restart since the observation (a
			// learner applying its snapshot reconnects). Plan again from a
			// fresh observation, not after the sidecar's hint (when this
			// learner may go again): the planner then sees the same restart
			// and waits for it on its own, or promotes another learner that
			// is ready meanwhile; waiting out the hint held such a learner
			// for 5 s. The failure backoff waited up to 4 s longer than the
			// learner needed after three such answers. One that stops
			// progressing is removed (rule 8).
			return ctrl.Result{RequeueAfter: r.opts.ProgressInterval}, nil
		}
		return r.backoff(key, res.RetryAfter), nil
	case sidecarcluster.Uncertain:
		s.stepUncertain(step, res, end)
		r.event(ctx, s.etcd, corev1.EventTypeWarning, v1alpha1.ReasonStepFailed, string(step.Kind), "the outcome of %s %s is unknown; nothing else changes until it shows: %v", step.Kind, stepLabel(step), res.Err)
		return r.backoff(key, res.RetryAfter), nil
	default:
		s.stepRefused(step, res, true)
		r.event(ctx, s.etcd, corev1.EventTypeWarning, v1alpha1.ReasonStepFailed, string(step.Kind), "%s %s refused: %v", step.Kind, stepLabel(step), res.Err)
		return r.backoff(key, res.RetryAfter), nil
	}
}

// syncPodWindow puts druid's StatefulSet on the pod window w (scope's
// podWindow): druid rewrites its StatefulSet only on spec changes, so
// without this the pod of a removed member would run (and crash-loop)
// until the next one. A failure is reported, not returned: an error would
// trade the reconcile's requeue interval for the rate limiter's backoff,
// and a refused patch (druid's component protection without the exemption
// docs/install.md asks for) would then slow every membership step.
func (r *Reconciler) syncPodWindow(ctx context.Context, e *v1alpha1.Etcd, w members.Ordinals) {
	changed, err := webhook.SyncPodWindow(ctx, r.client, e, w)
	switch {
	case err != nil:
		logf.FromContext(ctx).Error(err, "the StatefulSet does not follow the pod window; druid's next update of it will", "window", w.String())
		r.event(ctx, e, corev1.EventTypeWarning, "PodWindowNotSynced", "SyncPodWindow", "%v", err)
	case changed:
		r.event(ctx, e, corev1.EventTypeNormal, "PodWindowMoved", "SyncPodWindow", "the StatefulSet keeps the pods of ordinals %s", w)
	}
}

// statefulSet is druid's StatefulSet of e, nil when there is none or it
// is not e's. What it runs is the durable fact of which members are e's:
// status.membership is a record that others can drop.
func (r *Reconciler) statefulSet(ctx context.Context, e *v1alpha1.Etcd) (*appsv1.StatefulSet, error) {
	sts := &appsv1.StatefulSet{}
	if err := r.client.Get(ctx, types.NamespacedName{Namespace: e.Namespace, Name: e.Name}, sts); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading the StatefulSet of the Etcd: %w", err)
	}
	if !metav1.IsControlledBy(sts, e) {
		return nil, nil
	}
	return sts, nil
}

// podWindowOf is the pod window the webhook put sts on, from its
// annotation; none when sts is nil.
func podWindowOf(sts *appsv1.StatefulSet) (string, bool) {
	if sts == nil {
		return "", false
	}
	w, ok := sts.Annotations[webhook.PodWindowAnnotation]
	return w, ok
}

// extensionLost reports an Etcd that no longer carries druid-stretch's
// fields while its StatefulSet runs druid-stretch's sidecar and pod window
// (window): a CRD without the fields pruned them, or someone removed them.
// Nothing is changed: the webhook refuses druid's next write of the
// StatefulSet, which would restart every pod without its sidecar.
func (r *Reconciler) extensionLost(ctx context.Context, e *v1alpha1.Etcd, window string) {
	msg := fmt.Sprintf("neither the Etcd nor an EtcdMembership of its name carries druid-stretch's fields (spec.ordinalStart, spec.externalMembers, spec.externalMembersPolicy), "+
		"but its StatefulSet runs druid-stretch's sidecar on the pod window %s; no member is changed, and druid's updates of the StatefulSet are refused until the fields are back", window)
	logf.FromContext(ctx).Info("druid-stretch's fields are gone from the Etcd; changing nothing", "etcd", client.ObjectKeyFromObject(e), "window", window)
	r.event(ctx, e, corev1.EventTypeWarning, reasonExtensionLost, "Observe", "%s", msg)
	r.metrics.ExtensionLost.WithLabelValues(e.Namespace, e.Name).Set(1)
}

// holdStalledLearner keeps a learner that was removed for making no
// progress from being added again at once: it waits LearnerProgressTimeout,
// and the removal stays reported meanwhile.
func (r *Reconciler) holdStalledLearner(s *scope, plan *sidecarcluster.Plan) {
	last := s.st.LastStep
	if plan.Step.Kind != planner.AddLearner || last == nil || last.Kind != v1alpha1.StepRemoveMember ||
		last.Reason != v1alpha1.ReasonLearnerStalled || last.Member != plan.Step.Member {
		return
	}
	if wait := r.opts.LearnerProgressTimeout - s.now.Sub(last.Time.Time); wait > 0 {
		plan.Step = planner.Step{Kind: planner.Wait, Rule: planner.RuleStuckLearner,
			Reason: fmt.Sprintf("%s: %s was removed at %s for making no progress; it is added again in %s", v1alpha1.ReasonLearnerStalled,
				last.Member, last.Time.UTC().Format(time.RFC3339), wait.Round(time.Second))}
	}
}

// backoff requeues after a failure: 1 s doubling per failure up to
// MaxBackoff, and never sooner than the sidecar's hint.
func (r *Reconciler) backoff(key types.NamespacedName, hint time.Duration) ctrl.Result {
	r.mu.Lock()
	r.failures[key]++
	n := r.failures[key]
	r.mu.Unlock()
	d := time.Second
	for i := 1; i < n && d < r.opts.MaxBackoff; i++ {
		d *= 2
	}
	return ctrl.Result{RequeueAfter: max(min(d, r.opts.MaxBackoff), hint)}
}

// readyMargin is added to a wait's ReadyIn: the sidecars count from their
// own scrape of the raft transport, so a poll exactly at ReadyIn may find
// a few milliseconds still missing.
const readyMargin = 50 * time.Millisecond

// pollAfter is when a wait that ends by itself is looked at again: once its
// known rest has passed, or at the progress interval, whichever is sooner.
func (r *Reconciler) pollAfter(step planner.Step) time.Duration {
	if step.ReadyIn > 0 && step.ReadyIn+readyMargin < r.opts.ProgressInterval {
		return step.ReadyIn + readyMargin
	}
	return r.opts.ProgressInterval
}

func (r *Reconciler) resetFailures(key types.NamespacedName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.failures, key)
}

func (r *Reconciler) forget(key types.NamespacedName) {
	r.metrics.Forget(key)
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.failures, key)
	delete(r.tieSince, key)
	delete(r.learnerCap, key)
	delete(r.waiting, key)
}

// maxLearners is the learner limit to plan key's moves with.
func (r *Reconciler) maxLearners(key types.NamespacedName) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c, ok := r.learnerCap[key]; ok {
		return c
	}
	return r.opts.MaxLearners
}

// capLearners lowers key's learner limit to n (at least 1), the learners
// etcd held when it refused one more.
func (r *Reconciler) capLearners(key types.NamespacedName, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.learnerCap[key] = max(n, 1)
}

// learners counts the learners of an observation.
func learners(obs *sidecarcluster.Observation) int {
	n := 0
	for _, m := range obs.List.Members {
		if m.IsLearner {
			n++
		}
	}
	return n
}

// noteTie accounts the time the voters spent in a tie.
func (r *Reconciler) noteTie(key types.NamespacedName, tie bool, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	since, in := r.tieSince[key]
	switch {
	case tie && !in:
		r.tieSince[key] = at
	case !tie && in:
		d := max(at.Sub(since), 0).Seconds()
		r.metrics.Ties.Observe(d)
		r.metrics.TieSeconds.Add(d)
		delete(r.tieSince, key)
	}
}

// project is the membership right after a successful step.
func project(ms []planner.Member, s planner.Step) []planner.Member {
	out := make([]planner.Member, 0, len(ms))
	for _, m := range ms {
		same := (s.ID != "" && strings.EqualFold(m.ID, s.ID)) || (s.ID == "" && m.Name == s.Member)
		switch {
		case same && s.Kind == planner.Remove:
			continue
		case same && s.Kind == planner.Promote:
			m.Learner = false
		}
		out = append(out, m)
	}
	return out
}

// relatedKey keys the EtcdMembership a reconcile read in its context.
type relatedKey struct{}

// event records an Event regarding the Etcd e, related to the
// EtcdMembership that ctx's reconcile read. events/v1 folds an Event into
// the series of an earlier one of the same reason, action and objects
// (resourceVersions included) and reports the later ones only as a count,
// every 30 minutes, their notes dropped. The controller writes the
// EtcdMembership's status, not the Etcd's: only the EtcdMembership's
// resourceVersion moves from one step to the next, so it keeps each step's
// Event its own.
func (r *Reconciler) event(ctx context.Context, e *v1alpha1.Etcd, eventType, reason, action, note string, args ...any) {
	var related runtime.Object
	if m, _ := ctx.Value(relatedKey{}).(*stretchv1alpha1.EtcdMembership); m != nil {
		related = m
	}
	r.recorder.Eventf(e, related, eventType, reason, action, note, args...)
}

func stepEventReason(k planner.StepKind) string {
	switch k {
	case planner.AddLearner:
		return "LearnerAdded"
	case planner.Promote:
		return "LearnerPromoted"
	case planner.MoveLeader:
		return "LeaderMoved"
	default:
		return "MemberRemoved"
	}
}

func stepLabel(s planner.Step) string {
	switch {
	case s.Member != "" && s.ID != "":
		return fmt.Sprintf("%s (%s)", s.Member, s.ID)
	case s.Member != "":
		return s.Member
	}
	return s.ID
}

// waitWord is the CamelCase word a planner Wait reason starts with.
func waitWord(reason string) string {
	word, _, _ := strings.Cut(reason, ":")
	return word
}

// nameUnstartedLearner gives an unstarted learner (etcd names a member only
// once it starts) the name of the member the last step acted on when their
// peer URLs agree. A learner this controller added whose pod then left the
// ordinal range (the Etcd scaled in, or a live move aborted, before the pod
// started) is otherwise matched to no target, so it would stay unmanaged
// and hold etcd's only learner slot for good; named, it is a departing
// local member and is removed.
func (r *Reconciler) nameUnstartedLearner(e *v1alpha1.Etcd, last *v1alpha1.MembershipStep, obs *sidecarcluster.Observation) {
	if last == nil || last.Member == "" {
		return
	}
	o, ok := members.Ordinal(e, last.Member)
	if !ok {
		return
	}
	urls, err := r.resolver.PeerURLs(e, last.Member, members.PodName(e, o))
	if err != nil {
		return
	}
	for i := range obs.List.Members {
		if m := &obs.List.Members[i]; m.Name == "" && m.IsLearner && slices.ContainsFunc(m.PeerURLs, func(u string) bool { return slices.Contains(urls, u) }) {
			m.Name = last.Member
		}
	}
}
