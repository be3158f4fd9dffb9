package crdtest

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	. "github.com/onsi/gomega"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/validation"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
)

// TestDruidExamplesRoundTrip stores etcd-druid's own example objects through
// the extended CRD: each is accepted, comes back exactly as sent, and decodes
// into the extended Go type without losing anything druid's type holds.
func TestDruidExamplesRoundTrip(t *testing.T) {
	files, err := filepath.Glob("testdata/druid-*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no druid examples in testdata: %v", err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			g := NewWithT(t)
			sent := loadUnstructured(t, file)
			sent.SetNamespace(newNamespace(t))
			obj := sent.DeepCopy()
			g.Expect(stretch.Create(ctx(t), obj)).To(Succeed())

			got := &unstructured.Unstructured{}
			got.SetGroupVersionKind(sent.GroupVersionKind())
			g.Expect(stretch.Get(ctx(t), client.ObjectKeyFromObject(sent), got)).To(Succeed())
			g.Expect(got.Object["spec"]).To(Equal(sent.Object["spec"]), "spec stored unchanged")
			g.Expect(got.GetLabels()).To(Equal(sent.GetLabels()))
			g.Expect(got.GetAnnotations()).To(Equal(sent.GetAnnotations()))

			// Through the Go types: the extended type holds everything
			// druid's type holds, and has no extension of its own here.
			var ours v1alpha1.Etcd
			var theirs druidv1alpha1.Etcd
			g.Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(got.Object, &ours)).To(Succeed())
			g.Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(got.Object, &theirs)).To(Succeed())
			g.Expect(apiequality.Semantic.DeepEqual(ours.Spec.EtcdSpec, theirs.Spec)).To(BeTrue(), "druid's spec through the extended type")
			g.Expect(ours.Spec.OrdinalStart).To(BeNil())
			g.Expect(ours.Spec.ExternalMembers).To(BeEmpty())
			g.Expect(ours.Spec.ExternalMembersPolicy).To(BeNil())
			g.Expect(validation.ValidateEtcd(&ours)).To(BeEmpty(), "Go validation accepts druid's examples too")

			// A write back through the extended typed client changes
			// nothing druid's type can see.
			g.Expect(stretch.Update(ctx(t), &ours)).To(Succeed())
			var after druidv1alpha1.Etcd
			g.Expect(druid.Get(ctx(t), client.ObjectKeyFromObject(sent), &after)).To(Succeed())
			g.Expect(apiequality.Semantic.DeepEqual(after.Spec, theirs.Spec)).To(BeTrue(), "druid's spec after a typed round trip")
		})
	}
}

// TestExtendedExampleRoundTrip stores an Etcd with every extension field set
// and gets it back unchanged, through the unstructured and the typed client.
func TestExtendedExampleRoundTrip(t *testing.T) {
	g := NewWithT(t)
	e := stretchedEtcd(newNamespace(t))
	sent := e.DeepCopy()
	g.Expect(stretch.Create(ctx(t), e)).To(Succeed())

	var got v1alpha1.Etcd
	g.Expect(stretch.Get(ctx(t), client.ObjectKeyFromObject(sent), &got)).To(Succeed())
	g.Expect(apiequality.Semantic.DeepEqual(got.Spec, sent.Spec)).To(BeTrue(), "spec: %+v", got.Spec)
}

// TestDocsExamplesAreAccepted creates every Etcd in docs/api.md, so the
// reference never shows an object the API refuses.
func TestDocsExamplesAreAccepted(t *testing.T) {
	root, err := testbin.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join(root, "docs", "api.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllSubmatch(doc, -1)
	n := 0
	for _, b := range blocks {
		if !strings.Contains(string(b[1]), "kind: Etcd\n") {
			continue
		}
		n++
		obj := unstructuredFromYAML(t, b[1])
		t.Run(fmt.Sprintf("example-%d", n), func(t *testing.T) {
			g := NewWithT(t)
			docNamespace := obj.GetNamespace()
			obj.SetNamespace(newNamespace(t))
			sent := obj.DeepCopy()
			g.Expect(stretch.Create(ctx(t), obj)).To(Succeed())
			got := &unstructured.Unstructured{}
			got.SetGroupVersionKind(sent.GroupVersionKind())
			g.Expect(stretch.Get(ctx(t), client.ObjectKeyFromObject(sent), got)).To(Succeed())
			g.Expect(got.Object["spec"]).To(Equal(sent.Object["spec"]))
			// Go validation in the namespace the example names, for the
			// rule that depends on it.
			var typed v1alpha1.Etcd
			g.Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(got.Object, &typed)).To(Succeed())
			typed.Namespace = docNamespace
			g.Expect(validation.ValidateEtcd(&typed)).To(BeEmpty())
		})
	}
	if n < 3 {
		t.Fatalf("docs/api.md has %d Etcd examples, want the stretched cluster and both sides of a move", n)
	}
}
