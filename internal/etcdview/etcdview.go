// Package etcdview reads an Etcd together with its EtcdMembership, the way
// every part of druid-stretch sees an Etcd: druid's fields from the Etcd,
// druid-stretch's from the EtcdMembership of the same name (see
// stretchv1alpha1.View), and writes druid-stretch's part back where it lives.
package etcdview

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	stretchv1alpha1 "github.com/druid-stretch/druid-stretch/api/stretch/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
)

// Pair is an Etcd as stored, its EtcdMembership as stored (nil when there is
// none), and the View of the two.
type Pair struct {
	Etcd       *v1alpha1.Etcd
	Membership *stretchv1alpha1.EtcdMembership
	View       *v1alpha1.Etcd
	Source     stretchv1alpha1.SpecSource
}

// Get reads the Etcd key and its EtcdMembership. The Etcd's NotFound is
// returned as is (apierrors.IsNotFound); a missing EtcdMembership is not an
// error.
func Get(ctx context.Context, r client.Reader, key types.NamespacedName) (*Pair, error) {
	e := &v1alpha1.Etcd{}
	if err := r.Get(ctx, key, e); err != nil {
		return nil, err
	}
	m, err := GetMembership(ctx, r, key)
	if err != nil {
		return nil, err
	}
	return Of(e, m), nil
}

// Of is the Pair of e and m (nil when there is none).
func Of(e *v1alpha1.Etcd, m *stretchv1alpha1.EtcdMembership) *Pair {
	v, src := stretchv1alpha1.View(e, m)
	return &Pair{Etcd: e, Membership: m, View: v, Source: src}
}

// GetMembership reads the EtcdMembership key, nil when there is none.
func GetMembership(ctx context.Context, r client.Reader, key types.NamespacedName) (*stretchv1alpha1.EtcdMembership, error) {
	m := &stretchv1alpha1.EtcdMembership{}
	if err := r.Get(ctx, key, m); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading the EtcdMembership %s: %w", key, err)
	}
	return m, nil
}

// Adopt makes the EtcdMembership carry what the pair's View plans from: an
// Etcd that carries druid-stretch's fields inline (the extended Etcd CRD)
// gets them copied into its EtcdMembership, created when missing, so that
// they outlive druid's own CRD coming back; an Etcd planned from druid's
// bootstrap fields gets an empty one, to hold its status; an Etcd its
// namespace opts in (NamespaceOptIn) gets one with ordinalStart 0; an EtcdMembership
// without an owner gets the Etcd as its owner. Nothing of the etcd membership changes.
// It reports whether it wrote.
func Adopt(ctx context.Context, c client.Client, p *Pair) (bool, error) {
	switch {
	case p.Source == stretchv1alpha1.SpecFromEtcd && p.Membership == nil:
		m := stretchv1alpha1.For(p.Etcd, p.Etcd.Spec.MembershipSpec)
		if err := c.Create(ctx, m); err != nil {
			return false, fmt.Errorf("creating the EtcdMembership %s from the Etcd's fields: %w", client.ObjectKeyFromObject(m), err)
		}
		p.Membership = m
		return true, nil
	case p.Source == stretchv1alpha1.SpecFromBootstrap && p.Membership == nil:
		// Planned from druid's bootstrap fields alone (GEP-39), the Etcd
		// gets an EtcdMembership of its own all the same: the status lives
		// there, since druid's CRD prunes it from the Etcd. Its spec stays
		// empty: the View derives the rest from druid's fields every time.
		m := stretchv1alpha1.For(p.Etcd, v1alpha1.MembershipSpec{})
		if err := c.Create(ctx, m); err != nil {
			return false, fmt.Errorf("creating the EtcdMembership %s for the Etcd's bootstrapWithExistingCluster: %w", client.ObjectKeyFromObject(m), err)
		}
		p.Membership = m
		return true, nil
	case p.Source == stretchv1alpha1.SpecFromNamespace && p.Membership == nil:
		// Opted in by its namespace (NamespaceOptIn): written down, so
		// that it stays managed whatever the selector says later.
		m := stretchv1alpha1.For(p.Etcd, v1alpha1.MembershipSpec{OrdinalStart: ptr.To[int32](0)})
		if err := c.Create(ctx, m); err != nil {
			return false, fmt.Errorf("creating the EtcdMembership %s of an Etcd its namespace opts in: %w", client.ObjectKeyFromObject(m), err)
		}
		p.Membership, p.Source = m, stretchv1alpha1.SpecFromEtcdMembership
		return true, nil
	case p.Membership == nil:
		return false, nil
	}
	want := p.Membership.DeepCopy()
	switch p.Source {
	case stretchv1alpha1.SpecFromEtcd:
		want.Spec.MembershipSpec = *p.Etcd.Spec.MembershipSpec.DeepCopy()
	case stretchv1alpha1.SpecFromNamespace:
		want.Spec.OrdinalStart = ptr.To[int32](0)
	}
	if p.Etcd.UID != "" && !ownedBy(want, p.Etcd) {
		want.OwnerReferences = append(want.OwnerReferences, stretchv1alpha1.OwnerReference(p.Etcd))
	}
	if equality.Semantic.DeepEqual(want.Spec, p.Membership.Spec) && len(want.OwnerReferences) == len(p.Membership.OwnerReferences) {
		return false, nil
	}
	// Optimistic locking: a user's edit in between is not overwritten.
	if err := c.Patch(ctx, want, client.MergeFromWithOptions(p.Membership, client.MergeFromWithOptimisticLock{})); err != nil {
		return false, fmt.Errorf("copying the Etcd's fields into the EtcdMembership %s: %w", client.ObjectKeyFromObject(want), err)
	}
	p.Membership = want
	if p.Source == stretchv1alpha1.SpecFromNamespace {
		p.Source = stretchv1alpha1.SpecFromEtcdMembership
	}
	return true, nil
}

func ownedBy(m *stretchv1alpha1.EtcdMembership, e *v1alpha1.Etcd) bool {
	for _, o := range m.OwnerReferences {
		if o.UID == e.UID {
			return true
		}
	}
	return false
}

// WriteStatus writes status.membership of the pair's View back: into the
// EtcdMembership, and into the Etcd as well while the Etcd carries it (the
// extended Etcd CRD), so that readers of either see the same.
func WriteStatus(ctx context.Context, c client.Client, p *Pair) error {
	st := p.View.Status.Membership
	if m := p.Membership; m != nil {
		want := m.DeepCopy()
		want.Status.Membership = st.DeepCopy()
		want.Status.ObservedGeneration = m.Generation
		meta.SetStatusCondition(&want.Status.Conditions, metav1.Condition{
			Type: stretchv1alpha1.ConditionAttached, Status: metav1.ConditionTrue, Reason: stretchv1alpha1.ReasonEtcdFound, ObservedGeneration: m.Generation,
			Message: fmt.Sprintf("planned with the Etcd %s", client.ObjectKeyFromObject(p.Etcd)),
		})
		if !equality.Semantic.DeepEqual(want.Status, m.Status) {
			if err := c.Status().Patch(ctx, want, client.MergeFrom(m)); err != nil {
				return fmt.Errorf("writing status.membership of the EtcdMembership %s: %w", client.ObjectKeyFromObject(m), err)
			}
			p.Membership = want
		}
	}
	if p.Membership != nil && p.Source != stretchv1alpha1.SpecFromEtcd && p.Etcd.Status.Membership == nil {
		return nil
	}
	want := p.Etcd.DeepCopy()
	want.Status.Membership = st.DeepCopy()
	if equality.Semantic.DeepEqual(want.Status, p.Etcd.Status) {
		return nil
	}
	if err := c.Status().Patch(ctx, want, client.MergeFrom(p.Etcd)); err != nil {
		return fmt.Errorf("writing status.membership of the Etcd %s: %w", client.ObjectKeyFromObject(p.Etcd), err)
	}
	p.Etcd = want
	return nil
}

// Detached reports on the EtcdMembership key, when there is one, that no
// Etcd of its name exists, so that nothing is planned for it.
func Detached(ctx context.Context, c client.Client, key types.NamespacedName) error {
	m, err := GetMembership(ctx, c, key)
	if err != nil || m == nil {
		return err
	}
	want := m.DeepCopy()
	meta.SetStatusCondition(&want.Status.Conditions, metav1.Condition{
		Type: stretchv1alpha1.ConditionAttached, Status: metav1.ConditionFalse, Reason: stretchv1alpha1.ReasonEtcdNotFound, ObservedGeneration: m.Generation,
		Message: fmt.Sprintf("there is no Etcd %s in this namespace, so nothing is planned: an EtcdMembership attaches to the Etcd of its own name", key.Name),
	})
	if equality.Semantic.DeepEqual(want.Status, m.Status) {
		return nil
	}
	return c.Status().Patch(ctx, want, client.MergeFrom(m))
}

// Apply writes want, a changed copy of p.View, back where each part lives:
// druid-stretch's spec into the EtcdMembership (created when missing) first,
// so that the controller and the StatefulSet webhook see it before druid acts
// on the Etcd's change; then the Etcd, in druid's own form: an Etcd that
// still carries druid-stretch's fields inline (stored under the extended Etcd
// CRD of earlier releases) has them removed, now that its EtcdMembership
// carries them. Both writes are merge patches guarded by resourceVersion: a
// conflict is returned (apierrors.IsConflict) for the caller to read again
// and retry.
//
// A change that scales the Etcd to zero (an abort gives the cluster up)
// writes the Etcd first: the EtcdMembership's change that goes with it
// (Retire back to Keep in the middle of a move) is admitted only for an
// Etcd of zero replicas, and the EtcdMembership webhook judges it against
// the stored Etcd. In between, the controller sees Retire with no replicas,
// which it refuses to plan from, and changes nothing.
func Apply(ctx context.Context, c client.Client, p *Pair, want *v1alpha1.Etcd) error {
	if stretchv1alpha1.WriteEtcdFirst(p.Etcd, want) {
		if err := applyEtcd(ctx, c, p, want); err != nil {
			return err
		}
		return applyMembership(ctx, c, p, want)
	}
	if err := applyMembership(ctx, c, p, want); err != nil {
		return err
	}
	return applyEtcd(ctx, c, p, want)
}

func applyMembership(ctx context.Context, c client.Client, p *Pair, want *v1alpha1.Etcd) error {
	// A write that goes with a new spec.replicas of the Etcd, written
	// next, says so, so that the EtcdMembership's webhook judges it with
	// the pair as it is about to be (stretchv1alpha1.PairedReplicasAnnotation).
	m, err := writeMembership(ctx, c, p.Etcd, p.Membership, stretchv1alpha1.Own(want, p.Etcd), stretchv1alpha1.PairedReplicasFor(p.Etcd, want))
	if err != nil {
		return err
	}
	p.Membership = m
	return nil
}

func applyEtcd(ctx context.Context, c client.Client, p *Pair, want *v1alpha1.Etcd) error {
	e := p.Etcd.DeepCopy()
	e.ObjectMeta = *want.ObjectMeta.DeepCopy()
	// The View's generation is the pair's (stretchv1alpha1.View), not the
	// Etcd's; the API server owns the Etcd's.
	e.Generation = p.Etcd.Generation
	e.Spec = *want.Spec.DeepCopy()
	e.Spec.MembershipSpec = v1alpha1.MembershipSpec{}
	if equality.Semantic.DeepEqual(e.ObjectMeta, p.Etcd.ObjectMeta) && equality.Semantic.DeepEqual(e.Spec, p.Etcd.Spec) {
		return nil
	}
	if err := c.Patch(ctx, e, client.MergeFromWithOptions(p.Etcd, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("patching the Etcd %s: %w", client.ObjectKeyFromObject(e), err)
	}
	p.Etcd = e
	return nil
}

// Create creates e's EtcdMembership, when e sets druid-stretch's fields,
// and then e itself in druid's own form, as Apply writes it. An
// EtcdMembership that already exists is updated to e's fields. e is left
// as created, its fields back in place.
func Create(ctx context.Context, c client.Client, e *v1alpha1.Etcd) error {
	spec := *e.Spec.MembershipSpec.DeepCopy()
	if _, err := writeMembership(ctx, c, e, nil, stretchv1alpha1.Own(e), ""); err != nil {
		return err
	}
	e.Spec.MembershipSpec = v1alpha1.MembershipSpec{}
	err := c.Create(ctx, e)
	e.Spec.MembershipSpec = spec
	return err
}

// writeMembership makes e's EtcdMembership carry spec: it creates it when
// have is nil and spec sets a field (patching one that exists already), or
// patches have when its spec differs, guarded by resourceVersion; a patch
// carries paired, when set, as its PairedReplicasAnnotation. It returns the
// EtcdMembership as written, have when nothing was written.
func writeMembership(ctx context.Context, c client.Client, e *v1alpha1.Etcd, have *stretchv1alpha1.EtcdMembership, spec v1alpha1.MembershipSpec, paired string) (*stretchv1alpha1.EtcdMembership, error) {
	key := client.ObjectKeyFromObject(e)
	if have == nil {
		if stretchv1alpha1.IsZero(&spec) {
			return nil, nil
		}
		m := stretchv1alpha1.For(e, spec)
		err := c.Create(ctx, m)
		if err == nil {
			return m, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("creating the EtcdMembership %s: %w", key, err)
		}
		if have, err = GetMembership(ctx, c, key); err != nil || have == nil {
			return nil, err
		}
	}
	if equality.Semantic.DeepEqual(have.Spec.MembershipSpec, spec) {
		return have, nil
	}
	m := have.DeepCopy()
	m.Spec.MembershipSpec = *spec.DeepCopy()
	if paired != "" {
		metav1.SetMetaDataAnnotation(&m.ObjectMeta, stretchv1alpha1.PairedReplicasAnnotation, paired)
	}
	if err := c.Patch(ctx, m, client.MergeFromWithOptions(have, client.MergeFromWithOptimisticLock{})); err != nil {
		return nil, fmt.Errorf("patching the EtcdMembership %s: %w", key, err)
	}
	return m, nil
}
