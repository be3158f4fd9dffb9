package chart

import (
	"context"
	"fmt"
	"testing"

	. "github.com/onsi/gomega"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/release"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestInstallOnAPIServer creates every object the chart renders, for each
// documented option, on the real kube-apiserver with strict field
// validation: all are accepted and stored as rendered.
func TestInstallOnAPIServer(t *testing.T) {
	for i, opt := range chartOptions {
		t.Run(opt.name, func(t *testing.T) {
			g := NewWithT(t)
			ctx := context.Background()
			ns := newNamespace(t, "chart-install")
			r := render(t, fmt.Sprintf("opt%d", i), ns, values(t, opt.values))
			install(t, r)

			for _, o := range r.Objects {
				stored := &unstructured.Unstructured{}
				stored.SetGroupVersionKind(o.GroupVersionKind())
				g.Expect(admin.Get(ctx, client.ObjectKeyFromObject(o), stored)).To(Succeed(), "%s %s", o.GetKind(), o.GetName())
			}
			// Nothing the Deployment says was dropped or rewritten on the way.
			want := deployment(g, r)
			got := &appsv1.Deployment{}
			g.Expect(admin.Get(ctx, client.ObjectKeyFromObject(want), got)).To(Succeed())
			g.Expect(got.Spec.Template.Spec.Containers[0].Args).To(Equal(want.Spec.Template.Spec.Containers[0].Args))
			g.Expect(got.Spec.Template.Spec.Containers[0].SecurityContext).To(Equal(want.Spec.Template.Spec.Containers[0].SecurityContext))
			g.Expect(equality.Semantic.DeepEqual(got.Spec.Template.Spec.Containers[0].Resources, want.Spec.Template.Spec.Containers[0].Resources)).To(BeTrue())
		})
	}
}

// helmConfig is Helm's action configuration against the package's API
// server, storing releases in Secrets as the helm CLI does.
func helmConfig(t *testing.T, namespace string) *action.Configuration {
	t.Helper()
	return helmConfigAt(t, kubeconfigPath, namespace)
}

// helmConfigAt is helmConfig against the API server of a kubeconfig file.
func helmConfigAt(t *testing.T, kubeconfig, namespace string) *action.Configuration {
	t.Helper()
	flags := genericclioptions.NewConfigFlags(false)
	flags.KubeConfig = &kubeconfig
	flags.Namespace = &namespace
	cfg := &action.Configuration{}
	if err := cfg.Init(flags, namespace, "secret", func(format string, v ...any) { t.Logf("helm: "+format, v...) }); err != nil {
		t.Fatalf("initialising Helm: %v", err)
	}
	// Helm checks the chart's kubeVersion against the server's version,
	// which an unstamped test build reports as v0.0.0: give it the real
	// one, with the API versions the server serves, as Helm would find them.
	kv, err := chartutil.ParseKubeVersion(kubeVersion)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := flags.ToDiscoveryClient()
	if err != nil {
		t.Fatal(err)
	}
	apiVersions, err := action.GetVersionSet(dc)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Capabilities = &chartutil.Capabilities{KubeVersion: *kv, APIVersions: apiVersions, HelmVersion: chartutil.DefaultCapabilities.HelmVersion}
	return cfg
}

// TestHelmInstallUpgradeUninstall runs the SDK's install, upgrade and
// uninstall against the real API server, as `helm install/upgrade/uninstall`
// do: the upgrade keeps the self-signed webhook certificate (lookup reuses
// the Secret, so the caBundle and the mounted certificate never disagree),
// scaling to one replica removes the PodDisruptionBudget, and uninstalling
// leaves the EtcdMembership CRD (Helm never deletes crds/), so no
// EtcdMembership is lost. What the release does to druid's Etcd CRD (nothing)
// is TestDruidEtcdCRDStaysDruids'.
func TestHelmInstallUpgradeUninstall(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t, "chart-helm")
	ch, err := Load()
	g.Expect(err).NotTo(HaveOccurred())
	cfg := helmConfig(t, ns)

	inst := action.NewInstall(cfg)
	inst.ReleaseName = "druid-stretch"
	inst.Namespace = ns
	rel, err := inst.RunWithContext(ctx, ch, values(t, ``))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(rel.Info.Status).To(Equal(release.StatusDeployed))
	uninstalled := false
	t.Cleanup(func() {
		if !uninstalled {
			if _, err := action.NewUninstall(cfg).Run("druid-stretch"); err != nil {
				t.Errorf("uninstalling: %v", err)
			}
		}
	})

	secretKey := client.ObjectKey{Namespace: ns, Name: "druid-stretch-webhook-tls"}
	before := &corev1.Secret{}
	g.Expect(admin.Get(ctx, secretKey, before)).To(Succeed())
	g.Expect(caBundles(g, ctx)).To(HaveEach(Equal(before.Data["ca.crt"])))
	g.Expect(admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: "druid-stretch"}, &policyv1.PodDisruptionBudget{})).To(Succeed())

	up := action.NewUpgrade(cfg)
	up.Namespace = ns
	rel, err = up.RunWithContext(ctx, "druid-stretch", ch, values(t, `replicas: 1`))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(rel.Version).To(Equal(2))

	after := &corev1.Secret{}
	g.Expect(admin.Get(ctx, secretKey, after)).To(Succeed())
	g.Expect(after.Data).To(Equal(before.Data), "the upgrade reuses the webhook certificate")
	g.Expect(caBundles(g, ctx)).To(HaveEach(Equal(before.Data["ca.crt"])))
	err = admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: "druid-stretch"}, &policyv1.PodDisruptionBudget{})
	g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "no PodDisruptionBudget for one replica, got %v", err)
	dep := &appsv1.Deployment{}
	g.Expect(admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: "druid-stretch"}, dep)).To(Succeed())
	g.Expect(*dep.Spec.Replicas).To(Equal(int32(1)))

	_, err = action.NewUninstall(cfg).Run("druid-stretch")
	g.Expect(err).NotTo(HaveOccurred())
	uninstalled = true
	err = admin.Get(ctx, client.ObjectKey{Name: "druid-stretch"}, &admissionregistrationv1.ValidatingWebhookConfiguration{})
	g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "uninstall removes the webhook configurations, got %v", err)
	g.Expect(admin.Get(ctx, client.ObjectKey{Name: membershipCRDName}, &apiextensionsv1.CustomResourceDefinition{})).To(Succeed(),
		"uninstall keeps the EtcdMembership CRD and with it every EtcdMembership")
}

// caBundles are the caBundles of the release's two webhook configurations.
func caBundles(g *WithT, ctx context.Context) [][]byte {
	m := &admissionregistrationv1.MutatingWebhookConfiguration{}
	v := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	g.ExpectWithOffset(1, admin.Get(ctx, client.ObjectKey{Name: "druid-stretch"}, m)).To(Succeed())
	g.ExpectWithOffset(1, admin.Get(ctx, client.ObjectKey{Name: "druid-stretch"}, v)).To(Succeed())
	return [][]byte{m.Webhooks[0].ClientConfig.CABundle, v.Webhooks[0].ClientConfig.CABundle}
}

// TestHelmInstallRefusesBadValues: the SDK's install against the API server
// refuses bad values before it creates anything.
func TestHelmInstallRefusesBadValues(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t, "chart-helm-bad")
	ch, err := Load()
	g.Expect(err).NotTo(HaveOccurred())
	inst := action.NewInstall(helmConfig(t, ns))
	inst.ReleaseName = "bad"
	inst.Namespace = ns
	_, err = inst.RunWithContext(ctx, ch, values(t, `replicas: "2"`))
	g.Expect(err).To(MatchError(ContainSubstring("at '/replicas': got string, want integer")))

	var left corev1.SecretList
	g.Expect(admin.List(ctx, &left, client.InNamespace(ns))).To(Succeed())
	g.Expect(left.Items).To(BeEmpty(), "neither a release record nor a chart Secret was written")
	var deps appsv1.DeploymentList
	g.Expect(admin.List(ctx, &deps, client.InNamespace(ns))).To(Succeed())
	g.Expect(deps.Items).To(BeEmpty())
	err = admin.Get(ctx, client.ObjectKey{Name: "bad-druid-stretch"}, &admissionregistrationv1.MutatingWebhookConfiguration{})
	g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "got %v", err)
}

// TestPodSecurityRestricted: a pod made from the chart's Deployment template
// is admitted in a namespace that enforces the "restricted" Pod Security
// Standard, where the same pod with privilege escalation allowed is refused.
func TestPodSecurityRestricted(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "chart-restricted-", Labels: map[string]string{
		"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}}}
	g.Expect(admin.Create(ctx, ns)).To(Succeed())
	r := render(t, "druid-stretch", ns.Name, values(t, ``))
	dep := deployment(g, r)

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "controller", Labels: dep.Spec.Template.Labels},
		Spec:       *dep.Spec.Template.Spec.DeepCopy(),
	}
	pod.Spec.ServiceAccountName = "" // the ServiceAccount is not created here; the security checks do not need it
	loose := pod.DeepCopy()
	loose.Name = "loose"
	loose.Spec.Containers[0].SecurityContext.AllowPrivilegeEscalation = ptr.To(true)
	err := admin.Create(ctx, loose)
	g.Expect(err).To(MatchError(ContainSubstring(`violates PodSecurity "restricted:latest"`)), "the namespace enforces the restricted standard")

	g.Expect(admin.Create(ctx, pod)).To(Succeed())
}
