package membership

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/members"
	"github.com/druid-stretch/druid-stretch/internal/membership"
)

// joiners are e's pods of the pod window as the admission sees them: member
// name, the peer URLs the planner adds the member with, the sidecar.
func (r *Reconciler) joiners(e *v1alpha1.Etcd) ([]membership.Joiner, error) {
	var out []membership.Joiner
	for _, o := range ordinals(members.PodWindow(e)) {
		name, pod := members.MemberName(e, o), members.PodName(e, o)
		urls, err := r.resolver.PeerURLs(e, name, pod)
		if err != nil {
			return nil, fmt.Errorf("resolving the peer URLs of %s: %w", name, err)
		}
		sc, err := r.resolver.SidecarURL(e, name, pod)
		if err != nil {
			return nil, fmt.Errorf("resolving the sidecar of %s: %w", name, err)
		}
		out = append(out, membership.Joiner{Member: name, PeerURLs: urls, Sidecar: sc})
	}
	return out, nil
}

// admitLearners lets the pods of the learners the planner added start (see
// internal/membership/admit.go). A failure is logged and retried by the next
// reconcile: the learner waits meanwhile, and the planner's progress
// timeout covers one that never starts.
func (r *Reconciler) admitLearners(ctx context.Context, e *v1alpha1.Etcd, obs *membership.Observation) {
	js, err := r.joiners(e)
	if err == nil {
		var admitted []string
		admitted, err = r.cluster.Admit(ctx, obs, js)
		if len(admitted) > 0 {
			r.event(e, corev1.EventTypeNormal, "MemberAdmitted", "Admit", "%s may start: joins the cluster as the learner it was added as", strings.Join(admitted, ", "))
		}
	}
	if err != nil {
		logf.FromContext(ctx).Info("admitting learners failed; retried on the next reconcile", "error", err.Error())
	}
}

// bootstrap starts a new Etcd's cluster when no sidecar could show one: only
// for an Etcd with no external member whose status never recorded a member,
// and only when every pod of its window waits with no data. It reports
// whether it admitted the members, and otherwise why not.
func (r *Reconciler) bootstrap(ctx context.Context, e *v1alpha1.Etcd) (bool, string, error) {
	if len(e.Spec.ExternalMembers) > 0 {
		return false, "the Etcd lists external members: its pods join their cluster, they never bootstrap one", nil
	}
	if st := e.Status.Membership; st != nil && len(st.Members) > 0 {
		return false, "status.membership recorded members before: the cluster existed, it is not bootstrapped again", nil
	}
	js, err := r.joiners(e)
	if err != nil {
		return false, "", err
	}
	return r.cluster.Bootstrap(ctx, js)
}
