package validation

import (
	"testing"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	. "github.com/onsi/gomega"
)

// TestAdvertisedPeerURLs: ValidateEtcd refuses the additional peer URLs
// that the controller and the webhook cannot use, naming the entry; only
// the duplicate entry is a rule druid's CRD lacks.
func TestAdvertisedPeerURLs(t *testing.T) {
	for _, tc := range []struct {
		name    string
		entries []druidv1alpha1.MemberPeerURLs
		field   string
		detail  string
	}{
		{name: "a local member's entry", entries: []druidv1alpha1.MemberPeerURLs{{MemberName: "seed-b-etcd-main-0", URLs: []string{"http://lb-0.seed-b.example:2380"}}}},
		{name: "a duplicate entry", entries: []druidv1alpha1.MemberPeerURLs{
			{MemberName: "seed-b-etcd-main-0", URLs: []string{"http://lb-0.seed-b.example:2380"}},
			{MemberName: "seed-b-etcd-main-0", URLs: []string{"http://lb-9.seed-b.example:2380"}},
		}, field: "spec.etcd.additionalAdvertisePeerURLs[1].memberName", detail: "a member has one entry"},
		{name: "https without peer TLS", entries: []druidv1alpha1.MemberPeerURLs{{MemberName: "seed-b-etcd-main-1", URLs: []string{"https://lb-1.seed-b.example:2380"}}},
			field: "spec.etcd.additionalAdvertisePeerURLs[0].urls[0]", detail: "must use http:// because spec.etcd.peerUrlTls is not set"},
		{name: "the pod name under a prefix", entries: []druidv1alpha1.MemberPeerURLs{{MemberName: "etcd-main-1", URLs: []string{"http://lb-1.seed-b.example:2380"}}},
			field: "spec.etcd.additionalAdvertisePeerURLs[0].memberName", detail: "is the pod name of local member seed-b-etcd-main-1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			e := stretchedEtcd()
			e.Spec.Etcd.AdditionalAdvertisePeerURLs = tc.entries
			errs := ValidateEtcd(e)
			if tc.field == "" {
				g.Expect(errs).To(BeEmpty())
				return
			}
			g.Expect(errs).To(HaveLen(1))
			g.Expect(errs[0].Field).To(Equal(tc.field))
			g.Expect(errs[0].Error()).To(ContainSubstring(tc.detail))
		})
	}
}

// TestExternalPeerURLOfALocalPod: an external member that advertises the
// in-cluster peer URL of one of the Etcd's own pods (both seeds run the
// Etcd in one namespace) is admitted only when that pod's member has an
// additional peer URL, which it is then added with instead.
func TestExternalPeerURLOfALocalPod(t *testing.T) {
	g := NewWithT(t)
	e := stretchedEtcd()
	e.Spec.ExternalMembers[0].PeerURLs = []string{"http://etcd-main-0.etcd-main-peer.shoot--p--s.svc:2380", "http://etcd-main-0.seed-a.example:2380"}
	errs := ValidateEtcd(e)
	g.Expect(errs).To(HaveLen(1))
	g.Expect(errs[0].Field).To(Equal("spec.externalMembers[0].peerURLs[0]"))
	g.Expect(errs[0].Error()).To(ContainSubstring("give member seed-b-etcd-main-0 an additional peer URL"))

	e.Spec.Etcd.AdditionalAdvertisePeerURLs = []druidv1alpha1.MemberPeerURLs{{MemberName: "seed-b-etcd-main-0", URLs: []string{"http://etcd-main-0.seed-b.example:2380"}}}
	g.Expect(ValidateEtcd(e)).To(BeEmpty(), "the local member is added with its additional URL alone")
}
