// Package memberlease bridges druid's member leases and the pods of an Etcd
// whose ordinals do not start at 0.
//
// etcd-druid (v0.38.1, as v0.38.0) names member leases after the ordinals
// 0..replicas-1 (GetMemberLeaseNames) and reads only those: for the members'
// status and the Etcd's Ready condition (internal/health/etcdmember), and,
// with peer TLS, before every StatefulSet patch (its tls-enabled
// annotation). Each pod's backup-restore renews the lease named after its
// own member. An Etcd with spec.ordinalStart 3 runs the members 3..5: druid
// creates leases 0..2 that nobody renews, and the leases 3..5 that
// backup-restore would renew do not exist. druid then reports no members
// and never Ready, and with peer TLS its spec reconciliation waits forever.
// druid deletes leases it does not name only for externally managed
// members, so the leases created here stay.
//
// The Reconciler creates the leases of the members druid does not name
// (with druid's labels and owner, so druid deletes them with the Etcd) and
// copies what backup-restore writes into each of them (holder identity,
// renew time, backup-restore's annotations) onto a lease druid reads: the
// k-th member of the ordinal range onto druid's k-th lease name. druid's
// members then carry the real member IDs and roles under druid's names, and
// a member that stops renewing goes stale in druid's view as it would in
// druid's own naming. Nothing is copied while the real lease was never
// renewed.
package memberlease

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	stretchv1alpha1 "github.com/druid-stretch/druid-stretch/api/stretch/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/members"
	"github.com/druid-stretch/druid-stretch/internal/etcdview"
)

// componentMemberLease is the value of druid's component label on member
// leases (druid's internal common.ComponentNameMemberLease).
const componentMemberLease = "etcd-member-lease"

// backupRestoreAnnotationPrefix prefixes the annotations backup-restore
// writes on its member lease (member.etcd.gardener.cloud/tls-enabled).
const backupRestoreAnnotationPrefix = "member.etcd.gardener.cloud/"

// Selector selects druid's member leases (and those the bridge creates):
// a manager's cache of Leases for the bridge needs no others.
func Selector() labels.Selector {
	return labels.SelectorFromSet(labels.Set{druidv1alpha1.LabelComponentKey: componentMemberLease})
}

// Pair names a lease druid reads (Druid) and the lease of the member that
// stands in its place (Member).
type Pair struct {
	Druid, Member string
}

// Pairs are the leases to bridge for e: druid's lease names that no member
// of e's ordinal range has, each paired, in order, with a member of the
// range whose name druid does not use. Empty when the range starts at 0.
func Pairs(e *v1alpha1.Etcd) []Pair {
	druidNames := druidv1alpha1.GetMemberLeaseNames(e.DruidEtcd())
	r := members.LocalOrdinals(e)
	var own []string
	for o := r.Start; o < r.End; o++ {
		own = append(own, members.MemberName(e, o))
	}
	var unused, unnamed []string
	for _, n := range druidNames {
		if !slices.Contains(own, n) {
			unused = append(unused, n)
		}
	}
	for _, n := range own {
		if !slices.Contains(druidNames, n) {
			unnamed = append(unnamed, n)
		}
	}
	out := make([]Pair, 0, len(unused))
	for i := range min(len(unused), len(unnamed)) {
		out = append(out, Pair{Druid: unused[i], Member: unnamed[i]})
	}
	return out
}

// Reconciler keeps the bridged leases of every Etcd.
type Reconciler struct {
	// Client reads and writes Etcds and Leases.
	Client client.Client
	// Log receives a line per lease created.
	Log logr.Logger
	// Resync is how often an Etcd is looked at without a Lease event
	// (default 10 s, backup-restore's renewal period in druid's pods).
	Resync time.Duration
}

// SetupWithManager watches Etcds, their EtcdMemberships and the member
// leases druid labels.
func (r *Reconciler) SetupWithManager(mgr manager.Manager) error {
	if r.Resync <= 0 {
		r.Resync = 10 * time.Second
	}
	memberLease := predicate.NewPredicateFuncs(func(o client.Object) bool {
		return Selector().Matches(labels.Set(o.GetLabels()))
	})
	return ctrl.ControllerManagedBy(mgr).
		Named("etcd-member-lease-bridge").
		For(&v1alpha1.Etcd{}).
		// The ordinal range is the EtcdMembership's, of the Etcd's name:
		// a change of it alone may need leases that no Lease event asks for.
		Watches(&stretchv1alpha1.EtcdMembership{}, &handler.EnqueueRequestForObject{}).
		Watches(&coordinationv1.Lease{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			etcd := o.GetLabels()[druidv1alpha1.LabelPartOfKey]
			if etcd == "" {
				return nil
			}
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: etcd}}}
		}), ctrl.WithPredicates(memberLease)).
		Complete(r)
}

// Reconcile creates the missing member leases of one Etcd and copies each
// member's renewal onto the lease druid reads in its place.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	p, err := etcdview.Get(ctx, r.Client, req.NamespacedName)
	if err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	e := p.View
	pairs := Pairs(e)
	if len(pairs) == 0 || !e.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, nil
	}
	for _, p := range pairs {
		druidLease := &coordinationv1.Lease{}
		if err := r.Client.Get(ctx, client.ObjectKey{Namespace: e.Namespace, Name: p.Druid}, druidLease); err != nil {
			if apierrors.IsNotFound(err) {
				// druid has not synced this Etcd's leases yet (or does
				// not run it): nothing to bridge to.
				continue
			}
			return reconcile.Result{}, err
		}
		member, err := r.memberLease(ctx, e, p.Member)
		if err != nil {
			return reconcile.Result{}, err
		}
		if err := r.copyRenewal(ctx, member, druidLease); err != nil {
			return reconcile.Result{}, fmt.Errorf("copying the renewal of lease %s onto %s: %w", p.Member, p.Druid, err)
		}
	}
	return reconcile.Result{RequeueAfter: r.Resync}, nil
}

// memberLease returns the lease named after member, created as druid
// creates its own when it is missing.
func (r *Reconciler) memberLease(ctx context.Context, e *v1alpha1.Etcd, member string) (*coordinationv1.Lease, error) {
	l := &coordinationv1.Lease{}
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: e.Namespace, Name: member}, l)
	if !apierrors.IsNotFound(err) {
		return l, err
	}
	set := druidv1alpha1.GetDefaultLabels(e.ObjectMeta)
	set[druidv1alpha1.LabelComponentKey] = componentMemberLease
	set[druidv1alpha1.LabelAppNameKey] = member
	l = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{
		Name: member, Namespace: e.Namespace, Labels: set,
		OwnerReferences: []metav1.OwnerReference{druidv1alpha1.GetAsOwnerReference(e.ObjectMeta)},
	}}
	if err := r.Client.Create(ctx, l); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("creating the member lease %s: %w", member, err)
	}
	r.Log.Info("created the member lease backup-restore renews", "etcd", client.ObjectKeyFromObject(e).String(), "lease", member)
	return l, nil
}

// copyRenewal writes member's holder identity, renew time and
// backup-restore annotations onto druid's lease, when they differ.
func (r *Reconciler) copyRenewal(ctx context.Context, member, druidLease *coordinationv1.Lease) error {
	if member.Spec.RenewTime == nil {
		return nil
	}
	want := druidLease.DeepCopy()
	want.Spec.HolderIdentity = member.Spec.HolderIdentity
	want.Spec.RenewTime = member.Spec.RenewTime
	for k, v := range member.Annotations {
		if strings.HasPrefix(k, backupRestoreAnnotationPrefix) {
			if want.Annotations == nil {
				want.Annotations = map[string]string{}
			}
			want.Annotations[k] = v
		}
	}
	if equalRenewal(want, druidLease) {
		return nil
	}
	return r.Client.Patch(ctx, want, client.MergeFrom(druidLease))
}

func equalRenewal(a, b *coordinationv1.Lease) bool {
	return ptrEqual(a.Spec.HolderIdentity, b.Spec.HolderIdentity) &&
		a.Spec.RenewTime.Equal(b.Spec.RenewTime) && maps.Equal(a.Annotations, b.Annotations)
}

func ptrEqual[T comparable](a, b *T) bool {
	return (a == nil) == (b == nil) && (a == nil || *a == *b)
}
