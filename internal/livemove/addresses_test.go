package livemove_test

import (
	"testing"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/internal/livemove"
)

func TestURLTemplates(t *testing.T) {
	e := &v1alpha1.Etcd{ObjectMeta: metav1.ObjectMeta{Name: "etcd-main", Namespace: "shoot--p--s"}}
	prefix := "seed-b"
	e.Spec.MemberNamePrefix = &prefix
	cases := []struct {
		name    string
		t       livemove.URLTemplates
		want    v1alpha1.ExternalMember
		wantErr string
	}{
		{
			name: "every placeholder",
			t: livemove.URLTemplates{
				Peer:    "https://{pod}.{name}-peer.{namespace}.seed-b.example:2380",
				Client:  "https://{member}.seed-b.example:2379",
				Sidecar: "https://lb-{ordinal}.seed-b.example:8090/sidecar",
			},
			want: v1alpha1.ExternalMember{
				PeerURLs:   []string{"https://etcd-main-4.etcd-main-peer.shoot--p--s.seed-b.example:2380"},
				ClientURLs: []string{"https://seed-b-etcd-main-4.seed-b.example:2379"},
				SidecarURL: "https://lb-4.seed-b.example:8090/sidecar",
			},
		},
		{
			name: "peer only",
			t:    livemove.URLTemplates{Peer: "http://{pod}:2380"},
			want: v1alpha1.ExternalMember{PeerURLs: []string{"http://etcd-main-4:2380"}},
		},
		{name: "no peer template", t: livemove.URLTemplates{Client: "http://{pod}:2379"}, wantErr: "the peer URL template is empty"},
		{name: "unknown placeholder", t: livemove.URLTemplates{Peer: "http://{pod}:2380", Sidecar: "https://{host}:8090"},
			wantErr: `the sidecar URL template "https://{host}:8090" has the unknown placeholder {host}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := NewWithT(t)
			got, err := c.t.Addresses()(e, "seed-b-etcd-main-4", "etcd-main-4")
			if c.wantErr != "" {
				g.Expect(err).To(MatchError(ContainSubstring(c.wantErr)))
				g.Expect(c.t.Check()).To(MatchError(ContainSubstring(c.wantErr)))
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(got).To(Equal(c.want))
		})
	}
}
