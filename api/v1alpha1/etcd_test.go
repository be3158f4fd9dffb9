package v1alpha1_test

import (
	"encoding/json"
	"testing"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	. "github.com/onsi/gomega"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
)

func stretched() *v1alpha1.Etcd {
	return &v1alpha1.Etcd{
		ObjectMeta: metav1.ObjectMeta{Name: "etcd-main", Namespace: "ns"},
		Spec: v1alpha1.EtcdSpec{
			EtcdSpec: druidv1alpha1.EtcdSpec{
				Labels:           map[string]string{"app": "etcd"},
				Replicas:         3,
				MemberNamePrefix: ptr.To("seed-b"),
			},
			MembershipSpec: v1alpha1.MembershipSpec{
				OrdinalStart:          ptr.To[int32](3),
				ExternalMembers:       []v1alpha1.ExternalMember{{Name: "seed-a-etcd-main-0", PeerURLs: []string{"http://a0.example:2380"}}},
				ExternalMembersPolicy: ptr.To(v1alpha1.ExternalMembersPolicyRetire),
			},
		},
		Status: v1alpha1.EtcdStatus{
			EtcdStatus: druidv1alpha1.EtcdStatus{Ready: ptr.To(true), Replicas: 3},
			Membership: &v1alpha1.MembershipStatus{Phase: v1alpha1.MembershipPhaseConverged, RetiredMembers: []string{"seed-b-etcd-main-0"}},
		},
	}
}

// TestJSONIsDruidsPlusExtension checks the wire format: druid's fields sit
// where druid puts them (embedding, not nesting), the extension beside them,
// and druid's type decodes the same JSON unchanged.
func TestJSONIsDruidsPlusExtension(t *testing.T) {
	g := NewWithT(t)
	e := stretched()
	data, err := json.Marshal(e)
	g.Expect(err).NotTo(HaveOccurred())

	var wire map[string]map[string]any
	g.Expect(json.Unmarshal(data, &wire)).To(Succeed())
	g.Expect(wire["spec"]).To(HaveKeyWithValue("replicas", BeNumerically("==", 3)))
	g.Expect(wire["spec"]).To(HaveKeyWithValue("memberNamePrefix", "seed-b"))
	g.Expect(wire["spec"]).To(HaveKeyWithValue("ordinalStart", BeNumerically("==", 3)))
	g.Expect(wire["spec"]).To(HaveKeyWithValue("externalMembersPolicy", "Retire"))
	g.Expect(wire["spec"]).To(HaveKey("externalMembers"))
	g.Expect(wire["spec"]).NotTo(HaveKey("EtcdSpec"))
	g.Expect(wire["status"]).To(HaveKeyWithValue("ready", true))
	g.Expect(wire["status"]).To(HaveKey("membership"))

	var theirs druidv1alpha1.Etcd
	g.Expect(json.Unmarshal(data, &theirs)).To(Succeed())
	g.Expect(apiequality.Semantic.DeepEqual(theirs.Spec, e.Spec.EtcdSpec)).To(BeTrue())
	g.Expect(apiequality.Semantic.DeepEqual(theirs.Status, e.Status.EtcdStatus)).To(BeTrue())

	var back v1alpha1.Etcd
	g.Expect(json.Unmarshal(data, &back)).To(Succeed())
	g.Expect(apiequality.Semantic.DeepEqual(&back, e)).To(BeTrue())
}

func TestDefaults(t *testing.T) {
	g := NewWithT(t)
	var s v1alpha1.EtcdSpec
	g.Expect(s.GetOrdinalStart()).To(Equal(int32(0)))
	g.Expect(s.GetExternalMembersPolicy()).To(Equal(v1alpha1.ExternalMembersPolicyKeep))
	g.Expect(s.GetRetainedExternalMembers()).To(BeZero())
	s.RetainedExternalMembers = ptr.To[int32](1)
	g.Expect(s.GetRetainedExternalMembers()).To(Equal(1))
	e := stretched()
	g.Expect(e.Spec.GetOrdinalStart()).To(Equal(int32(3)))
	g.Expect(e.Spec.GetExternalMembersPolicy()).To(Equal(v1alpha1.ExternalMembersPolicyRetire))
	m, ok := e.Spec.ExternalMember("seed-a-etcd-main-0")
	g.Expect(ok).To(BeTrue())
	g.Expect(m.PeerURLs).To(ConsistOf("http://a0.example:2380"))
	_, ok = e.Spec.ExternalMember("nope")
	g.Expect(ok).To(BeFalse())
}

func TestDruidEtcdIsAnIndependentCopy(t *testing.T) {
	g := NewWithT(t)
	e := stretched()
	d := e.DruidEtcd()
	g.Expect(d.Name).To(Equal("etcd-main"))
	g.Expect(apiequality.Semantic.DeepEqual(d.Spec, e.Spec.EtcdSpec)).To(BeTrue())
	d.Spec.Labels["app"] = "changed"
	*d.Spec.MemberNamePrefix = "changed"
	g.Expect(e.Spec.Labels["app"]).To(Equal("etcd"))
	g.Expect(*e.Spec.MemberNamePrefix).To(Equal("seed-b"))
	// druid's helpers work on the copy.
	g.Expect(druidv1alpha1.GetPeerServiceName(d.ObjectMeta)).To(Equal("etcd-main-peer"))
}

func TestSchemeServesTheGroup(t *testing.T) {
	g := NewWithT(t)
	s := runtime.NewScheme()
	g.Expect(v1alpha1.AddToScheme(s)).To(Succeed())
	for kind, obj := range map[string]runtime.Object{
		"Etcd": &v1alpha1.Etcd{}, "EtcdList": &v1alpha1.EtcdList{},
		"EtcdCopyBackupsTask": &druidv1alpha1.EtcdCopyBackupsTask{}, "EtcdOpsTask": &druidv1alpha1.EtcdOpsTask{},
	} {
		gvks, _, err := s.ObjectKinds(obj)
		g.Expect(err).NotTo(HaveOccurred(), kind)
		g.Expect(gvks).To(ContainElement(v1alpha1.GroupVersion.WithKind(kind)))
	}
	g.Expect(v1alpha1.GroupVersion.String()).To(Equal("druid.gardener.cloud/v1alpha1"))
}

func TestVoters(t *testing.T) {
	g := NewWithT(t)
	st := &v1alpha1.MembershipStatus{Members: []v1alpha1.ObservedMember{
		{Name: "a", Role: v1alpha1.MemberRoleVoter},
		{Name: "b", Role: v1alpha1.MemberRoleLearner},
		{Name: "c", Role: v1alpha1.MemberRoleLeader},
	}}
	g.Expect(st.Voters()).To(Equal([]string{"a", "c"}))
	g.Expect(st.Members[1].Votes()).To(BeFalse())
	g.Expect((*v1alpha1.MembershipStatus)(nil).Voters()).To(BeEmpty(), "not observed yet")
}
