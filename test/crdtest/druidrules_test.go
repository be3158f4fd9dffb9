package crdtest

import (
	"testing"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/members"
)

// TestDruidRulesStillHold checks druid's own CEL rules on the real apiserver,
// including the additionalAdvertisePeerURLs index rule that the extended CRD
// generalizes to the ordinal range: with ordinalStart unset it refuses and
// accepts exactly what druid's rule does.
func TestDruidRulesStillHold(t *testing.T) {
	advertise := func(member string) func(e *v1alpha1.Etcd) {
		return func(e *v1alpha1.Etcd) {
			e.Spec.Etcd.AdditionalAdvertisePeerURLs = []druidv1alpha1.MemberPeerURLs{{MemberName: member, URLs: []string{"https://lb.seed-b.example:2380"}}}
		}
	}
	tests := []struct {
		name   string
		mutate func(e *v1alpha1.Etcd)
		reason string // "" when accepted
	}{
		{"index below replicas, no ordinalStart", func(e *v1alpha1.Etcd) {
			e.Spec.OrdinalStart = nil
			advertise("seed-b-etcd-main-2")(e)
		}, ""},
		{"index at replicas, no ordinalStart (druid refuses it too)", func(e *v1alpha1.Etcd) {
			e.Spec.OrdinalStart = nil
			advertise("seed-b-etcd-main-3")(e)
		}, "additionalAdvertisePeerURLs member name index must be in [ordinalStart, ordinalStart+replicas)"},
		{"index in the shifted range", advertise("seed-b-etcd-main-4"), ""},
		{"index below the shifted range", advertise("seed-b-etcd-main-1"), "additionalAdvertisePeerURLs member name index must be in [ordinalStart, ordinalStart+replicas)"},
		{"member name without the prefix", advertise("etcd-main-4"), "additionalAdvertisePeerURLs member names must start with the Etcd resource name"},
		{"http additional URL with peer TLS", func(e *v1alpha1.Etcd) {
			e.Spec.Etcd.AdditionalAdvertisePeerURLs = []druidv1alpha1.MemberPeerURLs{{MemberName: "seed-b-etcd-main-4", URLs: []string{"http://lb.seed-b.example:2380"}}}
		}, "all additional advertise peer URLs must use https://"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			e := stretchedEtcd(newNamespace(t))
			tc.mutate(e)
			err := stretch.Create(ctx(t), e.DeepCopy())
			if tc.reason == "" {
				g.Expect(err).NotTo(HaveOccurred())
				return
			}
			t.Log(err)
			g.Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want Invalid, got %v", err)
			g.Expect(err.Error()).To(ContainSubstring(tc.reason))
			g.Expect(stretch.Get(ctx(t), client.ObjectKeyFromObject(e), &v1alpha1.Etcd{})).To(Satisfy(apierrors.IsNotFound))
		})
	}

	t.Run("replicas cannot shrink except to 0", func(t *testing.T) {
		g := NewWithT(t)
		e := stretchedEtcd(newNamespace(t))
		g.Expect(stretch.Create(ctx(t), e)).To(Succeed())
		changed := e.DeepCopy()
		changed.Spec.Replicas = 2
		err := stretch.Update(ctx(t), changed)
		g.Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want Invalid, got %v", err)
		g.Expect(err.Error()).To(ContainSubstring("Replicas can either be increased or be downscaled to 0"))
	})
}

// TestOrdinalsPatchOnAStatefulSet applies members.OrdinalsMergePatch to a real
// StatefulSet: the apiserver accepts it and the pods' ordinals move.
func TestOrdinalsPatchOnAStatefulSet(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	labels := map[string]string{"app": "etcd-main"}
	sts := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: "etcd-main", Namespace: ns},
		Spec: appsv1.StatefulSetSpec{
			Replicas:    ptr.To[int32](3),
			ServiceName: "etcd-main-peer",
			Selector:    &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "etcd", Image: "etcd"}}},
			},
		},
	}
	g.Expect(stretch.Create(ctx(t), sts)).To(Succeed())

	e := stretchedEtcd(ns)
	g.Expect(stretch.Patch(ctx(t), sts, client.RawPatch(types.MergePatchType, members.OrdinalsMergePatch(e)))).To(Succeed())
	got := &appsv1.StatefulSet{}
	g.Expect(stretch.Get(ctx(t), client.ObjectKeyFromObject(sts), got)).To(Succeed())
	g.Expect(got.Spec.Ordinals).To(Equal(&appsv1.StatefulSetOrdinals{Start: 3}))

	e.Spec.OrdinalStart = nil
	g.Expect(stretch.Patch(ctx(t), got, client.RawPatch(types.MergePatchType, members.OrdinalsMergePatch(e)))).To(Succeed())
	g.Expect(stretch.Get(ctx(t), client.ObjectKeyFromObject(sts), got)).To(Succeed())
	g.Expect(got.Spec.Ordinals).To(BeNil())
}
