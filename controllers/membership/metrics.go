package membership

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/internal/sidecarcluster"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// The per-Etcd series carry the Etcd's namespace and name as these labels.
const (
	labelNamespace = "namespace"
	labelEtcd      = "etcd"
)

// phases are every phase status.membership.phase takes: the phase gauge has
// a series for each, 1 for the current one, so an alert can ask for how
// long an Etcd has been in one.
var phases = []v1alpha1.MembershipPhase{
	v1alpha1.MembershipPhasePending, v1alpha1.MembershipPhaseConverged,
	v1alpha1.MembershipPhaseReconfiguring, v1alpha1.MembershipPhaseBlocked,
}

// origins are the sites a member can be on, as status.membership reports
// them: this cluster's pods, another cluster's (spec.externalMembers), or
// neither.
var origins = []v1alpha1.MemberOrigin{
	v1alpha1.MemberOriginLocal, v1alpha1.MemberOriginExternal, v1alpha1.MemberOriginUnmanaged,
}

// Metrics are the controller's Prometheus metrics.
type Metrics struct {
	// Steps counts executed steps by kind (AddLearner, Promote, MoveLeader,
	// Remove) and outcome (Succeeded, Retry, Refused, Uncertain).
	Steps *prometheus.CounterVec
	// StepDuration times the sidecar call of each step, by Etcd and kind.
	StepDuration *prometheus.HistogramVec
	// StepFailures counts steps that did not succeed, by Etcd, kind and
	// reason (the sidecar's or this controller's reason code).
	StepFailures *prometheus.CounterVec
	// Phase is 1 for the current status.membership.phase of each Etcd and
	// 0 for the other phases.
	Phase *prometheus.GaugeVec
	// Members counts each Etcd's voters (the leader included) and learners
	// per site (origin), as last observed.
	Members *prometheus.GaugeVec
	// HealthyVoters counts each Etcd's voters that answered healthy.
	HealthyVoters *prometheus.GaugeVec
	// LearnerLag is how many raft entries each learner is behind the leader.
	LearnerLag *prometheus.GaugeVec
	// LearnerCatchUp is the time from a learner's first observation to its
	// promotion.
	LearnerCatchUp prometheus.Histogram
	// TieSeconds accumulates the time during which no side held a majority
	// of the voters (a cut between the clusters would stop every write).
	TieSeconds prometheus.Counter
	// Ties times each tie from the change that made it to the change that
	// ended it.
	Ties prometheus.Histogram
	// ExtensionLost is 1 for an Etcd whose druid-stretch fields are gone
	// while its StatefulSet still runs druid-stretch's sidecar and pod
	// window: the controller changes nothing until they are back.
	ExtensionLost *prometheus.GaugeVec
}

// NewMetrics creates the metrics and registers them on reg (controller-
// runtime's metrics.Registry in the manager). Metrics registered earlier in
// the same process (a controller restarted in a test) are reused.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		Steps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "druid_stretch", Subsystem: "membership", Name: "steps_total",
			Help: "Membership steps executed through a sidecar, by kind and outcome (Succeeded, Retry, Refused, Uncertain).",
		}, []string{"kind", "outcome"}),
		StepDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "druid_stretch", Subsystem: "membership", Name: "step_duration_seconds",
			Help: "Duration of the sidecar call of each membership step, by Etcd and kind.",
			// A local promotion takes milliseconds, a cross-site MoveLeader 0.6 s,
			// a removal waiting on etcd's strict reconfiguration check seconds.
			Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30},
		}, []string{labelNamespace, labelEtcd, "kind"}),
		StepFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "druid_stretch", Subsystem: "membership", Name: "step_failures_total",
			Help: "Membership steps that did not succeed (outcome Retry, Refused or Uncertain), by Etcd, kind and reason.",
		}, []string{labelNamespace, labelEtcd, "kind", "reason"}),
		Phase: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "druid_stretch", Subsystem: "membership", Name: "phase",
			Help: "1 for the Etcd's current status.membership.phase (Pending, Converged, Reconfiguring, Blocked), 0 for the others.",
		}, []string{labelNamespace, labelEtcd, "phase"}),
		Members: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "druid_stretch", Subsystem: "membership", Name: "members",
			Help: "The Etcd's etcd members as last observed, by origin (Local, External, Unmanaged: the site) and role (voter, the leader included, or learner).",
		}, []string{labelNamespace, labelEtcd, "origin", "role"}),
		HealthyVoters: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "druid_stretch", Subsystem: "membership", Name: "healthy_voters",
			Help: "The Etcd's voting members that answered healthy when last observed.",
		}, []string{labelNamespace, labelEtcd}),
		LearnerLag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "druid_stretch", Subsystem: "membership", Name: "learner_lag_entries",
			Help: "Raft entries a learner is behind the leader, as its sidecar last reported.",
		}, []string{labelNamespace, labelEtcd, "member"}),
		LearnerCatchUp: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "druid_stretch", Subsystem: "membership", Name: "learner_catch_up_seconds",
			Help:    "Time from a learner's first observation to its promotion.",
			Buckets: []float64{1, 2.5, 5, 7.5, 10, 15, 20, 30, 60, 120, 300, 600},
		}),
		TieSeconds: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "druid_stretch", Subsystem: "membership", Name: "tie_seconds_total",
			Help: "Time spent with no side (local or external members) holding a majority of the voters.",
		}),
		Ties: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "druid_stretch", Subsystem: "membership", Name: "tie_duration_seconds",
			Help:    "Duration of each tie, from the change that made it to the change that ended it.",
			Buckets: []float64{0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60},
		}),
		ExtensionLost: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "druid_stretch", Subsystem: "membership", Name: "extension_lost",
			Help: "1 for an Etcd whose druid-stretch fields are gone while its StatefulSet runs druid-stretch's sidecar: nothing is changed until they are back.",
		}, []string{labelNamespace, labelEtcd}),
	}
	// A metric registered earlier in this process is taken over, so that
	// every field points at the collector the registry serves.
	if err := errors.Join(
		register(reg, &m.Steps), register(reg, &m.StepDuration), register(reg, &m.StepFailures),
		register(reg, &m.Phase), register(reg, &m.Members), register(reg, &m.HealthyVoters),
		register(reg, &m.LearnerLag), register(reg, &m.LearnerCatchUp), register(reg, &m.TieSeconds),
		register(reg, &m.Ties), register(reg, &m.ExtensionLost),
	); err != nil {
		return nil, err
	}
	return m, nil
}

func register[C prometheus.Collector](reg prometheus.Registerer, c *C) error {
	err := reg.Register(*c)
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			*c = existing
			return nil
		}
	}
	if err != nil {
		return fmt.Errorf("registering the membership metrics: %w", err)
	}
	return nil
}

// ObserveStep accounts an executed step: its outcome, the duration of its
// sidecar call and, unless it succeeded, its reason.
func (m *Metrics) ObserveStep(key types.NamespacedName, res sidecarcluster.Result) {
	kind := string(res.Step.Kind)
	m.Steps.WithLabelValues(kind, string(res.Outcome)).Inc()
	m.StepDuration.WithLabelValues(key.Namespace, key.Name, kind).Observe(res.Duration.Seconds())
	if res.Outcome != sidecarcluster.Succeeded {
		reason := res.Reason
		if reason == "" {
			reason = string(res.Outcome)
		}
		m.StepFailures.WithLabelValues(key.Namespace, key.Name, kind, reason).Inc()
	}
}

// ObserveStatus sets the per-Etcd gauges from the status.membership just
// computed: the phase, and voters and learners per origin. An Etcd without
// status.membership has no such series.
func (m *Metrics) ObserveStatus(e *v1alpha1.Etcd) {
	st := e.Status.Membership
	if st == nil {
		return
	}
	ns, name := e.Namespace, e.Name
	for _, p := range phases {
		v := 0.0
		if st.Phase == p {
			v = 1
		}
		m.Phase.WithLabelValues(ns, name, string(p)).Set(v)
	}
	type site struct {
		origin v1alpha1.MemberOrigin
		role   string
	}
	counts := map[site]int{}
	healthy := 0
	for _, mem := range st.Members {
		role := "voter"
		if mem.Role == v1alpha1.MemberRoleLearner {
			role = "learner"
		} else if mem.Healthy {
			healthy++
		}
		counts[site{mem.Origin, role}]++
	}
	for _, o := range origins {
		for _, role := range []string{"voter", "learner"} {
			m.Members.WithLabelValues(ns, name, string(o), role).Set(float64(counts[site{o, role}]))
		}
	}
	m.HealthyVoters.WithLabelValues(ns, name).Set(float64(healthy))
}

// ObserveLearners sets each learner's lag from a sidecar's member list and
// drops the series of members that are no longer learners.
func (m *Metrics) ObserveLearners(key types.NamespacedName, list *sidecar.MemberList) {
	m.LearnerLag.DeletePartialMatch(prometheus.Labels{labelNamespace: key.Namespace, labelEtcd: key.Name})
	if list == nil {
		return
	}
	for _, mem := range list.Members {
		if mem.IsLearner {
			name := mem.Name
			if name == "" {
				// Added but not started: etcd knows it by ID only.
				name = mem.ID
			}
			m.LearnerLag.WithLabelValues(key.Namespace, key.Name, name).Set(float64(mem.BehindLeader))
		}
	}
}

// Forget drops every per-Etcd series of a deleted Etcd.
func (m *Metrics) Forget(key types.NamespacedName) {
	match := prometheus.Labels{labelNamespace: key.Namespace, labelEtcd: key.Name}
	m.StepDuration.DeletePartialMatch(match)
	m.StepFailures.DeletePartialMatch(match)
	m.Phase.DeletePartialMatch(match)
	m.Members.DeletePartialMatch(match)
	m.HealthyVoters.DeletePartialMatch(match)
	m.LearnerLag.DeletePartialMatch(match)
	m.ExtensionLost.DeletePartialMatch(match)
}
