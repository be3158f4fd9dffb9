package chart

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	gocmp "github.com/google/go-cmp/cmp"
	. "github.com/onsi/gomega"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/release"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	stretchv1alpha1 "github.com/druid-stretch/druid-stretch/api/stretch/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/internal/etcdview"
	"github.com/druid-stretch/druid-stretch/internal/testing/druidcrds"
	"github.com/druid-stretch/druid-stretch/internal/testing/extendedcrd"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
)

// membershipCRDName is the chart's one CRD.
const membershipCRDName = "etcdmemberships.druid-stretch.druid.gardener.cloud"

// TestDruidEtcdCRDStaysDruids: druid's Etcd CRD is druid's own whichever
// comes first. On a seed druid's CRDs are there before druid-stretch (druid's
// chart or gardenlet wrote them); on a fresh cluster the chart may come
// first and druid's CRDs after it. Either way the API server serves druid's
// shipped manifest exactly as it stores it when nothing else is installed,
// and Helm's install, upgrade and uninstall of the chart never write it:
// its metadata.generation stays where it was.
func TestDruidEtcdCRDStaysDruids(t *testing.T) {
	ctx := context.Background()
	bare, bareKubeconfig := bareAPIServer(t)
	// Defaults included, which a comparison with the manifest itself would
	// miss: a dry run on an API server that holds no CRD yet.
	alone := druidEtcdCRD(t)
	g := NewWithT(t)
	g.Expect(bare.Create(ctx, alone, client.DryRunAll)).To(Succeed())
	want := alone.Object["spec"]

	t.Run("chart after druid's CRDs", func(t *testing.T) {
		// The package's API server is the seed: it started with druid's CRDs.
		g := NewWithT(t)
		ns := newNamespace(t, "druid-first")
		kept := expectEtcdCRDKept(t, ctx, admin, want)
		h := newHelmRelease(t, helmConfig(t, ns), ns, "crd-after")

		rel := h.install(values(t, ``))
		expectLeavesCRDsAlone(g, releaseObjects(g, rel))
		kept("helm install")
		h.upgrade(values(t, `replicas: 1`))
		kept("helm upgrade")
		h.uninstall()
		kept("helm uninstall")
	})

	t.Run("chart before druid's CRDs", func(t *testing.T) {
		g := NewWithT(t)
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "stretch-first-"}}
		g.Expect(bare.Create(ctx, ns)).To(Succeed())
		h := newHelmRelease(t, helmConfigAt(t, bareKubeconfig, ns.Name), ns.Name, "crd-before")

		rel := h.install(values(t, ``))
		expectLeavesCRDsAlone(g, releaseObjects(g, rel))
		g.Expect(bare.Get(ctx, client.ObjectKey{Name: membershipCRDName}, &apiextensionsv1.CustomResourceDefinition{})).To(Succeed(),
			"helm install created the chart's CRD")
		err := bare.Get(ctx, client.ObjectKey{Name: druidcrds.EtcdCRDName}, &apiextensionsv1.CustomResourceDefinition{})
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the chart brings no Etcd CRD, got %v", err)

		// etcd-druid arrives: its CRDs are created as its chart or
		// gardenlet creates them.
		g.Expect(writeDruidCRDs(ctx, bare)).To(Succeed())
		kept := expectEtcdCRDKept(t, ctx, bare, want)
		h.upgrade(values(t, `replicas: 1`))
		kept("helm upgrade")
		h.uninstall()
		kept("helm uninstall")
		g.Expect(bare.Get(ctx, client.ObjectKey{Name: membershipCRDName}, &apiextensionsv1.CustomResourceDefinition{})).To(Succeed(),
			"Helm never deletes crds/, so no EtcdMembership goes with the release")
	})
}

// TestGardenletCRDWriteKeepsEtcdMembership: gardenlet writes druid's CRDs
// into a seed about once a minute, a JSON merge patch of each whole spec.
// Over an installed chart that changes nothing of druid-stretch's: an
// EtcdMembership written before keeps its spec and status, stored object for
// stored object, the pair still reads as opted in, and the chart's CRD keeps
// its generation. This holds for the write that finds druid's CRD in place
// and for the one that replaces the extended Etcd CRD an earlier release
// left, after which the Etcd is written under druid's schema.
func TestGardenletCRDWriteKeepsEtcdMembership(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t, "gardenlet")
	h := newHelmRelease(t, helmConfig(t, ns), ns, "gardenlet-write")
	h.install(values(t, ``))

	e := newEtcd(ns, "etcd-main")
	g.Expect(admin.Create(ctx, e)).To(Succeed())
	m := stretchv1alpha1.For(e, v1alpha1.MembershipSpec{
		OrdinalStart:          ptr.To[int32](3),
		ExternalMembersPolicy: ptr.To(v1alpha1.ExternalMembersPolicyKeep),
		ExternalMembers: []v1alpha1.ExternalMember{{
			Name: "etcd-main-0", PeerURLs: []string{"https://etcd-main-0.seed-b.example:2380"}, SidecarURL: "https://etcd-main-0.seed-b.example:8090",
		}},
	})
	g.Expect(admin.Create(ctx, m)).To(Succeed())
	m.Status = stretchv1alpha1.EtcdMembershipStatus{
		ObservedGeneration: m.Generation,
		Conditions: []metav1.Condition{{Type: stretchv1alpha1.ConditionAttached, Status: metav1.ConditionTrue, Reason: stretchv1alpha1.ReasonEtcdFound,
			Message: "planned with the Etcd", LastTransitionTime: metav1.Now(), ObservedGeneration: m.Generation}},
		Membership: &v1alpha1.MembershipStatus{Phase: v1alpha1.MembershipPhaseConverged, Members: []v1alpha1.ObservedMember{
			{ID: "8e9e05c52164694d", Name: "etcd-main-0", PeerURLs: []string{"https://etcd-main-0.seed-b.example:2380"}, Role: v1alpha1.MemberRoleLeader, Healthy: true, CaughtUp: true},
			{ID: "91bc3c398fb3c146", Name: "etcd-main-3", PeerURLs: []string{"https://etcd-main-3.etcd-main-peer." + ns + ".svc:2380"}, Role: v1alpha1.MemberRoleVoter, Healthy: true, CaughtUp: true},
		}},
	}
	g.Expect(admin.Status().Update(ctx, m)).To(Succeed())
	before := &stretchv1alpha1.EtcdMembership{}
	g.Expect(admin.Get(ctx, client.ObjectKeyFromObject(m), before)).To(Succeed())
	g.Expect(before.Status.Membership).NotTo(BeNil(), "the status write was stored")
	chartCRD := storedCRD(g, ctx, admin, membershipCRDName)
	druidsSpec := storedCRD(g, ctx, admin, druidcrds.EtcdCRDName).Object["spec"]

	g.Expect(writeDruidCRDs(ctx, admin)).To(Succeed(), "gardenlet's write with druid's CRD in place")

	// A seed upgraded from an earlier release: its extended Etcd CRD is
	// still there when gardenlet next writes druid's.
	withExtendedEtcdCRD(t)
	extended := storedCRD(g, ctx, admin, druidcrds.EtcdCRDName)
	g.Expect(writeDruidCRDs(ctx, admin)).To(Succeed())
	replaced := storedCRD(g, ctx, admin, druidcrds.EtcdCRDName)
	g.Expect(replaced.GetGeneration()).To(BeNumerically(">", extended.GetGeneration()), "gardenlet's write replaced the extended CRD")
	g.Expect(gocmp.Diff(druidsSpec, replaced.Object["spec"])).To(BeEmpty(), "druid's CRD is back whole")
	expectServedEtcdSchema(t, false)
	// druid writes every Etcd's status on each health check, and its spec
	// when asked to reconcile: the Etcd is stored under druid's schema.
	g.Expect(admin.Status().Patch(ctx, &v1alpha1.Etcd{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: e.Name}},
		client.RawPatch(types.MergePatchType, []byte(`{"status":{"ready":true}}`)))).To(Succeed())
	g.Expect(patchEtcd(ctx, ns, e.Name, `{"metadata":{"annotations":{"druid.gardener.cloud/operation":"reconcile"}}}`)).To(Succeed())

	after := &stretchv1alpha1.EtcdMembership{}
	g.Expect(admin.Get(ctx, client.ObjectKeyFromObject(m), after)).To(Succeed())
	g.Expect(after.Spec).To(Equal(before.Spec))
	g.Expect(after.Status).To(Equal(before.Status))
	g.Expect(after.ResourceVersion).To(Equal(before.ResourceVersion), "nothing wrote the EtcdMembership")
	p, err := etcdview.Get(ctx, admin, client.ObjectKeyFromObject(e))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(p.Source).To(Equal(stretchv1alpha1.SpecFromEtcdMembership))
	g.Expect(p.View.Spec.GetOrdinalStart()).To(Equal(int32(3)))
	g.Expect(p.View.Status.Membership).To(Equal(before.Status.Membership))
	chartAfter := storedCRD(g, ctx, admin, membershipCRDName)
	g.Expect(chartAfter.GetGeneration()).To(Equal(chartCRD.GetGeneration()), "gardenlet never writes the chart's CRD")
	g.Expect(gocmp.Diff(chartCRD.Object["spec"], chartAfter.Object["spec"])).To(BeEmpty())
}

// expectEtcdCRDKept checks that druid's Etcd CRD in c is druid's as want
// (its spec as stored when installed alone) and records its generation; the
// function it returns checks both again after each of the chart's steps.
func expectEtcdCRDKept(t *testing.T, ctx context.Context, c client.Client, want any) func(after string) {
	t.Helper()
	g := NewWithT(t)
	first := storedCRD(g, ctx, c, druidcrds.EtcdCRDName)
	g.Expect(gocmp.Diff(want, first.Object["spec"])).To(BeEmpty(), "druid's Etcd CRD before the chart's steps")
	return func(after string) {
		t.Helper()
		got := storedCRD(g, ctx, c, druidcrds.EtcdCRDName)
		g.Expect(gocmp.Diff(want, got.Object["spec"])).To(BeEmpty(), "druid's Etcd CRD after %s", after)
		g.Expect(got.GetGeneration()).To(Equal(first.GetGeneration()), "%s did not write druid's Etcd CRD", after)
	}
}

// storedCRD reads the CRD name as the API server stores it.
func storedCRD(g Gomega, ctx context.Context, c client.Client, name string) *unstructured.Unstructured {
	crd := &unstructured.Unstructured{}
	crd.SetGroupVersionKind(crdGVK)
	g.ExpectWithOffset(1, c.Get(ctx, client.ObjectKey{Name: name}, crd)).To(Succeed())
	return crd
}

// expectLeavesCRDsAlone: nothing the chart gives Helm to apply can change a
// CRD of druid's. crds/ holds none of druid's group; the templates hold no
// CRD at all (Helm would upgrade and delete those with the release); there
// is no Helm hook (a Job could patch anything); no admission webhook sees
// CustomResourceDefinitions; no role grants anything on them.
func expectLeavesCRDsAlone(g Gomega, objs releasedObjects) {
	for _, c := range objs.crds {
		g.ExpectWithOffset(1, c.GetName()).NotTo(Equal(druidcrds.EtcdCRDName))
		group, _, err := unstructured.NestedString(c.Object, "spec", "group")
		g.ExpectWithOffset(1, err).NotTo(HaveOccurred())
		g.ExpectWithOffset(1, group).NotTo(Equal(druidv1alpha1.GroupName), "crds/ holds no CRD of druid's group")
	}
	g.ExpectWithOffset(1, objs.hooks).To(BeEmpty(), "the chart has no Helm hooks")
	for _, o := range objs.manifest {
		what := o.GetKind() + " " + o.GetName()
		g.ExpectWithOffset(1, o.GroupVersionKind().Group).NotTo(Equal(apiextensionsv1.GroupName), what)
		switch o.GetKind() {
		case "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration":
			hooks, _, err := unstructured.NestedSlice(o.Object, "webhooks")
			g.ExpectWithOffset(1, err).NotTo(HaveOccurred(), what)
			for _, h := range hooks {
				rules, _, err := unstructured.NestedSlice(h.(map[string]any), "rules")
				g.ExpectWithOffset(1, err).NotTo(HaveOccurred(), what)
				for _, r := range rules {
					g.ExpectWithOffset(1, coversCRDs(r.(map[string]any))).To(BeFalse(), "%s: rule %v", what, r)
				}
			}
		case "ClusterRole", "Role":
			rules, _, err := unstructured.NestedSlice(o.Object, "rules")
			g.ExpectWithOffset(1, err).NotTo(HaveOccurred(), what)
			for _, r := range rules {
				g.ExpectWithOffset(1, coversCRDs(r.(map[string]any))).To(BeFalse(), "%s: rule %v", what, r)
			}
		}
	}
}

// coversCRDs reports whether a webhook or RBAC rule (apiGroups and
// resources) takes in CustomResourceDefinitions, wildcards included.
func coversCRDs(rule map[string]any) bool {
	groups, _, _ := unstructured.NestedStringSlice(rule, "apiGroups")
	resources, _, _ := unstructured.NestedStringSlice(rule, "resources")
	return (slices.Contains(groups, "*") || slices.Contains(groups, apiextensionsv1.GroupName)) &&
		slices.ContainsFunc(resources, func(r string) bool {
			return r == "*" || r == "*/*" || r == "customresourcedefinitions" || r == "customresourcedefinitions/*"
		})
}

// releasedObjects are what Helm applies for a release: the chart's crds/,
// the rendered manifest and the hooks.
type releasedObjects struct {
	crds, manifest, hooks []*unstructured.Unstructured
}

func renderedObjects(r *Rendered) releasedObjects {
	return releasedObjects{crds: r.CRDs, manifest: r.Objects, hooks: r.Hooks}
}

// releaseObjects are the objects of an installed release, as Helm
// recorded them.
func releaseObjects(g Gomega, rel *release.Release) releasedObjects {
	var out releasedObjects
	decode := func(what, doc string) []*unstructured.Unstructured {
		objs, err := DecodeManifest(doc)
		g.ExpectWithOffset(2, err).NotTo(HaveOccurred(), what)
		return objs
	}
	for _, f := range rel.Chart.CRDObjects() {
		out.crds = append(out.crds, decode(f.Filename, string(f.File.Data))...)
	}
	out.manifest = decode("the release's manifest", rel.Manifest)
	for _, h := range rel.Hooks {
		out.hooks = append(out.hooks, decode(h.Path, h.Manifest)...)
	}
	return out
}

// druidEtcdCRD is druid's Etcd CRD exactly as its API module renders it.
func druidEtcdCRD(t *testing.T) *unstructured.Unstructured {
	t.Helper()
	ms, err := druidcrds.Manifests()
	if err != nil {
		t.Fatal(err)
	}
	objs, err := DecodeManifest(string(ms[druidcrds.EtcdCRDName]))
	if err != nil || len(objs) != 1 {
		t.Fatalf("druid's Etcd CRD: %d objects, %v", len(objs), err)
	}
	return objs[0]
}

// writeDruidCRDs writes druid's CRDs into c as gardenlet's CRD deployer does
// on every seed reconcile (test/site.CRDDeployer plays it for the site
// tests): a CRD that is missing is created, one that exists gets a JSON
// merge patch of its whole spec, which replaces spec.versions. It returns
// once the API server serves each one.
func writeDruidCRDs(ctx context.Context, c client.Client) error {
	crds, err := druidcrds.All()
	if err != nil {
		return err
	}
	for _, crd := range crds {
		err := c.Get(ctx, client.ObjectKeyFromObject(crd), &apiextensionsv1.CustomResourceDefinition{})
		switch {
		case apierrors.IsNotFound(err):
			err = c.Create(ctx, crd.DeepCopy())
		case err == nil:
			var patch []byte
			if patch, err = json.Marshal(map[string]any{"spec": crd.Spec}); err == nil {
				target := &unstructured.Unstructured{}
				target.SetGroupVersionKind(crdGVK)
				target.SetName(crd.Name)
				err = c.Patch(ctx, target, client.RawPatch(types.MergePatchType, patch))
			}
		}
		if err != nil {
			return fmt.Errorf("writing druid's CRD %s: %w", crd.Name, err)
		}
	}
	for _, crd := range crds {
		if err := waitEstablished(ctx, c, crd.Name); err != nil {
			return err
		}
	}
	return nil
}

// withExtendedEtcdCRD puts the extended Etcd CRD of earlier releases in
// place of druid's for the rest of the test, as a cluster not yet upgraded
// from such a release still has it: Etcds there may carry druid-stretch's
// fields inline, which druid's own CRD prunes. druid's own CRD is back when
// the test ends.
func withExtendedEtcdCRD(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	ext, err := DecodeManifest(string(extendedcrd.Manifest()))
	if err != nil {
		t.Fatal(err)
	}
	druids := []*unstructured.Unstructured{druidEtcdCRD(t)}
	t.Cleanup(func() {
		if err := InstallCRDs(ctx, admin, druids); err != nil {
			t.Errorf("giving druid's Etcd CRD back: %v", err)
			return
		}
		expectServedEtcdSchema(t, false)
	})
	if err := InstallCRDs(ctx, admin, ext); err != nil {
		t.Fatal(err)
	}
	expectServedEtcdSchema(t, true)
}

// expectServedEtcdSchema waits until the API server keeps druid-stretch's
// inline fields of an Etcd (extended: the extended Etcd CRD answers) or
// prunes them (druid's own CRD). A CRD's Established condition does not
// say which schema answers: the API server swaps its handler a moment
// after the update. The probe is a dry run in kube-system, which the
// chart's webhooks never look at.
func expectServedEtcdSchema(t *testing.T, extended bool) {
	t.Helper()
	ctx := context.Background()
	NewWithT(t).Eventually(func() (bool, error) {
		probe := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": v1alpha1.GroupVersion.String(), "kind": "Etcd",
			"metadata": map[string]any{"generateName": "schema-probe-", "namespace": metav1.NamespaceSystem},
			"spec": map[string]any{"replicas": int64(1), "labels": map[string]any{"app": "etcd"}, "etcd": map[string]any{}, "backup": map[string]any{},
				"ordinalStart": int64(3)},
		}}
		if err := admin.Create(ctx, probe, client.DryRunAll); err != nil {
			return false, err
		}
		_, kept, err := unstructured.NestedFieldNoCopy(probe.Object, "spec", "ordinalStart")
		return kept, err
	}).WithTimeout(15*time.Second).WithPolling(50*time.Millisecond).Should(Equal(extended), "the Etcd schema served (extended: %v)", extended)
}

// bareAPIServer starts a kube-apiserver of the test's own that holds no CRD:
// a cluster where druid-stretch's chart comes before etcd-druid. It returns
// an admin client and a kubeconfig file for Helm, and stops when the test
// ends.
func bareAPIServer(t *testing.T) (client.Client, string) {
	t.Helper()
	env, err := testbin.Environment()
	if err != nil {
		t.Fatal(err)
	}
	env.CRDs, env.CRDDirectoryPaths, env.ErrorIfCRDPathMissing = nil, nil, false
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("starting a second kube-apiserver: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stopping the second kube-apiserver: %v", err)
		}
	})
	c, err := client.New(cfg, client.Options{Scheme: admin.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, env.KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}
	return c, path
}

// helmRelease is one release of the chart, installed, upgraded and
// uninstalled through the Helm SDK as the helm CLI does; one that a failing
// test leaves is uninstalled when it ends.
type helmRelease struct {
	t               *testing.T
	cfg             *action.Configuration
	namespace, name string
	installed       bool
}

func newHelmRelease(t *testing.T, cfg *action.Configuration, namespace, name string) *helmRelease {
	t.Helper()
	h := &helmRelease{t: t, cfg: cfg, namespace: namespace, name: name}
	t.Cleanup(func() {
		if h.installed {
			if _, err := action.NewUninstall(cfg).Run(name); err != nil {
				t.Errorf("uninstalling %s: %v", name, err)
			}
		}
	})
	return h
}

func (h *helmRelease) install(vals map[string]any) *release.Release {
	h.t.Helper()
	ch, err := Load()
	if err != nil {
		h.t.Fatal(err)
	}
	inst := action.NewInstall(h.cfg)
	inst.ReleaseName, inst.Namespace = h.name, h.namespace
	rel, err := inst.RunWithContext(context.Background(), ch, vals)
	if err != nil {
		h.t.Fatalf("helm install %s: %v", h.name, err)
	}
	h.installed = true
	return rel
}

func (h *helmRelease) upgrade(vals map[string]any) *release.Release {
	h.t.Helper()
	ch, err := Load()
	if err != nil {
		h.t.Fatal(err)
	}
	up := action.NewUpgrade(h.cfg)
	up.Namespace = h.namespace
	rel, err := up.RunWithContext(context.Background(), h.name, ch, vals)
	if err != nil {
		h.t.Fatalf("helm upgrade %s: %v", h.name, err)
	}
	return rel
}

func (h *helmRelease) uninstall() {
	h.t.Helper()
	if _, err := action.NewUninstall(h.cfg).Run(h.name); err != nil {
		h.t.Fatalf("helm uninstall %s: %v", h.name, err)
	}
	h.installed = false
}
