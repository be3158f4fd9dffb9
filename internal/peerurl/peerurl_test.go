package peerurl

import (
	"testing"

	. "github.com/onsi/gomega"
)

func TestCanonical(t *testing.T) {
	for raw, want := range map[string]string{
		"https://127.0.0.1:2380":           "https://127.0.0.1:2380",
		"HTTPS://Etcd-0.Example.:02380":    "https://etcd-0.example:2380",
		"https://127.0.0.1:2380/":          "https://127.0.0.1:2380",
		"http://[::FFFF:127.0.0.1]:2380":   "http://127.0.0.1:2380",
		"https://[2001:DB8:0:0::1]:2380":   "https://[2001:db8::1]:2380",
		"https://etcd_0.peer.ns.svc:00080": "https://etcd_0.peer.ns.svc:80",
	} {
		got, err := Canonical(raw)
		NewWithT(t).Expect(err).NotTo(HaveOccurred(), raw)
		NewWithT(t).Expect(got).To(Equal(want), raw)
	}
	for _, bad := range []string{
		"unix://127.0.0.1:2380", "https://127.0.0.1", "https://127.0.0.1:0", "https://127.0.0.1:65536",
		"https://user@127.0.0.1:2380", "https://127.0.0.1:2380/x", "https://127.0.0.1:2380?x", "https://127.0.0.1:2380#x",
		"https://[fe80::1%25eth0]:2380", "https://a..b:2380", "https://.:2380", "https://a%20b:2380",
	} {
		_, err := Canonical(bad)
		NewWithT(t).Expect(err).To(HaveOccurred(), bad)
	}
}

func TestSame(t *testing.T) {
	g := NewWithT(t)
	for _, pair := range [][2]string{
		{"https://127.0.0.1:2380", "https://localhost:2380"},
		{"https://127.0.0.1:2380", "https://LOCALHOST.:02380"},
		{"https://127.0.0.1:2380", "https://[::1]:2380"},
		{"https://127.0.0.1:2380", "https://etcd.localhost:2380"},
		{"https://etcd-0.example:2380", "HTTPS://ETCD-0.EXAMPLE.:2380/"},
	} {
		g.Expect(Same(pair[0], pair[1])).To(BeTrue(), "%v", pair)
	}
	for _, pair := range [][2]string{
		{"https://127.0.0.1:2380", "https://127.0.0.1:2381"},
		{"https://127.0.0.1:2380", "http://127.0.0.1:2380"},
		{"https://etcd-0.example:2380", "https://etcd-1.example:2380"},
	} {
		g.Expect(Same(pair[0], pair[1])).To(BeFalse(), "%v", pair)
	}
	g.Expect(SameSet([]string{"https://localhost:2380", "https://b:1"}, []string{"https://b:01", "https://127.0.0.1:2380"})).To(BeTrue())
	g.Expect(SameSet([]string{"https://a:1"}, []string{"https://a:1", "https://b:1"})).To(BeFalse())
	in, of, ok := Shared([]string{"https://x:1", "https://localhost:2380"}, []string{"https://127.0.0.1:2380"})
	g.Expect([]any{in, of, ok}).To(Equal([]any{"https://localhost:2380", "https://127.0.0.1:2380", true}))
}
