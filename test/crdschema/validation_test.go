package crdschema

import (
	"strings"
	"sync"
	"testing"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/validation"
)

var (
	sharedCRD     *crdValidator
	sharedCRDOnce sync.Once
)

// theCRD compiles the CRD's CEL rules once per test binary.
func theCRD(t testing.TB) *crdValidator {
	sharedCRDOnce.Do(func() { sharedCRD = loadCRDValidator(t) })
	if sharedCRD == nil {
		t.Fatal("the CRD validator failed to load in an earlier test")
	}
	return sharedCRD
}

// baseEtcd is a valid stretched Etcd: three local members etcd-main-0..2
// (prefix seed-b), one external member of the other cluster, peer TLS on.
func baseEtcd() *v1alpha1.Etcd {
	return &v1alpha1.Etcd{
		ObjectMeta: metav1.ObjectMeta{Name: "etcd-main", Namespace: "shoot--p--s"},
		Spec: v1alpha1.EtcdSpec{
			EtcdSpec: druidv1alpha1.EtcdSpec{
				MemberNamePrefix: ptr.To("seed-b"),
				Labels:           map[string]string{"app": "etcd"},
				Replicas:         3,
				Etcd: druidv1alpha1.EtcdConfig{
					PeerUrlTLS: &druidv1alpha1.PeerTLSConfig{TLSConfig: druidv1alpha1.TLSConfig{
						TLSCASecretRef:     druidv1alpha1.SecretReference{SecretReference: corev1.SecretReference{Name: "ca-etcd-peer"}},
						ServerTLSSecretRef: corev1.SecretReference{Name: "etcd-peer-server"},
					}},
				},
			},
			MembershipSpec: v1alpha1.MembershipSpec{ExternalMembers: []v1alpha1.ExternalMember{{
				Name:       "seed-a-etcd-main-0",
				PeerURLs:   []string{"https://etcd-main-0.seed-a.example:2380"},
				ClientURLs: []string{"https://etcd-main-0.seed-a.example:2379"},
				SidecarURL: "https://etcd-main-0.seed-a.example:8080",
			}}},
		},
	}
}

func external(name, peer string) v1alpha1.ExternalMember {
	return v1alpha1.ExternalMember{Name: name, PeerURLs: []string{peer}}
}

// wantErr is one expected Go error: its exact field path and type.
type wantErr struct {
	path string
	typ  field.ErrorType
}

func TestValidateEtcd(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(e *v1alpha1.Etcd)
		want   []wantErr
		// goOnly marks a rule the CRD cannot express (it needs the
		// namespace, which CEL does not see).
		goOnly bool
	}{
		{name: "valid stretched cluster", mutate: func(*v1alpha1.Etcd) {}},
		{name: "druid-only Etcd", mutate: func(e *v1alpha1.Etcd) { e.Spec.ExternalMembers = nil }},
		{name: "external member named like a local pod outside the ordinal range", mutate: func(e *v1alpha1.Etcd) {
			e.Spec.OrdinalStart = ptr.To[int32](3)
			e.Spec.ExternalMembers = append(e.Spec.ExternalMembers, external("seed-b-etcd-main-0", "https://b0.example:2380"))
		}},
		{name: "Retire with local members", mutate: func(e *v1alpha1.Etcd) {
			e.Spec.ExternalMembersPolicy = ptr.To(v1alpha1.ExternalMembersPolicyRetire)
		}},
		{name: "plain http without peer TLS", mutate: func(e *v1alpha1.Etcd) {
			e.Spec.Etcd.PeerUrlTLS = nil
			e.Spec.ExternalMembers = []v1alpha1.ExternalMember{external("a-0", "http://10.0.0.1:2380")}
		}},
		{name: "IPv6 peer URL", mutate: func(e *v1alpha1.Etcd) {
			e.Spec.ExternalMembers[0].PeerURLs = []string{"https://[fd00::1]:2380"}
		}},

		{name: "duplicate member names", mutate: func(e *v1alpha1.Etcd) {
			e.Spec.ExternalMembers = append(e.Spec.ExternalMembers, external("seed-a-etcd-main-0", "https://other.example:2380"))
		}, want: []wantErr{{"spec.externalMembers[1].name", field.ErrorTypeDuplicate}}},
		{name: "external name is a local member name", mutate: func(e *v1alpha1.Etcd) {
			e.Spec.ExternalMembers[0].Name = "seed-b-etcd-main-2"
		}, want: []wantErr{{"spec.externalMembers[0].name", field.ErrorTypeDuplicate}}},
		{name: "external name is a local member name of the shifted range", mutate: func(e *v1alpha1.Etcd) {
			e.Spec.OrdinalStart = ptr.To[int32](3)
			e.Spec.ExternalMembers[0].Name = "seed-b-etcd-main-5"
		}, want: []wantErr{{"spec.externalMembers[0].name", field.ErrorTypeDuplicate}}},
		{name: "external name is a local member name without prefix", mutate: func(e *v1alpha1.Etcd) {
			e.Spec.MemberNamePrefix = nil
			e.Spec.ExternalMembers[0].Name = "etcd-main-1"
		}, want: []wantErr{{"spec.externalMembers[0].name", field.ErrorTypeDuplicate}}},
		{name: "duplicate peer URL across members", mutate: func(e *v1alpha1.Etcd) {
			e.Spec.ExternalMembers = append(e.Spec.ExternalMembers, external("seed-a-etcd-main-1", "https://etcd-main-0.seed-a.example:2380"))
		}, want: []wantErr{{"spec.externalMembers[1].peerURLs[0]", field.ErrorTypeDuplicate}}},
		{name: "duplicate peer URL within a member", mutate: func(e *v1alpha1.Etcd) {
			e.Spec.ExternalMembers[0].PeerURLs = append(e.Spec.ExternalMembers[0].PeerURLs, e.Spec.ExternalMembers[0].PeerURLs[0])
		}, want: []wantErr{{"spec.externalMembers[0].peerURLs[1]", field.ErrorTypeDuplicate}}},
		{name: "peer URL advertised by a local member", mutate: func(e *v1alpha1.Etcd) {
			e.Spec.Etcd.AdditionalAdvertisePeerURLs = []druidv1alpha1.MemberPeerURLs{{
				MemberName: "seed-b-etcd-main-0", URLs: []string{"https://etcd-main-0.seed-a.example:2380"},
			}}
		}, want: []wantErr{{"spec.externalMembers[0].peerURLs[0]", field.ErrorTypeDuplicate}}},
		{name: "peer URL without port", mutate: func(e *v1alpha1.Etcd) {
			e.Spec.ExternalMembers[0].PeerURLs = []string{"https://etcd-main-0.seed-a.example"}
		}, want: []wantErr{{"spec.externalMembers[0].peerURLs[0]", field.ErrorTypeInvalid}}},
		{name: "peer URL with a path", mutate: func(e *v1alpha1.Etcd) {
			e.Spec.ExternalMembers[0].PeerURLs = []string{"https://etcd-main-0.seed-a.example:2380/peer"}
		}, want: []wantErr{{"spec.externalMembers[0].peerURLs[0]", field.ErrorTypeInvalid}}},
		{name: "peer URL with port out of range", mutate: func(e *v1alpha1.Etcd) {
			e.Spec.ExternalMembers[0].PeerURLs = []string{"https://etcd-main-0.seed-a.example:65536"}
		}, want: []wantErr{{"spec.externalMembers[0].peerURLs[0]", field.ErrorTypeInvalid}}},
		{name: "peer URL with uppercase host", mutate: func(e *v1alpha1.Etcd) {
			e.Spec.ExternalMembers[0].PeerURLs = []string{"https://ETCD.example:2380"}
		}, want: []wantErr{{"spec.externalMembers[0].peerURLs[0]", field.ErrorTypeInvalid}}},
		{name: "peer URL of another scheme", mutate: func(e *v1alpha1.Etcd) {
			e.Spec.ExternalMembers[0].PeerURLs = []string{"unix://etcd.example:2380"}
		}, want: []wantErr{
			{"spec.externalMembers[0].peerURLs[0]", field.ErrorTypeInvalid}, // not a member URL
			{"spec.externalMembers[0].peerURLs[0]", field.ErrorTypeInvalid}, // not https although peer TLS is set
		}},
		{name: "http peer URL with peer TLS", mutate: func(e *v1alpha1.Etcd) {
			e.Spec.ExternalMembers[0].PeerURLs = []string{"http://etcd-main-0.seed-a.example:2380"}
		}, want: []wantErr{{"spec.externalMembers[0].peerURLs[0]", field.ErrorTypeInvalid}}},
		{name: "https peer URL without peer TLS", mutate: func(e *v1alpha1.Etcd) {
			e.Spec.Etcd.PeerUrlTLS = nil
		}, want: []wantErr{{"spec.externalMembers[0].peerURLs[0]", field.ErrorTypeInvalid}}},
		{name: "no peer URLs", mutate: func(e *v1alpha1.Etcd) {
			e.Spec.ExternalMembers[0].PeerURLs = nil
		}, want: []wantErr{{"spec.externalMembers[0].peerURLs", field.ErrorTypeRequired}}},
		{name: "malformed client URL", mutate: func(e *v1alpha1.Etcd) {
			e.Spec.ExternalMembers[0].ClientURLs = []string{"etcd-main-0.seed-a.example:2379"}
		}, want: []wantErr{{"spec.externalMembers[0].clientURLs[0]", field.ErrorTypeInvalid}}},
		{name: "sidecar URL with a query", mutate: func(e *v1alpha1.Etcd) {
			e.Spec.ExternalMembers[0].SidecarURL = "https://etcd-main-0.seed-a.example:8080/?x=1"
		}, want: []wantErr{{"spec.externalMembers[0].sidecarURL", field.ErrorTypeInvalid}}},
		{name: "member name not a subdomain", mutate: func(e *v1alpha1.Etcd) {
			e.Spec.ExternalMembers[0].Name = "Seed_A"
		}, want: []wantErr{{"spec.externalMembers[0].name", field.ErrorTypeInvalid}}},
		{name: "empty member name", mutate: func(e *v1alpha1.Etcd) {
			e.Spec.ExternalMembers[0].Name = ""
		}, want: []wantErr{{"spec.externalMembers[0].name", field.ErrorTypeRequired}}},
		{name: "member name too long", mutate: func(e *v1alpha1.Etcd) {
			e.Spec.ExternalMembers[0].Name = strings.Repeat("a", 254)
		}, want: []wantErr{{"spec.externalMembers[0].name", field.ErrorTypeTooLong}}},
		{name: "negative ordinalStart", mutate: func(e *v1alpha1.Etcd) {
			e.Spec.OrdinalStart = ptr.To[int32](-1)
		}, want: []wantErr{{"spec.ordinalStart", field.ErrorTypeInvalid}}},
		{name: "negative retainedExternalMembers", mutate: func(e *v1alpha1.Etcd) {
			e.Spec.RetainedExternalMembers = ptr.To[int32](-1)
		}, want: []wantErr{{"spec.retainedExternalMembers", field.ErrorTypeInvalid}}},
		{name: "retainedExternalMembers above the external member limit", mutate: func(e *v1alpha1.Etcd) {
			e.Spec.RetainedExternalMembers = ptr.To[int32](11)
		}, want: []wantErr{{"spec.retainedExternalMembers", field.ErrorTypeInvalid}}},
		{name: "negative learnerReplicas", mutate: func(e *v1alpha1.Etcd) {
			e.Spec.LearnerReplicas = ptr.To[int32](-1)
		}, want: []wantErr{{"spec.learnerReplicas", field.ErrorTypeInvalid}}},
		{name: "learnerReplicas as many as replicas", mutate: func(e *v1alpha1.Etcd) {
			e.Spec.LearnerReplicas = ptr.To(e.Spec.Replicas)
		}, want: []wantErr{{"spec.learnerReplicas", field.ErrorTypeInvalid}}},
		{name: "learnerReplicas with zero replicas", mutate: func(e *v1alpha1.Etcd) {
			e.Spec.Replicas = 0
			e.Spec.LearnerReplicas = ptr.To[int32](1)
		}, want: []wantErr{{"spec.learnerReplicas", field.ErrorTypeInvalid}}},
		{name: "learnerReplicas one less than replicas", mutate: func(e *v1alpha1.Etcd) {
			e.Spec.LearnerReplicas = ptr.To(e.Spec.Replicas - 1)
		}},
		{name: "learnerReplicas 0 with zero replicas", mutate: func(e *v1alpha1.Etcd) {
			e.Spec.Replicas = 0
			e.Spec.LearnerReplicas = ptr.To[int32](0)
		}},
		{name: "Retire with zero local replicas", mutate: func(e *v1alpha1.Etcd) {
			e.Spec.Replicas = 0
			e.Spec.ExternalMembersPolicy = ptr.To(v1alpha1.ExternalMembersPolicyRetire)
		}, want: []wantErr{{"spec.externalMembersPolicy", field.ErrorTypeInvalid}}},
		{name: "unknown policy", mutate: func(e *v1alpha1.Etcd) {
			e.Spec.ExternalMembersPolicy = ptr.To(v1alpha1.ExternalMembersPolicy("Forget"))
		}, want: []wantErr{{"spec.externalMembersPolicy", field.ErrorTypeNotSupported}}},
		{name: "external peer URL is a local pod's in-cluster URL", mutate: func(e *v1alpha1.Etcd) {
			e.Spec.ExternalMembers[0].PeerURLs = append(e.Spec.ExternalMembers[0].PeerURLs,
				"https://etcd-main-1.etcd-main-peer.shoot--p--s.svc:2380")
		}, want: []wantErr{{"spec.externalMembers[0].peerURLs[1]", field.ErrorTypeDuplicate}}, goOnly: true},
		{name: "external peer URL is the in-cluster URL of a pod outside the local range", mutate: func(e *v1alpha1.Etcd) {
			e.Spec.OrdinalStart = ptr.To[int32](3)
			e.Spec.ExternalMembers[0].PeerURLs = append(e.Spec.ExternalMembers[0].PeerURLs,
				"https://etcd-main-1.etcd-main-peer.shoot--p--s.svc:2380")
		}},
		{name: "too many external members", mutate: func(e *v1alpha1.Etcd) {
			e.Spec.ExternalMembers = nil
			for i := range validation.MaxExternalMembers + 1 {
				e.Spec.ExternalMembers = append(e.Spec.ExternalMembers,
					external("seed-a-etcd-main-"+string(rune('a'+i)), "https://"+string(rune('a'+i))+".example:2380"))
			}
		}, want: []wantErr{{"spec.externalMembers", field.ErrorTypeTooMany}}},
	}
	crd := theCRD(t)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			e := baseEtcd()
			tc.mutate(e)
			errs := validation.ValidateEtcd(e)
			if len(errs) > 0 {
				t.Log(errs.ToAggregate())
			}
			g.Expect(errPaths(errs)).To(ConsistOf(wantPaths(tc.want)), "Go errors: %v", errs)
			for _, err := range errs {
				g.Expect(err.Error()).To(ContainSubstring(err.Field), "the message names the field")
			}
			crdErrs, err := crd.validate(e, nil)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(agreement(validation.ValidateCRDRules(e), crdErrs)).To(Succeed())
			switch {
			case tc.goOnly:
				g.Expect(crdErrs).To(BeEmpty(), "a Go-only rule")
			case len(tc.want) > 0:
				g.Expect(onlyExtension(crdErrs)).NotTo(BeEmpty(), "the CRD rejects it too")
			default:
				g.Expect(crdErrs).To(BeEmpty(), "the CRD accepts it too")
			}
		})
	}
}

func TestValidateEtcdUpdate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(e *v1alpha1.Etcd)
		want   []wantErr
	}{
		{name: "move to a new ordinal range", mutate: func(e *v1alpha1.Etcd) { e.Spec.OrdinalStart = ptr.To[int32](3) }},
		{name: "Keep to Retire", mutate: func(e *v1alpha1.Etcd) {
			e.Spec.ExternalMembersPolicy = ptr.To(v1alpha1.ExternalMembersPolicyRetire)
		}},
		{name: "add an external member", mutate: func(e *v1alpha1.Etcd) {
			e.Spec.ExternalMembers = append(e.Spec.ExternalMembers, external("seed-a-etcd-main-1", "https://etcd-main-1.seed-a.example:2380"))
		}},
		{name: "remove the external member", mutate: func(e *v1alpha1.Etcd) { e.Spec.ExternalMembers = nil }},
		{name: "change client and sidecar URLs", mutate: func(e *v1alpha1.Etcd) {
			e.Spec.ExternalMembers[0].ClientURLs = []string{"https://lb.seed-a.example:2379"}
			e.Spec.ExternalMembers[0].SidecarURL = "https://lb.seed-a.example:8443/sidecar"
		}},
		{name: "reorder peer URLs", mutate: func(e *v1alpha1.Etcd) {
			e.Spec.ExternalMembers[0].PeerURLs = []string{"https://10.0.0.1:2380", "https://etcd-main-0.seed-a.example:2380"}
		}},
		{name: "re-add the member under a new name with new peer URLs", mutate: func(e *v1alpha1.Etcd) {
			e.Spec.ExternalMembers = []v1alpha1.ExternalMember{external("seed-a-etcd-main-0b", "https://lb.seed-a.example:2380")}
		}},

		{name: "change peer URLs under the same name", mutate: func(e *v1alpha1.Etcd) {
			e.Spec.ExternalMembers[0].PeerURLs = []string{"https://lb.seed-a.example:2380"}
		}, want: []wantErr{{"spec.externalMembers[0].peerURLs", field.ErrorTypeInvalid}}},
		{name: "drop one of two peer URLs", mutate: func(e *v1alpha1.Etcd) {
			e.Spec.ExternalMembers[0].PeerURLs = []string{"https://10.0.0.1:2380"}
		}, want: []wantErr{{"spec.externalMembers[0].peerURLs", field.ErrorTypeInvalid}}},
		{name: "turn peer TLS off while external members are listed", mutate: func(e *v1alpha1.Etcd) {
			e.Spec.Etcd.PeerUrlTLS = nil
		}, want: []wantErr{{"spec.externalMembers[0].peerURLs[0]", field.ErrorTypeInvalid}, {"spec.externalMembers[0].peerURLs[1]", field.ErrorTypeInvalid}}},
		{name: "change memberNamePrefix", mutate: func(e *v1alpha1.Etcd) {
			e.Spec.MemberNamePrefix = ptr.To("seed-c")
		}, want: []wantErr{{"spec.memberNamePrefix", field.ErrorTypeInvalid}}},
	}
	crd := theCRD(t)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			old := baseEtcd()
			old.Spec.ExternalMembers[0].PeerURLs = []string{"https://etcd-main-0.seed-a.example:2380", "https://10.0.0.1:2380"}
			g.Expect(validation.ValidateEtcd(old)).To(BeEmpty())
			e := old.DeepCopy()
			tc.mutate(e)
			errs := validation.ValidateEtcdUpdate(e, old)
			if len(errs) > 0 {
				t.Log(errs.ToAggregate())
			}
			g.Expect(errPaths(errs)).To(ConsistOf(wantPaths(tc.want)), "Go errors: %v", errs)
			crdErrs, err := crd.validate(e, old)
			g.Expect(err).NotTo(HaveOccurred())
			if len(tc.want) > 0 {
				g.Expect(crdErrs).NotTo(BeEmpty(), "the CRD rejects it too")
			} else {
				g.Expect(crdErrs).To(BeEmpty(), "the CRD accepts it too")
			}
		})
	}
}

// TestPatternsAreTheCRDs checks that Go uses the CRD's regular expressions
// verbatim, so both judge every URL and name alike.
func TestPatternsAreTheCRDs(t *testing.T) {
	g := NewWithT(t)
	crd := theCRD(t)
	data, err := yamlOf(crd.raw)
	g.Expect(err).NotTo(HaveOccurred())
	for _, p := range []string{validation.MemberNamePattern, validation.MemberURLPattern, validation.SidecarURLPattern} {
		g.Expect(data).To(ContainSubstring("self.matches(r'"+p+"')"), "pattern %s", p)
	}
}

func errPaths(errs field.ErrorList) []wantErr {
	out := make([]wantErr, 0, len(errs))
	for _, e := range errs {
		out = append(out, wantErr{e.Field, e.Type})
	}
	return out
}

func wantPaths(w []wantErr) []wantErr {
	if w == nil {
		return []wantErr{}
	}
	return w
}
