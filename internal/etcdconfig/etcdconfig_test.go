package etcdconfig

import (
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	"sigs.k8s.io/yaml"
)

// druidFile is what etcd-druid v0.38.1 renders for an Etcd etcd-main in
// namespace ns with three replicas, memberNamePrefix seed-b, no TLS and an
// additional advertise peer URL for pod 1 (abridged to the keys that
// matter, plus two it never changes).
const druidFile = `name: etcd-config
data-dir: /var/etcd/data/new.etcd
quota-backend-bytes: 8589934592
initial-cluster-token: etcd-cluster
initial-cluster-state: new
initial-cluster: seed-b-etcd-main-0=http://etcd-main-0.etcd-main-peer.ns.svc:2380,seed-b-etcd-main-1=http://etcd-main-1.etcd-main-peer.ns.svc:2380,seed-b-etcd-main-2=http://etcd-main-2.etcd-main-peer.ns.svc:2380,seed-b-etcd-main-1=https://etcd-main-1.seed-b.example:2380
listen-peer-urls: http://0.0.0.0:2380
initial-advertise-peer-urls:
  seed-b-etcd-main-0: [http://etcd-main-0.etcd-main-peer.ns.svc:2380]
  seed-b-etcd-main-1: [http://etcd-main-1.etcd-main-peer.ns.svc:2380, https://etcd-main-1.seed-b.example:2380]
  seed-b-etcd-main-2: [http://etcd-main-2.etcd-main-peer.ns.svc:2380]
advertise-client-urls:
  seed-b-etcd-main-0: [http://etcd-main-0.etcd-main-peer.ns.svc:2379]
  seed-b-etcd-main-1: [http://etcd-main-1.etcd-main-peer.ns.svc:2379]
  seed-b-etcd-main-2: [http://etcd-main-2.etcd-main-peer.ns.svc:2379]
member-name-prefix: seed-b
`

func parse(t *testing.T, b []byte) map[string]any {
	t.Helper()
	out := map[string]any{}
	if err := yaml.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestMembersOfDruidsFile(t *testing.T) {
	g := NewWithT(t)
	f, err := Parse([]byte(druidFile))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(f.DataDir()).To(Equal("/var/etcd/data/new.etcd"))
	g.Expect(f.MemberName("etcd-main-1")).To(Equal("seed-b-etcd-main-1"))

	m, ok := f.Entry("seed-b-etcd-main-1")
	g.Expect(ok).To(BeTrue())
	g.Expect(m.PeerURLs).To(Equal([]string{"http://etcd-main-1.etcd-main-peer.ns.svc:2380", "https://etcd-main-1.seed-b.example:2380"}))
	g.Expect(m.ClientURLs).To(Equal([]string{"http://etcd-main-1.etcd-main-peer.ns.svc:2379"}))

	// druid's entry wins over the given URLs: it carries the additional ones.
	m, err = f.Resolve(Member{Name: "seed-b-etcd-main-1", PeerURLs: []string{"http://x:2380"}, ClientURLs: []string{"http://x:2379"}})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(m.PeerURLs).To(HaveLen(2))
	// An extra URL druid's entry has already gets its client URL all the same.
	m, err = f.Resolve(Member{Name: "seed-b-etcd-main-1"}, "https://etcd-main-1.seed-b.example:2380")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(m.PeerURLs).To(HaveLen(2))
	g.Expect(m.ClientURLs).To(Equal([]string{"http://etcd-main-1.etcd-main-peer.ns.svc:2379", "http://etcd-main-1.seed-b.example:2379"}))

	// A pod outside druid's ordinals 0..replicas-1 has no entry: the
	// given URLs are used, and without them it is an error naming it.
	outside := Member{Name: "seed-b-etcd-main-3", PeerURLs: []string{"http://etcd-main-3.etcd-main-peer.ns.svc:2380"}, ClientURLs: []string{"http://etcd-main-3.etcd-main-peer.ns.svc:2379"}}
	m, err = f.Resolve(outside)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(m).To(Equal(outside))
	_, err = f.Resolve(Member{Name: "seed-b-etcd-main-3"})
	g.Expect(err).To(MatchError(ContainSubstring("no entry for member seed-b-etcd-main-3")))

	// Extra peer URLs (additionalAdvertisePeerURLs druid's file misses)
	// come after druid's, each with a client URL on its host.
	m, err = f.Resolve(outside, "https://etcd-main-3.seed-b.example:2380", "http://etcd-main-3.etcd-main-peer.ns.svc:2380")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(m.PeerURLs).To(Equal([]string{"http://etcd-main-3.etcd-main-peer.ns.svc:2380", "https://etcd-main-3.seed-b.example:2380"}))
	g.Expect(m.ClientURLs).To(Equal([]string{"http://etcd-main-3.etcd-main-peer.ns.svc:2379", "http://etcd-main-3.seed-b.example:2379"}))
	_, err = f.Resolve(outside, "etcd-main-3.seed-b.example")
	g.Expect(err).To(MatchError(ContainSubstring("not a URL with a host")))
}

func TestForMember(t *testing.T) {
	g := NewWithT(t)
	f, err := Parse([]byte(druidFile))
	g.Expect(err).NotTo(HaveOccurred())
	m, _ := f.Entry("seed-b-etcd-main-1")
	cluster := "etcd-main-0=http://etcd-main-0.seed-a.example:2380," + FormatInitialCluster([]Member{m})

	b, err := f.ForMember(m, cluster, StateExisting)
	g.Expect(err).NotTo(HaveOccurred())
	got := parse(t, b)
	g.Expect(got).To(HaveKeyWithValue("name", "seed-b-etcd-main-1"))
	g.Expect(got).To(HaveKeyWithValue("initial-cluster", cluster))
	g.Expect(got).To(HaveKeyWithValue("initial-cluster-state", "existing"))
	g.Expect(got).To(HaveKeyWithValue("initial-advertise-peer-urls", "http://etcd-main-1.etcd-main-peer.ns.svc:2380,https://etcd-main-1.seed-b.example:2380"))
	g.Expect(got).To(HaveKeyWithValue("advertise-client-urls", "http://etcd-main-1.etcd-main-peer.ns.svc:2379"))
	// Every other key is druid's, unchanged.
	g.Expect(got).To(HaveKeyWithValue("quota-backend-bytes", BeNumerically("==", 8589934592)))
	g.Expect(got).To(HaveKeyWithValue("initial-cluster-token", "etcd-cluster"))
	g.Expect(got).To(HaveKeyWithValue("member-name-prefix", "seed-b"))

	for _, tc := range []struct {
		name, cluster, state, want string
	}{
		{"a state etcd does not know", cluster, "join", `state "join"`},
		{"an initial cluster without the member", "etcd-main-0=http://etcd-main-0.seed-a.example:2380", StateExisting, "lacks seed-b-etcd-main-1=http://etcd-main-1.etcd-main-peer.ns.svc:2380"},
		{"an initial cluster lacking one of its URLs", "seed-b-etcd-main-1=http://etcd-main-1.etcd-main-peer.ns.svc:2380", StateExisting, "lacks seed-b-etcd-main-1=https://etcd-main-1.seed-b.example:2380"},
		{"a malformed entry", cluster + ",oops", StateExisting, `entry "oops" is not name=peerURL`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := f.ForMember(m, tc.cluster, tc.state)
			NewWithT(t).Expect(err).To(MatchError(ContainSubstring(tc.want)))
		})
	}
}

func TestForBackupRestore(t *testing.T) {
	g := NewWithT(t)
	f, err := Parse([]byte(druidFile))
	g.Expect(err).NotTo(HaveOccurred())

	// Ordinal 3: druid's file has no entry; backup-restore gets one, and an
	// initial cluster of the member alone (cluster size 1: no membership
	// action of its own).
	m := Member{Name: "seed-b-etcd-main-3", PeerURLs: []string{"http://etcd-main-3.etcd-main-peer.ns.svc:2380"}, ClientURLs: []string{"http://etcd-main-3.etcd-main-peer.ns.svc:2379"}}
	b, err := f.ForBackupRestore(m)
	g.Expect(err).NotTo(HaveOccurred())
	got := parse(t, b)
	g.Expect(got).To(HaveKeyWithValue("initial-cluster", "seed-b-etcd-main-3=http://etcd-main-3.etcd-main-peer.ns.svc:2380"))
	g.Expect(strings.Count(got["initial-cluster"].(string), "=")).To(Equal(1))
	g.Expect(got["initial-advertise-peer-urls"]).To(HaveKeyWithValue("seed-b-etcd-main-3", []any{"http://etcd-main-3.etcd-main-peer.ns.svc:2380"}))
	g.Expect(got["initial-advertise-peer-urls"]).To(HaveKeyWithValue("seed-b-etcd-main-0", []any{"http://etcd-main-0.etcd-main-peer.ns.svc:2380"}), "druid's other entries stay")
	g.Expect(got["advertise-client-urls"]).To(HaveKeyWithValue("seed-b-etcd-main-3", []any{"http://etcd-main-3.etcd-main-peer.ns.svc:2379"}))
	g.Expect(got).To(HaveKeyWithValue("name", "etcd-config"), "druid's placeholder: backup-restore computes the name itself")
	g.Expect(got).To(HaveKeyWithValue("initial-cluster-state", "new"))

	// The input is not changed by rendering.
	again, err := f.ForBackupRestore(m)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(again).To(Equal(b))
	_, ok := f.Entry("seed-b-etcd-main-3")
	g.Expect(ok).To(BeFalse())
}

func TestParseRefusesWhatIsNotDruidsFile(t *testing.T) {
	g := NewWithT(t)
	_, err := Parse([]byte(""))
	g.Expect(err).To(MatchError(ContainSubstring("empty")))
	_, err = Parse([]byte("a: [b"))
	g.Expect(err).To(MatchError(ContainSubstring("parsing druid's etcd configuration")))
	_, err = Load("/nonexistent/etcd.conf.yaml")
	g.Expect(err).To(MatchError(ContainSubstring("reading druid's etcd configuration")))
}

// druidJoiningFile is what etcd-druid v0.38.1 renders for the destination
// Etcd of a GEP-39 move: the same name and namespace as the source, prefix
// seed-b, replicas 2, spec.etcd.bootstrapWithExistingCluster naming the
// source's three members (their in-cluster URLs and those seed-b reaches
// them by). druid drops the additional peer URLs under a prefix.
const druidJoiningFile = `name: etcd-config
data-dir: /var/etcd/data/new.etcd
initial-cluster-state: new
initial-cluster: seed-b-etcd-main-0=http://etcd-main-0.etcd-main-peer.ns.svc:2380,seed-b-etcd-main-1=http://etcd-main-1.etcd-main-peer.ns.svc:2380,etcd-main-0=http://etcd-main-0.etcd-main-peer.ns.svc:2380,etcd-main-0=http://etcd-main-0.seed-a.example:2380,etcd-main-1=http://etcd-main-1.etcd-main-peer.ns.svc:2380,etcd-main-1=http://etcd-main-1.seed-a.example:2380
initial-advertise-peer-urls:
  seed-b-etcd-main-0: [http://etcd-main-0.etcd-main-peer.ns.svc:2380]
  seed-b-etcd-main-1: [http://etcd-main-1.etcd-main-peer.ns.svc:2380]
advertise-client-urls:
  seed-b-etcd-main-0: [http://etcd-main-0.etcd-main-peer.ns.svc:2379]
  seed-b-etcd-main-1: [http://etcd-main-1.etcd-main-peer.ns.svc:2379]
member-name-prefix: seed-b
`

// A destination member whose in-cluster peer URL a source member has
// advertises only the URLs the other cluster reaches it by: etcd would
// refuse to add it with a peer URL another member has.
func TestResolveKeepsMembersApart(t *testing.T) {
	g := NewWithT(t)
	f, err := Parse([]byte(druidJoiningFile))
	g.Expect(err).NotTo(HaveOccurred())

	m, err := f.Resolve(Member{Name: "seed-b-etcd-main-0"}, "http://etcd-main-0.seed-b.example:2380")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(m.PeerURLs).To(Equal([]string{"http://etcd-main-0.seed-b.example:2380"}))
	g.Expect(m.ClientURLs).To(Equal([]string{"http://etcd-main-0.seed-b.example:2379"}), "in seed-a the in-cluster host is the source's pod")

	// Without additional URLs nothing is dropped: the member would have no
	// URL at all, and the controller reports that instead.
	m, err = f.Resolve(Member{Name: "seed-b-etcd-main-1"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(m.PeerURLs).To(Equal([]string{"http://etcd-main-1.etcd-main-peer.ns.svc:2380"}))

	// The same Etcd in druid's usual file (no source listed) keeps its
	// in-cluster URL first.
	f, err = Parse([]byte(druidFile))
	g.Expect(err).NotTo(HaveOccurred())
	m, err = f.Resolve(Member{Name: "seed-b-etcd-main-0"}, "http://etcd-main-0.seed-b.example:2380")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(m.PeerURLs).To(Equal([]string{"http://etcd-main-0.etcd-main-peer.ns.svc:2380", "http://etcd-main-0.seed-b.example:2380"}))
}
