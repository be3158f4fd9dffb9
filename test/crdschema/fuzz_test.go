package crdschema

import (
	"fmt"
	"testing"
	"unicode/utf8"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/members"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/validation"
)

// fuzzInput is the part of an Etcd the fuzzer varies: everything the
// extension's rules read.
type fuzzInput struct {
	prefix            string // "" leaves memberNamePrefix unset
	replicas          int32
	hasStart          bool
	start             int32
	peerTLS           bool
	policy            string // "" leaves externalMembersPolicy unset
	name1             string
	peer1a, peer1b    string // "" leaves the URL out
	client1           string
	sidecar1          string
	name2, peer2      string // name2 "" leaves the second member out
	localAdvertised   string // a URL the first local member advertises; "" for none
	oldPeer1          string // non-empty: validate an update from peerURLs [oldPeer1]
	etcdNameVariant   uint8
	secondBeforeFirst bool
}

var fuzzEtcdNames = []string{"etcd-main", "etcd-events", "e", "etcd-main-1"}

func (in fuzzInput) etcd() *v1alpha1.Etcd {
	e := &v1alpha1.Etcd{
		ObjectMeta: metav1.ObjectMeta{Name: fuzzEtcdNames[int(in.etcdNameVariant)%len(fuzzEtcdNames)], Namespace: "default"},
		Spec: v1alpha1.EtcdSpec{EtcdSpec: druidv1alpha1.EtcdSpec{
			Labels:   map[string]string{"app": "etcd"},
			Replicas: in.replicas,
		}},
	}
	if in.prefix != "" {
		e.Spec.MemberNamePrefix = &in.prefix
	}
	if in.hasStart {
		e.Spec.OrdinalStart = &in.start
	}
	if in.peerTLS {
		e.Spec.Etcd.PeerUrlTLS = &druidv1alpha1.PeerTLSConfig{TLSConfig: druidv1alpha1.TLSConfig{
			TLSCASecretRef:     druidv1alpha1.SecretReference{SecretReference: corev1.SecretReference{Name: "ca"}},
			ServerTLSSecretRef: corev1.SecretReference{Name: "server"},
		}}
	}
	if in.policy != "" {
		p := v1alpha1.ExternalMembersPolicy(in.policy)
		e.Spec.ExternalMembersPolicy = &p
	}
	first := v1alpha1.ExternalMember{Name: in.name1, PeerURLs: nonEmpty(in.peer1a, in.peer1b), ClientURLs: nonEmpty(in.client1), SidecarURL: in.sidecar1}
	e.Spec.ExternalMembers = []v1alpha1.ExternalMember{first}
	if in.name2 != "" {
		second := v1alpha1.ExternalMember{Name: in.name2, PeerURLs: nonEmpty(in.peer2)}
		if in.secondBeforeFirst {
			e.Spec.ExternalMembers = []v1alpha1.ExternalMember{second, first}
		} else {
			e.Spec.ExternalMembers = append(e.Spec.ExternalMembers, second)
		}
	}
	if in.localAdvertised != "" && in.replicas > 0 {
		// Named like the first local member, so druid's own rules on
		// additionalAdvertisePeerURLs hold and only the extension's rule
		// about shared peer URLs is in play.
		e.Spec.Etcd.AdditionalAdvertisePeerURLs = []druidv1alpha1.MemberPeerURLs{{
			MemberName: members.MemberName(e, int64(e.Spec.GetOrdinalStart())),
			URLs:       []string{in.localAdvertised},
		}}
	}
	return e
}

func nonEmpty(s ...string) []string {
	var out []string
	for _, x := range s {
		if x != "" {
			out = append(out, x)
		}
	}
	return out
}

func (in fuzzInput) strings() []string {
	return []string{in.prefix, in.policy, in.name1, in.peer1a, in.peer1b, in.client1, in.sidecar1, in.name2, in.peer2, in.localAdvertised, in.oldPeer1}
}

// FuzzValidateEtcd checks that Go validation never panics and agrees with the
// CRD's OpenAPI and CEL rules, run in process as the apiserver runs them.
// The seed corpus is testdata/fuzz/FuzzValidateEtcd (one file per rule);
// run it longer with: go test ./api/v1alpha1/validation -run '^$' -fuzz FuzzValidateEtcd -fuzztime 60s
func FuzzValidateEtcd(f *testing.F) {
	f.Add("seed-b", int32(3), true, int32(3), true, "Keep",
		"seed-a-etcd-main-0", "https://etcd-main-0.seed-a.example:2380", "", "https://etcd-main-0.seed-a.example:2379", "https://etcd-main-0.seed-a.example:8080",
		"seed-a-etcd-main-1", "https://etcd-main-1.seed-a.example:2380", "", "", uint8(0), false)
	crd := theCRD(f)
	f.Fuzz(func(t *testing.T, prefix string, replicas int32, hasStart bool, start int32, peerTLS bool, policy string,
		name1, peer1a, peer1b, client1, sidecar1, name2, peer2, localAdvertised, oldPeer1 string, etcdNameVariant uint8, secondBeforeFirst bool) {
		in := fuzzInput{prefix, replicas, hasStart, start, peerTLS, policy, name1, peer1a, peer1b, client1, sidecar1,
			name2, peer2, localAdvertised, oldPeer1, etcdNameVariant, secondBeforeFirst}
		e := in.etcd()
		var old *v1alpha1.Etcd
		// goErrs are the Go errors of the rules the CRD has too; the
		// exported functions run as well, to show they never panic.
		goErrs := validation.ValidateCRDRules(e)
		if in.oldPeer1 != "" {
			old = e.DeepCopy()
			for i := range old.Spec.ExternalMembers {
				if old.Spec.ExternalMembers[i].Name == in.name1 {
					old.Spec.ExternalMembers[i].PeerURLs = []string{in.oldPeer1}
					break
				}
			}
			_ = validation.ValidateEtcdUpdate(e, old)
			goErrs = append(goErrs, validation.ValidateUpdateRules(e, old)...)
		} else {
			_ = validation.ValidateEtcd(e)
		}

		// JSON replaces invalid UTF-8, so the CRD would judge other strings.
		for _, s := range in.strings() {
			if !utf8.ValidString(s) {
				return
			}
		}
		// With an invalid old object the apiserver ratchets (accepts values
		// left unchanged), which Go validation deliberately does not.
		if old != nil && len(validation.ValidateCRDRules(old)) > 0 {
			return
		}
		crdErrs, err := crd.validate(e, old)
		if err != nil {
			t.Fatal(err)
		}
		if err := agreement(goErrs, crdErrs); err != nil {
			t.Fatalf("%v\ninput: %+v", err, in)
		}
	})
}

// agreement checks that Go validation and the CRD find the same problems in
// the extension fields: every CRD error is found by Go at the same field or a
// more precise one below it, and every Go error is found by the CRD at that
// field or above it. After a blocking error the apiserver skips all CEL rules,
// so then only the first direction holds.
func agreement(goErrs, crdErrs field.ErrorList) error {
	goExt := onlyExtension(goErrs)
	crdExt := onlyExtension(crdErrs)
	for _, ce := range crdExt {
		if !anyWithin(goExt, func(ge *field.Error) bool { return isPathWithin(ge.Field, ce.Field) }) {
			return fmt.Errorf("the CRD rejects %q and Go does not\nCRD: %v\nGo: %v", ce.Error(), crdErrs, goErrs)
		}
	}
	if hasBlockingErr(crdErrs) {
		return nil
	}
	for _, ge := range goExt {
		if !anyWithin(crdExt, func(ce *field.Error) bool { return isPathWithin(ge.Field, ce.Field) }) {
			return fmt.Errorf("Go rejects %q and the CRD does not\nCRD: %v\nGo: %v", ge.Error(), crdErrs, goErrs)
		}
	}
	return nil
}

func anyWithin(errs field.ErrorList, match func(*field.Error) bool) bool {
	for _, e := range errs {
		if match(e) {
			return true
		}
	}
	return false
}

func yamlOf(v any) (string, error) {
	data, err := yaml.Marshal(v)
	return string(data), err
}

// TestAgreementDetectsDisagreement shows the fuzz test's oracle can fail.
func TestAgreementDetectsDisagreement(t *testing.T) {
	members := field.NewPath("spec", "externalMembers")
	crdOnly := field.ErrorList{field.Invalid(members, "array", "a CRD rule")}
	goOnly := field.ErrorList{field.Invalid(field.NewPath("spec", "ordinalStart"), -1, "a Go rule")}
	goDeeper := field.ErrorList{field.Invalid(members.Index(1).Child("name"), "x", "a Go rule")}
	crdOtherIndex := field.ErrorList{field.Invalid(members.Index(10), "object", "a CRD rule")}
	blocking := field.ErrorList{field.TooLong(field.NewPath("spec", "externalMembers").Index(0).Child("name"), "x", 253)}

	for name, c := range map[string]struct {
		goErrs, crdErrs field.ErrorList
		agree           bool
	}{
		"CRD only":                    {nil, crdOnly, false},
		"Go only":                     {goOnly, nil, false},
		"Go more precise":             {goDeeper, crdOnly, true},
		"index 1 is not within 10":    {goDeeper, crdOtherIndex, false},
		"CEL skipped after TooLong":   {append(blocking, goDeeper...), blocking, true},
		"druid's fields are not ours": {nil, field.ErrorList{field.Invalid(field.NewPath("spec", "memberNamePrefix"), "x", "druid")}, true},
	} {
		t.Run(name, func(t *testing.T) {
			err := agreement(c.goErrs, c.crdErrs)
			if (err == nil) != c.agree {
				t.Fatalf("agreement = %v, want agree=%t", err, c.agree)
			}
		})
	}
}
