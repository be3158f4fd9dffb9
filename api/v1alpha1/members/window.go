package members

import "github.com/druid-stretch/druid-stretch/api/v1alpha1"

// PodWindow is the ordinals whose pods must run for e: the ordinal range,
// widened to cover every local member that is still in the etcd membership as
// status.membership last observed it. A pod therefore stops only once its
// member has been removed, never while etcd still counts it. A StatefulSet
// runs a contiguous range of ordinals, so the window is the smallest range
// that covers both; the StatefulSet webhook and the test pod runner both use
// it. The window is empty (Start == End) when there is nothing to run.
func PodWindow(e *v1alpha1.Etcd) Ordinals {
	w := LocalOrdinals(e)
	if w.End <= w.Start {
		w = Ordinals{}
	}
	if e.Status.Membership == nil {
		return w
	}
	for _, m := range e.Status.Membership.Members {
		o, ok := Ordinal(e, m.Name)
		if !ok {
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
