package webhook_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	stretchv1alpha1 "github.com/druid-stretch/druid-stretch/api/stretch/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/controllers/webhook"
	"github.com/druid-stretch/druid-stretch/internal/etcdview"
	"github.com/druid-stretch/druid-stretch/internal/testing/extendedcrd"
)

// stretchedEtcd is a valid destination-side Etcd of a live move.
func stretchedEtcd(namespace string) *v1alpha1.Etcd {
	e := etcdWithTLS(namespace)
	e.Spec.OrdinalStart = ptr.To[int32](3)
	for _, host := range []string{"etcd-main-0", "etcd-main-1", "etcd-main-2"} {
		e.Spec.ExternalMembers = append(e.Spec.ExternalMembers, v1alpha1.ExternalMember{
			Name:       "seed-a-" + host,
			PeerURLs:   []string{"https://" + host + ".seed-a.example:2380"},
			SidecarURL: "https://" + host + ".seed-a.example:8090",
		})
	}
	return e
}

// invalidCase is one Etcd the API server must refuse.
type invalidCase struct {
	name string
	// create is the Etcd to create, as a view; with update set it is
	// created valid and update then makes the invalid change.
	create func(ns string) *v1alpha1.Etcd
	update func(e *v1alpha1.Etcd)
	// field is the path the refusal of the inline Etcd must name, under
	// the extended Etcd CRD, whoever refuses.
	field string
	// webhookField is the precise path the webhook names.
	webhookField string
	// druidRule: druid's own CRD rule refuses it too, before any webhook.
	druidRule bool
	// pairField is the path the refusal names when the case is written
	// through the pair under druid's own Etcd CRD (the EtcdMembership's
	// CRD rules, or druid's on the Etcd). Empty when nothing refuses it
	// there: its rule reads druid-stretch's fields together with the
	// Etcd's, which the EtcdMembership's CRD cannot see.
	pairField string
}

var invalidCases = []invalidCase{
	{
		name: "duplicate external member names",
		create: func(ns string) *v1alpha1.Etcd {
			e := stretchedEtcd(ns)
			e.Spec.ExternalMembers[1].Name = e.Spec.ExternalMembers[0].Name
			return e
		},
		field:        "spec.externalMembers[1]",
		webhookField: "spec.externalMembers[1].name",
		pairField:    "spec.externalMembers[1]",
	},
	{
		name: "an external member named like a local member",
		create: func(ns string) *v1alpha1.Etcd {
			e := stretchedEtcd(ns)
			e.Spec.ExternalMembers[2].Name = "seed-b-etcd-main-4"
			return e
		},
		field:        "spec.externalMembers",
		webhookField: "spec.externalMembers[2].name",
	},
	{
		name:   "changed peer URLs of a listed external member",
		create: stretchedEtcd,
		update: func(e *v1alpha1.Etcd) {
			e.Spec.ExternalMembers[0].PeerURLs = []string{"https://elsewhere.seed-a.example:2380"}
		},
		field:        "spec.externalMembers[0]",
		webhookField: "spec.externalMembers[0].peerURLs",
		pairField:    "spec.externalMembers[0]",
	},
	{
		// How the sidecars are reached (ValidateSidecarAccess).
		name: "no spec.backup.tls and no insecure opt-in",
		create: func(ns string) *v1alpha1.Etcd {
			e := stretchedEtcd(ns)
			e.Spec.Backup.TLS = nil
			return e
		},
		field:        "spec.backup.tls",
		webhookField: "spec.backup.tls",
	},
	{
		name:      "changed member name prefix",
		create:    stretchedEtcd,
		update:    func(e *v1alpha1.Etcd) { e.Spec.MemberNamePrefix = ptr.To("seed-c") },
		field:     "spec.memberNamePrefix",
		druidRule: true,
		pairField: "spec.memberNamePrefix",
	},
}

// expectRefused checks that err is an Invalid refusal naming field and,
// when byWebhook, that the validating webhook gave it.
func expectRefused(t *testing.T, err error, field string, byWebhook bool) {
	t.Helper()
	g := NewWithT(t)
	g.Expect(err).To(HaveOccurred(), "the API server accepted it")
	var status *apierrors.StatusError
	g.Expect(errors.As(err, &status)).To(BeTrue(), "an API status: %v", err)
	g.Expect(apierrors.IsInvalid(err)).To(BeTrue(), "Invalid: %v", err)
	var fields []string
	if d := status.ErrStatus.Details; d != nil {
		for _, c := range d.Causes {
			fields = append(fields, c.Field)
		}
	}
	g.Expect(fields).To(ContainElement(HavePrefix(field)), "the causes name %s: %v", field, err)
	g.Expect(err.Error()).To(ContainSubstring(field))
	if byWebhook {
		g.Expect(err.Error()).To(ContainSubstring(`admission webhook "etcds.druid-stretch.druid.gardener.cloud" denied the request`))
	}
	t.Logf("refused: %v", err)
}

// tryInvalid runs one case with the fields inline, on c (whose Etcd CRD is
// the extended one), and checks that nothing was stored or changed.
func tryInvalid(t *testing.T, c client.Client, tc invalidCase, byWebhook bool) {
	g := NewWithT(t)
	field := tc.field
	if byWebhook {
		field = tc.webhookField
	}
	e := tc.create(namespaceIn(t, c))
	key := client.ObjectKeyFromObject(e)
	if tc.update == nil {
		expectRefused(t, c.Create(t.Context(), e), field, byWebhook)
		err := c.Get(t.Context(), key, &v1alpha1.Etcd{})
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "nothing stored: %v", err)
		return
	}
	g.Expect(c.Create(t.Context(), e)).To(Succeed())
	before := &v1alpha1.Etcd{}
	g.Expect(c.Get(t.Context(), key, before)).To(Succeed())
	changed := before.DeepCopy()
	tc.update(changed)
	expectRefused(t, c.Update(t.Context(), changed), field, byWebhook)
	after := &v1alpha1.Etcd{}
	g.Expect(c.Get(t.Context(), key, after)).To(Succeed())
	g.Expect(after.ResourceVersion).To(Equal(before.ResourceVersion), "nothing changed")
	g.Expect(equality.Semantic.DeepEqual(after.Spec, before.Spec)).To(BeTrue(), "the stored spec is the one before")
}

// tryInvalidPair runs one case as a user of druid's own Etcd CRD writes
// it, through the pair (etcdview), and checks that neither the
// EtcdMembership nor the Etcd was stored or changed.
func tryInvalidPair(t *testing.T, tc invalidCase) {
	g := NewWithT(t)
	e := tc.create(newNamespace(t))
	key := client.ObjectKeyFromObject(e)
	if tc.update == nil {
		expectRefused(t, etcdview.Create(t.Context(), k8s, e), tc.pairField, false)
		err := k8s.Get(t.Context(), key, &stretchv1alpha1.EtcdMembership{})
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "no EtcdMembership stored: %v", err)
		err = k8s.Get(t.Context(), key, &v1alpha1.Etcd{})
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "no Etcd stored: %v", err)
		return
	}
	g.Expect(etcdview.Create(t.Context(), k8s, e)).To(Succeed())
	p, err := etcdview.Get(t.Context(), k8s, key)
	g.Expect(err).NotTo(HaveOccurred())
	before := etcdview.Of(p.Etcd.DeepCopy(), p.Membership.DeepCopy())
	changed := p.View.DeepCopy()
	tc.update(changed)
	expectRefused(t, etcdview.Apply(t.Context(), k8s, p, changed), tc.pairField, false)
	after, err := etcdview.Get(t.Context(), k8s, key)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(after.Etcd.ResourceVersion).To(Equal(before.Etcd.ResourceVersion), "the Etcd did not change")
	g.Expect(after.Membership.ResourceVersion).To(Equal(before.Membership.ResourceVersion), "the EtcdMembership did not change")
	g.Expect(equality.Semantic.DeepEqual(after.View.Spec, before.View.Spec)).To(BeTrue(), "the stored spec is the one before")
}

// Under druid's own Etcd CRD, as on a seed: each case written through the
// pair.
func TestInvalidEtcdIsRefused(t *testing.T) {
	for _, tc := range invalidCases {
		if tc.pairField == "" {
			// Refused inline only (TestInvalidInlineEtcdIsRefused); under
			// druid's own CRD the StatefulSet webhook refuses druid's
			// StatefulSet of it (TestWebhookRefusals), or the membership
			// controller's check of the pair blocks it.
			continue
		}
		t.Run(tc.name, func(t *testing.T) { tryInvalidPair(t, tc) })
	}
}

// The same cases with druid-stretch's fields inline, under the extended
// Etcd CRD of earlier releases: its rules and the Etcd validator.
func TestInvalidInlineEtcdIsRefused(t *testing.T) {
	c := extended.client(t)
	for _, tc := range invalidCases {
		t.Run(tc.name, func(t *testing.T) { tryInvalid(t, c, tc, false) })
	}
}

// Under druid's own Etcd CRD the Etcd carries nothing of druid-stretch's,
// so the Etcd validator's match condition never holds: the writes of a
// live move go through the EtcdMembership's CRD rules alone, and no write
// of an Etcd waits for druid-stretch's webhook server.
func TestPairNeedsNoEtcdValidator(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	before := webhookRequests(t, webhook.EtcdValidatorPath)

	e := createEtcd(t, stretchedEtcd(ns))
	// The changes a live move makes: the ordinal range moves, the policy
	// turns to Retire, an external member goes.
	changeEtcd(t, e, func(v *v1alpha1.Etcd) {
		v.Spec.OrdinalStart = ptr.To[int32](6)
		v.Spec.ExternalMembersPolicy = ptr.To(v1alpha1.ExternalMembersPolicyRetire)
		v.Spec.ExternalMembers = v.Spec.ExternalMembers[1:]
	})
	p, err := etcdview.Get(t.Context(), k8s, client.ObjectKeyFromObject(e))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(p.Source).To(Equal(stretchv1alpha1.SpecFromEtcdMembership))
	g.Expect(p.View.Spec.OrdinalStart).To(HaveValue(BeEquivalentTo(6)))
	g.Expect(p.View.Spec.ExternalMembers).To(HaveLen(2))
	g.Expect(p.Etcd.UsesExtension()).To(BeFalse(), "druid's CRD stores none of druid-stretch's fields")
	g.Expect(webhookRequests(t, webhook.EtcdValidatorPath)).To(Equal(before), "the Etcd validator was not asked")
}

// Under the extended Etcd CRD the validator admits the changes of a live
// move made inline, and a plain Etcd never reaches it.
func TestValidEtcdPassesTheValidator(t *testing.T) {
	g := NewWithT(t)
	c := extended.client(t)
	ns := namespaceIn(t, c)
	before := webhookRequests(t, webhook.EtcdValidatorPath)

	e := stretchedEtcd(ns)
	g.Expect(c.Create(t.Context(), e)).To(Succeed())
	// The changes a live move makes: the ordinal range moves, the policy
	// turns to Retire, an external member goes.
	e.Spec.OrdinalStart = ptr.To[int32](6)
	e.Spec.ExternalMembersPolicy = ptr.To(v1alpha1.ExternalMembersPolicyRetire)
	e.Spec.ExternalMembers = e.Spec.ExternalMembers[1:]
	g.Expect(c.Update(t.Context(), e)).To(Succeed())
	g.Expect(webhookRequests(t, webhook.EtcdValidatorPath)).To(Equal(before+2), "the validator admitted both")

	// A plain Etcd never reaches the validator (the match condition), so
	// druid's own Etcds do not depend on druid-stretch being up.
	g.Expect(c.Create(t.Context(), plainEtcd(ns))).To(Succeed())
	g.Expect(webhookRequests(t, webhook.EtcdValidatorPath)).To(Equal(before + 2))
}

// TestWebhookAloneRefusesInvalidEtcd removes the extension's rules from the
// extended Etcd CRD, as on a cluster whose CRD predates them, so that only
// the webhook stands between an invalid inline extension and the store.
// The API server evaluates a CRD's own rules before validating webhooks,
// so with the full CRD the webhook is the second line and this is the way
// to see it refuse. It edits the CRD of the extended server, which no test
// of druid's own CRD shares.
func TestWebhookAloneRefusesInvalidEtcd(t *testing.T) {
	g := NewWithT(t)
	ctx := t.Context()
	c := extended.client(t)
	probeNS := namespaceIn(t, c)
	crd := loadCRD(t)
	original := crd.DeepCopy()
	stripExtensionRules(t, crd)
	live := &apiextensionsv1.CustomResourceDefinition{}
	g.Expect(c.Get(ctx, client.ObjectKeyFromObject(crd), live)).To(Succeed())
	setSchema(live, crd)
	g.Expect(c.Update(ctx, live)).To(Succeed())
	t.Cleanup(func() {
		// Later tests see the extended CRD again.
		ctx := context.Background()
		restored := &apiextensionsv1.CustomResourceDefinition{}
		g.Expect(c.Get(ctx, client.ObjectKeyFromObject(original), restored)).To(Succeed())
		setSchema(restored, original)
		g.Expect(c.Update(ctx, restored)).To(Succeed())
		waitUntilRefusedBy(ctx, t, c, probeNS, false)
	})
	waitUntilRefusedBy(ctx, t, c, probeNS, true)

	for _, tc := range invalidCases {
		if tc.druidRule {
			continue // druid's rule stays in the CRD and answers first
		}
		t.Run(tc.name, func(t *testing.T) { tryInvalid(t, c, tc, true) })
	}
}

// waitUntilRefusedBy waits until the API server of c serves the CRD it was
// given: a dry-run create of duplicate names is refused by the webhook (or,
// with the full extended CRD, by the CRD's list rule).
func waitUntilRefusedBy(ctx context.Context, t *testing.T, c client.Client, ns string, byWebhook bool) {
	t.Helper()
	NewWithT(t).Eventually(func() bool {
		e := invalidCases[0].create(ns)
		err := c.Create(ctx, e, client.DryRunAll)
		return err != nil && strings.Contains(err.Error(), "admission webhook") == byWebhook
	}).WithTimeout(30 * time.Second).WithPolling(100 * time.Millisecond).Should(BeTrue())
}

// loadCRD is the extended Etcd CRD as testbin installs it.
func loadCRD(t *testing.T) *apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	crd, err := extendedcrd.CRD()
	if err != nil {
		t.Fatal(err)
	}
	return crd
}

func setSchema(dst, src *apiextensionsv1.CustomResourceDefinition) {
	for i := range dst.Spec.Versions {
		dst.Spec.Versions[i].Schema = src.Spec.Versions[i].Schema.DeepCopy()
	}
}

// stripExtensionRules drops every rule that reads the extension fields: the
// CEL rules inside and about spec.externalMembers and the list-map type
// that refuses duplicate names.
func stripExtensionRules(t *testing.T, crd *apiextensionsv1.CustomResourceDefinition) {
	t.Helper()
	root := crd.Spec.Versions[0].Schema.OpenAPIV3Schema
	spec := root.Properties["spec"]
	ext := spec.Properties["externalMembers"]
	ext.XValidations = nil
	ext.XListType = ptr.To("atomic")
	ext.XListMapKeys = nil
	item := ext.Items.Schema
	item.XValidations = nil
	for name, p := range item.Properties {
		p.XValidations = nil
		if p.Items != nil && p.Items.Schema != nil {
			p.Items.Schema.XValidations = nil
		}
		item.Properties[name] = p
	}
	spec.Properties["externalMembers"] = ext
	spec.XValidations = withoutRulesOn(spec.XValidations, "externalMembers")
	root.Properties["spec"] = spec
	root.XValidations = withoutRulesOn(root.XValidations, "externalMembers")
	data, _ := json.Marshal(root)
	if strings.Contains(string(data), "externalMembers.all") || strings.Contains(string(data), "oldSelf.peerURLs") {
		t.Fatal("an extension rule survived the stripping")
	}
}

func withoutRulesOn(rules apiextensionsv1.ValidationRules, field string) apiextensionsv1.ValidationRules {
	var out apiextensionsv1.ValidationRules
	for _, r := range rules {
		if !strings.Contains(r.Rule, field) {
			out = append(out, r)
		}
	}
	return out
}
