package demo

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	stretchv1alpha1 "github.com/druid-stretch/druid-stretch/api/stretch/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/members"
	move "github.com/druid-stretch/druid-stretch/api/v1alpha1/migration"
	"github.com/druid-stretch/druid-stretch/internal/etcdview"
	"github.com/druid-stretch/druid-stretch/internal/livemove"
)

// SourceEtcd is the Etcd the demo creates in cluster A: druid's Etcd with
// peer TLS (the pod runner serves TLS with the demo's CA; the secrets are
// druid's business and not read here).
func (e *Env) SourceEtcd() *v1alpha1.Etcd {
	x := &v1alpha1.Etcd{ObjectMeta: metav1.ObjectMeta{Name: e.Config.Name, Namespace: e.Config.Namespace}}
	x.Spec.Replicas = e.Config.Replicas
	// ordinalStart 0 changes nothing for druid but opts the Etcd in: the
	// membership controller manages only Etcds that use an extension field,
	// and the move waits for the source to be observed converged.
	x.Spec.OrdinalStart = ptr.To[int32](0)
	x.Spec.Labels = map[string]string{"app": "etcd-statefulset", "role": "main"}
	tls := druidv1alpha1.TLSConfig{
		TLSCASecretRef:     druidv1alpha1.SecretReference{SecretReference: corev1.SecretReference{Name: "ca-etcd"}},
		ServerTLSSecretRef: corev1.SecretReference{Name: "etcd-server"},
		ClientTLSSecretRef: corev1.SecretReference{Name: "etcd-client"},
	}
	x.Spec.Etcd.PeerUrlTLS = &druidv1alpha1.PeerTLSConfig{TLSConfig: tls}
	x.Spec.Etcd.ClientUrlTLS = &tls
	return x
}

// CreateSource creates the Etcd in cluster A and waits until its members
// run and its controller reports them converged, all voters.
func (e *Env) CreateSource(ctx context.Context, timeout time.Duration) error {
	if err := etcdview.Create(ctx, e.A.Client, e.SourceEtcd()); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating the Etcd in cluster A: %w", err)
	}
	return e.WaitFor(ctx, timeout, "the source's members to run and converge", func(src, _ *v1alpha1.Etcd) bool {
		return src != nil && move.SourceRestored(src)
	})
}

// WaitFor polls both Etcd objects until cond holds, failing after timeout
// with what was last seen.
func (e *Env) WaitFor(ctx context.Context, timeout time.Duration, what string, cond func(src, dst *v1alpha1.Etcd) bool) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var lastErr error
	var src, dst *v1alpha1.Etcd
	for {
		var err error
		if src, dst, err = e.Read(ctx); err == nil {
			if cond(src, dst) {
				return nil
			}
		} else {
			lastErr = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w; last seen %s (last error: %v)", what, ctx.Err(), move.Explain(src, dst), lastErr)
		case <-tick.C:
		}
	}
}

// Mover is a livemove.Mover of the demo's Etcd from A to B, reaching each
// cluster's members through its pod runner. o's clients, names and
// addresses are filled in.
func (e *Env) Mover(o livemove.Options) (*livemove.Mover, error) {
	o.Source, o.Destination = e.A.Client, e.B.Client
	o.Namespace, o.Name = e.Config.Namespace, e.Config.Name
	o.SourceAddresses, o.DestinationAddresses = e.A.addresses, e.B.addresses
	if o.DestinationOrdinalStart == nil && o.DestinationMemberNamePrefix == nil {
		// Members etcd-main-3.. in B: the ordinal start at work.
		start := e.Config.Replicas
		o.DestinationOrdinalStart = &start
	}
	if o.PollInterval == 0 {
		o.PollInterval = 100 * time.Millisecond
	}
	return livemove.New(o)
}

// addresses are the URLs of a member of this cluster's runner: on one
// machine the other cluster reaches them directly (through the WAN fronts).
func (c *Cluster) addresses(e *v1alpha1.Etcd, memberName, _ string) (v1alpha1.ExternalMember, error) {
	o, ok := members.Ordinal(e, memberName)
	if !ok {
		return v1alpha1.ExternalMember{}, fmt.Errorf("%s is not a member name of %s/%s", memberName, e.Namespace, e.Name)
	}
	m, err := c.Runner.Member(e, o)
	if err != nil {
		return v1alpha1.ExternalMember{}, err
	}
	return v1alpha1.ExternalMember{PeerURLs: []string{m.PeerURL}, ClientURLs: []string{m.ClientURL}, SidecarURL: m.SidecarURL}, nil
}

// SideOf places a member name in cluster A (the source's members) or B.
func (e *Env) SideOf(name string) string {
	if slices.Contains(members.LocalMemberNames(e.SourceEtcd()), name) {
		return e.A.Name
	}
	return e.B.Name
}

// Delete deletes the Etcd in both clusters and waits until neither runner
// runs a pod of it any more.
func (e *Env) Delete(ctx context.Context, timeout time.Duration) error {
	for _, c := range e.Clusters() {
		x := &v1alpha1.Etcd{ObjectMeta: metav1.ObjectMeta{Name: e.Config.Name, Namespace: e.Config.Namespace}}
		if err := c.Client.Delete(ctx, x); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting the Etcd in cluster %s: %w", c.Name, err)
		}
		// Its owner's deletion would take it with a garbage collector;
		// these clusters run none.
		m := &stretchv1alpha1.EtcdMembership{ObjectMeta: metav1.ObjectMeta{Name: e.Config.Name, Namespace: e.Config.Namespace}}
		if err := c.Client.Delete(ctx, m); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting the EtcdMembership in cluster %s: %w", c.Name, err)
		}
	}
	return e.WaitFor(ctx, timeout, "the pods of the deleted Etcd to stop", func(_, _ *v1alpha1.Etcd) bool {
		for _, c := range e.Clusters() {
			for o := range 2*int(e.Config.Replicas) + 1 {
				if c.Runner.Running(e.Config.Namespace, fmt.Sprintf("%s-%d", e.Config.Name, o)) {
					return false
				}
			}
		}
		return true
	})
}

// EtcdMember is one member as etcd itself lists it.
type EtcdMember struct {
	Name    string
	Learner bool
}

// EtcdMembers asks etcd for its member list, through the running members
// of this Etcd in either cluster: the ground truth the controllers' status
// is checked against.
func (e *Env) EtcdMembers(ctx context.Context) ([]EtcdMember, error) {
	cli, err := e.etcdClient(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = cli.Close() }()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := cli.MemberList(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing the members through %v: %w", cli.Endpoints(), err)
	}
	out := make([]EtcdMember, 0, len(resp.Members))
	for _, m := range resp.Members {
		out = append(out, EtcdMember{Name: m.Name, Learner: m.IsLearner})
	}
	slices.SortFunc(out, func(a, b EtcdMember) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// etcdClient connects to the running voters of this Etcd in either
// cluster, as the controllers' status names them. The caller closes it.
func (e *Env) etcdClient(ctx context.Context) (*clientv3.Client, error) {
	voters, err := e.observedVoters(ctx)
	if err != nil {
		return nil, err
	}
	var eps []string
	for _, v := range voters {
		if m := e.member(v.Name); m != nil {
			eps = append(eps, m.ClientURL)
		}
	}
	if len(eps) == 0 {
		return nil, errors.New("no voter of the Etcd runs")
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, TLS: e.ClientTLS, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("connecting to %v: %w", eps, err)
	}
	return cli, nil
}
