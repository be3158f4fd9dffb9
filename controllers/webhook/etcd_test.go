package webhook_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/controllers/webhook"
	"github.com/druid-stretch/druid-stretch/internal/testbin"
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
	// create is the Etcd to create; with update set it is created valid and
	// update then makes the invalid change.
	create func(ns string) *v1alpha1.Etcd
	update func(e *v1alpha1.Etcd)
	// field is the path the refusal must name, whoever refuses.
	field string
	// webhookField is the precise path the webhook names.
	webhookField string
	// druidRule: druid's own CRD rule refuses it too, before any webhook.
	druidRule bool
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
	},
	{
		name:      "changed member name prefix",
		create:    stretchedEtcd,
		update:    func(e *v1alpha1.Etcd) { e.Spec.MemberNamePrefix = ptr.To("seed-c") },
		field:     "spec.memberNamePrefix",
		druidRule: true,
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

// tryInvalid runs one case and checks that nothing was stored or changed.
func tryInvalid(t *testing.T, tc invalidCase, byWebhook bool) {
	g := NewWithT(t)
	field := tc.field
	if byWebhook {
		field = tc.webhookField
	}
	e := tc.create(newNamespace(t))
	key := client.ObjectKeyFromObject(e)
	if tc.update == nil {
		expectRefused(t, k8s.Create(t.Context(), e), field, byWebhook)
		err := k8s.Get(t.Context(), key, &v1alpha1.Etcd{})
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "nothing stored: %v", err)
		return
	}
	g.Expect(k8s.Create(t.Context(), e)).To(Succeed())
	before := &v1alpha1.Etcd{}
	g.Expect(k8s.Get(t.Context(), key, before)).To(Succeed())
	changed := before.DeepCopy()
	tc.update(changed)
	expectRefused(t, k8s.Update(t.Context(), changed), field, byWebhook)
	after := &v1alpha1.Etcd{}
	g.Expect(k8s.Get(t.Context(), key, after)).To(Succeed())
	g.Expect(after.ResourceVersion).To(Equal(before.ResourceVersion), "nothing changed")
	g.Expect(equality.Semantic.DeepEqual(after.Spec, before.Spec)).To(BeTrue(), "the stored spec is the one before")
}

func TestInvalidEtcdIsRefused(t *testing.T) {
	for _, tc := range invalidCases {
		t.Run(tc.name, func(t *testing.T) { tryInvalid(t, tc, false) })
	}
}

func TestValidEtcdPassesTheValidator(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	before := webhookRequests(t, webhook.EtcdValidatorPath)

	e := stretchedEtcd(ns)
	g.Expect(k8s.Create(t.Context(), e)).To(Succeed())
	// The changes a live move makes: the ordinal range moves, the policy
	// turns to Retire, an external member goes.
	e.Spec.OrdinalStart = ptr.To[int32](6)
	e.Spec.ExternalMembersPolicy = ptr.To(v1alpha1.ExternalMembersPolicyRetire)
	e.Spec.ExternalMembers = e.Spec.ExternalMembers[1:]
	g.Expect(k8s.Update(t.Context(), e)).To(Succeed())
	g.Expect(webhookRequests(t, webhook.EtcdValidatorPath)).To(Equal(before+2), "the validator admitted both")

	// A plain Etcd never reaches the validator (the match condition), so
	// druid's own Etcds do not depend on druid-stretch being up.
	g.Expect(k8s.Create(t.Context(), plainEtcd(ns))).To(Succeed())
	g.Expect(webhookRequests(t, webhook.EtcdValidatorPath)).To(Equal(before + 2))
}

// TestWebhookAloneRefusesInvalidEtcd removes the extension's rules from the
// CRD, as on a cluster whose CRD predates them, so that only the webhook
// stands between an invalid extension and the store. The API server
// evaluates a CRD's own rules before validating webhooks, so with the full
// CRD the webhook is the second line and this is the way to see it refuse.
func TestWebhookAloneRefusesInvalidEtcd(t *testing.T) {
	g := NewWithT(t)
	ctx := t.Context()
	probeNS := newNamespace(t)
	crd := loadCRD(t)
	original := crd.DeepCopy()
	stripExtensionRules(t, crd)
	live := &apiextensionsv1.CustomResourceDefinition{}
	g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(crd), live)).To(Succeed())
	setSchema(live, crd)
	g.Expect(k8s.Update(ctx, live)).To(Succeed())
	t.Cleanup(func() {
		// Later tests see the CRD of the chart again.
		ctx := context.Background()
		restored := &apiextensionsv1.CustomResourceDefinition{}
		g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(original), restored)).To(Succeed())
		setSchema(restored, original)
		g.Expect(k8s.Update(ctx, restored)).To(Succeed())
		waitUntilRefusedBy(ctx, t, probeNS, false)
	})
	waitUntilRefusedBy(ctx, t, probeNS, true)

	for _, tc := range invalidCases {
		if tc.druidRule {
			continue // druid's rule stays in the CRD and answers first
		}
		t.Run(tc.name, func(t *testing.T) { tryInvalid(t, tc, true) })
	}
}

// waitUntilRefusedBy waits until the API server serves the CRD it was
// given: a dry-run create of duplicate names is refused by the webhook (or,
// with the chart's CRD, by the CRD's list rule).
func waitUntilRefusedBy(ctx context.Context, t *testing.T, ns string, byWebhook bool) {
	t.Helper()
	NewWithT(t).Eventually(func() bool {
		e := invalidCases[0].create(ns)
		err := k8s.Create(ctx, e, client.DryRunAll)
		return err != nil && strings.Contains(err.Error(), "admission webhook") == byWebhook
	}).WithTimeout(30 * time.Second).WithPolling(100 * time.Millisecond).Should(BeTrue())
}

func loadCRD(t *testing.T) *apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	root, err := testbin.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, "charts", "druid-stretch", "crds", "druid.gardener.cloud_etcds.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.UnmarshalStrict(data, crd); err != nil {
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
