package site

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	clientv3 "go.etcd.io/etcd/client/v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
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
// refuses that while the Etcd runs another pod window than druid's own
// (checked: an error when it does not), so it is deleted as an operator
// must to mean it: with the override annotation set first.
func dropExtensionFields(ctx context.Context, s *Site, key client.ObjectKey) (*lostFields, error) {
	m := &stretchv1alpha1.EtcdMembership{}
	if err := s.Client.Get(ctx, key, m); err != nil {
		return nil, fmt.Errorf("reading the EtcdMembership %s: %w", key, err)
	}
	saved := m.DeepCopy()
	if err := s.Client.Delete(ctx, m); err == nil {
		return nil, fmt.Errorf("the EtcdMembership %s of an Etcd that runs another pod window was deleted without the override annotation: the webhook must refuse that", key)
	} else if !strings.Contains(err.Error(), webhook.DeleteStretchedAnnotation) {
		return nil, fmt.Errorf("deleting the EtcdMembership %s without the override: want the webhook's refusal naming %s, got %w", key, webhook.DeleteStretchedAnnotation, err)
	}
	patch := client.MergeFrom(m.DeepCopy())
	metav1.SetMetaDataAnnotation(&m.ObjectMeta, webhook.DeleteStretchedAnnotation, "true")
	if err := s.Client.Patch(ctx, m, patch); err != nil {
		return nil, fmt.Errorf("setting the override annotation on the EtcdMembership %s: %w", key, err)
	}
	since := time.Now().Add(-time.Second) // events' times are whole seconds
	if err := s.Client.Delete(ctx, m); err != nil {
		return nil, fmt.Errorf("deleting the EtcdMembership %s with the override: %w", key, err)
	}
	l := &lostFields{s: s, key: key, saved: saved, since: since}
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		return apierrors.IsNotFound(s.Client.Get(ctx, key, &stretchv1alpha1.EtcdMembership{})), nil
	})
	if err != nil {
		return l, fmt.Errorf("the EtcdMembership %s is not gone 30 s after its deletion: %w", key, err)
	}
	return l, nil
}

// reported waits for the controller's ExtensionLost Warning event about
// the Etcd, the report of the loss.
func (l *lostFields) reported(ctx context.Context) error {
	e := &v1alpha1.Etcd{ObjectMeta: metav1.ObjectMeta{Namespace: l.key.Namespace, Name: l.key.Name}}
	var last []string
	err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		reasons, err := reasonsSince(ctx, l.s, e, l.since)
		last = reasons
		return err == nil && slices.Contains(reasons, "ExtensionLost"), nil
	})
	if err != nil {
		return fmt.Errorf("no ExtensionLost event about the Etcd %s within 2 minutes of its fields' loss (events since: %v): %w", l.key, last, err)
	}
	return nil
}

// siteState is what a site's controller keeps as it is while an Etcd's
// fields are gone: the site's members in etcd's member list (by ID and
// role; mine tells the site's members from the others'), the Etcd's pods,
// and its StatefulSet's generation and pod window.
type siteState struct {
	members       []string
	pods          map[client.ObjectKey]types.UID
	stsGeneration int64
	ordinals      *appsv1.StatefulSetOrdinals
}

func (s siteState) String() string {
	return fmt.Sprintf("members %v, %d pods, StatefulSet generation %d", s.members, len(s.pods), s.stsGeneration)
}

// state reads the site's part of the Etcd now. A member counts as the
// site's when its name is one of the Etcd's pods there, or when it has no
// name yet (added, not started: it takes its pod's name when it starts,
// which is no change of the membership).
func (l *lostFields) state(ctx context.Context, cli *clientv3.Client) (siteState, error) {
	var st siteState
	pods, err := l.s.EtcdPods(ctx, l.key)
	if err != nil {
		return st, err
	}
	st.pods = map[client.ObjectKey]types.UID{}
	for _, p := range pods {
		st.pods[client.ObjectKeyFromObject(&p)] = p.UID
	}
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := cli.MemberList(lctx)
	if err != nil {
		return st, fmt.Errorf("listing etcd's members: %w", err)
	}
	for _, m := range resp.Members {
		if m.Name == "" || st.pods[client.ObjectKey{Namespace: l.key.Namespace, Name: m.Name}] != "" {
			st.members = append(st.members, fmt.Sprintf("%x learner=%t", m.ID, m.IsLearner))
		}
	}
	slices.Sort(st.members)
	var sts appsv1.StatefulSet
	if err := l.s.Client.Get(ctx, l.key, &sts); err != nil {
		return st, fmt.Errorf("reading the StatefulSet %s: %w", l.key, err)
	}
	st.stsGeneration, st.ordinals = sts.Generation, sts.Spec.Ordinals
	return st, nil
}

// unchanged compares the site's part of the Etcd now with before.
func (l *lostFields) unchanged(ctx context.Context, cli *clientv3.Client, before siteState) error {
	now, err := l.state(ctx, cli)
	if err != nil {
		return err
	}
	var errs []error
	if !slices.Equal(now.members, before.members) {
		errs = append(errs, fmt.Errorf("the site's etcd members changed while the fields were gone: %v, then %v", before.members, now.members))
	}
	if !apiequality.Semantic.DeepEqual(now.pods, before.pods) {
		errs = append(errs, fmt.Errorf("pods were deleted or added while the fields were gone: %v, then %v", before.pods, now.pods))
	}
	if now.stsGeneration != before.stsGeneration || !apiequality.Semantic.DeepEqual(now.ordinals, before.ordinals) {
		errs = append(errs, fmt.Errorf("the StatefulSet changed while the fields were gone: generation %d ordinals %v, then generation %d ordinals %v",
			before.stsGeneration, before.ordinals, now.stsGeneration, now.ordinals))
	}
	return errors.Join(errs...)
}

// druidWriteRefused writes the StatefulSet as druid's would be without the
// fields, its replicas on ordinals from 0, which would stop the members
// outside them, and wants the webhook's refusal. A StatefulSet that
// already runs druid's replicas from ordinal 0 is not written: such a
// write would change nothing.
func (l *lostFields) druidWriteRefused(ctx context.Context) error {
	var stored v1alpha1.Etcd
	if err := l.s.Client.Get(ctx, l.key, &stored); err != nil {
		return fmt.Errorf("reading the Etcd %s: %w", l.key, err)
	}
	wrote := false
	// A conflict (the StatefulSet's status written meanwhile) is no
	// answer: read and write again.
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		var sts appsv1.StatefulSet
		if err := l.s.Client.Get(ctx, l.key, &sts); err != nil {
			return fmt.Errorf("reading the StatefulSet %s: %w", l.key, err)
		}
		if sts.Spec.Ordinals == nil || sts.Spec.Ordinals.Start == 0 && ptr.Deref(sts.Spec.Replicas, 0) == stored.Spec.Replicas {
			return nil
		}
		druids := sts.DeepCopy()
		druids.Spec.Replicas = ptr.To(stored.Spec.Replicas)
		druids.Spec.Ordinals = nil
		wrote = true
		return l.s.Client.Update(ctx, druids)
	})
	const refusal = "the update is refused so that no member loses its sidecar or its pod"
	if wrote && (err == nil || !strings.Contains(err.Error(), refusal)) {
		return fmt.Errorf("a write of the StatefulSet %s on druid's own ordinals while the fields are gone: want the webhook's refusal (%q), got %v", l.key, refusal, err)
	}
	if !wrote {
		return err
	}
	return nil
}

// restore creates the EtcdMembership again from the spec it had, without
// its status or the override annotation.
func (l *lostFields) restore(ctx context.Context) error {
	m := &stretchv1alpha1.EtcdMembership{ObjectMeta: metav1.ObjectMeta{
		Namespace: l.saved.Namespace, Name: l.saved.Name, Labels: l.saved.Labels, OwnerReferences: l.saved.OwnerReferences,
	}, Spec: l.saved.Spec}
	if err := l.s.Client.Create(ctx, m); err != nil {
		return fmt.Errorf("creating the EtcdMembership %s again: %w", l.key, err)
	}
	return nil
}

// fieldsGoneFor is how long the fields stay gone in the fault lane's row
// (faults_test.go) once the controller reported their loss.
const fieldsGoneFor = 20 * time.Second

// withFieldsGone takes the Etcd's fields away on s (dropExtensionFields),
// waits for the controller's report, checks that a write of the
// StatefulSet as druid's is refused, keeps the fields away for hold, and
// checks that the site's part of the Etcd (siteState, etcd's members read
// through eps) stayed as it was; the fields are given back on every path.
func withFieldsGone(ctx context.Context, s *Site, key client.ObjectKey, eps []string, hold time.Duration, logf func(string, ...any)) (err error) {
	cli, err := s.EtcdClient(eps...)
	if err != nil {
		return err
	}
	defer func() { _ = cli.Close() }()
	l, err := dropExtensionFields(ctx, s, key)
	if l == nil {
		return err
	}
	defer func() {
		// Given back on every path: a row that leaves the fields away
		// fails on the move, not on its cause.
		restoreErr := l.restore(context.WithoutCancel(ctx))
		if restoreErr == nil {
			logf("the EtcdMembership %s was created again from its spec", key)
		}
		err = errors.Join(err, restoreErr)
	}()
	if err != nil {
		return err
	}
	if err := l.reported(ctx); err != nil {
		return err
	}
	before, err := l.state(ctx, cli)
	if err != nil {
		return err
	}
	logf("the fields of %s are reported lost; %s", key, before)
	if err := l.druidWriteRefused(ctx); err != nil {
		return err
	}
	if err := pauseUntil(ctx, time.Now().Add(hold)); err != nil {
		return err
	}
	return l.unchanged(ctx, cli, before)
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

// expectFieldsLostInProcess checks what only a site alone in this process
// shows (the metrics registry is the process's): the controller
// reconciles again while the fields are gone, and its ExtensionLost
// metric stands.
func expectFieldsLostInProcess(t *testing.T, key client.ObjectKey, reconcilesBefore float64) {
	t.Helper()
	g := NewWithT(t)
	g.Eventually(func() float64 { return membershipReconciles(t) }).WithTimeout(2*time.Minute).WithPolling(time.Second).
		Should(BeNumerically(">", reconcilesBefore), "the controller reconciled the Etcd again while the fields were gone")
	g.Expect(extensionLostMetric(t, key)).To(Equal(1.0), "the ExtensionLost metric stands")
}

// reasonsSince are the reasons of the Events about e last seen at or
// after since.
func reasonsSince(ctx context.Context, s *Site, e *v1alpha1.Etcd, since time.Time) ([]string, error) {
	var list corev1.EventList
	if err := s.Client.List(ctx, &list, client.InNamespace(e.Namespace)); err != nil {
		return nil, err
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
	return out, nil
}
