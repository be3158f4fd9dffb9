package site

import (
	"context"
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	clientv3 "go.etcd.io/etcd/client/v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	stretchv1alpha1 "github.com/druid-stretch/druid-stretch/api/stretch/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/controllers/webhook"
)

// lostFields is an Etcd's druid-stretch fields taken away mid-change and
// given back: its EtcdMembership deleted (the only place its fields live
// under druid's own CRD) and later created again from the same spec, with
// no status: a restore from a backup of the namespace, or an operator who
// deleted it on purpose and thought better of it.
type lostFields struct {
	s     *Site
	key   client.ObjectKey
	saved *stretchv1alpha1.EtcdMembership
	since time.Time
}

// dropExtensionFields deletes the Etcd's EtcdMembership. The webhook
// refuses that while the Etcd runs another pod window than druid's own, so
// it is deleted as an operator must to mean it: with the override
// annotation set first.
func dropExtensionFields(ctx context.Context, t *testing.T, s *Site, key client.ObjectKey) *lostFields {
	t.Helper()
	g := NewWithT(t)
	m := &stretchv1alpha1.EtcdMembership{}
	g.Expect(s.Client.Get(ctx, key, m)).To(Succeed())
	saved := m.DeepCopy()
	err := s.Client.Delete(ctx, m)
	g.Expect(err).To(HaveOccurred(), "the webhook refuses to drop the fields of an Etcd that runs another pod window")
	t.Logf("deleting the EtcdMembership without the override: %v", err)
	patch := client.MergeFrom(m.DeepCopy())
	metav1.SetMetaDataAnnotation(&m.ObjectMeta, webhook.DeleteStretchedAnnotation, "true")
	g.Expect(s.Client.Patch(ctx, m, patch)).To(Succeed())
	since := time.Now().Add(-time.Second) // events' times are whole seconds
	g.Expect(s.Client.Delete(ctx, m)).To(Succeed())
	g.Eventually(func() bool {
		return apierrors.IsNotFound(s.Client.Get(ctx, key, &stretchv1alpha1.EtcdMembership{}))
	}).WithTimeout(30*time.Second).Should(BeTrue(), "the EtcdMembership is gone")
	return &lostFields{s: s, key: key, saved: saved, since: since}
}

// expectNothingChanges checks what the controller and the webhook do while
// the fields are gone: the controller reports ExtensionLost (a Warning
// event and its metric) at every reconcile and changes nothing, and a
// write of the StatefulSet as druid's would be without the fields (its
// pods on druid's ordinals from 0, which would stop the members outside
// them) is refused. From the loss's first report until the controller has
// reconciled the Etcd again, etcd's member list, the pods and the
// StatefulSet stay as they were.
func (l *lostFields) expectNothingChanges(ctx context.Context, t *testing.T, cli *clientv3.Client) {
	t.Helper()
	g := NewWithT(t)
	e := &v1alpha1.Etcd{ObjectMeta: metav1.ObjectMeta{Namespace: l.key.Namespace, Name: l.key.Name}}
	g.Eventually(func() []string { return eventReasonsSince(t, l.s, e, l.since) }).WithTimeout(2*time.Minute).WithPolling(time.Second).
		Should(ContainElement("ExtensionLost"), "the controller reports the lost fields")
	reconciles := membershipReconciles(t)
	members := memberListOf(ctx, t, cli)
	pods := podUIDs(t, l.s, e)
	var sts appsv1.StatefulSet
	g.Expect(l.s.Client.Get(ctx, l.key, &sts)).To(Succeed())
	t.Logf("the fields are reported lost; members %v, %d pods, StatefulSet generation %d", members, len(pods), sts.Generation)

	// druid's StatefulSet of the Etcd: its replicas on ordinals from 0.
	var stored v1alpha1.Etcd
	g.Expect(l.s.Client.Get(ctx, l.key, &stored)).To(Succeed())
	druids := sts.DeepCopy()
	druids.Spec.Replicas = ptr.To(stored.Spec.Replicas)
	druids.Spec.Ordinals = nil
	err := l.s.Client.Update(ctx, druids)
	g.Expect(err).To(MatchError(ContainSubstring("the update is refused so that no member loses its sidecar or its pod")),
		"a write of the StatefulSet on druid's own ordinals is refused while the fields are gone")

	g.Eventually(func() float64 { return membershipReconciles(t) }).WithTimeout(2*time.Minute).WithPolling(time.Second).
		Should(BeNumerically(">", reconciles), "the controller reconciled the Etcd again while the fields were gone")
	g.Expect(extensionLostMetric(t, l.key)).To(Equal(1.0), "the ExtensionLost metric stands")
	g.Expect(memberListOf(ctx, t, cli)).To(Equal(members), "etcd's members did not change while the fields were gone")
	g.Expect(podUIDs(t, l.s, e)).To(Equal(pods), "no pod was deleted or added while the fields were gone")
	var after appsv1.StatefulSet
	g.Expect(l.s.Client.Get(ctx, l.key, &after)).To(Succeed())
	g.Expect(after.Generation).To(Equal(sts.Generation), "the StatefulSet was not changed")
	g.Expect(after.Spec.Ordinals).To(Equal(sts.Spec.Ordinals), "the StatefulSet keeps its pod window")
}

// membershipReconciles counts the membership controller's reconciles in
// this process, as controller-runtime's metrics do.
func membershipReconciles(t *testing.T) float64 {
	t.Helper()
	families, err := crmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, f := range families {
		if f.GetName() != "controller_runtime_reconcile_total" {
			continue
		}
		for _, m := range f.Metric {
			for _, l := range m.GetLabel() {
				if l.GetName() == "controller" && l.GetValue() == "etcd-membership" {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}

// extensionLostMetric is druid-stretch's ExtensionLost gauge of the Etcd
// key names, 0 when it is not set.
func extensionLostMetric(t *testing.T, key client.ObjectKey) float64 {
	t.Helper()
	families, err := crmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "druid_stretch_membership_extension_lost" {
			continue
		}
		for _, m := range f.Metric {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["namespace"] == key.Namespace && labels["etcd"] == key.Name {
				return m.GetGauge().GetValue()
			}
		}
	}
	return 0
}

// restore creates the EtcdMembership again from the spec it had, without
// its status or the override annotation.
func (l *lostFields) restore(ctx context.Context, t *testing.T) {
	t.Helper()
	m := &stretchv1alpha1.EtcdMembership{ObjectMeta: metav1.ObjectMeta{
		Namespace: l.saved.Namespace, Name: l.saved.Name, Labels: l.saved.Labels, OwnerReferences: l.saved.OwnerReferences,
	}, Spec: l.saved.Spec}
	if err := l.s.Client.Create(ctx, m); err != nil {
		t.Fatalf("creating the EtcdMembership %s again: %v", l.key, err)
	}
	t.Logf("the EtcdMembership %s was created again from its spec", l.key)
}

// eventReasonsSince are the reasons of the Events about e last seen at or
// after since.
func eventReasonsSince(t *testing.T, s *Site, e *v1alpha1.Etcd, since time.Time) []string {
	t.Helper()
	var list corev1.EventList
	if err := s.Client.List(context.Background(), &list, client.InNamespace(e.Namespace)); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, ev := range list.Items {
		last := ev.LastTimestamp.Time
		if ev.Series != nil {
			last = ev.Series.LastObservedTime.Time
		}
		if last.IsZero() {
			last = ev.EventTime.Time
		}
		if ev.InvolvedObject.Kind == "Etcd" && ev.InvolvedObject.Name == e.Name && !last.Before(since) {
			out = append(out, ev.Reason)
		}
	}
	return out
}

// memberListOf is etcd's member list, a line per member.
func memberListOf(ctx context.Context, t *testing.T, cli *clientv3.Client) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := cli.MemberList(ctx)
	if err != nil {
		t.Fatalf("listing etcd's members: %v", err)
	}
	var out []string
	for _, m := range resp.Members {
		out = append(out, fmt.Sprintf("%s %x learner=%t", m.Name, m.ID, m.IsLearner))
	}
	return out
}
