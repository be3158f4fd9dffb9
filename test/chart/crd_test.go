package chart

import (
	"context"
	"testing"
	"time"

	druidcrds "github.com/gardener/etcd-druid/api/core/v1alpha1/crds"
	. "github.com/onsi/gomega"
	"helm.sh/helm/v3/pkg/action"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
)

// TestDruidCRDOverwrite shows what docs/install.md says about etcd-druid
// upgrades: when a druid deployment re-applies druid's own etcds CRD over the
// extended one, the API server stops serving the extension fields (pruned on
// read), and the first write then erases them from storage; re-applying the
// chart's CRD brings back what was not yet overwritten. The chart's CRD
// accepts every Etcd druid's accepts, so applying it after druid's is safe.
func TestDruidCRDOverwrite(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t, "druid-upgrade")
	r := render(t, "druid-stretch", ns, values(t, ``))

	all, err := druidcrds.GetAll(kubeVersion)
	g.Expect(err).NotTo(HaveOccurred())
	druidCRD, err := DecodeManifest(all[druidcrds.ResourceNameEtcd])
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(druidCRD).To(HaveLen(1))
	t.Cleanup(func() {
		if err := InstallCRDs(ctx, admin, r.CRDs); err != nil {
			t.Errorf("restoring the chart's CRD: %v", err)
		}
	})

	kept := newEtcd(ns, "etcd-main")
	kept.Spec.OrdinalStart = ptr.To[int32](3)
	g.Expect(admin.Create(ctx, kept)).To(Succeed())
	written := newEtcd(ns, "etcd-events")
	written.Spec.OrdinalStart = ptr.To[int32](3)
	g.Expect(admin.Create(ctx, written)).To(Succeed())
	statusWritten := newEtcd(ns, "etcd-status")
	statusWritten.Spec.OrdinalStart = ptr.To[int32](3)
	g.Expect(admin.Create(ctx, statusWritten)).To(Succeed())

	// druid's deployer applies druid's CRD (a druid upgrade).
	g.Expect(InstallCRDs(ctx, admin, druidCRD)).To(Succeed())
	g.Eventually(func() (any, error) { return ordinalStart(ctx, ns, "etcd-main") }).
		WithTimeout(10*time.Second).WithPolling(50*time.Millisecond).Should(BeNil(), "druid's CRD prunes the extension on read")
	// druid (or anyone) writes the Etcd meanwhile; druid writes every
	// Etcd's status on each health check.
	g.Expect(patchEtcd(ctx, ns, "etcd-events", `{"metadata":{"annotations":{"druid.gardener.cloud/operation":"reconcile"}}}`)).To(Succeed())
	g.Expect(admin.Status().Patch(ctx, &v1alpha1.Etcd{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "etcd-status"}},
		client.RawPatch("application/merge-patch+json", []byte(`{"status":{"ready":true}}`)))).To(Succeed())

	// The chart's CRD applied again, as docs/install.md says after every
	// druid upgrade.
	g.Expect(InstallCRDs(ctx, admin, r.CRDs)).To(Succeed())
	g.Eventually(func() (any, error) { return ordinalStart(ctx, ns, "etcd-main") }).
		WithTimeout(10*time.Second).WithPolling(50*time.Millisecond).Should(BeEquivalentTo(3), "an Etcd nobody wrote keeps its extension")
	g.Expect(ordinalStart(ctx, ns, "etcd-events")).To(BeNil(), "an Etcd written under druid's CRD lost its extension for good")
	g.Expect(ordinalStart(ctx, ns, "etcd-status")).To(BeNil(), "a status write is enough to lose it")

	// Every Etcd druid's CRD stored is served by the chart's unchanged.
	var list v1alpha1.EtcdList
	g.Expect(admin.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
	g.Expect(list.Items).To(HaveLen(3))
}

// ordinalStart reads spec.ordinalStart of an Etcd without a typed client,
// nil when the API server does not return it.
func ordinalStart(ctx context.Context, namespace, name string) (any, error) {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("Etcd"))
	if err := admin.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, u); err != nil {
		return nil, err
	}
	v, ok, err := unstructured.NestedFieldNoCopy(u.Object, "spec", "ordinalStart")
	if err != nil || !ok {
		return nil, err
	}
	return v, nil
}

// TestHelmInstallKeepsDruidCRD: when druid's etcds CRD exists, `helm
// install` leaves it (Helm creates crds/ only when absent), which is why
// docs/install.md applies the chart's CRD with kubectl first.
func TestHelmInstallKeepsDruidCRD(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t, "druid-first")
	ch, err := Load()
	g.Expect(err).NotTo(HaveOccurred())
	r := render(t, "stretch-crd", ns, values(t, ``))
	all, err := druidcrds.GetAll(kubeVersion)
	g.Expect(err).NotTo(HaveOccurred())
	druidCRD, err := DecodeManifest(all[druidcrds.ResourceNameEtcd])
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() {
		if err := InstallCRDs(ctx, admin, r.CRDs); err != nil {
			t.Errorf("restoring the chart's CRD: %v", err)
		}
	})
	g.Expect(InstallCRDs(ctx, admin, druidCRD)).To(Succeed())

	cfg := helmConfig(t, ns)
	inst := action.NewInstall(cfg)
	inst.ReleaseName = "stretch-crd"
	inst.Namespace = ns
	_, err = inst.RunWithContext(ctx, ch, values(t, ``))
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() {
		if _, err := action.NewUninstall(cfg).Run("stretch-crd"); err != nil {
			t.Errorf("uninstalling: %v", err)
		}
	})
	g.Expect(crdHasOrdinalStart(g, ctx)).To(BeFalse(), "helm install kept druid's CRD")

	g.Expect(InstallCRDs(ctx, admin, r.CRDs)).To(Succeed(), "kubectl apply of crds/")
	g.Expect(crdHasOrdinalStart(g, ctx)).To(BeTrue())
}

// crdHasOrdinalStart reports whether the served etcds CRD has the extension,
// the check docs/install.md gives operators.
func crdHasOrdinalStart(g *WithT, ctx context.Context) bool {
	crd := &apiextensionsv1.CustomResourceDefinition{}
	g.ExpectWithOffset(1, admin.Get(ctx, client.ObjectKey{Name: "etcds.druid.gardener.cloud"}, crd)).To(Succeed())
	_, ok := crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"].Properties["ordinalStart"]
	return ok
}
