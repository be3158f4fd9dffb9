package membership

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the controller's Prometheus metrics.
type Metrics struct {
	// Steps counts executed steps by kind (AddLearner, Promote, MoveLeader,
	// Remove) and outcome (Succeeded, Retry, Refused, Uncertain).
	Steps *prometheus.CounterVec
	// StepDuration times the sidecar call of each step, by kind.
	StepDuration *prometheus.HistogramVec
	// LearnerCatchUp is the time from a learner's first observation to its
	// promotion.
	LearnerCatchUp prometheus.Histogram
	// TieSeconds accumulates the time during which no side held a majority
	// of the voters (a cut between the clusters would stop every write).
	TieSeconds prometheus.Counter
	// Ties times each tie from the change that made it to the change that
	// ended it.
	Ties prometheus.Histogram
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
			Help: "Duration of the sidecar call of each membership step, by kind.",
			// A local promotion takes milliseconds, a cross-site MoveLeader 0.6 s,
			// a removal waiting on etcd's strict reconfiguration check seconds.
			Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30},
		}, []string{"kind"}),
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
	}
	var err error
	if m.Steps, err = register(reg, m.Steps); err != nil {
		return nil, err
	}
	if m.StepDuration, err = register(reg, m.StepDuration); err != nil {
		return nil, err
	}
	if m.LearnerCatchUp, err = register(reg, m.LearnerCatchUp); err != nil {
		return nil, err
	}
	if m.TieSeconds, err = register(reg, m.TieSeconds); err != nil {
		return nil, err
	}
	if m.Ties, err = register(reg, m.Ties); err != nil {
		return nil, err
	}
	return m, nil
}

func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	if err != nil {
		return c, fmt.Errorf("registering the membership metrics: %w", err)
	}
	return c, nil
}
