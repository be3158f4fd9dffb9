package chart

import (
	"crypto/x509"
	"encoding/pem"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/druid-stretch/druid-stretch/controllers/membership"
)

// chartOption is one documented way to install the chart: its values (over
// requiredValues) and what the render must then contain. The same table
// drives the render checks and the install on the API server.
type chartOption struct {
	name   string
	values string
	// kinds counts the rendered objects by kind.
	kinds map[string]int
	check func(g *WithT, r *Rendered)
}

// baseKinds are the objects of every install.
func baseKinds(extra map[string]int) map[string]int {
	k := map[string]int{
		"ServiceAccount": 1, "ClusterRole": 1, "ClusterRoleBinding": 1, "Role": 1, "RoleBinding": 1,
		"Service": 2, "Deployment": 1, "MutatingWebhookConfiguration": 1, "ValidatingWebhookConfiguration": 1,
	}
	for kind, n := range extra {
		if n == 0 {
			delete(k, kind)
			continue
		}
		k[kind] = n
	}
	return k
}

var chartOptions = []chartOption{
	{
		name:   "defaults",
		values: ``,
		kinds:  baseKinds(map[string]int{"Secret": 1, "PodDisruptionBudget": 1}),
		check: func(g *WithT, r *Rendered) {
			ns := r.Options.Namespace
			dep := deployment(g, r)
			g.Expect(dep.Spec.Replicas).To(Equal(ptr.To[int32](2)))

			pod := dep.Spec.Template.Spec
			g.Expect(pod.SecurityContext.RunAsNonRoot).To(Equal(ptr.To(true)))
			g.Expect(pod.SecurityContext.SeccompProfile.Type).To(Equal(corev1.SeccompProfileTypeRuntimeDefault))
			_, saName, err := r.ServiceAccount()
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(pod.ServiceAccountName).To(Equal(saName))

			g.Expect(controllerFlags(g, r)).NotTo(HaveKey("--manage-etcds-in-namespaces"), "only Etcds with an EtcdMembership are managed")
			g.Expect(controllerFlags(g, r)).NotTo(HaveKey("--membership-status-writers"), "the controller alone writes status.membership")
			for _, rule := range clusterRoleRules(g, r) {
				g.Expect(rule.Resources).NotTo(ContainElement("namespaces"), "no namespace is read without controller.manageEtcdsInNamespaces")
				g.Expect(rule.Resources).NotTo(ContainElement("secrets"), "no Secret is read without sidecarClientTLS.caFromEtcd")
			}
			g.Expect(controllerFlags(g, r)).To(HaveKey("--sidecar-ca-file"))
			g.Expect(controllerFlags(g, r)).NotTo(HaveKey("--sidecar-ca-from-etcd"))

			c := controllerContainer(g, dep)
			g.Expect(c.Image).To(Equal("registry.example.com/druid-stretch:0.1.0"), "tag defaults to appVersion")
			expectRestricted(g, c.SecurityContext, c.Name)
			g.Expect(c.Resources.Requests).To(HaveKey(corev1.ResourceCPU))
			g.Expect(c.Resources.Requests).To(HaveKey(corev1.ResourceMemory))
			g.Expect(c.LivenessProbe.HTTPGet.Path).To(Equal("/healthz"))
			g.Expect(c.ReadinessProbe.HTTPGet.Path).To(Equal("/readyz"))
			g.Expect(containerPort(g, c, c.LivenessProbe.HTTPGet.Port.String())).To(Equal(int32(8081)))
			g.Expect(containerPort(g, c, c.ReadinessProbe.HTTPGet.Port.String())).To(Equal(int32(8081)))

			args := controllerFlags(g, r)
			g.Expect(args).To(HaveKeyWithValue("--metrics-bind-address", ":8080"))
			g.Expect(args).To(HaveKeyWithValue("--health-probe-bind-address", ":8081"))
			g.Expect(args).To(HaveKeyWithValue("--leader-elect", "true"))
			g.Expect(args).To(HaveKeyWithValue("--leader-election-namespace", ns))
			g.Expect(args).To(HaveKeyWithValue("--cluster-identity", "seed-a"))
			g.Expect(args).To(HaveKeyWithValue("--webhook-port", "9443"))
			g.Expect(args).To(HaveKeyWithValue("--webhook-cert-dir", "/tmp/k8s-webhook-server/serving-certs"))
			g.Expect(args).To(HaveKeyWithValue("--sidecar-port", "8090"))
			g.Expect(args).To(HaveKeyWithValue("--learner-progress-timeout", "5m"))
			g.Expect(args).To(HaveKeyWithValue("--min-learner-healthy", "5s"))
			g.Expect(args).To(HaveKeyWithValue("--progress-interval", "250ms"))
			g.Expect(args).To(HaveKeyWithValue("--max-learners", strconv.Itoa(membership.DefaultMaxLearners)),
				"the chart gives the controller's own default: a three-member destination joins side by side")
			g.Expect(args).To(HaveKeyWithValue("--zap-log-level", "info"))
			g.Expect(args).To(HaveKeyWithValue("--sidecar-image", c.Image), "the sidecar defaults to the controller image")
			g.Expect(args).To(HaveKeyWithValue("--sidecar-image-pull-policy", "IfNotPresent"))
			g.Expect(args).To(HaveKeyWithValue("--sidecar-resources-requests-cpu", "20m"))
			g.Expect(args).To(HaveKeyWithValue("--sidecar-resources-requests-memory", "32Mi"))
			g.Expect(args).To(HaveKeyWithValue("--sidecar-resources-limits-memory", "128Mi"))
			g.Expect(args).NotTo(HaveKey("--sidecar-resources-limits-cpu"))
			g.Expect(args).NotTo(HaveKey("--sidecar-client-ca-secret-name"))

			// The files the flags name are where the Secrets are mounted.
			g.Expect(mountedFile(g, dep, c, args["--webhook-cert-dir"]+"/tls.crt")).To(Equal(r.fullname() + "-webhook-tls/tls.crt"))
			g.Expect(mountedFile(g, dep, c, args["--webhook-cert-dir"]+"/tls.key")).To(Equal(r.fullname() + "-webhook-tls/tls.key"))
			g.Expect(mountedFile(g, dep, c, args["--sidecar-ca-file"])).To(Equal("druid-stretch-sidecar-client/ca.crt"))
			g.Expect(mountedFile(g, dep, c, args["--sidecar-cert-file"])).To(Equal("druid-stretch-sidecar-client/tls.crt"))
			g.Expect(mountedFile(g, dep, c, args["--sidecar-key-file"])).To(Equal("druid-stretch-sidecar-client/tls.key"))

			// Services reach the pods on the ports the flags open.
			webhookSvc := service(g, r, r.fullname()+"-webhook")
			g.Expect(selects(webhookSvc.Spec.Selector, dep.Spec.Template.Labels)).To(BeTrue())
			g.Expect(containerPort(g, c, webhookSvc.Spec.Ports[0].TargetPort.String())).To(Equal(int32(9443)))
			metricsSvc := service(g, r, r.fullname()+"-metrics")
			g.Expect(selects(metricsSvc.Spec.Selector, dep.Spec.Template.Labels)).To(BeTrue())
			g.Expect(containerPort(g, c, metricsSvc.Spec.Ports[0].TargetPort.String())).To(Equal(int32(8080)))

			var pdb policyv1.PodDisruptionBudget
			g.Expect(r.Typed("PodDisruptionBudget", &pdb)).To(Succeed())
			g.Expect(pdb.Spec.MinAvailable.IntValue()).To(Equal(1))
			g.Expect(selects(pdb.Spec.Selector.MatchLabels, dep.Spec.Template.Labels)).To(BeTrue())

			mut, val := webhookConfigs(g, r)
			g.Expect(mut.Webhooks).To(HaveLen(1))
			g.Expect(val.Webhooks).To(HaveLen(4))
			m, v, mv, dv, sv := mut.Webhooks[0], val.Webhooks[0], val.Webhooks[1], val.Webhooks[2], val.Webhooks[3]
			g.Expect(*m.ClientConfig.Service).To(Equal(admissionregistrationv1.ServiceReference{
				Namespace: ns, Name: webhookSvc.Name, Path: ptr.To("/mutate-apps-v1-statefulset"), Port: ptr.To[int32](443)}))
			g.Expect(*v.ClientConfig.Service).To(Equal(admissionregistrationv1.ServiceReference{
				Namespace: ns, Name: webhookSvc.Name, Path: ptr.To("/validate-druid-gardener-cloud-v1alpha1-etcd"), Port: ptr.To[int32](443)}))
			g.Expect(webhookSvc.Spec.Ports[0].Port).To(Equal(int32(443)))
			g.Expect(*m.FailurePolicy).To(Equal(admissionregistrationv1.Fail))
			g.Expect(*v.FailurePolicy).To(Equal(admissionregistrationv1.Fail))
			g.Expect(m.ObjectSelector.MatchLabels).To(Equal(map[string]string{
				"app.kubernetes.io/managed-by": "etcd-druid", "app.kubernetes.io/component": "etcd-statefulset"}))
			g.Expect(m.Rules).To(HaveLen(1))
			g.Expect(m.Rules[0].Resources).To(Equal([]string{"statefulsets"}))
			g.Expect(v.Rules[0].Resources).To(Equal([]string{"etcds"}), "never etcds/status: druid's status writes must not need druid-stretch")
			g.Expect(v.MatchConditions).To(HaveLen(1))
			// The EtcdMembership's validator: druid-stretch's own objects
			// only, so that druid's and gardenlet's writes never wait for
			// it; their status too, which only the controller may change.
			g.Expect(*mv.ClientConfig.Service).To(Equal(admissionregistrationv1.ServiceReference{
				Namespace: ns, Name: webhookSvc.Name, Path: ptr.To("/validate-druid-stretch-druid-gardener-cloud-v1alpha1-etcdmembership"), Port: ptr.To[int32](443)}))
			g.Expect(*mv.FailurePolicy).To(Equal(admissionregistrationv1.Fail))
			g.Expect(mv.Rules).To(HaveLen(1))
			g.Expect(mv.Rules[0].APIGroups).To(Equal([]string{"druid-stretch.druid.gardener.cloud"}))
			g.Expect(mv.Rules[0].Resources).To(Equal([]string{"etcdmemberships", "etcdmemberships/status"}))
			g.Expect(mv.Rules[0].Operations).To(ConsistOf(admissionregistrationv1.Create, admissionregistrationv1.Update, admissionregistrationv1.Delete))
			// The Etcd deletion validator: every Etcd deletion (a stored
			// Etcd carries no field of druid-stretch's to match on), and
			// nothing else of an Etcd's.
			g.Expect(*dv.ClientConfig.Service).To(Equal(admissionregistrationv1.ServiceReference{
				Namespace: ns, Name: webhookSvc.Name, Path: ptr.To("/validate-druid-gardener-cloud-v1alpha1-etcd-delete"), Port: ptr.To[int32](443)}))
			g.Expect(*dv.FailurePolicy).To(Equal(admissionregistrationv1.Fail))
			g.Expect(dv.MatchConditions).To(BeEmpty())
			g.Expect(dv.Rules).To(HaveLen(1))
			g.Expect(dv.Rules[0].APIGroups).To(Equal([]string{"druid.gardener.cloud"}))
			g.Expect(dv.Rules[0].Resources).To(Equal([]string{"etcds"}))
			g.Expect(dv.Rules[0].Operations).To(Equal([]admissionregistrationv1.OperationType{admissionregistrationv1.Delete}))
			g.Expect(dv.ClientConfig.CABundle).To(Equal(m.ClientConfig.CABundle))
			// The scale validator: updates of the scale subresource only.
			g.Expect(*sv.ClientConfig.Service).To(Equal(admissionregistrationv1.ServiceReference{
				Namespace: ns, Name: webhookSvc.Name, Path: ptr.To("/validate-druid-gardener-cloud-v1alpha1-etcd-scale"), Port: ptr.To[int32](443)}))
			g.Expect(*sv.FailurePolicy).To(Equal(admissionregistrationv1.Fail))
			g.Expect(sv.Rules).To(HaveLen(1))
			g.Expect(sv.Rules[0].Resources).To(Equal([]string{"etcds/scale"}))
			g.Expect(sv.Rules[0].Operations).To(Equal([]admissionregistrationv1.OperationType{admissionregistrationv1.Update}))
			g.Expect(sv.ClientConfig.CABundle).To(Equal(m.ClientConfig.CABundle))

			// The self-signed certificate serves the Service's DNS names and
			// chains to the caBundle of both configurations.
			secret := unstructuredSecret(g, r, r.fullname()+"-webhook-tls")
			g.Expect(m.ClientConfig.CABundle).To(Equal(secret.Data["ca.crt"]))
			g.Expect(v.ClientConfig.CABundle).To(Equal(secret.Data["ca.crt"]))
			leaf := parseCert(g, secret.Data["tls.crt"])
			roots := x509.NewCertPool()
			g.Expect(roots.AppendCertsFromPEM(m.ClientConfig.CABundle)).To(BeTrue())
			for _, name := range []string{webhookSvc.Name + "." + ns + ".svc", webhookSvc.Name + "." + ns + ".svc.cluster.local"} {
				_, err := leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
				g.Expect(err).NotTo(HaveOccurred(), "serving certificate for %s", name)
			}
			g.Expect(leaf.NotAfter).To(BeTemporally(">", time.Now().AddDate(9, 0, 0)), "validityDays defaults to 3650")

			var crds []string
			for _, c := range r.CRDs {
				crds = append(crds, c.GetName())
			}
			// The chart's one CRD is its own; druid's Etcd CRD stays druid's
			// (expectLeavesCRDsAlone, for every option).
			g.Expect(crds).To(ConsistOf(membershipCRDName))
			// Helm never upgrades crds/, so the notes still say how to.
			g.Expect(r.Notes).To(ContainSubstring("kubectl apply --server-side"))
			g.Expect(r.Notes).To(ContainSubstring(membershipCRDName))
			g.Expect(r.Notes).NotTo(ContainSubstring("replaces"), "the notes tell of no CRD of druid's replaced")
		},
	},
	{
		name:   "one replica",
		values: `replicas: 1`,
		kinds:  baseKinds(map[string]int{"Secret": 1}),
		check: func(g *WithT, r *Rendered) {
			g.Expect(deployment(g, r).Spec.Replicas).To(Equal(ptr.To[int32](1)))
			g.Expect(r.OfKind("PodDisruptionBudget")).To(BeEmpty(), "minAvailable 1 of 1 would block every drain")
		},
	},
	{
		name:   "three replicas",
		values: `replicas: 3`,
		kinds:  baseKinds(map[string]int{"Secret": 1, "PodDisruptionBudget": 1}),
		check: func(g *WithT, r *Rendered) {
			g.Expect(deployment(g, r).Spec.Replicas).To(Equal(ptr.To[int32](3)))
		},
	},
	{
		name: "cert-manager with the chart's self-signed issuer",
		values: `
webhook:
  certManager:
    enabled: true
`,
		kinds: baseKinds(map[string]int{"PodDisruptionBudget": 1, "Issuer": 1, "Certificate": 1}),
		check: func(g *WithT, r *Rendered) {
			ns := r.Options.Namespace
			cert, err := r.One("Certificate")
			g.Expect(err).NotTo(HaveOccurred())
			secretName, _, _ := unstructured.NestedString(cert.Object, "spec", "secretName")
			g.Expect(secretName).To(Equal(r.fullname()+"-webhook-cert"), "a Secret of its own: switching modes never has Helm and cert-manager fight over one")
			dep := deployment(g, r)
			g.Expect(mountedFile(g, dep, controllerContainer(g, dep), "/tmp/k8s-webhook-server/serving-certs/tls.crt")).To(Equal(secretName + "/tls.crt"))
			dnsNames, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
			g.Expect(dnsNames).To(ContainElement(r.fullname() + "-webhook." + ns + ".svc"))
			issuer, err := r.One("Issuer")
			g.Expect(err).NotTo(HaveOccurred())
			ref, _, _ := unstructured.NestedStringMap(cert.Object, "spec", "issuerRef")
			g.Expect(ref).To(Equal(map[string]string{"name": issuer.GetName(), "kind": "Issuer", "group": "cert-manager.io"}))

			mut, val := webhookConfigs(g, r)
			for _, meta := range []map[string]string{mut.Annotations, val.Annotations} {
				g.Expect(meta).To(HaveKeyWithValue("cert-manager.io/inject-ca-from", ns+"/"+cert.GetName()))
			}
			g.Expect(mut.Webhooks[0].ClientConfig.CABundle).To(BeEmpty(), "cainjector fills it")
			g.Expect(val.Webhooks[0].ClientConfig.CABundle).To(BeEmpty(), "cainjector fills it")
		},
	},
	{
		name: "cert-manager with an existing ClusterIssuer",
		values: `
webhook:
  certManager:
    enabled: true
    issuerRef:
      name: corp-ca
      kind: ClusterIssuer
`,
		kinds: baseKinds(map[string]int{"PodDisruptionBudget": 1, "Certificate": 1}),
		check: func(g *WithT, r *Rendered) {
			cert, err := r.One("Certificate")
			g.Expect(err).NotTo(HaveOccurred())
			ref, _, _ := unstructured.NestedStringMap(cert.Object, "spec", "issuerRef")
			g.Expect(ref).To(Equal(map[string]string{"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}))
		},
	},
	{
		name: "ServiceMonitor",
		values: `
metrics:
  serviceMonitor:
    enabled: true
    interval: 15s
    labels:
      release: prometheus
`,
		kinds: baseKinds(map[string]int{"Secret": 1, "PodDisruptionBudget": 1, "ServiceMonitor": 1}),
		check: func(g *WithT, r *Rendered) {
			sm, err := r.One("ServiceMonitor")
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(sm.GetLabels()).To(HaveKeyWithValue("release", "prometheus"))
			sel, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
			metricsSvc := service(g, r, r.fullname()+"-metrics")
			webhookSvc := service(g, r, r.fullname()+"-webhook")
			g.Expect(selects(sel, metricsSvc.Labels)).To(BeTrue(), "selects the metrics Service")
			g.Expect(selects(sel, webhookSvc.Labels)).To(BeFalse(), "and not the webhook Service")
			eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
			g.Expect(eps).To(HaveLen(1))
			ep := eps[0].(map[string]any)
			g.Expect(ep["port"]).To(Equal(metricsSvc.Spec.Ports[0].Name))
			g.Expect(ep["interval"]).To(Equal("15s"))
			names, _, _ := unstructured.NestedStringSlice(sm.Object, "spec", "namespaceSelector", "matchNames")
			g.Expect(names).To(Equal([]string{r.Options.Namespace}))
		},
	},
	{
		name: "custom sidecar settings",
		values: `
sidecar:
  image:
    repository: registry.example.com/druid-stretch-debug
    tag: "1.2.3"
    pullPolicy: Always
  port: 8091
  clientCASecretName: druid-stretch-client-ca
  resources:
    requests:
      cpu: 100m
      memory: 64Mi
    limits:
      cpu: 1
      memory: 256Mi
`,
		kinds: baseKinds(map[string]int{"Secret": 1, "PodDisruptionBudget": 1}),
		check: func(g *WithT, r *Rendered) {
			args := controllerFlags(g, r)
			g.Expect(args).To(HaveKeyWithValue("--sidecar-image", "registry.example.com/druid-stretch-debug:1.2.3"))
			g.Expect(args).To(HaveKeyWithValue("--sidecar-image-pull-policy", "Always"))
			g.Expect(args).To(HaveKeyWithValue("--sidecar-port", "8091"))
			g.Expect(args).To(HaveKeyWithValue("--sidecar-client-ca-secret-name", "druid-stretch-client-ca"))
			g.Expect(args).To(HaveKeyWithValue("--sidecar-resources-requests-cpu", "100m"))
			g.Expect(args).To(HaveKeyWithValue("--sidecar-resources-requests-memory", "64Mi"))
			g.Expect(args).To(HaveKeyWithValue("--sidecar-resources-limits-cpu", "1"))
			g.Expect(args).To(HaveKeyWithValue("--sidecar-resources-limits-memory", "256Mi"))
			g.Expect(controllerContainer(g, deployment(g, r)).Image).To(Equal("registry.example.com/druid-stretch:0.1.0"), "the controller keeps its image")
		},
	},
	{
		name: "other writers of status.membership",
		values: `
webhook:
  membershipStatusWriters: [system:serviceaccount:garden:operator, alice]
`,
		kinds: baseKinds(map[string]int{"Secret": 1, "PodDisruptionBudget": 1}),
		check: func(g *WithT, r *Rendered) {
			g.Expect(controllerFlags(g, r)).To(HaveKeyWithValue("--membership-status-writers", "system:serviceaccount:garden:operator,alice"))
		},
	},
	{
		name: "every Etcd of the shoot namespaces",
		values: `
controller:
  manageEtcdsInNamespaces: gardener.cloud/role=shoot
`,
		kinds: baseKinds(map[string]int{"Secret": 1, "PodDisruptionBudget": 1}),
		check: func(g *WithT, r *Rendered) {
			g.Expect(controllerFlags(g, r)).To(HaveKeyWithValue("--manage-etcds-in-namespaces", "gardener.cloud/role=shoot"))
			g.Expect(clusterRoleRules(g, r)).To(ContainElement(rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"get"}}),
				"the controller and the webhook read the labels of an Etcd's namespace")
		},
	},
	{
		name: "each Etcd's sidecars verified with its own CA",
		values: `
sidecarClientTLS:
  secretName: druid-stretch-sidecar-client
  caFromEtcd: true
`,
		kinds: baseKinds(map[string]int{"Secret": 1, "PodDisruptionBudget": 1}),
		check: func(g *WithT, r *Rendered) {
			flags := controllerFlags(g, r)
			g.Expect(flags).To(HaveKeyWithValue("--sidecar-ca-from-etcd", "true"))
			g.Expect(flags).NotTo(HaveKey("--sidecar-ca-file"), "the controller refuses both")
			g.Expect(clusterRoleRules(g, r)).To(ContainElement(rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}}),
				"the controller reads each Etcd's CA Secret by name")
		},
	},
	{
		name: "webhook selectors, Ignore and timeouts",
		values: `
webhook:
  timeoutSeconds: 5
  namespaceSelector:
    matchLabels:
      druid-stretch.io/served: "true"
  statefulSetMutator:
    failurePolicy: Ignore
    namespaceSelector:
      matchExpressions:
      - key: gardener.cloud/role
        operator: In
        values: [shoot]
  etcdValidator:
    failurePolicy: Ignore
    objectSelector:
      matchLabels:
        druid-stretch.io/enabled: "true"
  etcdDeletionValidator:
    failurePolicy: Ignore
`,
		kinds: baseKinds(map[string]int{"Secret": 1, "PodDisruptionBudget": 1}),
		check: func(g *WithT, r *Rendered) {
			mut, val := webhookConfigs(g, r)
			m, v := mut.Webhooks[0], val.Webhooks[0]
			g.Expect(*m.FailurePolicy).To(Equal(admissionregistrationv1.Ignore))
			g.Expect(*v.FailurePolicy).To(Equal(admissionregistrationv1.Ignore))
			g.Expect(*m.TimeoutSeconds).To(Equal(int32(5)))
			g.Expect(*v.TimeoutSeconds).To(Equal(int32(5)))
			g.Expect(*val.Webhooks[2].FailurePolicy).To(Equal(admissionregistrationv1.Ignore), "Etcd deletions never wait for druid-stretch")
			g.Expect(*val.Webhooks[1].FailurePolicy).To(Equal(admissionregistrationv1.Fail))
			// webhook.namespaceSelector applies to both, each webhook's own
			// narrows, and the system namespaces are always left out.
			for _, sel := range []*metav1.LabelSelector{m.NamespaceSelector, v.NamespaceSelector} {
				g.Expect(sel.MatchLabels).To(Equal(map[string]string{"druid-stretch.io/served": "true"}))
				last := sel.MatchExpressions[len(sel.MatchExpressions)-1]
				g.Expect(last.Key).To(Equal("kubernetes.io/metadata.name"))
				g.Expect(last.Operator).To(Equal(metav1.LabelSelectorOpNotIn))
				g.Expect(last.Values).To(ContainElements("kube-system", "kube-public", "kube-node-lease"))
			}
			g.Expect(m.NamespaceSelector.MatchExpressions).To(HaveLen(2))
			g.Expect(m.NamespaceSelector.MatchExpressions[0].Values).To(Equal([]string{"shoot"}))
			g.Expect(v.NamespaceSelector.MatchExpressions).To(HaveLen(1))
			g.Expect(v.ObjectSelector.MatchLabels).To(Equal(map[string]string{"druid-stretch.io/enabled": "true"}))
		},
	},
	{
		name: "placement and pod metadata",
		values: `
image:
  tag: "0.2.0"
  pullPolicy: Always
imagePullSecrets:
- name: regcred
priorityClassName: system-cluster-critical
nodeSelector:
  worker.gardener.cloud/pool: system
tolerations:
- key: dedicated
  operator: Equal
  value: etcd
  effect: NoSchedule
affinity:
  podAntiAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
    - topologyKey: kubernetes.io/hostname
      labelSelector:
        matchLabels:
          app.kubernetes.io/name: druid-stretch
podLabels:
  team: etcd
podAnnotations:
  example.com/scrape: "false"
controller:
  learnerProgressTimeout: 10m
  minLearnerHealthy: 7s
  downVoterGrace: 90s
  progressInterval: 1s
logLevel: debug
`,
		kinds: baseKinds(map[string]int{"Secret": 1, "PodDisruptionBudget": 1}),
		check: func(g *WithT, r *Rendered) {
			dep := deployment(g, r)
			pod := dep.Spec.Template
			c := controllerContainer(g, dep)
			g.Expect(c.Image).To(Equal("registry.example.com/druid-stretch:0.2.0"))
			g.Expect(c.ImagePullPolicy).To(Equal(corev1.PullAlways))
			g.Expect(pod.Spec.ImagePullSecrets).To(Equal([]corev1.LocalObjectReference{{Name: "regcred"}}))
			g.Expect(pod.Spec.PriorityClassName).To(Equal("system-cluster-critical"))
			g.Expect(pod.Spec.NodeSelector).To(Equal(map[string]string{"worker.gardener.cloud/pool": "system"}))
			g.Expect(pod.Spec.Tolerations).To(HaveLen(1))
			g.Expect(pod.Spec.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution).To(HaveLen(1))
			g.Expect(pod.Labels).To(HaveKeyWithValue("team", "etcd"))
			g.Expect(pod.Annotations).To(HaveKeyWithValue("example.com/scrape", "false"))
			g.Expect(selects(dep.Spec.Selector.MatchLabels, pod.Labels)).To(BeTrue())
			args := controllerFlags(g, r)
			g.Expect(args).To(HaveKeyWithValue("--sidecar-image", "registry.example.com/druid-stretch:0.2.0"), "the sidecar follows the image tag")
			g.Expect(args).To(HaveKeyWithValue("--sidecar-image-pull-policy", "Always"), "and the pull policy")
			g.Expect(args).To(HaveKeyWithValue("--learner-progress-timeout", "10m"))
			g.Expect(args).To(HaveKeyWithValue("--min-learner-healthy", "7s"))
			g.Expect(args).To(HaveKeyWithValue("--down-voter-grace", "90s"))
			g.Expect(args).To(HaveKeyWithValue("--progress-interval", "1s"))
			g.Expect(args).To(HaveKeyWithValue("--zap-log-level", "debug"))
		},
	},
}

// TestRenderOptions renders the chart with the Helm SDK for each documented
// option and checks what it must contain.
func TestRenderOptions(t *testing.T) {
	for _, opt := range chartOptions {
		t.Run(opt.name, func(t *testing.T) {
			g := NewWithT(t)
			r := render(t, "stretch", "druid-stretch-system", values(t, opt.values))
			counts := map[string]int{}
			for _, o := range r.Objects {
				counts[o.GetKind()]++
				if o.GetKind() != "ClusterRole" && o.GetKind() != "ClusterRoleBinding" &&
					!strings.HasSuffix(o.GetKind(), "WebhookConfiguration") {
					g.Expect(o.GetNamespace()).To(Equal("druid-stretch-system"), "%s %s is namespaced in the release namespace", o.GetKind(), o.GetName())
				}
				g.Expect(o.GetLabels()).To(HaveKeyWithValue("app.kubernetes.io/instance", "stretch"), "%s %s", o.GetKind(), o.GetName())
			}
			g.Expect(counts).To(Equal(opt.kinds))
			expectLeavesCRDsAlone(g, renderedObjects(r))
			opt.check(g, r)
		})
	}
}

func (r *Rendered) fullname() string {
	if strings.Contains(r.Options.ReleaseName, "druid-stretch") {
		return r.Options.ReleaseName
	}
	return r.Options.ReleaseName + "-druid-stretch"
}

func deployment(g *WithT, r *Rendered) *appsv1.Deployment {
	var d appsv1.Deployment
	g.ExpectWithOffset(1, r.Typed("Deployment", &d)).To(Succeed())
	return &d
}

func controllerContainer(g *WithT, d *appsv1.Deployment) *corev1.Container {
	for i := range d.Spec.Template.Spec.Containers {
		if c := &d.Spec.Template.Spec.Containers[i]; c.Name == ControllerContainer {
			return c
		}
	}
	g.Expect(d.Spec.Template.Spec.Containers).To(ContainElement(HaveField("Name", ControllerContainer)))
	return nil
}

// clusterRoleRules are the rules of the chart's ClusterRole.
func clusterRoleRules(g *WithT, r *Rendered) []rbacv1.PolicyRule {
	var cr rbacv1.ClusterRole
	g.ExpectWithOffset(1, r.Typed("ClusterRole", &cr)).To(Succeed())
	return cr.Rules
}

// controllerFlags are the controller's --flag=value arguments as a map; the
// first argument must be the subcommand and no flag may repeat.
func controllerFlags(g *WithT, r *Rendered) map[string]string {
	args, err := r.ControllerArgs()
	g.ExpectWithOffset(1, err).NotTo(HaveOccurred())
	g.ExpectWithOffset(1, args).NotTo(BeEmpty())
	g.ExpectWithOffset(1, args[0]).To(Equal("controller"))
	out := map[string]string{}
	for _, a := range args[1:] {
		name, value, ok := strings.Cut(a, "=")
		g.ExpectWithOffset(1, ok).To(BeTrue(), "argument %q is --flag=value", a)
		g.ExpectWithOffset(1, out).NotTo(HaveKey(name), "flag %s given twice", name)
		out[name] = value
	}
	return out
}

// containerPort resolves a port name or number of c to the number.
func containerPort(g *WithT, c *corev1.Container, nameOrNumber string) int32 {
	for _, p := range c.Ports {
		if p.Name == nameOrNumber {
			return p.ContainerPort
		}
	}
	g.ExpectWithOffset(1, c.Ports).To(ContainElement(HaveField("Name", nameOrNumber)), "container port %s", nameOrNumber)
	return 0
}

// mountedFile follows a file path in container c to "<secret>/<key>".
func mountedFile(g *WithT, d *appsv1.Deployment, c *corev1.Container, path string) string {
	for _, m := range c.VolumeMounts {
		rel, ok := strings.CutPrefix(path, m.MountPath+"/")
		if !ok {
			continue
		}
		g.ExpectWithOffset(1, m.ReadOnly).To(BeTrue(), "mount %s is read-only", m.MountPath)
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Name != m.Name || v.Secret == nil {
				continue
			}
			for _, item := range v.Secret.Items {
				if item.Path == rel {
					return v.Secret.SecretName + "/" + item.Key
				}
			}
		}
	}
	g.ExpectWithOffset(1, path).To(BeEmpty(), "no Secret volume provides %s", path)
	return ""
}

func service(g *WithT, r *Rendered, name string) *corev1.Service {
	u, err := r.Get("Service", name)
	g.ExpectWithOffset(1, err).NotTo(HaveOccurred())
	var s corev1.Service
	g.ExpectWithOffset(1, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &s)).To(Succeed())
	return &s
}

func unstructuredSecret(g *WithT, r *Rendered, name string) *corev1.Secret {
	u, err := r.Get("Secret", name)
	g.ExpectWithOffset(1, err).NotTo(HaveOccurred())
	var s corev1.Secret
	g.ExpectWithOffset(1, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &s)).To(Succeed())
	return &s
}

func webhookConfigs(g *WithT, r *Rendered) (*admissionregistrationv1.MutatingWebhookConfiguration, *admissionregistrationv1.ValidatingWebhookConfiguration) {
	var m admissionregistrationv1.MutatingWebhookConfiguration
	var v admissionregistrationv1.ValidatingWebhookConfiguration
	g.ExpectWithOffset(1, r.Typed("MutatingWebhookConfiguration", &m)).To(Succeed())
	g.ExpectWithOffset(1, r.Typed("ValidatingWebhookConfiguration", &v)).To(Succeed())
	return &m, &v
}

func selects(selector, podLabels map[string]string) bool {
	return len(selector) > 0 && labels.SelectorFromSet(selector).Matches(labels.Set(podLabels))
}

func parseCert(g *WithT, pemBytes []byte) *x509.Certificate {
	block, _ := pem.Decode(pemBytes)
	g.ExpectWithOffset(1, block).NotTo(BeNil(), "PEM certificate")
	cert, err := x509.ParseCertificate(block.Bytes)
	g.ExpectWithOffset(1, err).NotTo(HaveOccurred())
	return cert
}

// TestControllerArgsWith: a test running the controller outside a pod
// replaces the chart's mount paths and ports; a flag the chart does not set
// is an error, not silently added.
func TestControllerArgsWith(t *testing.T) {
	g := NewWithT(t)
	r := render(t, "stretch", "druid-stretch-system", values(t, ``))
	args, err := r.ControllerArgsWith(map[string]string{
		"--webhook-cert-dir":     "/tmp/certs",
		"--metrics-bind-address": "127.0.0.1:0",
	})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(args).To(ContainElements("--webhook-cert-dir=/tmp/certs", "--metrics-bind-address=127.0.0.1:0", "--cluster-identity=seed-a"))
	g.Expect(args).NotTo(ContainElement("--webhook-cert-dir=/tmp/k8s-webhook-server/serving-certs"))
	_, err = r.ControllerArgsWith(map[string]string{"--webhook-host": "127.0.0.1"})
	g.Expect(err).To(MatchError(ContainSubstring("the chart does not set --webhook-host")))
}
