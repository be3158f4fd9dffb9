package members_test

import (
	"encoding/json"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/members"
)

func etcd(prefix *string, start *int32, replicas int32) *v1alpha1.Etcd {
	return &v1alpha1.Etcd{
		ObjectMeta: metav1.ObjectMeta{Name: "etcd-main", Namespace: "shoot--p--s"},
		Spec: v1alpha1.EtcdSpec{
			EtcdSpec:       druidv1alpha1.EtcdSpec{MemberNamePrefix: prefix, Replicas: replicas},
			MembershipSpec: v1alpha1.MembershipSpec{OrdinalStart: start},
		},
	}
}

func TestNames(t *testing.T) {
	tests := []struct {
		name         string
		e            *v1alpha1.Etcd
		wantPods     []string
		wantMembers  []string
		wantOrdinals members.Ordinals
	}{
		{"druid's default", etcd(nil, nil, 3),
			[]string{"etcd-main-0", "etcd-main-1", "etcd-main-2"},
			[]string{"etcd-main-0", "etcd-main-1", "etcd-main-2"}, members.Ordinals{Start: 0, End: 3}},
		{"ordinal start", etcd(nil, ptr.To[int32](3), 3),
			[]string{"etcd-main-3", "etcd-main-4", "etcd-main-5"},
			[]string{"etcd-main-3", "etcd-main-4", "etcd-main-5"}, members.Ordinals{Start: 3, End: 6}},
		{"prefix and ordinal start", etcd(ptr.To("seed-b"), ptr.To[int32](3), 2),
			[]string{"etcd-main-3", "etcd-main-4"},
			[]string{"seed-b-etcd-main-3", "seed-b-etcd-main-4"}, members.Ordinals{Start: 3, End: 5}},
		{"empty prefix is no prefix, as in druid", etcd(ptr.To(""), nil, 1),
			[]string{"etcd-main-0"}, []string{"etcd-main-0"}, members.Ordinals{Start: 0, End: 1}},
		{"scaled to zero", etcd(nil, ptr.To[int32](3), 0), []string{}, []string{}, members.Ordinals{Start: 3, End: 3}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			g.Expect(members.PodNames(tc.e)).To(Equal(tc.wantPods))
			g.Expect(members.LocalMemberNames(tc.e)).To(Equal(tc.wantMembers))
			g.Expect(members.LocalOrdinals(tc.e)).To(Equal(tc.wantOrdinals))
			for i, pod := range tc.wantPods {
				// Member names are druid's GetMemberName of the pod names.
				g.Expect(tc.wantMembers[i]).To(Equal(druidv1alpha1.GetMemberName(tc.e.Spec.MemberNamePrefix, pod)))
			}
		})
	}
}

func TestOrdinal(t *testing.T) {
	e := etcd(ptr.To("seed-b"), ptr.To[int32](3), 3)
	tests := []struct {
		member  string
		ordinal int64
		ok      bool
		local   bool
	}{
		{"seed-b-etcd-main-3", 3, true, true},
		{"seed-b-etcd-main-5", 5, true, true},
		{"seed-b-etcd-main-6", 6, true, false},
		{"seed-b-etcd-main-0", 0, true, false},
		{"seed-b-etcd-main-1234567890", 1234567890, true, false},
		{"seed-b-etcd-main-03", 0, false, false},          // pods are never named with leading zeros
		{"seed-b-etcd-main--3", 0, false, false},          // nor negative ordinals
		{"seed-b-etcd-main-3a", 0, false, false},          // nor suffixes
		{"seed-b-etcd-main-", 0, false, false},            // nor no ordinal
		{"seed-a-etcd-main-3", 0, false, false},           // another prefix
		{"etcd-main-3", 0, false, false},                  // no prefix
		{"seed-b-etcd-main-12345678901", 0, false, false}, // beyond int32+int32
	}
	for _, tc := range tests {
		t.Run(tc.member, func(t *testing.T) {
			g := NewWithT(t)
			o, ok := members.Ordinal(e, tc.member)
			g.Expect(ok).To(Equal(tc.ok))
			g.Expect(o).To(Equal(tc.ordinal))
			g.Expect(members.IsLocal(e, tc.member)).To(Equal(tc.local))
		})
	}
	// Every local member name maps back to its ordinal.
	g := NewWithT(t)
	for i, name := range members.LocalMemberNames(e) {
		o, ok := members.Ordinal(e, name)
		g.Expect(ok).To(BeTrue())
		g.Expect(o).To(Equal(int64(3 + i)))
	}
	o, ok := members.PodOrdinal(e, "etcd-main-4")
	g.Expect(ok).To(BeTrue())
	g.Expect(o).To(Equal(int64(4)))
}

func TestInitialCluster(t *testing.T) {
	g := NewWithT(t)
	e := etcd(nil, ptr.To[int32](3), 2)
	e.Spec.ExternalMembers = []v1alpha1.ExternalMember{
		{Name: "etcd-main-0", PeerURLs: []string{"https://etcd-main-0.seed-a.example:2380", "https://10.0.0.1:2380"}},
		{Name: "etcd-main-1", PeerURLs: []string{"https://etcd-main-1.seed-a.example:2380"}},
	}
	local := func(member, pod string) []string { return []string{"https://" + pod + ".local:2380"} }
	g.Expect(members.InitialCluster(e, local)).To(Equal(
		"etcd-main-3=https://etcd-main-3.local:2380," +
			"etcd-main-4=https://etcd-main-4.local:2380," +
			"etcd-main-0=https://etcd-main-0.seed-a.example:2380," +
			"etcd-main-0=https://10.0.0.1:2380," +
			"etcd-main-1=https://etcd-main-1.seed-a.example:2380"))
	g.Expect(members.FormatInitialCluster(nil)).To(BeEmpty())
}

func TestStatefulSetOrdinals(t *testing.T) {
	tests := []struct {
		name      string
		start     *int32
		wantPatch string
		want      *appsv1.StatefulSetOrdinals
	}{
		{"unset leaves druid's StatefulSet alone", nil, `{"spec":{"ordinals":null}}`, nil},
		{"zero is druid's default", ptr.To[int32](0), `{"spec":{"ordinals":null}}`, nil},
		{"start", ptr.To[int32](3), `{"spec":{"ordinals":{"start":3}}}`, &appsv1.StatefulSetOrdinals{Start: 3}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			e := etcd(nil, tc.start, 3)
			g.Expect(string(members.OrdinalsMergePatch(e))).To(MatchJSON(tc.wantPatch))

			sts := &appsv1.StatefulSet{Spec: appsv1.StatefulSetSpec{Ordinals: &appsv1.StatefulSetOrdinals{Start: 7}}}
			members.SetStatefulSetOrdinals(sts, e)
			g.Expect(sts.Spec.Ordinals).To(Equal(tc.want))

			// Applied as a merge patch to a StatefulSet on another start.
			before, err := json.Marshal(&appsv1.StatefulSet{Spec: appsv1.StatefulSetSpec{Ordinals: &appsv1.StatefulSetOrdinals{Start: 7}}})
			g.Expect(err).NotTo(HaveOccurred())
			after, err := jsonpatch.MergePatch(before, members.OrdinalsMergePatch(e))
			g.Expect(err).NotTo(HaveOccurred())
			var patched appsv1.StatefulSet
			g.Expect(json.Unmarshal(after, &patched)).To(Succeed())
			g.Expect(patched.Spec.Ordinals).To(Equal(tc.want))
		})
	}
}

func TestIsOwn(t *testing.T) {
	e := etcd(ptr.To("seed-b"), ptr.To[int32](3), 3)
	tests := []struct {
		name string
		m    v1alpha1.ObservedMember
		own  bool
	}{
		{"in the range, any origin", v1alpha1.ObservedMember{Name: "seed-b-etcd-main-4", Origin: v1alpha1.MemberOriginUnmanaged}, true},
		{"left the range, observed as Local", v1alpha1.ObservedMember{Name: "seed-b-etcd-main-6", Origin: v1alpha1.MemberOriginLocal}, true},
		{"unstarted learner observed as Local", v1alpha1.ObservedMember{Origin: v1alpha1.MemberOriginLocal}, true},
		{"external", v1alpha1.ObservedMember{Name: "seed-a-etcd-main-0", Origin: v1alpha1.MemberOriginExternal}, false},
		{"out of the range, unmanaged", v1alpha1.ObservedMember{Name: "seed-b-etcd-main-6", Origin: v1alpha1.MemberOriginUnmanaged}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			NewWithT(t).Expect(members.IsOwn(e, tc.m)).To(Equal(tc.own))
		})
	}
}
