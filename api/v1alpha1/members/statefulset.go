package members

import (
	"encoding/json"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
)

// statefulSetOrdinalsPatch is the merge patch body. A nil Ordinals renders as
// "ordinals": null, which removes the field: ordinal start 0 leaves druid's
// StatefulSet exactly as druid writes it.
type statefulSetOrdinalsPatch struct {
	Spec struct {
		Ordinals *appsv1.StatefulSetOrdinals `json:"ordinals"`
	} `json:"spec"`
}

// StatefulSetOrdinals is the spec.ordinals that druid's StatefulSet for e
// must carry: nil for ordinal start 0 (druid's default), else the start.
func StatefulSetOrdinals(e *v1alpha1.Etcd) *appsv1.StatefulSetOrdinals {
	start := e.Spec.GetOrdinalStart()
	if start == 0 {
		return nil
	}
	return &appsv1.StatefulSetOrdinals{Start: start}
}

// SetStatefulSetOrdinals sets sts.spec.ordinals for e, for a mutating
// webhook that edits druid's StatefulSet in place.
func SetStatefulSetOrdinals(sts *appsv1.StatefulSet, e *v1alpha1.Etcd) {
	sts.Spec.Ordinals = StatefulSetOrdinals(e)
}

// OrdinalsMergePatch is the JSON merge patch that puts a StatefulSet on e's
// ordinal start: {"spec":{"ordinals":{"start":N}}}, or
// {"spec":{"ordinals":null}} for 0. With controller-runtime:
// c.Patch(ctx, sts, client.RawPatch(types.MergePatchType, OrdinalsMergePatch(e)))
// (the api module leaves controller-runtime to its importers).
func OrdinalsMergePatch(e *v1alpha1.Etcd) []byte {
	var p statefulSetOrdinalsPatch
	p.Spec.Ordinals = StatefulSetOrdinals(e)
	data, err := json.Marshal(p)
	if err != nil {
		// A struct of an int32 pointer always marshals.
		panic("members: marshalling the ordinals patch: " + err.Error())
	}
	return data
}
