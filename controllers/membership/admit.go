package membership

import (
	"context"
	"crypto/tls"
	"fmt"
	"slices"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/members"
	"github.com/druid-stretch/druid-stretch/controllers/webhook"
	"github.com/druid-stretch/druid-stretch/internal/planner"
	"github.com/druid-stretch/druid-stretch/internal/sidecarcluster"
)

// joiners are e's pods of the pod window, every pod that runs included
// (running), as the admission sees them: member name, the peer URLs the
// planner adds the member with (without those another member of obs has;
// obs is nil for a bootstrap), the sidecar.
func (r *Reconciler) joiners(e *v1alpha1.Etcd, running members.Ordinals, obs *sidecarcluster.Observation, t *tls.Config) ([]sidecarcluster.Joiner, error) {
	var out []sidecarcluster.Joiner
	for _, o := range ordinals(members.KeptWindow(e, running)) {
		name, pod := members.MemberName(e, o), members.PodName(e, o)
		urls, err := r.resolver.PeerURLs(e, name, pod)
		if err != nil {
			return nil, fmt.Errorf("resolving the peer URLs of %s: %w", name, err)
		}
		// The URLs the member was added with (target): without those
		// another member has.
		if obs != nil {
			if urls, err = apart(e, name, urls, obs); err != nil {
				return nil, err
			}
		}
		sc, err := r.resolver.SidecarURL(e, name, pod)
		if err != nil {
			return nil, fmt.Errorf("resolving the sidecar of %s: %w", name, err)
		}
		out = append(out, sidecarcluster.Joiner{Member: name, PeerURLs: urls, Sidecar: sc, TLS: t})
	}
	return out, nil
}

// admitLearners lets the pods of the learners the planner added start (see
// internal/sidecarcluster/admit.go). A failure is logged and retried by the next
// reconcile: the learner waits meanwhile, and the planner's progress
// timeout covers one that never starts.
func (r *Reconciler) admitLearners(ctx context.Context, e *v1alpha1.Etcd, running members.Ordinals, obs *sidecarcluster.Observation, t *tls.Config) {
	js, err := r.joiners(e, running, obs, t)
	if err == nil {
		var admitted []string
		admitted, err = r.cluster.Admit(ctx, obs, js)
		if len(admitted) > 0 {
			r.event(ctx, e, corev1.EventTypeNormal, "MemberAdmitted", "Admit", "%s may start: joins the cluster as the learner it was added as", strings.Join(admitted, ", "))
		}
	}
	if err != nil {
		logf.FromContext(ctx).Info("admitting learners failed; retried on the next reconcile", "error", err.Error())
	}
}

// bootstrap starts a new Etcd's cluster when no sidecar could show one: only
// for an Etcd with no external member whose status never recorded a member,
// only when every pod of its window (every pod that runs included) waits
// with no data, and only when no volume of another ordinal exists. The
// status alone proves nothing, since others can drop it (druid's compaction
// controller replaces the whole status): the pods' data and the volumes
// are the facts that a cluster existed. It reports whether it admitted the
// members, and otherwise why not.
func (r *Reconciler) bootstrap(ctx context.Context, e *v1alpha1.Etcd, sts *appsv1.StatefulSet, t *tls.Config) (bool, string, error) {
	if len(e.Spec.ExternalMembers) > 0 {
		return false, "the Etcd lists external members: its pods join their cluster, they never bootstrap one", nil
	}
	if st := e.Status.Membership; st != nil && len(st.Members) > 0 {
		return false, "status.membership recorded members before: the cluster existed, it is not bootstrapped again", nil
	}
	running := members.RunningOrdinals(sts)
	window := members.KeptWindow(e, running)
	if vol, err := r.volumeOutside(ctx, sts, window); err != nil || vol != "" {
		if err != nil {
			return false, "", fmt.Errorf("not bootstrapping: listing the Etcd's volumes: %w", err)
		}
		return false, "", fmt.Errorf("not bootstrapping: the volume %s belongs to an ordinal outside the pods %s, so the cluster may have existed with data there; "+
			"the pods wait until a member of the cluster answers (delete the volume if its data is not needed)", vol, window)
	}
	js, err := r.joiners(e, running, nil, t)
	if err != nil {
		return false, "", err
	}
	return r.cluster.Bootstrap(ctx, js)
}

// volumeOutside names a PersistentVolumeClaim of sts's volume claim
// templates whose ordinal is outside window ("" if none): a volume the
// StatefulSet made for a pod it no longer runs, which may hold etcd data.
func (r *Reconciler) volumeOutside(ctx context.Context, sts *appsv1.StatefulSet, window members.Ordinals) (string, error) {
	if sts == nil || len(sts.Spec.VolumeClaimTemplates) == 0 {
		return "", nil
	}
	var pvcs corev1.PersistentVolumeClaimList
	if err := r.reader.List(ctx, &pvcs, client.InNamespace(sts.Namespace)); err != nil {
		return "", err
	}
	for _, pvc := range pvcs.Items {
		for _, t := range sts.Spec.VolumeClaimTemplates {
			digits, ok := strings.CutPrefix(pvc.Name, t.Name+"-"+sts.Name+"-")
			if !ok {
				continue
			}
			if o, err := strconv.ParseInt(digits, 10, 64); err == nil && strconv.FormatInt(o, 10) == digits && !window.Contains(o) {
				return pvc.Name, nil
			}
		}
	}
	return "", nil
}

// notePodsWaiting marks in t the members to add whose pods cannot start
// them yet (planner.Want.PodNotWaiting), where e's pods start their
// members only once admitted (webhook.StartsThroughSidecar): the planner
// adds such a member once its pod runs, so that its etcd takes its
// configuration at once instead of after the pod's start, a learner that
// cannot start holding a learner slot and the next learner's start
// meanwhile. Elsewhere (members started by other means) every member is
// added as before.
func (r *Reconciler) notePodsWaiting(ctx context.Context, e *v1alpha1.Etcd, s *scope, obs *sidecarcluster.Observation, t *sidecarcluster.Target, tlsCfg *tls.Config) error {
	if s.sts != nil && !webhook.StartsThroughSidecar(s.sts) {
		return nil
	}
	if s.sts == nil && !r.opts.PodsStartThroughSidecar {
		return nil
	}
	missing := map[string]*planner.Want{}
	for _, ws := range [][]planner.Want{t.Add, t.Learners} {
		for i := range ws {
			if !inCluster(obs, ws[i]) {
				missing[ws[i].Name] = &ws[i]
			}
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if s.sts == nil {
		// The first reconcile of a destination's join runs before druid
		// created its StatefulSet: a learner added now waits for a pod
		// that does not exist yet, and the next learner's add behind it.
		for _, w := range missing {
			w.PodNotWaiting = "the Etcd's StatefulSet does not exist yet (druid creates it)"
		}
		return nil
	}
	js, err := r.joiners(e, s.running, obs, tlsCfg)
	if err != nil {
		return err
	}
	js = slices.DeleteFunc(js, func(j sidecarcluster.Joiner) bool { return missing[j.Member] == nil })
	waiting := r.cluster.PodsWaiting(ctx, js)
	for name, w := range missing {
		why, asked := waiting[name]
		if !asked {
			// Not a pod of the window: nothing could start it yet.
			why = "its pod is not in the StatefulSet's pod window yet"
		}
		w.PodNotWaiting = why
	}
	return nil
}

// inCluster tells whether obs has a member that is w: by name, or by a
// peer URL in common (a learner that has not started has no name yet).
func inCluster(obs *sidecarcluster.Observation, w planner.Want) bool {
	for _, m := range obs.List.Members {
		if m.Name == w.Name || slices.ContainsFunc(m.PeerURLs, func(u string) bool { return slices.Contains(w.PeerURLs, u) }) {
			return true
		}
	}
	return false
}
