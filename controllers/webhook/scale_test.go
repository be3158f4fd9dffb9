package webhook_test

import (
	"fmt"
	"testing"

	. "github.com/onsi/gomega"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/controllers/webhook"
	"github.com/druid-stretch/druid-stretch/internal/etcdview"
)

// scaleEtcd writes replicas through e's scale subresource, as kubectl
// scale does.
func scaleEtcd(t *testing.T, e *v1alpha1.Etcd, replicas int32) error {
	t.Helper()
	scale := &autoscalingv1.Scale{Spec: autoscalingv1.ScaleSpec{Replicas: replicas}}
	return k8s.SubResource("scale").Update(t.Context(), &v1alpha1.Etcd{ObjectMeta: e.ObjectMeta}, client.WithSubResourceBody(scale))
}

// storedReplicas is spec.replicas of e as stored.
func storedReplicas(t *testing.T, e *v1alpha1.Etcd) int32 {
	t.Helper()
	p, err := etcdview.Get(t.Context(), k8s, client.ObjectKeyFromObject(e))
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	return p.Etcd.Spec.Replicas
}

// A write of the scale subresource of an Etcd that uses druid-stretch's
// fields is judged as the same change of spec.replicas on the pair is, and
// a refused one leaves the Etcd as it was.
func TestScaleSubresourceIsJudgedWithThePair(t *testing.T) {
	ns := newNamespace(t)
	for i, tc := range []struct {
		name     string
		build    func(*v1alpha1.Etcd)
		replicas int32
		field    string
		detail   string
	}{
		{"more than the most replicas", nil, 10, "spec.replicas", "must be between 0 and 9"},
		{"past the last ordinal", func(e *v1alpha1.Etcd) { e.Spec.OrdinalStart = ptr.To[int32](995) }, 6, "spec.ordinalStart", "ordinalStart+replicas is 1001"},
		{"no replicas beside learners", func(e *v1alpha1.Etcd) { e.Spec.LearnerReplicas = ptr.To[int32](2) }, 0, "spec.learnerReplicas", "must be less than spec.replicas (0)"},
		{"Retire with no replicas", func(e *v1alpha1.Etcd) {
			e.Spec.ExternalMembersPolicy = ptr.To(v1alpha1.ExternalMembersPolicyRetire)
		}, 0, "spec.externalMembersPolicy", "spec.replicas must be at least 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			e := stretchedEtcd(ns)
			e.Name = fmt.Sprintf("etcd-scale-%d", i)
			if tc.build != nil {
				tc.build(e)
			}
			e = createEtcd(t, e)
			before := webhookRequests(t, webhook.EtcdScaleValidatorPath)
			err := scaleEtcd(t, e, tc.replicas)
			g.Expect(err).To(HaveOccurred(), "the scale was admitted")
			g.Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
			g.Expect(err.Error()).To(And(ContainSubstring(tc.field), ContainSubstring(tc.detail), ContainSubstring("the scale subresource")))
			g.Expect(webhookRequests(t, webhook.EtcdScaleValidatorPath)).To(Equal(before + 1))
			g.Expect(storedReplicas(t, e)).To(Equal(int32(3)), "unchanged")
		})
	}
}

// What the scale subresource still does: scale an Etcd of druid-stretch
// within its bounds, abort a destination (replicas 0 under Keep), and
// scale an Etcd that is druid's alone by druid's rules only.
func TestScaleSubresourceStillScales(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	e := createEtcd(t, stretchedEtcd(ns))
	g.Expect(scaleEtcd(t, e, 5)).To(Succeed())
	g.Expect(storedReplicas(t, e)).To(Equal(int32(5)))
	g.Expect(scaleEtcd(t, e, 0)).To(Succeed(), "an abort")
	g.Expect(storedReplicas(t, e)).To(BeZero())

	plain := etcdWithTLS(ns)
	plain.Name = "etcd-druids"
	plain = createEtcd(t, plain)
	g.Expect(scaleEtcd(t, plain, 12)).To(Succeed(), "druid's own Etcds keep druid's rules")
	g.Expect(storedReplicas(t, plain)).To(Equal(int32(12)))
}
