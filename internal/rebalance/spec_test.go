package rebalance_test

import (
	"os"
	"path/filepath"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/druid-stretch/druid-stretch/internal/rebalance"
)

func TestParseFlags(t *testing.T) {
	g := NewWithT(t)
	s, err := rebalance.ParseSidecar("a-0=https://10.0.0.1:8090")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(s).To(Equal(rebalance.Sidecar{Member: "a-0", URL: "https://10.0.0.1:8090"}))

	tm, err := rebalance.ParseTarget("b/b-0=https://10.0.1.1:2380,https://b-0.example:2380")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(tm).To(Equal(rebalance.TargetMember{Name: "b-0", Group: "b", PeerURLs: []string{"https://10.0.1.1:2380", "https://b-0.example:2380"}}))
	tm, err = rebalance.ParseTarget("b-1=http://10.0.1.2:2380")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(tm).To(Equal(rebalance.TargetMember{Name: "b-1", PeerURLs: []string{"http://10.0.1.2:2380"}}))

	groups := map[string][]string{}
	g.Expect(rebalance.ParseGroup("a=a-0,a-1", groups)).To(Succeed())
	g.Expect(rebalance.ParseGroup("a=a-2", groups)).To(Succeed())
	g.Expect(groups).To(Equal(map[string][]string{"a": {"a-0", "a-1", "a-2"}}))

	for _, bad := range []struct {
		parse func() error
		want  string
	}{
		{func() error { _, err := rebalance.ParseSidecar("https://10.0.0.1:8090"); return err }, "want MEMBER=URL"},
		{func() error { _, err := rebalance.ParseTarget("b-0"); return err }, "want [GROUP/]NAME=PEERURL"},
		{func() error { return rebalance.ParseGroup("=a-0", groups) }, "want GROUP=MEMBER"},
	} {
		g.Expect(bad.parse()).To(MatchError(ContainSubstring(bad.want)))
	}
}

func TestSpecValidate(t *testing.T) {
	valid := func() rebalance.Spec {
		return rebalance.Spec{
			Sidecars: []rebalance.Sidecar{{Member: "a-0", URL: "https://10.0.0.1:8090"}, {Member: "b-0", URL: "https://10.0.1.1:8090"}},
			Target:   []rebalance.TargetMember{{Name: "b-0", PeerURLs: []string{"https://10.0.1.1:2380"}, Group: "b"}, {Name: "b-1", PeerURLs: []string{"https://10.0.1.2:2380"}}},
			Groups:   map[string][]string{"a": {"a-0"}, "b": {"b-1"}},
		}
	}
	g := NewWithT(t)
	g.Expect(valid().Validate()).To(Succeed())

	for _, tc := range []struct {
		name   string
		mutate func(*rebalance.Spec)
		want   []string
	}{
		{"no sidecar", func(s *rebalance.Spec) { s.Sidecars = nil }, []string{"no sidecar given"}},
		{"no target", func(s *rebalance.Spec) { s.Target = nil }, []string{"no target member given"}},
		{"duplicate target names", func(s *rebalance.Spec) { s.Target[1].Name = "b-0" }, []string{"target[1].name: b-0 is also target[0]"}},
		{"shared peer URL", func(s *rebalance.Spec) { s.Target[1].PeerURLs = s.Target[0].PeerURLs }, []string{"target[1].peerURLs[0]: https://10.0.1.1:2380 is also a peer URL of b-0"}},
		{"peer URL with a path", func(s *rebalance.Spec) { s.Target[0].PeerURLs = []string{"https://10.0.1.1:2380/x"} }, []string{"target[0].peerURLs[0]", "without user, path"}},
		{"peer URL without port", func(s *rebalance.Spec) { s.Target[0].PeerURLs = []string{"https://10.0.1.1"} }, []string{"needs a host and a port"}},
		{"no peer URL", func(s *rebalance.Spec) { s.Target[0].PeerURLs = nil }, []string{"target[0].peerURLs: b-0 has no peer URL"}},
		{"bad member name", func(s *rebalance.Spec) { s.Target[0].Name = "b 0" }, []string{"target[0].name", `character ' '`}},
		{"sidecar without member", func(s *rebalance.Spec) { s.Sidecars[0].Member = "" }, []string{"sidecars[0].member: the member name is empty"}},
		{"sidecar URL without scheme", func(s *rebalance.Spec) { s.Sidecars[0].URL = "10.0.0.1:8090" }, []string{"sidecars[0].url"}},
		{"two sidecars for a member", func(s *rebalance.Spec) {
			s.Sidecars = append(s.Sidecars, rebalance.Sidecar{Member: "a-0", URL: "https://10.9.9.9:8090"})
		}, []string{"member a-0 has two sidecars"}},
		{"member in two groups", func(s *rebalance.Spec) { s.Groups["b"] = append(s.Groups["b"], "a-0") }, []string{"member a-0 is in groups"}},
		{"target group contradicts groups", func(s *rebalance.Spec) { s.Groups["a"] = append(s.Groups["a"], "b-0") }, []string{"target[0].group: b-0 is in group b here and in group a under groups"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			s := valid()
			tc.mutate(&s)
			err := s.Validate()
			g.Expect(err).To(HaveOccurred())
			for _, w := range tc.want {
				g.Expect(err.Error()).To(ContainSubstring(w))
			}
		})
	}
}

func TestLoadSpec(t *testing.T) {
	g := NewWithT(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "spec.yaml")
	g.Expect(os.WriteFile(path, []byte(`
sidecars:
  - {member: a-0, url: "https://10.0.0.1:8090"}
target:
  - {name: b-0, peerURLs: ["https://10.0.1.1:2380"], group: b}
groups:
  a: [a-0]
`), 0o600)).To(Succeed())
	s, err := rebalance.LoadSpec(path)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(s).To(Equal(rebalance.Spec{
		Sidecars: []rebalance.Sidecar{{Member: "a-0", URL: "https://10.0.0.1:8090"}},
		Target:   []rebalance.TargetMember{{Name: "b-0", PeerURLs: []string{"https://10.0.1.1:2380"}, Group: "b"}},
		Groups:   map[string][]string{"a": {"a-0"}},
	}))

	g.Expect(os.WriteFile(path, []byte("target:\n  - {name: b-0, peerURL: \"https://10.0.1.1:2380\"}\n"), 0o600)).To(Succeed())
	_, err = rebalance.LoadSpec(path)
	g.Expect(err).To(MatchError(ContainSubstring(`unknown field "peerURL"`)))
}
