package chart

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	. "github.com/onsi/gomega"
	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	stretchv1alpha1 "github.com/druid-stretch/druid-stretch/api/stretch/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/internal/testing/pki"
)

// admissionCall is one AdmissionReview the API server sent.
type admissionCall struct {
	Path, Kind, Operation, Namespace, Name string
}

// admissionRecorder is an HTTPS admission endpoint that records what the API
// server sends and allows it unchanged. It stands where the controller's
// webhook server will stand, to show which requests the chart's webhook
// configurations route to druid-stretch; what the webhooks then decide is
// the controller's to test.
type admissionRecorder struct {
	srv      *httptest.Server
	caBundle []byte
	mu       sync.Mutex
	calls    []admissionCall
}

func newAdmissionRecorder(t *testing.T) *admissionRecorder {
	t.Helper()
	ca, err := pki.NewCA("chart-test-webhook-ca")
	if err != nil {
		t.Fatal(err)
	}
	pair, err := ca.Issue("127.0.0.1", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := pair.Certificate()
	if err != nil {
		t.Fatal(err)
	}
	rec := &admissionRecorder{caBundle: ca.CertPEM()}
	rec.srv = httptest.NewUnstartedServer(http.HandlerFunc(rec.serve))
	rec.srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	rec.srv.StartTLS()
	t.Cleanup(rec.srv.Close)
	return rec
}

func (rec *admissionRecorder) serve(w http.ResponseWriter, r *http.Request) {
	var review admissionv1.AdmissionReview
	if err := json.NewDecoder(r.Body).Decode(&review); err != nil || review.Request == nil {
		http.Error(w, fmt.Sprintf("not an AdmissionReview: %v", err), http.StatusBadRequest)
		return
	}
	req := review.Request
	rec.mu.Lock()
	rec.calls = append(rec.calls, admissionCall{
		Path: r.URL.Path, Kind: req.Kind.Group + "/" + req.Kind.Kind, Operation: string(req.Operation),
		Namespace: req.Namespace, Name: req.Name,
	})
	rec.mu.Unlock()
	review.Response = &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	review.Request = nil
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(&review)
}

// callsFor returns the recorded calls about namespace/name.
func (rec *admissionRecorder) callsFor(namespace, name string) []admissionCall {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var out []admissionCall
	for _, c := range rec.calls {
		if c.Namespace == namespace && c.Name == name {
			out = append(out, c)
		}
	}
	return out
}

// installWebhooks renders the chart with vals, points its webhook
// configurations at baseURL and creates them, removed again when the test
// ends.
func installWebhooks(t *testing.T, release string, vals map[string]any, baseURL string, caBundle []byte) {
	t.Helper()
	g := NewWithT(t)
	r := render(t, release, newNamespace(t, "webhook-release"), vals)
	var hooks []*unstructured.Unstructured
	for _, kind := range []string{"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"} {
		hooks = append(hooks, r.OfKind(kind)...)
	}
	n, err := PointWebhooksAt(hooks, baseURL, caBundle)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(n).To(Equal(5), "the StatefulSet mutator, the Etcd and EtcdMembership validators, and the Etcd deletion and scale validators")
	ctx := context.Background()
	t.Cleanup(func() {
		if err := Delete(ctx, admin, hooks); err != nil {
			t.Errorf("removing webhook configurations: %v", err)
		}
	})
	g.Expect(Create(ctx, admin, hooks)).To(Succeed())
}

// druidStatefulSet is a StatefulSet labelled as etcd-druid labels the
// StatefulSet of an Etcd.
func druidStatefulSet(namespace, etcdName string) *appsv1.StatefulSet {
	sts := plainStatefulSet(namespace, etcdName)
	// druid's two containers, as far as the webhook reads them: the
	// wrapper's backup-restore flag, the data volume in both, the etcd
	// configuration in backup-restore's.
	data := corev1.VolumeMount{Name: etcdName, MountPath: "/var/etcd/data"}
	sts.Spec.Template.Spec.Containers = []corev1.Container{
		{Name: "etcd", Image: "etcd-wrapper", Args: []string{"start-etcd", "--backup-restore-host-port=" + etcdName + "-local:8080"},
			VolumeMounts: []corev1.VolumeMount{data}},
		{Name: "backup-restore", Image: "etcdbrctl", Args: []string{"server"},
			VolumeMounts: []corev1.VolumeMount{data, {Name: "etcd-config-file", MountPath: "/var/etcd/config/"}}},
	}
	sts.Spec.Template.Spec.Volumes = []corev1.Volume{{Name: "etcd-config-file", VolumeSource: corev1.VolumeSource{
		ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: etcdName + "-config"}}}}}
	sts.Spec.VolumeClaimTemplates = []corev1.PersistentVolumeClaim{{ObjectMeta: metav1.ObjectMeta{Name: etcdName},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		}}}
	sts.Labels = map[string]string{
		"app.kubernetes.io/managed-by": "etcd-druid",
		"app.kubernetes.io/component":  "etcd-statefulset",
		"app.kubernetes.io/part-of":    etcdName,
		"app.kubernetes.io/name":       etcdName,
	}
	return sts
}

func plainStatefulSet(namespace, name string) *appsv1.StatefulSet {
	return &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: appsv1.StatefulSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "etcd", Image: "etcd"}}},
			},
		},
	}
}

// TestWebhookRouting: with the chart's webhook configurations (pointed at a
// recording endpoint), the real kube-apiserver calls the StatefulSet mutator
// for druid's StatefulSets only, and the Etcd validator only for Etcds that
// carry or carried druid-stretch's fields inline, never for status writes.
// On a seed (druid's own Etcd CRD) no Etcd carries them: an Etcd opted in
// by its EtcdMembership and an Etcd a client of an earlier release sends
// with the fields inline (druid's CRD prunes them before admission) reach
// no webhook; the EtcdMembership's creates, updates and status writes reach
// its own validator (only the controller may change status.membership). Under the extended Etcd CRD of an
// earlier release, the validator sees exactly the Etcds that use or used
// the fields.
func TestWebhookRouting(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	rec := newAdmissionRecorder(t)
	installWebhooks(t, "routing", values(t, ``), rec.srv.URL, rec.caBundle)
	ns := newNamespace(t, "webhook-routing")

	// The API server picks new webhook configurations up asynchronously:
	// wait until a druid StatefulSet reaches the mutator.
	first := druidStatefulSet(ns, "etcd-main")
	g.Expect(admin.Create(ctx, first)).To(Succeed())
	g.Eventually(func() error {
		if len(rec.callsFor(ns, "etcd-main")) > 0 {
			return nil
		}
		cur := &appsv1.StatefulSet{}
		if err := admin.Get(ctx, client.ObjectKeyFromObject(first), cur); err != nil {
			return err
		}
		cur.Annotations = map[string]string{"probe": time.Now().String()}
		if err := admin.Update(ctx, cur); err != nil {
			return err
		}
		return fmt.Errorf("no admission call yet")
	}).WithTimeout(15 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
	g.Expect(rec.callsFor(ns, "etcd-main")).To(HaveEach(And(
		HaveField("Path", "/mutate-apps-v1-statefulset"), HaveField("Kind", "apps/StatefulSet"))))

	type step struct {
		what string
		do   func() error
		name string
		want []admissionCall
	}
	validated := func(op string, name string) admissionCall {
		return admissionCall{"/validate-druid-gardener-cloud-v1alpha1-etcd", "druid.gardener.cloud/Etcd", op, ns, name}
	}
	judged := func(op string, name string) admissionCall {
		return admissionCall{"/validate-druid-stretch-druid-gardener-cloud-v1alpha1-etcdmembership", "druid-stretch.druid.gardener.cloud/EtcdMembership", op, ns, name}
	}
	seed := []step{
		{"druid StatefulSet created", func() error { return admin.Create(ctx, druidStatefulSet(ns, "etcd-events")) }, "etcd-events",
			[]admissionCall{{"/mutate-apps-v1-statefulset", "apps/StatefulSet", "CREATE", ns, "etcd-events"}}},
		{"another StatefulSet created", func() error { return admin.Create(ctx, plainStatefulSet(ns, "postgres")) }, "postgres", nil},
		{"plain druid Etcd created", func() error { return admin.Create(ctx, newEtcd(ns, "plain")) }, "plain", nil},
		{"plain druid Etcd updated", func() error {
			return patchEtcd(ctx, ns, "plain", `{"metadata":{"annotations":{"druid.gardener.cloud/operation":"reconcile"}}}`)
		}, "plain", nil},
		{"EtcdMembership created", func() error {
			return admin.Create(ctx, stretchv1alpha1.For(newEtcd(ns, "opted-in"), v1alpha1.MembershipSpec{OrdinalStart: ptr.To[int32](3)}))
		}, "opted-in", []admissionCall{judged("CREATE", "opted-in")}},
		{"its Etcd created", func() error { return admin.Create(ctx, newEtcd(ns, "opted-in")) }, "opted-in", []admissionCall{judged("CREATE", "opted-in")}},
		{"its Etcd updated", func() error {
			return patchEtcd(ctx, ns, "opted-in", `{"metadata":{"annotations":{"druid.gardener.cloud/operation":"reconcile"}}}`)
		}, "opted-in", []admissionCall{judged("CREATE", "opted-in")}},
		{"its EtcdMembership changed", func() error {
			return admin.Patch(ctx, &stretchv1alpha1.EtcdMembership{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "opted-in"}},
				client.RawPatch(types.MergePatchType, []byte(`{"spec":{"ordinalStart":4}}`)))
		}, "opted-in", []admissionCall{judged("CREATE", "opted-in"), judged("UPDATE", "opted-in")}},
		{"its status written", func() error {
			return admin.Status().Patch(ctx, &stretchv1alpha1.EtcdMembership{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "opted-in"}},
				client.RawPatch(types.MergePatchType, []byte(`{"status":{"membership":{"phase":"Pending"}}}`)))
		}, "opted-in", []admissionCall{judged("CREATE", "opted-in"), judged("UPDATE", "opted-in"), judged("UPDATE", "opted-in")}},
		{"Etcd sent with the fields inline", func() error {
			e := newEtcd(ns, "inline")
			e.Spec.OrdinalStart = ptr.To[int32](3)
			return admin.Create(ctx, e)
		}, "inline", nil},
	}
	extended := []step{
		{"extended Etcd created", func() error {
			e := newEtcd(ns, "extended")
			e.Spec.OrdinalStart = ptr.To[int32](3)
			return admin.Create(ctx, e)
		}, "extended", []admissionCall{validated("CREATE", "extended")}},
		{"extended Etcd status written", func() error {
			return admin.Status().Patch(ctx, &v1alpha1.Etcd{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "extended"}},
				client.RawPatch(types.MergePatchType, []byte(`{"status":{"membership":{"phase":"Pending"}}}`)))
		}, "extended", []admissionCall{validated("CREATE", "extended")}},
		{"extension removed from the Etcd", func() error {
			return patchEtcd(ctx, ns, "extended", `{"spec":{"ordinalStart":null}}`)
		}, "extended", []admissionCall{validated("CREATE", "extended"), validated("UPDATE", "extended")}},
		{"now plain Etcd updated", func() error {
			return patchEtcd(ctx, ns, "extended", `{"metadata":{"annotations":{"druid.gardener.cloud/operation":"reconcile"}}}`)
		}, "extended", []admissionCall{validated("CREATE", "extended"), validated("UPDATE", "extended")}},
		{"external members added to a plain Etcd", func() error {
			return patchEtcd(ctx, ns, "plain", `{"spec":{"externalMembers":[{"name":"seed-a-plain-0","peerURLs":["http://plain-0.seed-a.example:2380"]}]}}`)
		}, "plain", []admissionCall{validated("UPDATE", "plain")}},
		{"an Etcd opted in by its EtcdMembership updated", func() error {
			return patchEtcd(ctx, ns, "opted-in", `{"metadata":{"annotations":{"druid.gardener.cloud/operation":"reconcile"}}}`)
		}, "opted-in", []admissionCall{judged("CREATE", "opted-in"), judged("UPDATE", "opted-in"), judged("UPDATE", "opted-in")}},
	}
	// The calls per object, each step's repeats counted once: the API
	// server may admit one write twice, since a PATCH is first tried on the
	// object of its watch cache, and when that lags behind (the status just
	// written), the update conflicts and is retried, admission included.
	// A lagging cache can also show the webhook an old object from before
	// the previous step (still extended, where the stored one no longer
	// is), so each step starts only once the cache holds the Etcd as
	// stored.
	seen := map[string][]admissionCall{}
	recorded := map[string]int{}
	run := func(steps []step) {
		for _, s := range steps {
			g.Expect(etcdCached(ctx, ns, s.name)).To(Succeed(), s.what)
			g.Expect(s.do()).To(Succeed(), s.what)
			// Admission is synchronous: the call, if any, was made before
			// the request returned.
			calls := rec.callsFor(ns, s.name)
			seen[s.name] = append(seen[s.name], slices.Compact(slices.Clone(calls[recorded[s.name]:]))...)
			recorded[s.name] = len(calls)
			g.Expect(seen[s.name]).To(Equal(s.want), s.what)
		}
	}
	run(seed)
	withExtendedEtcdCRD(t)
	run(extended)
}

// etcdCached waits until the API server's watch cache, which a PATCH reads
// its old object from first, holds the Etcd at the resource version stored
// in etcd; an Etcd that does not exist needs no wait.
func etcdCached(ctx context.Context, namespace, name string) error {
	key := client.ObjectKey{Namespace: namespace, Name: name}
	stored := &v1alpha1.Etcd{}
	if err := admin.Get(ctx, key, stored); err != nil {
		return client.IgnoreNotFound(err)
	}
	fromCache := &client.GetOptions{Raw: &metav1.GetOptions{ResourceVersion: "0"}}
	cached := &v1alpha1.Etcd{}
	var lastErr error
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 15*time.Second, true, func(ctx context.Context) (bool, error) {
		lastErr = admin.Get(ctx, key, cached, fromCache)
		return lastErr == nil && cached.ResourceVersion == stored.ResourceVersion, nil
	})
	if err != nil {
		return fmt.Errorf("the watch cache does not hold Etcd %s at resource version %s (last read: %q, %v): %w",
			key, stored.ResourceVersion, cached.ResourceVersion, lastErr, err)
	}
	return nil
}

func patchEtcd(ctx context.Context, namespace, name, mergePatch string) error {
	return admin.Patch(ctx, &v1alpha1.Etcd{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}},
		client.RawPatch("application/merge-patch+json", []byte(mergePatch)))
}

// TestWebhookFailurePolicy: with no webhook server answering (the controller
// is down), the default Fail refuses a change of an EtcdMembership, druid's
// StatefulSet of an Etcd opted in by its EtcdMembership and, where the extended Etcd CRD of an earlier
// release is still in place, an Etcd that carries druid-stretch's fields
// inline; Ignore admits them. Whatever the policy, druid's writes of its
// Etcds (an opted-in Etcd is plain to druid) and other StatefulSets never
// wait on druid-stretch. That is the trade-off
// docs/install.md describes.
func TestWebhookFailurePolicy(t *testing.T) {
	rec := newAdmissionRecorder(t)
	downURL, caBundle := rec.srv.URL, rec.caBundle
	rec.srv.Close() // nothing listens at downURL any more

	inline := func(ns, name string) *v1alpha1.Etcd {
		e := newEtcd(ns, name)
		e.Spec.OrdinalStart = ptr.To[int32](3)
		return e
	}
	cases := []struct {
		name, values string
		refused      bool
	}{
		{"Fail", ``, true},
		{"Ignore", "webhook:\n  statefulSetMutator: {failurePolicy: Ignore}\n  etcdValidator: {failurePolicy: Ignore}\n  etcdMembershipValidator: {failurePolicy: Ignore}\n", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			ctx := context.Background()
			ns := newNamespace(t, "webhook-policy")
			// A seed: an Etcd opted in by its EtcdMembership, written
			// while druid-stretch was up.
			opted := newEtcd(ns, "etcd-main")
			g.Expect(admin.Create(ctx, opted)).To(Succeed())
			membership := stretchv1alpha1.For(opted, v1alpha1.MembershipSpec{OrdinalStart: ptr.To[int32](3)})
			g.Expect(admin.Create(ctx, membership)).To(Succeed())
			installWebhooks(t, "policy-"+map[bool]string{true: "fail", false: "ignore"}[tc.refused], values(t, tc.values), downURL, caBundle)
			if tc.refused {
				// Wait until the API server uses the new configuration; a
				// dry run stores nothing, whether admitted or not.
				g.Eventually(func() error {
					return admin.Create(ctx, druidStatefulSet(ns, "probe"), client.DryRunAll)
				}).WithTimeout(15 * time.Second).WithPolling(100 * time.Millisecond).Should(MatchError(ContainSubstring("failed calling webhook")))
			}

			// The Etcd is written as ever; a change of its EtcdMembership
			// and druid's StatefulSet of it wait on the webhooks.
			g.Expect(patchEtcd(ctx, ns, opted.Name, `{"metadata":{"annotations":{"druid.gardener.cloud/operation":"reconcile"}}}`)).To(Succeed())
			moved := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"ordinalStart":4}}`))
			if tc.refused {
				// The validating configuration may reach the API server after
				// the mutating one the probe above waited for.
				g.Eventually(func() error {
					return admin.Patch(ctx, membership.DeepCopy(), moved, client.DryRunAll)
				}).WithTimeout(15 * time.Second).WithPolling(100 * time.Millisecond).Should(MatchError(ContainSubstring("failed calling webhook")))
				g.Expect(admin.Patch(ctx, membership.DeepCopy(), moved)).To(MatchError(ContainSubstring(`failed calling webhook "etcdmemberships.druid-stretch.druid.gardener.cloud"`)))
				stored := &stretchv1alpha1.EtcdMembership{}
				g.Expect(admin.Get(ctx, client.ObjectKeyFromObject(membership), stored)).To(Succeed())
				g.Expect(stored.Spec.OrdinalStart).To(HaveValue(BeNumerically("==", 3)), "nothing refused was stored")
			} else {
				g.Expect(admin.Patch(ctx, membership.DeepCopy(), moved)).To(Succeed())
			}
			sts := druidStatefulSet(ns, opted.Name)
			sts.OwnerReferences = []metav1.OwnerReference{druidv1alpha1.GetAsOwnerReference(opted.ObjectMeta)}
			if tc.refused {
				g.Expect(admin.Create(ctx, sts)).To(MatchError(ContainSubstring(`failed calling webhook "statefulsets.druid-stretch.druid.gardener.cloud"`)))
				var stored appsv1.StatefulSetList
				g.Expect(admin.List(ctx, &stored, client.InNamespace(ns))).To(Succeed())
				g.Expect(stored.Items).To(BeEmpty(), "nothing refused was stored")
			} else {
				g.Expect(admin.Create(ctx, sts)).To(Succeed())
			}
			// Independent of the policy: druid's plain Etcds and other
			// StatefulSets never wait on druid-stretch.
			expectPlainWritesAdmitted(g, ctx, ns, "etcd-events")
			g.Expect(admin.Create(ctx, plainStatefulSet(ns, "postgres"))).To(Succeed())

			// A cluster not yet upgraded from the extended Etcd CRD.
			withExtendedEtcdCRD(t)
			if tc.refused {
				err := admin.Create(ctx, inline(ns, "etcd-inline"))
				g.Expect(err).To(MatchError(ContainSubstring(`failed calling webhook "etcds.druid-stretch.druid.gardener.cloud"`)))
				var etcds v1alpha1.EtcdList
				g.Expect(admin.List(ctx, &etcds, client.InNamespace(ns))).To(Succeed())
				g.Expect(etcds.Items).To(ConsistOf(HaveField("Name", opted.Name), HaveField("Name", "etcd-events")), "nothing refused was stored")
			} else {
				g.Expect(admin.Create(ctx, inline(ns, "etcd-inline"))).To(Succeed())
			}
			expectPlainWritesAdmitted(g, ctx, ns, "etcd-plain")
			g.Expect(patchEtcd(ctx, ns, opted.Name, `{"metadata":{"annotations":{"druid.gardener.cloud/operation":"reconcile"}}}`)).To(Succeed())
		})
	}
}

// expectPlainWritesAdmitted: druid creates a plain Etcd named name and adds
// and removes its finalizer, each write admitted.
func expectPlainWritesAdmitted(g *WithT, ctx context.Context, namespace, name string) {
	g.ExpectWithOffset(1, admin.Create(ctx, newEtcd(namespace, name))).To(Succeed())
	g.ExpectWithOffset(1, patchEtcd(ctx, namespace, name, `{"metadata":{"finalizers":["druid.gardener.cloud/etcd-druid"]}}`)).To(Succeed())
	g.ExpectWithOffset(1, patchEtcd(ctx, namespace, name, `{"metadata":{"finalizers":null}}`)).To(Succeed())
}

// TestWebhookDownOutsideServedNamespaces: with webhook.namespaceSelector
// naming the served namespaces and no webhook server answering, druid's
// StatefulSet and an Etcd that carries druid-stretch's fields inline (under
// the extended Etcd CRD of an earlier release) in a namespace outside the
// selector are admitted, while the same objects in a served namespace are
// refused and not stored: a druid-stretch outage blocks only the namespaces
// it serves.
func TestWebhookDownOutsideServedNamespaces(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	withExtendedEtcdCRD(t)
	rec := newAdmissionRecorder(t)
	downURL, caBundle := rec.srv.URL, rec.caBundle
	rec.srv.Close() // nothing listens at downURL any more
	installWebhooks(t, "served-namespaces", values(t, "webhook:\n  namespaceSelector:\n    matchLabels: {druid-stretch.io/served: \"true\"}\n"), downURL, caBundle)

	served := newNamespace(t, "served")
	g.Expect(admin.Patch(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: served}},
		client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"druid-stretch.io/served":"true"}}}`)))).To(Succeed())
	unserved := newNamespace(t, "unserved")
	inline := func(ns, name string) *v1alpha1.Etcd {
		e := newEtcd(ns, name)
		e.Spec.OrdinalStart = ptr.To[int32](3)
		return e
	}

	// Wait until the API server uses the new configuration: the served
	// namespace's StatefulSet is refused by the failing call. A dry run
	// stores nothing, whether admitted or not.
	g.Eventually(func() error {
		return admin.Create(ctx, druidStatefulSet(served, "probe"), client.DryRunAll)
	}).WithTimeout(15 * time.Second).WithPolling(100 * time.Millisecond).Should(MatchError(ContainSubstring("failed calling webhook")))
	err := admin.Create(ctx, druidStatefulSet(served, "etcd-main"))
	g.Expect(err).To(MatchError(ContainSubstring(`failed calling webhook "statefulsets.druid-stretch.druid.gardener.cloud"`)))
	g.Expect(admin.Create(ctx, inline(served, "etcd-main"))).To(MatchError(ContainSubstring(`failed calling webhook "etcds.druid-stretch.druid.gardener.cloud"`)))
	var stored appsv1.StatefulSetList
	g.Expect(admin.List(ctx, &stored, client.InNamespace(served))).To(Succeed())
	g.Expect(stored.Items).To(BeEmpty(), "nothing refused was stored")
	var etcds v1alpha1.EtcdList
	g.Expect(admin.List(ctx, &etcds, client.InNamespace(served))).To(Succeed())
	g.Expect(etcds.Items).To(BeEmpty(), "nothing refused was stored")

	// Outside the selector the webhook server's outage does not matter.
	g.Expect(admin.Create(ctx, druidStatefulSet(unserved, "etcd-main"))).To(Succeed())
	g.Expect(admin.Create(ctx, inline(unserved, "etcd-main"))).To(Succeed())
	g.Expect(admin.List(ctx, &stored, client.InNamespace(unserved))).To(Succeed())
	g.Expect(stored.Items).To(HaveLen(1))
	// kube-system is never selected, whatever the values say.
	g.Expect(admin.Create(ctx, druidStatefulSet("kube-system", "etcd-"+unserved))).To(Succeed())
	g.Expect(admin.Delete(ctx, druidStatefulSet("kube-system", "etcd-"+unserved))).To(Succeed())
}
