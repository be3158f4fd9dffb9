package chart

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	. "github.com/onsi/gomega"
	"github.com/spf13/pflag"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	stretchv1alpha1 "github.com/druid-stretch/druid-stretch/api/stretch/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/controllers/membership"
	"github.com/druid-stretch/druid-stretch/controllers/webhook"
	"github.com/druid-stretch/druid-stretch/internal/cli"
	"github.com/druid-stretch/druid-stretch/internal/testing/pki"
)

// TestControllerAcceptsChartFlags: the druid-stretch controller command
// parses every argument the chart's Deployment gives it, for each documented
// option (cobra parses flags before it answers --help, so an unknown flag or
// a bad value fails here).
func TestControllerAcceptsChartFlags(t *testing.T) {
	for _, opt := range chartOptions {
		t.Run(opt.name, func(t *testing.T) {
			g := NewWithT(t)
			r := render(t, "stretch", "druid-stretch-system", values(t, opt.values))
			args, err := r.ControllerArgs()
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(runCLIQuietly(append(args, "--help"))).To(Equal(0), "druid-stretch %s", strings.Join(args, " "))
		})
	}
	t.Run("a flag the controller does not know fails", func(t *testing.T) {
		g := NewWithT(t)
		args, err := render(t, "stretch", "druid-stretch-system", values(t, ``)).ControllerArgs()
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(runCLIQuietly(append(args, "--sidecar-imag=x", "--help"))).NotTo(Equal(0))
	})
}

// runCLIQuietly runs the druid-stretch command line with its help text and
// errors sent to /dev/null.
func runCLIQuietly(args []string) int {
	devnull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		return -1
	}
	defer func() { _ = devnull.Close() }()
	stdout, stderr := os.Stdout, os.Stderr
	os.Stdout, os.Stderr = devnull, devnull
	defer func() { os.Stdout, os.Stderr = stdout, stderr }()
	return cli.Main(args)
}

// webhookServer is the controller's real webhook server (controllers/webhook)
// configured from the chart's flags, running in the test with a client that
// acts as the chart's ServiceAccount, and reachable through the chart's
// webhook configurations.
type webhookServer struct {
	options webhook.Options
}

// startChartWebhooks starts the controller's webhooks as the chart deploys
// them: options parsed from the chart's controller arguments, API reads made
// as the chart's ServiceAccount (f.saCfg), the chart's two webhook
// configurations pointed at the server. Everything stops when the test ends.
func startChartWebhooks(t *testing.T, f *rbacFixture) *webhookServer {
	t.Helper()
	g := NewWithT(t)
	args, err := f.rendered.ControllerArgs()
	g.Expect(err).NotTo(HaveOccurred())
	ws := &webhookServer{}
	fs := pflag.NewFlagSet("controller", pflag.ContinueOnError)
	ws.options.AddFlags(fs)
	fs.Int32Var(&ws.options.SidecarPort, "sidecar-port", 0, "")
	var known []string
	for _, a := range args[1:] {
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if fs.Lookup(name) != nil {
			known = append(known, a)
		}
	}
	g.Expect(fs.Parse(known)).To(Succeed())

	// The serving certificate, as the chart mounts it into --webhook-cert-dir.
	ca, err := pki.NewCA("druid-stretch-webhook-test-ca")
	g.Expect(err).NotTo(HaveOccurred())
	pair, err := ca.Issue("127.0.0.1", "127.0.0.1")
	g.Expect(err).NotTo(HaveOccurred())
	certDir := t.TempDir()
	g.Expect(os.WriteFile(filepath.Join(certDir, "tls.crt"), pair.CertPEM, 0o600)).To(Succeed())
	g.Expect(os.WriteFile(filepath.Join(certDir, "tls.key"), pair.KeyPEM, 0o600)).To(Succeed())

	scheme, err := membership.Scheme()
	g.Expect(err).NotTo(HaveOccurred())
	port, probes := freePort(t), "127.0.0.1:"+strconv.Itoa(freePort(t))
	mgr, err := ctrl.NewManager(f.saCfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: probes,
		WebhookServer:          ctrlwebhook.NewServer(ctrlwebhook.Options{Host: "127.0.0.1", Port: port, CertDir: certDir}),
	})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(webhook.SetupWithManager(mgr, ws.options)).To(Succeed())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("webhook manager: %v", err)
		}
	})
	// The chart's readiness probe: ready once the webhook server answers
	// TLS, so the kube-apiserver is not sent to a server still starting.
	g.Eventually(func(g Gomega) string {
		resp, err := http.Get("http://" + probes + "/readyz?verbose")
		g.Expect(err).NotTo(HaveOccurred())
		defer func() { _ = resp.Body.Close() }()
		body, err := io.ReadAll(resp.Body)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(resp.StatusCode).To(Equal(http.StatusOK), string(body))
		return string(body)
	}).WithTimeout(30 * time.Second).WithPolling(50 * time.Millisecond).Should(ContainSubstring("[+]webhook-server ok"))

	var hooks []*unstructured.Unstructured
	for _, kind := range []string{"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"} {
		hooks = append(hooks, f.rendered.OfKind(kind)...)
	}
	n, err := PointWebhooksAt(hooks, "https://127.0.0.1:"+strconv.Itoa(port), ca.CertPEM())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(n).To(Equal(5), "the StatefulSet mutator, the Etcd and EtcdMembership validators, and the Etcd deletion and scale validators")
	t.Cleanup(func() {
		if err := Delete(context.Background(), admin, hooks); err != nil {
			t.Errorf("removing webhook configurations: %v", err)
		}
	})
	g.Expect(Create(context.Background(), admin, hooks)).To(Succeed())
	return ws
}

// freePort is a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port
}

// webhookRequests is the controller-runtime counter of requests a webhook
// path served, summed over response codes.
func webhookRequests(g *WithT, path string) float64 {
	families, err := crmetrics.Registry.Gather()
	g.ExpectWithOffset(1, err).NotTo(HaveOccurred())
	var n float64
	for _, fam := range families {
		if fam.GetName() != "controller_runtime_webhook_requests_total" {
			continue
		}
		for _, m := range fam.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "webhook" && l.GetValue() == path {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}

// tlsEtcd is an Etcd with TLS as Gardener configures it, so the injected
// sidecar serves and reaches etcd over TLS.
func tlsEtcd(namespace, name string) *v1alpha1.Etcd {
	e := newEtcd(namespace, name)
	e.Spec.Etcd.ClientUrlTLS = &druidv1alpha1.TLSConfig{
		TLSCASecretRef:     druidv1alpha1.SecretReference{SecretReference: corev1.SecretReference{Name: "ca-etcd-bundle"}},
		ServerTLSSecretRef: corev1.SecretReference{Name: "etcd-server-tls"},
		ClientTLSSecretRef: corev1.SecretReference{Name: "etcd-client-tls"},
	}
	e.Spec.Backup.TLS = &druidv1alpha1.TLSConfig{
		TLSCASecretRef:     druidv1alpha1.SecretReference{SecretReference: corev1.SecretReference{Name: "ca-etcd-bundle"}},
		ServerTLSSecretRef: corev1.SecretReference{Name: "etcdbr-server-tls"},
		ClientTLSSecretRef: corev1.SecretReference{Name: "etcd-client-tls"},
	}
	return e
}

// TestChartWebhooks: the controller's real webhooks, configured by the
// chart's flags and reading as the chart's ServiceAccount, are called by the
// kube-apiserver through the chart's webhook configurations. On a seed
// (druid's own Etcd CRD), druid's StatefulSet of an Etcd opted in by its
// EtcdMembership is put on the ordinals the EtcdMembership gives and gets the
// sidecar the chart configured; a plain Etcd's StatefulSet stays as druid
// wrote it; no Etcd reaches the validator, since none carries druid-stretch's
// fields. Under the extended Etcd CRD of an earlier release, only Etcds that
// carry them inline reach the validator, which refuses an update that would
// break the running cluster.
func TestChartWebhooks(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	f := newRBACFixture(t, values(t, `
sidecar:
  port: 8091
  resources:
    requests: {cpu: 30m, memory: 40Mi}
    limits: {memory: 100Mi}
`))
	ws := startChartWebhooks(t, f)
	g.Expect(ws.options.SidecarPort).To(Equal(int32(8091)))
	g.Expect(ws.options.SidecarImage).To(Equal("registry.example.com/druid-stretch:0.1.0"))

	validations := webhookRequests(g, webhook.EtcdValidatorPath)
	e := tlsEtcd(f.etcdNS, "etcd-moved")
	g.Expect(admin.Create(ctx, e)).To(Succeed())
	g.Expect(admin.Create(ctx, stretchv1alpha1.For(e, v1alpha1.MembershipSpec{OrdinalStart: ptr.To[int32](3)}))).To(Succeed())
	plain := newEtcd(f.etcdNS, "etcd-plain")
	g.Expect(admin.Create(ctx, plain)).To(Succeed())
	g.Expect(webhookRequests(g, webhook.EtcdValidatorPath)).To(Equal(validations), "neither Etcd went through the validator")

	// druid creates the StatefulSet of the opted-in Etcd.
	sts := druidStatefulSet(f.etcdNS, e.Name)
	sts.OwnerReferences = []metav1.OwnerReference{druidv1alpha1.GetAsOwnerReference(e.ObjectMeta)}
	sts.Spec.Replicas = ptr.To[int32](3)
	g.Expect(admin.Create(ctx, sts)).To(Succeed())
	stored := &appsv1.StatefulSet{}
	g.Expect(admin.Get(ctx, client.ObjectKeyFromObject(sts), stored)).To(Succeed())
	g.Expect(stored.Spec.Ordinals).To(Equal(&appsv1.StatefulSetOrdinals{Start: 3}), "pods etcd-moved-3..5")
	g.Expect(*stored.Spec.Replicas).To(Equal(int32(3)))
	var sidecar *corev1.Container
	for i := range stored.Spec.Template.Spec.Containers {
		if c := &stored.Spec.Template.Spec.Containers[i]; c.Name == webhook.SidecarContainerName {
			sidecar = c
		}
	}
	g.Expect(sidecar).NotTo(BeNil(), "the sidecar was injected")
	g.Expect(sidecar.Image).To(Equal("registry.example.com/druid-stretch:0.1.0"))
	g.Expect(sidecar.Ports).To(ConsistOf(HaveField("ContainerPort", int32(8091))))
	g.Expect(sidecar.Resources.Requests.Cpu().Equal(resource.MustParse("30m"))).To(BeTrue())
	g.Expect(sidecar.Resources.Limits.Memory().Equal(resource.MustParse("100Mi"))).To(BeTrue())
	g.Expect(sidecar.Args).To(ContainElement("--server-cert=/var/etcdbr/ssl/server/tls.crt"), "serves with the Etcd's backup TLS")
	g.Expect(sidecar.Args).To(ContainElement("--allowed-client=druid-stretch-controller"), "the chart's sidecar.allowedClients")
	// What the webhook adds runs under Pod Security's restricted profile.
	expectRestricted(g, sidecar.SecurityContext, sidecar.Name)
	for _, c := range stored.Spec.Template.Spec.InitContainers {
		expectRestricted(g, c.SecurityContext, c.Name)
	}

	// The StatefulSet of a plain Etcd passes unchanged.
	plainSts := druidStatefulSet(f.etcdNS, plain.Name)
	plainSts.OwnerReferences = []metav1.OwnerReference{druidv1alpha1.GetAsOwnerReference(plain.ObjectMeta)}
	g.Expect(admin.Create(ctx, plainSts)).To(Succeed())
	g.Expect(admin.Get(ctx, client.ObjectKeyFromObject(plainSts), stored)).To(Succeed())
	g.Expect(stored.Spec.Ordinals).To(BeNil())
	g.Expect(stored.Spec.Template.Spec.Containers).To(HaveLen(2), "druid's two containers, no sidecar")
	g.Expect(stored.Spec.Template.Spec.InitContainers).To(BeEmpty())

	// Deletions: one side of a stretched cluster (its members vote beside
	// another side's, as its EtcdMembership's status says) is refused by
	// the Etcd deletion validator, which every Etcd deletion reaches; a
	// plain Etcd is deleted.
	// The status is written as the controller (the chart's ServiceAccount):
	// the EtcdMembership validator admits no one else's.
	m := &stretchv1alpha1.EtcdMembership{}
	g.Expect(f.sa.Get(ctx, client.ObjectKeyFromObject(e), m)).To(Succeed())
	unwritten := m.DeepCopy()
	m.Status.Membership = &v1alpha1.MembershipStatus{Phase: v1alpha1.MembershipPhaseConverged}
	for i, name := range []string{"etcd-moved-3", "etcd-moved-4", "seed-a-etcd-moved-0"} {
		origin := v1alpha1.MemberOriginLocal
		if i == 2 {
			origin = v1alpha1.MemberOriginExternal
		}
		m.Status.Membership.Members = append(m.Status.Membership.Members, v1alpha1.ObservedMember{
			ID: strconv.Itoa(i + 1), Name: name, Role: v1alpha1.MemberRoleVoter, Origin: origin, Healthy: true})
	}
	g.Expect(f.sa.Status().Patch(ctx, m, client.MergeFrom(unwritten))).To(Succeed())
	err := admin.Delete(ctx, e)
	g.Expect(err).To(MatchError(And(ContainSubstring(`admission webhook "etcddeletions.druid-stretch.druid.gardener.cloud" denied`),
		ContainSubstring(webhook.DeleteStretchedAnnotation))))
	g.Expect(admin.Get(ctx, client.ObjectKeyFromObject(e), &v1alpha1.Etcd{})).To(Succeed(), "still stored")
	g.Expect(admin.Delete(ctx, plain)).To(Succeed())

	// kubectl scale of the opted-in Etcd past the bounds is refused by the
	// scale validator, and the Etcd keeps its replicas.
	err = admin.SubResource("scale").Update(ctx, &v1alpha1.Etcd{ObjectMeta: e.ObjectMeta},
		client.WithSubResourceBody(&autoscalingv1.Scale{Spec: autoscalingv1.ScaleSpec{Replicas: 10}}))
	g.Expect(err).To(MatchError(And(ContainSubstring(`admission webhook "etcdscales.druid-stretch.druid.gardener.cloud" denied`),
		ContainSubstring("spec.replicas"))))
	scaled := &v1alpha1.Etcd{}
	g.Expect(admin.Get(ctx, client.ObjectKeyFromObject(e), scaled)).To(Succeed())
	g.Expect(scaled.Spec.Replicas).To(Equal(e.Spec.Replicas))

	// A cluster not yet upgraded from the extended Etcd CRD: an Etcd that
	// carries the fields inline goes through the validator, a plain one
	// does not.
	withExtendedEtcdCRD(t)
	inline := tlsEtcd(f.etcdNS, "etcd-inline")
	inline.Spec.OrdinalStart = ptr.To[int32](3)
	g.Expect(admin.Create(ctx, inline)).To(Succeed())
	g.Expect(webhookRequests(g, webhook.EtcdValidatorPath)).To(Equal(validations+1), "the Etcd with inline fields went through the validator")
	g.Expect(admin.Create(ctx, newEtcd(f.etcdNS, "etcd-plain-too"))).To(Succeed())
	g.Expect(webhookRequests(g, webhook.EtcdValidatorPath)).To(Equal(validations+1), "the plain Etcd did not")

	// An update that breaks the running cluster is refused (by the CRD's
	// rule or, behind it, the webhook) and changes nothing.
	err = patchEtcd(ctx, f.etcdNS, inline.Name, `{"spec":{"externalMembers":[{"name":"etcd-inline-4","peerURLs":["https://etcd-inline-4.seed-a.example:2380"]}]}}`)
	g.Expect(err).To(HaveOccurred())
	g.Expect(err.Error()).To(ContainSubstring("spec.externalMembers"))
	after := &v1alpha1.Etcd{}
	g.Expect(admin.Get(ctx, client.ObjectKeyFromObject(inline), after)).To(Succeed())
	g.Expect(after.Spec.ExternalMembers).To(BeEmpty())
}
