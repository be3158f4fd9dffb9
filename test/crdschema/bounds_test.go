package crdschema

import (
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/validation"
)

// TestTransitions covers the transitions validateTransitions refuses and,
// beside each, the ones a move needs and that must stay possible.
func TestTransitions(t *testing.T) {
	retiring := func(phase v1alpha1.MembershipPhase) *v1alpha1.Etcd {
		e := baseEtcd()
		e.Spec.ExternalMembersPolicy = ptr.To(v1alpha1.ExternalMembersPolicyRetire)
		e.Status.Membership = &v1alpha1.MembershipStatus{Phase: phase}
		return e
	}
	keep := func(e *v1alpha1.Etcd) { e.Spec.ExternalMembersPolicy = ptr.To(v1alpha1.ExternalMembersPolicyKeep) }
	policy := wantErr{"spec.externalMembersPolicy", field.ErrorTypeInvalid}
	start := wantErr{"spec.ordinalStart", field.ErrorTypeInvalid}
	for _, tc := range []struct {
		name   string
		old    *v1alpha1.Etcd
		mutate func(*v1alpha1.Etcd)
		want   []wantErr
	}{
		{"Retire to Keep while Reconfiguring", retiring(v1alpha1.MembershipPhaseReconfiguring), keep, []wantErr{policy}},
		{"Retire to Keep while Blocked", retiring(v1alpha1.MembershipPhaseBlocked), keep, []wantErr{policy}},
		{"Retire to unset while Reconfiguring", retiring(v1alpha1.MembershipPhaseReconfiguring), func(e *v1alpha1.Etcd) { e.Spec.ExternalMembersPolicy = nil }, []wantErr{policy}},
		{"Retire to Keep once Converged", retiring(v1alpha1.MembershipPhaseConverged), keep, nil},
		{"Retire to Keep before the first observation", retiring(v1alpha1.MembershipPhasePending), keep, nil},
		{"abort mid-move: Keep with replicas 0", retiring(v1alpha1.MembershipPhaseReconfiguring), func(e *v1alpha1.Etcd) { keep(e); e.Spec.Replicas = 0 }, nil},
		{"finish mid-move: Keep with no external member", retiring(v1alpha1.MembershipPhaseReconfiguring), func(e *v1alpha1.Etcd) { keep(e); e.Spec.ExternalMembers = nil }, nil},
		{"ordinalStart by replicas", baseEtcd(), func(e *v1alpha1.Etcd) { e.Spec.OrdinalStart = ptr.To[int32](3) }, nil},
		{"ordinalStart by replicas+1", baseEtcd(), func(e *v1alpha1.Etcd) { e.Spec.OrdinalStart = ptr.To[int32](4) }, []wantErr{start}},
		{"ordinalStart jump with replicas 0 (no pod runs)", func() *v1alpha1.Etcd { e := baseEtcd(); e.Spec.Replicas = 0; return e }(),
			func(e *v1alpha1.Etcd) { e.Spec.OrdinalStart = ptr.To[int32](100) }, nil},
		{"replicas 9", baseEtcd(), func(e *v1alpha1.Etcd) { e.Spec.Replicas = 9 }, nil},
		{"replicas 10", baseEtcd(), func(e *v1alpha1.Etcd) { e.Spec.Replicas = 10 }, []wantErr{{"spec.replicas", field.ErrorTypeInvalid}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			e := tc.old.DeepCopy()
			tc.mutate(e)
			g.Expect(errPaths(validation.ValidateEtcdUpdate(e, tc.old))).To(ConsistOf(wantPaths(tc.want)))
		})
	}
}

// TestPodWindowBound: the StatefulSet webhook refuses a window that
// status.membership stretches past MaxPodWindow, and takes a move's.
func TestPodWindowBound(t *testing.T) {
	g := NewWithT(t)
	e := baseEtcd()
	e.Spec.OrdinalStart = ptr.To[int32](3)
	e.Status.Membership = &v1alpha1.MembershipStatus{Members: []v1alpha1.ObservedMember{
		{Name: "seed-b-etcd-main-0", Origin: v1alpha1.MemberOriginLocal},
	}}
	g.Expect(validation.ValidatePodWindow(e)).To(Succeed(), "the old and the new range of a move")
	e.Status.Membership.Members = append(e.Status.Membership.Members, v1alpha1.ObservedMember{Name: "seed-b-etcd-main-500", Origin: v1alpha1.MemberOriginLocal})
	g.Expect(validation.ValidatePodWindow(e)).To(MatchError(ContainSubstring("spans 501 pods, more than 18")))
}

// TestValidateSidecarAccess: mutual TLS or the loud opt-in, and a
// well-formed allow-list.
func TestValidateSidecarAccess(t *testing.T) {
	withTLS := func() *v1alpha1.Etcd {
		e := baseEtcd()
		e.Spec.Backup.TLS = e.Spec.Etcd.PeerUrlTLS.TLSConfig.DeepCopy()
		return e
	}
	annotated := func(e *v1alpha1.Etcd, kv ...string) *v1alpha1.Etcd {
		e.Annotations = map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			e.Annotations[kv[i]] = kv[i+1]
		}
		return e
	}
	tlsPath := wantErr{"spec.backup.tls", field.ErrorTypeRequired}
	optIn := "metadata.annotations[" + v1alpha1.InsecurePlainHTTPSidecarAnnotation + "]"
	allowed := "metadata.annotations[" + v1alpha1.SidecarAllowedClientsAnnotation + "]"
	for _, tc := range []struct {
		name string
		e    *v1alpha1.Etcd
		want []wantErr
	}{
		{"backup TLS", withTLS(), nil},
		{"no backup TLS", baseEtcd(), []wantErr{tlsPath}},
		{"no backup TLS, opted in", annotated(baseEtcd(), v1alpha1.InsecurePlainHTTPSidecarAnnotation, "true"), nil},
		{"no backup TLS, opt-in not true", annotated(baseEtcd(), v1alpha1.InsecurePlainHTTPSidecarAnnotation, "True"),
			[]wantErr{{optIn, field.ErrorTypeNotSupported}, tlsPath}},
		{"allowed clients", annotated(withTLS(), v1alpha1.SidecarAllowedClientsAnnotation, "seed-a-controller, spiffe://seed-b/controller"), nil},
		{"an empty allowed client", annotated(withTLS(), v1alpha1.SidecarAllowedClientsAnnotation, "a,"), []wantErr{{allowed, field.ErrorTypeInvalid}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			g.Expect(errPaths(validation.ValidateSidecarAccess(tc.e))).To(ConsistOf(wantPaths(tc.want)))
		})
	}
	g := NewWithT(t)
	g.Expect(annotated(withTLS(), v1alpha1.SidecarAllowedClientsAnnotation, " a ,b").SidecarAllowedClients()).To(Equal([]string{"a", "b"}))
	// One reader for the webhooks and the sidecar's flag: a list that does
	// not parse gives no identity, and the webhooks refuse its Etcd.
	g.Expect(annotated(withTLS(), v1alpha1.SidecarAllowedClientsAnnotation, " a ,b,,").SidecarAllowedClients()).To(BeEmpty())
}
