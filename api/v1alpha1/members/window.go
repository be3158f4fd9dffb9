package members

import (
	appsv1 "k8s.io/api/apps/v1"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
)

// PodWindow is the ordinals whose pods must run for e: the ordinal range,
// widened to cover every local member that is still in the etcd membership as
// status.membership last observed it. A pod therefore stops only once its
// member has been removed, never while etcd still counts it. A StatefulSet
// runs a contiguous range of ordinals, so the window is the smallest range
// that covers both; the StatefulSet webhook and the test pod runner both use
// it. The window is empty (Start == End) when there is nothing to run.
//
// A hibernated Etcd (see Hibernated) runs no pod, whatever the membership.
//
// A member observed as External or Unmanaged does not widen the window,
// whatever its name: the two Etcds of a live move share their name, so the
// destination's members have names of the source's form (etcd-main-3 beside
// etcd-main-0), and the source's last observation still lists them after
// the move forgot them.
func PodWindow(e *v1alpha1.Etcd) Ordinals {
	w := LocalOrdinals(e)
	if w.End <= w.Start {
		w = Ordinals{}
	}
	if e.Status.Membership == nil || Hibernated(e) {
		return w
	}
	for _, m := range e.Status.Membership.Members {
		o, ok := Ordinal(e, m.Name)
		if !ok || m.Origin == v1alpha1.MemberOriginExternal || m.Origin == v1alpha1.MemberOriginUnmanaged {
			continue
		}
		if w.End <= w.Start {
			w = Ordinals{Start: o, End: o + 1}
			continue
		}
		w.Start, w.End = min(w.Start, o), max(w.End, o+1)
	}
	return w
}

// RunningOrdinals is the ordinals whose pods sts runs:
// [spec.ordinals.start, start+spec.replicas); empty for a nil sts.
func RunningOrdinals(sts *appsv1.StatefulSet) Ordinals {
	if sts == nil || sts.Spec.Replicas == nil {
		return Ordinals{}
	}
	var start int64
	if sts.Spec.Ordinals != nil {
		start = int64(sts.Spec.Ordinals.Start)
	}
	return Ordinals{Start: start, End: start + int64(*sts.Spec.Replicas)}.Union(Ordinals{})
}

// KeptWindow is the pod window where nobody has just observed etcd's
// members: PodWindow widened to every ordinal the StatefulSet runs
// (running). PodWindow reads status.membership, which others can drop
// (druid's compaction controller replaces the whole status): a window that
// shrank on a dropped status would stop the pods of voters. A pod that runs
// stops only once an observation of etcd's member list showed its member
// gone (the membership controller's SyncPodWindow), or when e hibernates.
func KeptWindow(e *v1alpha1.Etcd, running Ordinals) Ordinals {
	if Hibernated(e) {
		return Ordinals{}
	}
	return PodWindow(e).Union(running)
}

// Hibernated reports whether e asks for no pod and takes part in no move:
// replicas 0 and no external member. druid scales such an Etcd to zero and
// keeps its volumes; etcd's membership is left as it is, so the same
// members come back with their data when the replicas do. (The destination
// of an aborted move also has replicas 0, but lists the source's members:
// its pods stay until its members are removed.)
func Hibernated(e *v1alpha1.Etcd) bool {
	return e.Spec.Replicas == 0 && len(e.Spec.ExternalMembers) == 0
}
