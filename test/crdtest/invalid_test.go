package crdtest

import (
	"testing"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	. "github.com/onsi/gomega"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/validation"
)

// invalidCase is a change that the apiserver must refuse, with the field it
// must name and a piece of the reason it must give.
type invalidCase struct {
	name   string
	mutate func(e *v1alpha1.Etcd)
	field  string
	reason string
}

func TestInvalidCreateIsRejected(t *testing.T) {
	tests := []invalidCase{
		{"duplicate member names", func(e *v1alpha1.Etcd) {
			e.Spec.ExternalMembers[1].Name = e.Spec.ExternalMembers[0].Name
		}, "spec.externalMembers[1]", "Duplicate value"},
		{"external name is a local member name", func(e *v1alpha1.Etcd) {
			e.Spec.ExternalMembers[0].Name = "seed-b-etcd-main-4"
		}, "spec.externalMembers", "must not take the name of a local member"},
		{"external name is a local member name without prefix", func(e *v1alpha1.Etcd) {
			e.Spec.MemberNamePrefix = nil
			e.Spec.ExternalMembers[0].Name = "etcd-main-3"
		}, "spec.externalMembers", "must not take the name of a local member"},
		{"duplicate peer URL across members", func(e *v1alpha1.Etcd) {
			e.Spec.ExternalMembers[1].PeerURLs = e.Spec.ExternalMembers[0].PeerURLs
		}, "spec.externalMembers", "a peer URL must belong to one external member only"},
		{"duplicate peer URL within a member", func(e *v1alpha1.Etcd) {
			m := &e.Spec.ExternalMembers[0]
			m.PeerURLs = append(m.PeerURLs, m.PeerURLs[0])
		}, "spec.externalMembers[0].peerURLs[1]", "Duplicate value"},
		{"peer URL advertised by a local member", func(e *v1alpha1.Etcd) {
			e.Spec.Etcd.AdditionalAdvertisePeerURLs = []druidv1alpha1.MemberPeerURLs{{
				MemberName: "seed-b-etcd-main-3", URLs: e.Spec.ExternalMembers[0].PeerURLs,
			}}
		}, "spec.externalMembers", "must not be one that a local member advertises"},
		{"peer URL without port", func(e *v1alpha1.Etcd) {
			e.Spec.ExternalMembers[0].PeerURLs = []string{"https://etcd-main-0.seed-a.example"}
		}, "spec.externalMembers[0].peerURLs[0]", "must be an http:// or https:// URL scheme://host:port"},
		{"peer URL with a path", func(e *v1alpha1.Etcd) {
			e.Spec.ExternalMembers[0].PeerURLs = []string{"https://etcd-main-0.seed-a.example:2380/x"}
		}, "spec.externalMembers[0].peerURLs[0]", "no path"},
		{"malformed client URL", func(e *v1alpha1.Etcd) {
			e.Spec.ExternalMembers[0].ClientURLs = []string{"etcd-main-0.seed-a.example:2379"}
		}, "spec.externalMembers[0].clientURLs[0]", "must be an http:// or https:// URL"},
		{"malformed sidecar URL", func(e *v1alpha1.Etcd) {
			e.Spec.ExternalMembers[0].SidecarURL = "https://etcd-main-0.seed-a.example:8080/?debug=1"
		}, "spec.externalMembers[0].sidecarURL", "no query or fragment"},
		{"member name not a subdomain", func(e *v1alpha1.Etcd) {
			e.Spec.ExternalMembers[0].Name = "Seed_A-etcd-main-0"
		}, "spec.externalMembers[0].name", "RFC 1123 subdomain"},
		{"http peer URL with peer TLS", func(e *v1alpha1.Etcd) {
			e.Spec.ExternalMembers[0].PeerURLs = []string{"http://etcd-main-0.seed-a.example:2380"}
		}, "spec.externalMembers", "must use https:// when spec.etcd.peerUrlTls is set"},
		{"https peer URL without peer TLS", func(e *v1alpha1.Etcd) {
			e.Spec.Etcd.PeerUrlTLS = nil
		}, "spec.externalMembers", "http:// when it is not"},
		{"negative ordinalStart", func(e *v1alpha1.Etcd) {
			e.Spec.OrdinalStart = ptr.To[int32](-1)
		}, "spec.ordinalStart", "greater than or equal to 0"},
		{"Retire with zero local replicas", func(e *v1alpha1.Etcd) {
			e.Spec.Replicas = 0
			e.Spec.ExternalMembersPolicy = ptr.To(v1alpha1.ExternalMembersPolicyRetire)
		}, "spec.externalMembersPolicy", "spec.replicas must be at least 1"},
		{"unknown policy", func(e *v1alpha1.Etcd) {
			e.Spec.ExternalMembersPolicy = ptr.To(v1alpha1.ExternalMembersPolicy("Drop"))
		}, "spec.externalMembersPolicy", `supported values: "Keep", "Retire"`},
		{"no peer URLs", func(e *v1alpha1.Etcd) {
			e.Spec.ExternalMembers[0].PeerURLs = nil
		}, "spec.externalMembers[0].peerURLs", "Required value"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			e := stretchedEtcd(newNamespace(t))
			tc.mutate(e)

			err := stretch.Create(ctx(t), e.DeepCopy())
			t.Log(err)
			g.Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want Invalid, got %v", err)
			g.Expect(err.Error()).To(ContainSubstring(tc.field + ":"))
			g.Expect(err.Error()).To(ContainSubstring(tc.reason))
			g.Expect(stretch.Get(ctx(t), client.ObjectKeyFromObject(e), &v1alpha1.Etcd{})).To(
				Satisfy(apierrors.IsNotFound), "nothing is stored")

			// The Go validation behind the webhook refuses it at the
			// same field or one below it.
			g.Expect(fieldsOf(validation.ValidateEtcd(e))).To(ContainElement(HavePrefix(tc.field)))
		})
	}
}

func TestInvalidUpdateIsRejected(t *testing.T) {
	tests := []struct {
		invalidCase
		// prepare changes the object before it is first stored.
		prepare func(e *v1alpha1.Etcd)
	}{
		{invalidCase{"peer URLs of a listed member", func(e *v1alpha1.Etcd) {
			e.Spec.ExternalMembers[0].PeerURLs = []string{"https://lb.seed-a.example:2380"}
		}, "spec.externalMembers[0]", "peerURLs of a listed external member cannot change"}, nil},
		{invalidCase{"peer TLS turned off while external members are listed", func(e *v1alpha1.Etcd) {
			e.Spec.Etcd.PeerUrlTLS = nil
		}, "spec.externalMembers", "http:// when it is not"}, nil},
		{invalidCase{"memberNamePrefix", func(e *v1alpha1.Etcd) {
			e.Spec.MemberNamePrefix = ptr.To("seed-c")
		}, "spec.memberNamePrefix", "immutable"}, nil},
		{invalidCase{"a move onto an external member's name", func(e *v1alpha1.Etcd) {
			e.Spec.OrdinalStart = ptr.To[int32](0)
		}, "spec.externalMembers", "must not take the name of a local member"}, func(e *v1alpha1.Etcd) {
			// Allowed while the local range is [3, 6).
			e.Spec.ExternalMembers[0].Name = "seed-b-etcd-main-0"
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			stored := stretchedEtcd(newNamespace(t))
			if tc.prepare != nil {
				tc.prepare(stored)
			}
			g.Expect(stretch.Create(ctx(t), stored)).To(Succeed())
			before := stored.DeepCopy()

			changed := stored.DeepCopy()
			tc.mutate(changed)
			err := stretch.Update(ctx(t), changed)
			t.Log(err)
			g.Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want Invalid, got %v", err)
			g.Expect(err.Error()).To(ContainSubstring(tc.field + ":"))
			g.Expect(err.Error()).To(ContainSubstring(tc.reason))

			var after v1alpha1.Etcd
			g.Expect(stretch.Get(ctx(t), client.ObjectKeyFromObject(stored), &after)).To(Succeed())
			g.Expect(after.ResourceVersion).To(Equal(before.ResourceVersion), "nothing is stored")
			g.Expect(apiequality.Semantic.DeepEqual(after.Spec, before.Spec)).To(BeTrue())

			g.Expect(fieldsOf(validation.ValidateEtcdUpdate(changed, before))).To(ContainElement(HavePrefix(tc.field)))
		})
	}
}

// TestValidUpdatesAreAccepted shows the immutability rules are no broader
// than documented: a move, a policy switch and membership list edits pass.
func TestValidUpdatesAreAccepted(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(e *v1alpha1.Etcd)
	}{
		{"move to another ordinal range", func(e *v1alpha1.Etcd) { e.Spec.OrdinalStart = ptr.To[int32](6) }},
		{"Keep to Retire", func(e *v1alpha1.Etcd) {
			e.Spec.ExternalMembersPolicy = ptr.To(v1alpha1.ExternalMembersPolicyRetire)
		}},
		{"remove an external member", func(e *v1alpha1.Etcd) { e.Spec.ExternalMembers = e.Spec.ExternalMembers[1:] }},
		{"re-add a member under a new name", func(e *v1alpha1.Etcd) {
			e.Spec.ExternalMembers[0] = v1alpha1.ExternalMember{Name: "seed-a-etcd-main-0-v2", PeerURLs: []string{"https://lb.seed-a.example:2380"}}
		}},
		{"change client and sidecar URLs", func(e *v1alpha1.Etcd) {
			e.Spec.ExternalMembers[0].ClientURLs = []string{"https://lb.seed-a.example:2379"}
			e.Spec.ExternalMembers[0].SidecarURL = "https://lb.seed-a.example/sidecar/etcd-main-0"
		}},
		{"scale up", func(e *v1alpha1.Etcd) { e.Spec.Replicas = 5 }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			stored := stretchedEtcd(newNamespace(t))
			g.Expect(stretch.Create(ctx(t), stored)).To(Succeed())
			changed := stored.DeepCopy()
			tc.mutate(changed)
			g.Expect(validation.ValidateEtcdUpdate(changed, stored)).To(BeEmpty())
			want := changed.Spec.DeepCopy()
			g.Expect(stretch.Update(ctx(t), changed)).To(Succeed())
			var after v1alpha1.Etcd
			g.Expect(stretch.Get(ctx(t), client.ObjectKeyFromObject(stored), &after)).To(Succeed())
			g.Expect(apiequality.Semantic.DeepEqual(after.Spec, *want)).To(BeTrue(), "stored: %+v", after.Spec)
		})
	}
}

func fieldsOf(errs field.ErrorList) []string {
	out := make([]string, 0, len(errs))
	for _, e := range errs {
		out = append(out, e.Field)
	}
	return out
}
