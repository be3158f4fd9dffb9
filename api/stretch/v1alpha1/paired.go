package v1alpha1

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
)

// PairedReplicasAnnotation marks an EtcdMembership write that goes with a
// write of the Etcd's spec.replicas, made right after it (a step of a move
// that changes both, as etcdview.Apply writes them): its value is
// "<replicas>/<the Etcd's resourceVersion before the write>". The
// EtcdMembership's webhook judges that write with those replicas, the pair
// as it is about to be, and only when the value is new in that write: a
// value left behind by an earlier write judges nothing.
const PairedReplicasAnnotation = "druid-stretch.druid.gardener.cloud/paired-etcd-replicas"

// PairedReplicas is the value of PairedReplicasAnnotation for a write that
// goes with the Etcd e scaled to replicas.
func PairedReplicas(e *v1alpha1.Etcd, replicas int32) string {
	return fmt.Sprintf("%d/%s", replicas, e.ResourceVersion)
}

// ParsePairedReplicas is the replicas of a PairedReplicasAnnotation value.
func ParsePairedReplicas(v string) (int32, error) {
	n, _, ok := strings.Cut(v, "/")
	if !ok {
		return 0, fmt.Errorf("%s %q: want <replicas>/<resourceVersion>", PairedReplicasAnnotation, v)
	}
	r, err := strconv.ParseInt(n, 10, 32)
	if err != nil || r < 0 {
		return 0, fmt.Errorf("%s %q: want <replicas>/<resourceVersion> with replicas a number from 0", PairedReplicasAnnotation, v)
	}
	return int32(r), nil
}

// WriteEtcdFirst reports whether a change of the stored Etcd to view, a
// changed View, writes the Etcd before its EtcdMembership: only a change
// that scales the Etcd to zero (an abort), whose EtcdMembership change
// (Retire back to Keep in the middle of a move) is admitted only for an
// Etcd of zero replicas. Every other change writes the EtcdMembership
// first, so that the controller and the StatefulSet webhook see it before
// druid acts on the Etcd.
func WriteEtcdFirst(stored, view *v1alpha1.Etcd) bool {
	return view.Spec.Replicas == 0 && stored.Spec.Replicas > 0
}

// PairedReplicasFor is the PairedReplicasAnnotation value for the
// EtcdMembership write of a change of the stored Etcd to view, written
// before the Etcd; empty when the Etcd's spec.replicas does not change.
func PairedReplicasFor(stored, view *v1alpha1.Etcd) string {
	if view.Spec.Replicas == stored.Spec.Replicas {
		return ""
	}
	return PairedReplicas(stored, view.Spec.Replicas)
}
