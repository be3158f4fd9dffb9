package membership_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/apimachinery/pkg/types"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	membershipctrl "github.com/druid-stretch/druid-stretch/controllers/membership"
	"github.com/druid-stretch/druid-stretch/internal/planner"
	"github.com/druid-stretch/druid-stretch/internal/sidecarcluster"
	"github.com/druid-stretch/druid-stretch/internal/testing/docscheck"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// gather reads reg's families by name.
func gather(g Gomega, reg prometheus.Gatherer) map[string]*dto.MetricFamily {
	families, err := reg.Gather()
	g.Expect(err).NotTo(HaveOccurred())
	out := map[string]*dto.MetricFamily{}
	for _, f := range families {
		out[f.GetName()] = f
	}
	return out
}

// TestMetricsTableMatchesTheEndpoint holds docs/metrics.md's controller
// table to the metrics the controller registers: every
// druid_stretch_membership_* family the endpoint shows is a row with its
// type and labels, and every row is on the endpoint.
func TestMetricsTableMatchesTheEndpoint(t *testing.T) {
	g := NewWithT(t)
	reg := prometheus.NewRegistry()
	m, err := membershipctrl.NewMetrics(reg)
	g.Expect(err).NotTo(HaveOccurred())
	// One sample in every vector, so that each family is exposed.
	key := types.NamespacedName{Namespace: "shoot--p--s", Name: "etcd-main"}
	m.ObserveStep(key, sidecarcluster.Result{Step: planner.Step{Kind: planner.Promote}, Outcome: sidecarcluster.Retry, Reason: sidecar.ReasonLearnerNotReady})
	e := &v1alpha1.Etcd{}
	e.Namespace, e.Name = key.Namespace, key.Name
	e.Status.Membership = &v1alpha1.MembershipStatus{Phase: v1alpha1.MembershipPhaseConverged}
	m.ObserveStatus(e)
	m.ObserveLearners(key, &sidecar.MemberList{Members: []sidecar.Member{{Name: "b-etcd-main-3", IsLearner: true, BehindLeader: 7}}})
	m.LearnerCatchUp.Observe(1)
	m.TieSeconds.Add(1)
	m.Ties.Observe(1)
	m.ExtensionLost.WithLabelValues(key.Namespace, key.Name).Set(1)

	exposed, err := docscheck.Scrape(reg)
	g.Expect(err).NotTo(HaveOccurred())
	documented := metricsTable(g, "druid_stretch_membership_")
	g.Expect(documented).To(ConsistOf(exposed), "docs/metrics.md's controller table against /metrics")
}

// metricsTable reads the rows of docs/metrics.md whose names have prefix.
func metricsTable(g Gomega, prefix string) []docscheck.Metric {
	root, err := testbin.RepoRoot()
	g.Expect(err).NotTo(HaveOccurred())
	md, err := os.ReadFile(filepath.Join(root, "docs", "metrics.md"))
	g.Expect(err).NotTo(HaveOccurred())
	rows, err := docscheck.Metrics(string(md), prefix)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(rows).NotTo(BeEmpty())
	return rows
}

// TestPerEtcdMetricsOfARealCluster reads the per-Etcd gauges off the
// registry a running controller serves on /metrics, for a real 3-member cluster it
// manages, and sees them go with the Etcd.
func TestPerEtcdMetricsOfARealCluster(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t)
	etcd := e.newEtcd("mx", 3)
	druidStatefulSet(g, etcd)
	e.startController()
	converged(g, etcd, current, 90*time.Second, names("mx", 0, 1, 2)...)

	this := map[string]string{"namespace": etcd.Namespace, "etcd": etcd.Name}
	with := func(extra ...string) map[string]string {
		l := map[string]string{"namespace": etcd.Namespace, "etcd": etcd.Name}
		for i := 0; i < len(extra); i += 2 {
			l[extra[i]] = extra[i+1]
		}
		return l
	}
	g.Eventually(func(g Gomega) {
		f := gather(g, crmetrics.Registry)
		g.Expect(sample(f, "druid_stretch_membership_phase", with("phase", "Converged"))).To(Equal(1.0))
		g.Expect(sample(f, "druid_stretch_membership_phase", with("phase", "Reconfiguring"))).To(Equal(0.0))
		g.Expect(sample(f, "druid_stretch_membership_members", with("origin", "Local", "role", "voter"))).To(Equal(3.0))
		g.Expect(sample(f, "druid_stretch_membership_members", with("origin", "Local", "role", "learner"))).To(Equal(0.0))
		g.Expect(sample(f, "druid_stretch_membership_members", with("origin", "External", "role", "voter"))).To(Equal(0.0))
		g.Expect(sample(f, "druid_stretch_membership_healthy_voters", this)).To(Equal(3.0))
		g.Expect(has(f, "druid_stretch_membership_learner_lag_entries", this)).To(BeFalse(), "no learner, no lag series")
	}).WithTimeout(10 * time.Second).Should(Succeed())

	g.Expect(k8s.Delete(context.Background(), etcd)).To(Succeed())
	g.Eventually(func(g Gomega) {
		f := gather(g, crmetrics.Registry)
		for _, name := range []string{"druid_stretch_membership_phase", "druid_stretch_membership_members", "druid_stretch_membership_healthy_voters"} {
			g.Expect(has(f, name, this)).To(BeFalse(), "%s of the deleted Etcd", name)
		}
	}).WithTimeout(30 * time.Second).Should(Succeed())
}

// sample is the value of the gauge or counter of family name whose labels
// include want; -1 when there is none.
func sample(families map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	ms := matching(families, name, want)
	switch {
	case len(ms) == 0:
		return -1
	case ms[0].Gauge != nil:
		return ms[0].Gauge.GetValue()
	}
	return ms[0].Counter.GetValue()
}

func has(families map[string]*dto.MetricFamily, name string, want map[string]string) bool {
	return len(matching(families, name, want)) > 0
}

func matching(families map[string]*dto.MetricFamily, name string, want map[string]string) []*dto.Metric {
	f, ok := families[name]
	if !ok {
		return nil
	}
	var out []*dto.Metric
metric:
	for _, m := range f.Metric {
		got := map[string]string{}
		for _, l := range m.Label {
			got[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if got[k] != v {
				continue metric
			}
		}
		out = append(out, m)
	}
	return out
}

// TestStepAndLearnerMetrics: a failed step counts under its reason and a
// successful one does not; a learner's lag series goes once it is promoted.
func TestStepAndLearnerMetrics(t *testing.T) {
	g := NewWithT(t)
	reg := prometheus.NewRegistry()
	m, err := membershipctrl.NewMetrics(reg)
	g.Expect(err).NotTo(HaveOccurred())
	key := types.NamespacedName{Namespace: "ns", Name: "etcd-main"}
	this := map[string]string{"namespace": "ns", "etcd": "etcd-main"}
	promote := planner.Step{Kind: planner.Promote}

	m.ObserveStep(key, sidecarcluster.Result{Step: promote, Outcome: sidecarcluster.Refused, Reason: sidecar.ReasonQuorumAtRisk})
	m.ObserveStep(key, sidecarcluster.Result{Step: promote, Outcome: sidecarcluster.Refused, Reason: sidecar.ReasonQuorumAtRisk})
	m.ObserveStep(key, sidecarcluster.Result{Step: promote, Outcome: sidecarcluster.Uncertain})
	m.ObserveStep(key, sidecarcluster.Result{Step: promote, Outcome: sidecarcluster.Succeeded, Duration: time.Second})
	f := gather(g, reg)
	g.Expect(sample(f, "druid_stretch_membership_step_failures_total", map[string]string{"kind": "Promote", "reason": "QuorumAtRisk"})).To(Equal(2.0))
	g.Expect(sample(f, "druid_stretch_membership_step_failures_total", map[string]string{"kind": "Promote", "reason": "Uncertain"})).To(Equal(1.0), "no reason: the outcome")
	g.Expect(matching(f, "druid_stretch_membership_step_failures_total", this)).To(HaveLen(2))
	g.Expect(matching(f, "druid_stretch_membership_step_duration_seconds", this)[0].Histogram.GetSampleCount()).To(Equal(uint64(4)))

	m.ObserveLearners(key, &sidecar.MemberList{Members: []sidecar.Member{
		{Name: "b-3", IsLearner: true, BehindLeader: 120}, {ID: "8e9e05c52164694d", IsLearner: true}, {Name: "a-0"},
	}})
	f = gather(g, reg)
	g.Expect(sample(f, "druid_stretch_membership_learner_lag_entries", map[string]string{"member": "b-3"})).To(Equal(120.0))
	g.Expect(has(f, "druid_stretch_membership_learner_lag_entries", map[string]string{"member": "8e9e05c52164694d"})).To(BeTrue(), "an unstarted learner by its ID")
	g.Expect(matching(f, "druid_stretch_membership_learner_lag_entries", this)).To(HaveLen(2), "voters have no lag series")
	m.ObserveLearners(key, &sidecar.MemberList{Members: []sidecar.Member{{Name: "b-3"}, {Name: "a-0"}}})
	g.Expect(has(gather(g, reg), "druid_stretch_membership_learner_lag_entries", this)).To(BeFalse())
}
