package etcdview

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	stretchv1alpha1 "github.com/druid-stretch/druid-stretch/api/stretch/v1alpha1"
)

// NamespaceOptIn opts in every Etcd of the namespaces its selector matches,
// as if each had an EtcdMembership with ordinalStart 0: the sidecars are
// injected and the membership is observed, and nothing of the Etcd or its
// members changes. On a seed that is every shoot namespace
// (gardener.cloud/role=shoot), so that an Etcd gardenlet creates is ready
// for a live move without any object of druid-stretch's: GEP-39 writes
// only druid's fields.
//
// The opt-in is written down (Adopt creates the EtcdMembership), so that an
// Etcd stays managed when the selector changes later or its namespace loses
// the label: a move under way never loses its sidecars to a configuration
// change. Callers apply it only where it changes nothing that runs
// (webhook.NamespaceMayOptIn): an Etcd whose StatefulSet druid-stretch
// put on other ordinals than druid's own and that lost its fields is lost
// state, reported and left as it is, never planned anew from ordinalStart 0.
//
// It is a pflag.Value: the flag takes a label selector, and an empty one
// opts in nothing (not every namespace).
type NamespaceOptIn struct {
	selector labels.Selector
	raw      string
}

// ParseNamespaceOptIn parses a label selector (kubectl's syntax); "" opts in
// nothing.
func ParseNamespaceOptIn(s string) (NamespaceOptIn, error) {
	var o NamespaceOptIn
	return o, o.Set(s)
}

// Set parses s as a label selector.
func (o *NamespaceOptIn) Set(s string) error {
	if s == "" {
		*o = NamespaceOptIn{}
		return nil
	}
	sel, err := labels.Parse(s)
	if err != nil {
		return fmt.Errorf("namespace selector %q: %w", s, err)
	}
	*o = NamespaceOptIn{selector: sel, raw: s}
	return nil
}

func (o *NamespaceOptIn) String() string { return o.raw }

// Type names the flag's value in the help text.
func (*NamespaceOptIn) Type() string { return "selector" }

// Enabled reports whether the opt-in matches any namespace at all.
func (o NamespaceOptIn) Enabled() bool { return o.selector != nil }

// Apply opts the pair in when neither its Etcd nor an EtcdMembership sets a
// membership field and its namespace's labels match: the View gets
// ordinalStart 0, the pair's Source becomes SpecFromNamespace. A namespace
// that cannot be read is an error (nothing is decided on a guess); one that
// is gone matches nothing.
func (o NamespaceOptIn) Apply(ctx context.Context, r client.Reader, p *Pair) error {
	if o.selector == nil || p.Source != stretchv1alpha1.SpecNone {
		return nil
	}
	ns := &corev1.Namespace{}
	if err := r.Get(ctx, client.ObjectKey{Name: p.Etcd.Namespace}, ns); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("reading the labels of namespace %s (Etcds of namespaces matching %q are managed): %w", p.Etcd.Namespace, o.raw, err)
	}
	if !o.selector.Matches(labels.Set(ns.Labels)) {
		return nil
	}
	p.View.Spec.OrdinalStart = ptr.To[int32](0)
	p.Source = stretchv1alpha1.SpecFromNamespace
	return nil
}
