package sidecar

import (
	"net/http"
	"os"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/druid-stretch/druid-stretch/internal/testing/docscheck"
)

// TestSidecarMetricsTableMatchesTheEndpoint holds docs/metrics.md's sidecar
// table to the metrics a sidecar registers, read back through promhttp.
func TestSidecarMetricsTableMatchesTheEndpoint(t *testing.T) {
	g := NewWithT(t)
	reg := prometheus.NewRegistry()
	m, err := newMetrics(reg)
	g.Expect(err).NotTo(HaveOccurred())
	m.observe("/v1/members", "add_learner", http.StatusOK, ReasonOK, time.Millisecond)
	exposed, err := docscheck.Scrape(reg)
	g.Expect(err).NotTo(HaveOccurred())

	md, err := os.ReadFile("../docs/metrics.md")
	g.Expect(err).NotTo(HaveOccurred())
	documented, err := docscheck.Metrics(string(md), "druid_stretch_sidecar_")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(documented).To(ConsistOf(exposed))
}
