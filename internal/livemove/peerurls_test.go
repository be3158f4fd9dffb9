package livemove

import (
	"testing"

	. "github.com/onsi/gomega"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
)

// TestCheckObservedPeerURLs: the source addresses must give each member a
// peer URL etcd knows it by; druid's members advertise more (their
// in-cluster name first), and one in common identifies the member.
func TestCheckObservedPeerURLs(t *testing.T) {
	src := &v1alpha1.Etcd{}
	src.Status.Membership = &v1alpha1.MembershipStatus{Members: []v1alpha1.ObservedMember{{
		Name:     "etcd-main-0",
		PeerURLs: []string{"http://etcd-main-0.etcd-main-peer.shoot.svc:2380", "http://etcd-main-0.shoot.seed-a.example:2380"},
	}}}
	listed := func(urls ...string) []v1alpha1.ExternalMember {
		return []v1alpha1.ExternalMember{{Name: "etcd-main-0", PeerURLs: urls}}
	}
	for _, tc := range []struct {
		name    string
		listed  []v1alpha1.ExternalMember
		wantErr string
	}{
		{"the external URL only", listed("http://etcd-main-0.shoot.seed-a.example:2380"), ""},
		{"every URL etcd knows", listed("http://etcd-main-0.shoot.seed-a.example:2380", "http://etcd-main-0.etcd-main-peer.shoot.svc:2380"), ""},
		{"a URL etcd does not know", listed("http://etcd-main-0.shoot.seed-x.example:2380"), "etcd knows it by [http://etcd-main-0.etcd-main-peer.shoot.svc:2380 http://etcd-main-0.shoot.seed-a.example:2380]"},
		{"a member etcd does not list yet", []v1alpha1.ExternalMember{{Name: "etcd-main-9", PeerURLs: []string{"http://x:2380"}}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			err := checkObservedPeerURLs(src, tc.listed)
			if tc.wantErr == "" {
				g.Expect(err).NotTo(HaveOccurred())
				return
			}
			g.Expect(err).To(MatchError(ContainSubstring(tc.wantErr)))
		})
	}
}
