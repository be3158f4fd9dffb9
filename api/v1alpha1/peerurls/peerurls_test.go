package peerurls_test

import (
	"encoding/json"
	"strconv"
	"testing"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/peerurls"
)

// etcd is etcd-main in ns with 3 replicas and peer TLS.
func etcd(prefix *string, start *int32) *v1alpha1.Etcd {
	e := &v1alpha1.Etcd{ObjectMeta: metav1.ObjectMeta{Name: "etcd-main", Namespace: "ns"}}
	e.Spec.Replicas = 3
	e.Spec.MemberNamePrefix = prefix
	e.Spec.OrdinalStart = start
	e.Spec.Etcd.PeerUrlTLS = &druidv1alpha1.PeerTLSConfig{}
	return e
}

// withPR1438 is e's JSON with druid#1438's field set to spec, as an Etcd
// stored under druid's newer CRD reads. The JSON keys are spelled out
// here, not taken from the package's mirror types, so that a mirror that
// strays from druid#1438's shape fails the tests.
func withPR1438(t *testing.T, e *v1alpha1.Etcd, spec peerurls.AdditionalAdvertiseURLsSpec) []byte {
	t.Helper()
	raw, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	var obj map[string]any
	if err := json.Unmarshal(raw, &obj); err != nil {
		t.Fatal(err)
	}
	list := func(l *peerurls.AdditionalURLsSpec) map[string]any {
		members := []any{}
		for _, m := range l.Members {
			members = append(members, map[string]any{"name": m.Name, "urls": m.URLs})
		}
		out := map[string]any{"members": members}
		if l.OverrideDefaultURL != nil {
			out["overrideDefaultURL"] = *l.OverrideDefaultURL
		}
		return out
	}
	value := map[string]any{}
	if spec.ClientURLs != nil {
		value["clientURLs"] = list(spec.ClientURLs)
	}
	if spec.PeerURLs != nil {
		value["peerURLs"] = list(spec.PeerURLs)
	}
	obj["spec"].(map[string]any)["etcd"].(map[string]any)["additionalAdvertisedURLs"] = value
	out, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func peers(override *bool, m ...peerurls.MemberURLs) peerurls.AdditionalAdvertiseURLsSpec {
	return peerurls.AdditionalAdvertiseURLsSpec{PeerURLs: &peerurls.AdditionalURLsSpec{OverrideDefaultURL: override, Members: m}}
}

func lb(ordinal string) []string { return []string{"https://lb-" + ordinal + ".seed-b.example:2380"} }

// TestConversion reads both shapes into the one form, and refuses bad
// input with an error on the offending field.
func TestConversion(t *testing.T) {
	tests := []struct {
		name    string
		prefix  *string
		start   *int32
		v0381   []druidv1alpha1.MemberPeerURLs        // set on the typed object
		pr1438  *peerurls.AdditionalAdvertiseURLsSpec // set in its JSON
		want    []peerurls.Member
		errs    []string // field paths
		details []string // substrings of the errors
	}{
		{name: "neither field"},
		{name: "v0.38.1, no prefix",
			v0381: []druidv1alpha1.MemberPeerURLs{{MemberName: "etcd-main-2", URLs: lb("2")}, {MemberName: "etcd-main-0", URLs: lb("0")}},
			want:  []peerurls.Member{{Name: "etcd-main-0", URLs: lb("0")}, {Name: "etcd-main-2", URLs: lb("2")}}},
		{name: "v0.38.1, prefix", prefix: ptr.To("seed-b"),
			v0381: []druidv1alpha1.MemberPeerURLs{{MemberName: "seed-b-etcd-main-1", URLs: lb("1")}},
			want:  []peerurls.Member{{Name: "seed-b-etcd-main-1", URLs: lb("1")}}},
		{name: "v0.38.1, prefix, an entry under the pod name", prefix: ptr.To("seed-b"),
			v0381:   []druidv1alpha1.MemberPeerURLs{{MemberName: "etcd-main-1", URLs: lb("1")}},
			errs:    []string{"spec.etcd.additionalAdvertisePeerURLs[0].memberName"},
			details: []string{"is the pod name of local member seed-b-etcd-main-1"}},
		{name: "v0.38.1, duplicate member",
			v0381: []druidv1alpha1.MemberPeerURLs{{MemberName: "etcd-main-1", URLs: lb("1")}, {MemberName: "etcd-main-1", URLs: lb("x")}},
			want:  []peerurls.Member{{Name: "etcd-main-1", URLs: lb("1")}},
			errs:  []string{"spec.etcd.additionalAdvertisePeerURLs[1].memberName"}, details: []string{"also spec.etcd.additionalAdvertisePeerURLs[0].memberName"}},
		{name: "druid#1438, overrideDefaultURL unset",
			pr1438: ptr.To(peers(nil, peerurls.MemberURLs{Name: "etcd-main-0", URLs: lb("0")})),
			want:   []peerurls.Member{{Name: "etcd-main-0", URLs: lb("0")}}},
		{name: "druid#1438, overrideDefaultURL false, prefix", prefix: ptr.To("seed-b"),
			pr1438: ptr.To(peers(ptr.To(false), peerurls.MemberURLs{Name: "seed-b-etcd-main-2", URLs: lb("2")})),
			want:   []peerurls.Member{{Name: "seed-b-etcd-main-2", URLs: lb("2")}}},
		{name: "druid#1438, overrideDefaultURL true",
			pr1438: ptr.To(peers(ptr.To(true), peerurls.MemberURLs{Name: "etcd-main-1", URLs: lb("1")}, peerurls.MemberURLs{Name: "etcd-main-0", URLs: lb("0")})),
			want:   []peerurls.Member{{Name: "etcd-main-0", URLs: lb("0"), ReplacesDefault: true}, {Name: "etcd-main-1", URLs: lb("1"), ReplacesDefault: true}}},
		{name: "druid#1438, client URLs only",
			pr1438: &peerurls.AdditionalAdvertiseURLsSpec{ClientURLs: &peerurls.AdditionalURLsSpec{Members: []peerurls.MemberURLs{{Name: "etcd-main-0", URLs: []string{"https://lb-0:2379"}}}}}},
		{name: "druid#1438, shifted ordinals", start: ptr.To[int32](3),
			pr1438: ptr.To(peers(nil, peerurls.MemberURLs{Name: "etcd-main-5", URLs: lb("5")})),
			want:   []peerurls.Member{{Name: "etcd-main-5", URLs: lb("5")}}},
		{name: "druid#1438, a name of no local member (index at replicas)",
			pr1438:  ptr.To(peers(nil, peerurls.MemberURLs{Name: "etcd-main-0", URLs: lb("0")}, peerurls.MemberURLs{Name: "etcd-main-3", URLs: lb("3")})),
			want:    []peerurls.Member{{Name: "etcd-main-0", URLs: lb("0")}},
			errs:    []string{"spec.etcd.additionalAdvertisedURLs.peerURLs.members[1].name"},
			details: []string{"names no local member: the local members are etcd-main-0..etcd-main-2 (ordinals [0, 3))"}},
		{name: "druid#1438, a name below the shifted ordinals", start: ptr.To[int32](3),
			pr1438: ptr.To(peers(nil, peerurls.MemberURLs{Name: "etcd-main-0", URLs: lb("0")})),
			errs:   []string{"spec.etcd.additionalAdvertisedURLs.peerURLs.members[0].name"}, details: []string{"ordinals [3, 6)"}},
		{name: "druid#1438, another Etcd's name", prefix: ptr.To("seed-b"),
			pr1438: ptr.To(peers(nil, peerurls.MemberURLs{Name: "seed-a-etcd-main-0", URLs: lb("0")})),
			errs:   []string{"spec.etcd.additionalAdvertisedURLs.peerURLs.members[0].name"}, details: []string{"names no local member"}},
		{name: "druid#1438, the pod name under a prefix", prefix: ptr.To("seed-b"),
			pr1438: ptr.To(peers(nil, peerurls.MemberURLs{Name: "etcd-main-0", URLs: lb("0")})),
			errs:   []string{"spec.etcd.additionalAdvertisedURLs.peerURLs.members[0].name"}, details: []string{"is the pod name of local member seed-b-etcd-main-0"}},
		{name: "druid#1438, duplicate names",
			pr1438:  ptr.To(peers(nil, peerurls.MemberURLs{Name: "etcd-main-1", URLs: lb("1")}, peerurls.MemberURLs{Name: "etcd-main-1", URLs: lb("y")})),
			want:    []peerurls.Member{{Name: "etcd-main-1", URLs: lb("1")}},
			errs:    []string{"spec.etcd.additionalAdvertisedURLs.peerURLs.members[1].name"},
			details: []string{"Duplicate value", "also spec.etcd.additionalAdvertisedURLs.peerURLs.members[0].name"}},
		{name: "druid#1438, http with peer TLS",
			pr1438:  ptr.To(peers(nil, peerurls.MemberURLs{Name: "etcd-main-1", URLs: []string{"https://a:2380", "http://b:2380"}})),
			errs:    []string{"spec.etcd.additionalAdvertisedURLs.peerURLs.members[0].urls[1]"},
			details: []string{"must use https:// because spec.etcd.peerUrlTls is set"}},
		{name: "druid#1438, no URLs",
			pr1438: ptr.To(peers(nil, peerurls.MemberURLs{Name: "etcd-main-1"})),
			errs:   []string{"spec.etcd.additionalAdvertisedURLs.peerURLs.members[0].urls"}, details: []string{"Required value"}},
		{name: "druid#1438, no name",
			pr1438: ptr.To(peers(nil, peerurls.MemberURLs{URLs: lb("0")})),
			errs:   []string{"spec.etcd.additionalAdvertisedURLs.peerURLs.members[0].name"}, details: []string{"Required value"}},
		{name: "druid#1438, no members",
			pr1438: ptr.To(peers(ptr.To(true))),
			errs:   []string{"spec.etcd.additionalAdvertisedURLs.peerURLs.members"}, details: []string{"at least one member"}},
		{name: "both shapes at once",
			v0381:  []druidv1alpha1.MemberPeerURLs{{MemberName: "etcd-main-0", URLs: lb("0")}},
			pr1438: ptr.To(peers(nil, peerurls.MemberURLs{Name: "etcd-main-0", URLs: lb("0")})),
			errs:   []string{"spec.etcd.additionalAdvertisedURLs"}, details: []string{"set together with spec.etcd.additionalAdvertisePeerURLs"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			e := etcd(tc.prefix, tc.start)
			e.Spec.Etcd.AdditionalAdvertisePeerURLs = tc.v0381
			raw, err := json.Marshal(e)
			g.Expect(err).NotTo(HaveOccurred())
			if tc.pr1438 != nil {
				raw = withPR1438(t, e, *tc.pr1438)
			}
			got, errs := peerurls.ReadJSON(e, raw)
			g.Expect(paths(errs)).To(ConsistOf(tc.errs), "errors: %v", errs)
			for _, d := range tc.details {
				g.Expect(errs.ToAggregate()).To(MatchError(ContainSubstring(d)))
			}
			g.Expect(got.Members()).To(Equal(tc.want))
			if tc.pr1438 == nil {
				fromType, typeErrs := peerurls.Read(e)
				g.Expect(fromType).To(Equal(got), "without druid#1438's field, ReadJSON reads what Read reads")
				g.Expect(typeErrs).To(Equal(errs))
			}
		})
	}
}

func paths(errs field.ErrorList) []string {
	out := []string{}
	for _, e := range errs {
		out = append(out, e.Field)
	}
	return out
}

// TestReadJSONOfDruidsExample reads an Etcd written as druid#1438's usage
// guide writes one, TLS and overrideDefaultURL on both lists.
func TestReadJSONOfDruidsExample(t *testing.T) {
	g := NewWithT(t)
	doc := `{"apiVersion": "druid.gardener.cloud/v1alpha1", "kind": "Etcd",
	  "metadata": {"name": "etcd-main", "namespace": "ns"},
	  "spec": {"replicas": 3, "etcd": {"peerUrlTls": {"tlsCASecretRef": {"name": "ca"}, "serverTLSSecretRef": {"name": "tls"}},
	    "additionalAdvertisedURLs": {
	      "clientURLs": {"overrideDefaultURL": true, "members": [{"name": "etcd-main-0", "urls": ["https://lb-0.example.com:2379"]}]},
	      "peerURLs": {"overrideDefaultURL": true, "members": [
	        {"name": "etcd-main-0", "urls": ["https://lb-0.example.com:2380"]},
	        {"name": "etcd-main-1", "urls": ["https://lb-1.example.com:2380"]},
	        {"name": "etcd-main-2", "urls": ["https://lb-2.example.com:2380"]}]}}}}}`
	var e v1alpha1.Etcd
	g.Expect(json.Unmarshal([]byte(doc), &e)).To(Succeed())
	got, errs := peerurls.ReadJSON(&e, []byte(doc))
	g.Expect(errs).To(BeEmpty())
	g.Expect(got.PeerURLs(&e, "etcd-main-1", "etcd-main-1")).To(Equal([]string{"https://lb-1.example.com:2380"}))
	g.Expect(got.Members()).To(HaveLen(3))
	fromType, _ := peerurls.Read(&e)
	g.Expect(fromType.Members()).To(BeEmpty(), "the Go type of the pinned druid API drops the field")
}

func TestReadJSONRefusesAnotherShape(t *testing.T) {
	g := NewWithT(t)
	_, errs := peerurls.ReadJSON(etcd(nil, nil), []byte(`{"spec":{"etcd":{"additionalAdvertisedURLs":{"peerURLs":{"members":"etcd-main-0"}}}}}`))
	g.Expect(paths(errs)).To(Equal([]string{"spec.etcd.additionalAdvertisedURLs"}))
	g.Expect(errs.ToAggregate()).To(MatchError(ContainSubstring("does not decode as druid#1438's shape")))
}

// TestPeerURLs: druid's in-cluster URL first, then the entry's; the
// entry's alone when it replaces the default; the in-cluster URL alone
// for a member without an entry.
func TestPeerURLs(t *testing.T) {
	g := NewWithT(t)
	e := etcd(ptr.To("seed-b"), ptr.To[int32](3))
	e.Spec.Etcd.ServerPort = ptr.To[int32](12380)
	const inCluster4 = "https://etcd-main-4.etcd-main-peer.ns.svc:12380"

	appended, errs := peerurls.FromAdditionalAdvertisedURLs(e, ptr.To(peers(nil, peerurls.MemberURLs{Name: "seed-b-etcd-main-4", URLs: lb("4")})))
	g.Expect(errs).To(BeEmpty())
	g.Expect(appended.PeerURLs(e, "seed-b-etcd-main-4", "etcd-main-4")).To(Equal(append([]string{inCluster4}, lb("4")...)))
	g.Expect(appended.LocalPeerURLs(e)("seed-b-etcd-main-3", "etcd-main-3")).To(Equal([]string{"https://etcd-main-3.etcd-main-peer.ns.svc:12380"}))

	replaced, errs := peerurls.FromAdditionalAdvertisedURLs(e, ptr.To(peers(ptr.To(true), peerurls.MemberURLs{Name: "seed-b-etcd-main-4", URLs: lb("4")})))
	g.Expect(errs).To(BeEmpty())
	g.Expect(replaced.PeerURLs(e, "seed-b-etcd-main-4", "etcd-main-4")).To(Equal(lb("4")))
	g.Expect(replaced.PeerURLs(e, "seed-b-etcd-main-5", "etcd-main-5")).To(Equal([]string{"https://etcd-main-5.etcd-main-peer.ns.svc:12380"}),
		"overrideDefaultURL leaves members without an entry on the in-cluster URL")

	var none peerurls.Advertised
	g.Expect(none.PeerURLs(e, "seed-b-etcd-main-4", "etcd-main-4")).To(Equal([]string{inCluster4}))
}

// TestBothShapesAgree: the same members in either shape read the same,
// with and without a memberNamePrefix and an ordinal start.
func TestBothShapesAgree(t *testing.T) {
	for _, c := range []struct {
		name   string
		prefix *string
		start  *int32
	}{{"no prefix", nil, nil}, {"prefix", ptr.To("seed-b"), nil}, {"prefix and ordinal start", ptr.To("seed-b"), ptr.To[int32](3)}} {
		t.Run(c.name, func(t *testing.T) {
			g := NewWithT(t)
			old := etcd(c.prefix, c.start)
			next := old.DeepCopy()
			var v1438 []peerurls.MemberURLs
			for i := range int32(3) {
				o := strconv.Itoa(int(ptr.Deref(c.start, 0) + i))
				name := druidv1alpha1.GetMemberName(c.prefix, "etcd-main-"+o)
				old.Spec.Etcd.AdditionalAdvertisePeerURLs = append(old.Spec.Etcd.AdditionalAdvertisePeerURLs, druidv1alpha1.MemberPeerURLs{MemberName: name, URLs: lb(o)})
				v1438 = append(v1438, peerurls.MemberURLs{Name: name, URLs: lb(o)})
			}
			fromOld, errs := peerurls.Read(old)
			g.Expect(errs).To(BeEmpty())
			fromNew, errs := peerurls.ReadJSON(next, withPR1438(t, next, peers(nil, v1438...)))
			g.Expect(errs).To(BeEmpty())
			g.Expect(fromNew).To(Equal(fromOld))
			g.Expect(fromNew.Members()).To(HaveLen(3))
		})
	}
}

// TestOwnField: druid-stretch's spec.additionalAdvertisePeerURLs holds the
// entries druid's field cannot (ordinals from spec.replicas on) and reads
// as druid's do, after the in-cluster URL, beside druid's entries in
// either of druid's shapes. An entry druid's field admits is refused there
// (druid would not render it), and so is a member named in both.
func TestOwnField(t *testing.T) {
	g := NewWithT(t)
	e := etcd(nil, ptr.To[int32](2)) // members etcd-main-2..4
	e.Spec.Etcd.AdditionalAdvertisePeerURLs = []druidv1alpha1.MemberPeerURLs{{MemberName: "etcd-main-2", URLs: lb("2")}}
	e.Spec.AdditionalAdvertisePeerURLs = []v1alpha1.MemberPeerURLs{
		{MemberName: "etcd-main-3", URLs: lb("3")}, {MemberName: "etcd-main-4", URLs: lb("4")},
	}
	a, errs := peerurls.Read(e)
	g.Expect(errs).To(BeEmpty())
	g.Expect(a.Members()).To(HaveExactElements(
		peerurls.Member{Name: "etcd-main-2", URLs: lb("2")},
		peerurls.Member{Name: "etcd-main-3", URLs: lb("3")},
		peerurls.Member{Name: "etcd-main-4", URLs: lb("4")},
	))
	g.Expect(a.PeerURLs(e, "etcd-main-4", "etcd-main-4")).To(Equal(append(
		[]string{"https://etcd-main-4.etcd-main-peer.ns.svc:2380"}, lb("4")...)))

	// Beside druid#1438's shape, with overrideDefaultURL: druid's entries
	// replace the in-cluster URL, druid-stretch's do not.
	e.Spec.Etcd.AdditionalAdvertisePeerURLs = nil
	raw := withPR1438(t, e, peers(ptr.To(true), peerurls.MemberURLs{Name: "etcd-main-2", URLs: lb("2")}))
	a, errs = peerurls.ReadJSON(e, raw)
	g.Expect(errs).To(BeEmpty())
	g.Expect(a.Members()).To(HaveExactElements(
		peerurls.Member{Name: "etcd-main-2", URLs: lb("2"), ReplacesDefault: true},
		peerurls.Member{Name: "etcd-main-3", URLs: lb("3")},
		peerurls.Member{Name: "etcd-main-4", URLs: lb("4")},
	))

	// Ordinal 2 is below spec.replicas (3): druid's field admits it.
	e.Spec.AdditionalAdvertisePeerURLs = append(e.Spec.AdditionalAdvertisePeerURLs, v1alpha1.MemberPeerURLs{MemberName: "etcd-main-2", URLs: lb("2")})
	_, errs = peerurls.Read(e)
	g.Expect(paths(errs)).To(ConsistOf("spec.additionalAdvertisePeerURLs[2].memberName"))
	g.Expect(errs[0].Detail).To(ContainSubstring("belongs in druid's spec.etcd.additionalAdvertisePeerURLs"))

	// A member named in druid's field and in druid-stretch's.
	e.Spec.Replicas = 2 // members etcd-main-2..3: ordinal 2 is druid-stretch's now
	e.Spec.AdditionalAdvertisePeerURLs = []v1alpha1.MemberPeerURLs{{MemberName: "etcd-main-2", URLs: lb("2")}}
	e.Spec.Etcd.AdditionalAdvertisePeerURLs = []druidv1alpha1.MemberPeerURLs{{MemberName: "etcd-main-2", URLs: lb("2")}}
	_, errs = peerurls.Read(e)
	g.Expect(paths(errs)).To(ContainElement("spec.additionalAdvertisePeerURLs[0].memberName"))
	g.Expect(errs.ToAggregate().Error()).To(ContainSubstring("Duplicate value"))
}
