package sidecar

import (
	"fmt"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are registered on the registry passed in Config, never on the
// global one, so that several sidecars can live in one process (tests, the
// local member runtime).
type metrics struct {
	requests   *prometheus.CounterVec
	operations *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "druid_stretch",
			Subsystem: "sidecar",
			Name:      "requests_total",
			Help:      "HTTP requests answered by the sidecar, by endpoint, status code and outcome reason (OK on success).",
		}, []string{"endpoint", "code", "reason"}),
		operations: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "druid_stretch",
			Subsystem: "sidecar",
			Name:      "operation_duration_seconds",
			Help:      "Duration of membership operations (add_learner, promote, remove, move_leader, acquire_lock, release_lock), by outcome reason.",
			// From a local no-op (milliseconds) to a cross-site removal
			// waiting on etcd's strict reconfiguration check (seconds).
			Buckets: []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30},
		}, []string{"operation", "reason"}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.operations} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering sidecar metrics: %w", err)
		}
	}
	return m, nil
}

func (m *metrics) observe(endpoint, operation string, code int, reason string, took time.Duration) {
	m.requests.WithLabelValues(endpoint, strconv.Itoa(code), reason).Inc()
	if operation != "" {
		m.operations.WithLabelValues(operation, reason).Observe(took.Seconds())
	}
}
