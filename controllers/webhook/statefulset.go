package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/members"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/validation"
	"github.com/druid-stretch/druid-stretch/internal/etcdview"
)

// StatefulSetMutator is the mutating webhook on druid's StatefulSets. For a
// StatefulSet owned by an Etcd that uses the extension it sets
// spec.ordinals.start and spec.replicas to the Etcd's pod window and injects
// the membership sidecar; every other StatefulSet passes untouched. Admitting
// a StatefulSet it already mutated changes nothing.
type StatefulSetMutator struct {
	// Reader reads the owner Etcd (the manager's API reader).
	Reader client.Reader
	// Decoder decodes the admitted StatefulSet.
	Decoder admission.Decoder
	// Options say what to inject.
	Options Options
}

// Handle admits one StatefulSet create or update.
func (m *StatefulSetMutator) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return admission.Allowed("only creates and updates are mutated")
	}
	sts := &appsv1.StatefulSet{}
	if err := m.Decoder.Decode(req, sts); err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding the StatefulSet: %w", err))
	}
	p, err := m.owner(ctx, req.Namespace, sts)
	if err != nil {
		// Fail closed: a StatefulSet admitted without its ordinal start would
		// run pods at ordinals that are no members of the etcd cluster.
		return admission.Errored(http.StatusInternalServerError, err)
	}
	if p == nil {
		return admission.Allowed("not owned by an Etcd")
	}
	var old *appsv1.StatefulSet
	if req.Operation == admissionv1.Update {
		old = &appsv1.StatefulSet{}
		if err := m.Decoder.DecodeRaw(req.OldObject, old); err != nil {
			return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding the StatefulSet as stored: %w", err))
		}
	}
	// A StatefulSet on another pod window of druid-stretch's whose Etcd
	// lost its fields is refused below, not put on ordinals from 0.
	if NamespaceMayOptIn(old, p.Etcd) {
		if err := m.Options.ManagedNamespaces.Apply(ctx, m.Reader, p); err != nil {
			return admission.Errored(http.StatusInternalServerError, err)
		}
	}
	e := p.View
	if !e.UsesExtension() {
		if w, ok := storedWindow(old); ok && !equality.Semantic.DeepEqual(sts.Spec, old.Spec) {
			// The fields went while the pods run with druid-stretch's
			// sidecar and window: pruned by a CRD without them (gardenlet
			// re-applies druid's own), or removed by hand. Letting druid's
			// write through would restart every pod without its sidecar and
			// stop the pods outside druid's ordinals, voters among them. A
			// change of metadata alone goes through: removing the
			// annotation hands the StatefulSet back to druid.
			return admission.Denied(fmt.Sprintf("neither Etcd %s nor an EtcdMembership of its name carries druid-stretch's fields (spec.ordinalStart, spec.externalMembers, spec.externalMembersPolicy), "+
				"but its StatefulSet %s runs druid-stretch's sidecar on the pod window %s: the update is refused so that no member loses its sidecar or its pod. "+
				"Restore the fields in the EtcdMembership %s, or hand the StatefulSet back to druid by removing its annotation %s once its pods are druid's ordinals 0..replicas-1",
				e.Name, sts.Name, w, e.Name, PodWindowAnnotation))
		}
		return admission.Allowed(fmt.Sprintf("Etcd %s uses no druid-stretch extension field", e.Name))
	}
	mutated := sts.DeepCopy()
	if err := m.mutate(mutated, e, old); err != nil {
		return admission.Denied(err.Error())
	}
	raw, err := json.Marshal(mutated)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("encoding the mutated StatefulSet: %w", err))
	}
	logf.FromContext(ctx).V(1).Info("StatefulSet put on the Etcd's pod window with the sidecar",
		"statefulSet", req.Name, "etcd", e.Name, "replicas", *mutated.Spec.Replicas, "ordinalStart", ordinalStart(mutated))
	return admission.PatchResponseFromRaw(req.Object.Raw, raw)
}

// owner returns the Etcd that owns sts with its EtcdMembership, nil when it
// has none (or the owner named is gone, or is another object under the
// same name).
func (m *StatefulSetMutator) owner(ctx context.Context, namespace string, sts *appsv1.StatefulSet) (*etcdview.Pair, error) {
	for _, ref := range sts.OwnerReferences {
		gv, err := schema.ParseGroupVersion(ref.APIVersion)
		if err != nil || gv.Group != v1alpha1.GroupVersion.Group || ref.Kind != "Etcd" {
			continue
		}
		key := types.NamespacedName{Namespace: namespace, Name: ref.Name}
		p, err := etcdview.Get(ctx, m.Reader, key)
		if err != nil {
			if apierrors.IsNotFound(err) {
				return nil, nil
			}
			return nil, fmt.Errorf("reading the owner Etcd %s of StatefulSet %s: %w", key, sts.Name, err)
		}
		if ref.UID != "" && ref.UID != p.Etcd.UID {
			return nil, nil
		}
		return p, nil
	}
	return nil, nil
}

// PodWindowAnnotation records on the StatefulSet the pod window the webhook
// put it on, "[start, end)". SyncPodWindow changes it to have the window
// recomputed when status.membership moved it.
const PodWindowAnnotation = "druid-stretch.druid.gardener.cloud/pod-window"

// mutate puts sts on e's pod window and injects the sidecar. old is sts as
// stored (nil on create): an update keeps every pod old runs (KeptWindow),
// unless it is SyncPodWindow's, which carries the window the controller
// derived from etcd's member list.
func (m *StatefulSetMutator) mutate(sts *appsv1.StatefulSet, e *v1alpha1.Etcd, old *appsv1.StatefulSet) error {
	if err := validation.ValidatePodWindow(e); err != nil {
		return err
	}
	w := members.PodWindow(e)
	if old != nil {
		running := members.RunningOrdinals(old)
		if synced, ok := syncedWindow(sts, old); ok {
			running = synced
		}
		w = members.KeptWindow(e, running)
	}
	if sts.Annotations == nil {
		sts.Annotations = map[string]string{}
	}
	sts.Annotations[PodWindowAnnotation] = w.String()
	if w.End <= w.Start {
		// Nothing runs: keep the ordinal start of the range, so scaling up
		// again starts the pods where the Etcd says.
		zero := int32(0)
		sts.Spec.Replicas = &zero
		members.SetStatefulSetOrdinals(sts, e)
	} else {
		if w.Start > math.MaxInt32 || w.End-w.Start > math.MaxInt32 {
			return fmt.Errorf("the pod window [%d, %d) of Etcd %s does not fit a StatefulSet's int32 ordinals; check status.membership for a member named like a local member with a huge ordinal", w.Start, w.End, e.Name)
		}
		replicas := int32(w.End - w.Start)
		sts.Spec.Replicas = &replicas
		if w.Start == 0 {
			sts.Spec.Ordinals = nil // as druid writes it
		} else {
			sts.Spec.Ordinals = &appsv1.StatefulSetOrdinals{Start: int32(w.Start)}
		}
	}
	if err := injectSidecar(&sts.Spec.Template.Spec, e, m.Options); err != nil {
		return err
	}
	if err := interposeSidecar(&sts.Spec.Template.Spec, e, m.Options); err != nil {
		return err
	}
	// druid stamps the pod template with a checksum of its etcd ConfigMap,
	// whose initial cluster lists ordinals 0..replicas-1: every replicas
	// change of a move (1, 2, 3 destination members) would make a new
	// revision, and the StatefulSet controller would restart the members
	// that joined first, with their clients, once all are ready. A managed
	// member takes its etcd configuration from the sidecar at every start,
	// which reads druid's file as mounted then; a changed setting applies
	// at the member's next restart instead of through a rolling restart.
	delete(sts.Spec.Template.Annotations, DruidConfigChecksumAnnotation)
	return nil
}

// syncedWindow is the window SyncPodWindow wrote into sts: its
// PodWindowAnnotation, when that differs from old's and parses. druid's own
// writes of the StatefulSet drop every annotation, so they never carry one.
func syncedWindow(sts, old *appsv1.StatefulSet) (members.Ordinals, bool) {
	a, ok := sts.Annotations[PodWindowAnnotation]
	if !ok || a == old.Annotations[PodWindowAnnotation] {
		return members.Ordinals{}, false
	}
	w, err := members.ParseOrdinals(a)
	return w, err == nil
}

// NamespaceMayOptIn reports whether an Etcd e that carries no field of
// druid-stretch's may be opted in by its namespace
// (etcdview.NamespaceOptIn), given its StatefulSet as stored (nil when
// there is none): when druid-stretch never put the StatefulSet on a pod
// window, or put it on exactly druid's own ordinals [0, replicas), which
// is what the opt-in gives. Any other window is lost state: the Etcd's
// fields went while its pods run elsewhere (a move, a change of replicas
// under way), and planning it from ordinalStart 0 would undo that; it is
// reported and left as it is.
func NamespaceMayOptIn(sts *appsv1.StatefulSet, e *v1alpha1.Etcd) bool {
	if sts == nil {
		return true
	}
	a, ok := sts.Annotations[PodWindowAnnotation]
	if !ok {
		return true
	}
	w, err := members.ParseOrdinals(a)
	return err == nil && w == members.Ordinals{Start: 0, End: int64(e.Spec.Replicas)}
}

// storedWindow is the PodWindowAnnotation of the stored StatefulSet old
// (nil on create): the window the webhook put it on.
func storedWindow(old *appsv1.StatefulSet) (string, bool) {
	if old == nil {
		return "", false
	}
	w, ok := old.Annotations[PodWindowAnnotation]
	return w, ok
}

// DruidConfigChecksumAnnotation is the pod template annotation through
// which druid rolls its pods whenever its etcd ConfigMap changes.
const DruidConfigChecksumAnnotation = "checksum/etcd-configmap"

// SyncPodWindow puts druid's StatefulSet of e on the pod window want: it
// patches PodWindowAnnotation, and the admission of that patch puts
// spec.ordinals and spec.replicas on want widened to e's PodWindow. The
// membership controller calls it after writing status.membership, with the
// window it derived from etcd's member list (a member of the old ordinal
// range was removed, so its pod may go); druid itself writes the
// StatefulSet only when the Etcd's spec changes, and such a write never
// stops a running pod. It does nothing when the window is already in
// place, when the StatefulSet does not exist yet, or when it is not e's.
// It needs patch on statefulsets.
func SyncPodWindow(ctx context.Context, c client.Client, e *v1alpha1.Etcd, want members.Ordinals) (changed bool, err error) {
	if !e.UsesExtension() {
		return false, nil
	}
	sts := &appsv1.StatefulSet{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: e.Namespace, Name: e.Name}, sts); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("reading the StatefulSet of Etcd %s/%s: %w", e.Namespace, e.Name, err)
	}
	if !metav1.IsControlledBy(sts, e) {
		return false, nil
	}
	if sts.Annotations[PodWindowAnnotation] == want.String() {
		return false, nil
	}
	patch := client.MergeFrom(sts.DeepCopy())
	if sts.Annotations == nil {
		sts.Annotations = map[string]string{}
	}
	sts.Annotations[PodWindowAnnotation] = want.String()
	if err := c.Patch(ctx, sts, patch); err != nil {
		return false, fmt.Errorf("moving the StatefulSet of Etcd %s/%s to the pod window %s: %w", e.Namespace, e.Name, want, err)
	}
	return true, nil
}

func ordinalStart(sts *appsv1.StatefulSet) int32 {
	if sts.Spec.Ordinals == nil {
		return 0
	}
	return sts.Spec.Ordinals.Start
}
