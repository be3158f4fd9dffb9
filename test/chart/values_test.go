package chart

import (
	"testing"

	. "github.com/onsi/gomega"
	"helm.sh/helm/v3/pkg/lint/support"
)

// TestValuesRejected: wrong types, unknown keys and missing required values
// fail the render (helm install and helm template alike) with a message that
// names the value, and nothing is rendered.
func TestValuesRejected(t *testing.T) {
	cases := []struct {
		name   string
		values string
		// want are substrings of the error: the value's path and the reason.
		want []string
	}{
		{"missing image", `image: {repository: ""}`, []string{"at '/image/repository'", "minLength"}},
		{"missing cluster identity", `clusterIdentity: ""`, []string{"at '/clusterIdentity'"}},
		{"missing sidecar client TLS secret", `sidecarClientTLS: {secretName: ""}`, []string{"at '/sidecarClientTLS/secretName'"}},
		{"replicas as a string", `replicas: "2"`, []string{"at '/replicas': got string, want integer"}},
		{"zero replicas", `replicas: 0`, []string{"at '/replicas'", "minimum"}},
		{"fractional replicas", `replicas: 1.5`, []string{"at '/replicas'", "want integer"}},
		{"unknown top-level key", `replica: 2`, []string{"additional properties 'replica' not allowed"}},
		{"unknown nested key", `image: {tags: v1}`, []string{"at '/image'", "additional properties 'tags' not allowed"}},
		{"unknown key in a selector", `webhook: {statefulSetMutator: {objectSelector: {matchLabel: {a: b}}}}`,
			[]string{"at '/webhook/statefulSetMutator/objectSelector'", "additional properties 'matchLabel' not allowed"}},
		{"failure policy", `webhook: {etcdValidator: {failurePolicy: Never}}`, []string{"at '/webhook/etcdValidator/failurePolicy'", "'Fail', 'Ignore'"}},
		{"timeout too long", `webhook: {timeoutSeconds: 60}`, []string{"at '/webhook/timeoutSeconds'", "maximum"}},
		{"cert-manager enabled as a string", `webhook: {certManager: {enabled: "yes"}}`, []string{"at '/webhook/certManager/enabled': got string, want boolean"}},
		{"service monitor interval", `metrics: {serviceMonitor: {interval: 1.5s}}`, []string{"at '/metrics/serviceMonitor/interval'"}},
		{"learner timeout not a duration", `controller: {learnerProgressTimeout: "5 minutes"}`, []string{"at '/controller/learnerProgressTimeout'"}},
		{"sidecar port clashes with backup-restore", `sidecar: {port: 8080}`, []string{"at '/sidecar/port'"}},
		{"sidecar resource quantity", `sidecar: {resources: {requests: {cpu: lots}}}`, []string{"at '/sidecar/resources/requests/cpu'"}},
		{"unknown sidecar resource", `sidecar: {resources: {limits: {gpu: 1}}}`, []string{"at '/sidecar/resources/limits'", "'gpu'"}},
		{"pull policy", `image: {pullPolicy: Sometimes}`, []string{"at '/image/pullPolicy'"}},
		{"node selector value", `nodeSelector: {zone: 1}`, []string{"at '/nodeSelector/zone': got number, want string"}},
		{"toleration key", `tolerations: [{key: a, operator: Equals}]`, []string{"at '/tolerations/0/operator'"}},
		{"log level", `logLevel: verbose`, []string{"at '/logLevel'"}},
		{"cluster identity with capitals", `clusterIdentity: Seed-A`, []string{"at '/clusterIdentity'", "pattern"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			r, err := Render(Options{ReleaseName: "bad", Namespace: "ns", Values: values(t, tc.values), KubeVersion: kubeVersion})
			g.Expect(r).To(BeNil())
			g.Expect(err).To(MatchError(ContainSubstring("values don't meet the specifications of the schema")))
			for _, w := range tc.want {
				g.Expect(err.Error()).To(ContainSubstring(w))
			}
		})
	}
}

// TestRequiredWithoutSchema: with schema validation skipped
// (--skip-schema-validation), the templates still refuse a missing image,
// cluster identity or sidecar client Secret by name.
func TestRequiredWithoutSchema(t *testing.T) {
	cases := []struct{ values, want string }{
		{`image: {repository: ""}`, "image.repository is required"},
		{`clusterIdentity: ""`, "clusterIdentity is required"},
		{`sidecarClientTLS: {secretName: ""}`, "sidecarClientTLS.secretName is required"},
	}
	for _, tc := range cases {
		t.Run(tc.want, func(t *testing.T) {
			g := NewWithT(t)
			_, err := Render(Options{ReleaseName: "bad", Namespace: "ns", Values: values(t, tc.values), KubeVersion: kubeVersion, SkipSchemaValidation: true})
			g.Expect(err).To(MatchError(ContainSubstring(tc.want)))
		})
	}
}

// TestLint runs helm lint's checks through the SDK: the chart passes with
// the required values (information only, no warning or error), and lint
// reports bad values as an error naming the value.
func TestLint(t *testing.T) {
	t.Run("required values", func(t *testing.T) {
		g := NewWithT(t)
		msgs, err := Lint(values(t, ``), "druid-stretch-system", kubeVersion)
		g.Expect(err).NotTo(HaveOccurred())
		for _, m := range msgs {
			g.Expect(m.Severity).To(BeNumerically("<", support.WarningSev), "lint: %s", m)
		}
	})
	t.Run("every option", func(t *testing.T) {
		for _, opt := range chartOptions {
			g := NewWithT(t)
			msgs, err := Lint(values(t, opt.values), "druid-stretch-system", kubeVersion)
			g.Expect(err).NotTo(HaveOccurred())
			for _, m := range msgs {
				g.Expect(m.Severity).To(BeNumerically("<", support.WarningSev), "%s: lint: %s", opt.name, m)
			}
		}
	})
	t.Run("bad values", func(t *testing.T) {
		g := NewWithT(t)
		msgs, err := Lint(values(t, `replicas: many`), "druid-stretch-system", kubeVersion)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(msgs).To(ContainElement(And(
			HaveField("Severity", support.ErrorSev),
			HaveField("Err", MatchError(ContainSubstring("at '/replicas': got string, want integer"))),
		)))
	})
}
