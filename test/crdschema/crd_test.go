package crdschema

import (
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	druidcrds "github.com/gardener/etcd-druid/api/core/v1alpha1/crds"
	. "github.com/onsi/gomega"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"

	"github.com/druid-stretch/druid-stretch/internal/testing/extendedcrd"
)

// The only places where our schema may differ from druid's: the extension's
// properties, and the CEL rules listed here. Anything else is a regression.
var (
	extensionProperties = []string{
		".spec.additionalAdvertisePeerURLs",
		".spec.externalMembers",
		".spec.externalMembersPolicy",
		".spec.learnerReplicas",
		".spec.ordinalStart",
		".spec.retainedExternalMembers",
		".status.membership",
	}
	// druid's rule that assumes ordinals start at 0, and the rule that
	// replaces it. The replacement equals druid's rule when ordinalStart is
	// unset (crdtest shows both verdicts on the real apiserver).
	replacedDruidRule = "!has(self.spec.etcd.additionalAdvertisePeerURLs) || self.spec.etcd.additionalAdvertisePeerURLs.all(m, int(m.memberName.substring(m.memberName.lastIndexOf('-')+1)) < self.spec.replicas)"
	replacementRule   = "!has(self.spec.etcd.additionalAdvertisePeerURLs) || self.spec.etcd.additionalAdvertisePeerURLs.all(m, int(m.memberName.substring(m.memberName.lastIndexOf('-')+1)) >= (has(self.spec.ordinalStart) ? self.spec.ordinalStart : 0) && int(m.memberName.substring(m.memberName.lastIndexOf('-')+1)) < (has(self.spec.ordinalStart) ? self.spec.ordinalStart : 0) + self.spec.replicas)"
	// Rules the extension adds, by schema path, counted.
	addedRules = map[string]int{"": 1, ".spec": 4}
)

func loadCRDs(t *testing.T) (druid, ours *apiextensionsv1.CustomResourceDefinition) {
	t.Helper()
	all, err := druidcrds.GetAll("1.35")
	if err != nil {
		t.Fatal(err)
	}
	druid = &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.UnmarshalStrict([]byte(all[druidcrds.ResourceNameEtcd]), druid); err != nil {
		t.Fatalf("decoding druid's CRD: %v", err)
	}
	ours, err = extendedcrd.CRD()
	if err != nil {
		t.Fatal(err)
	}
	return druid, ours
}

// TestCRDIsASupersetOfDruids walks druid's shipped Etcd CRD and checks that
// every property, type, validation and CEL rule is in ours unchanged, that
// subresources and printer columns are kept, and that ours adds only the
// extension.
func TestCRDIsASupersetOfDruids(t *testing.T) {
	g := NewWithT(t)
	druid, ours := loadCRDs(t)

	g.Expect(ours.Name).To(Equal(druid.Name))
	g.Expect(ours.Spec.Group).To(Equal(druid.Spec.Group))
	g.Expect(ours.Spec.Names).To(Equal(druid.Spec.Names))
	g.Expect(ours.Spec.Scope).To(Equal(druid.Spec.Scope))
	g.Expect(ours.Spec.Versions).To(HaveLen(len(druid.Spec.Versions)))

	for i, dv := range druid.Spec.Versions {
		ov := ours.Spec.Versions[i]
		g.Expect(ov.Name).To(Equal(dv.Name))
		g.Expect(ov.Served).To(Equal(dv.Served))
		g.Expect(ov.Storage).To(Equal(dv.Storage))
		g.Expect(ov.Subresources).To(Equal(dv.Subresources), "status and scale subresources")
		g.Expect(len(ov.AdditionalPrinterColumns)).To(BeNumerically(">=", len(dv.AdditionalPrinterColumns)))
		g.Expect(ov.AdditionalPrinterColumns[:len(dv.AdditionalPrinterColumns)]).To(Equal(dv.AdditionalPrinterColumns),
			"druid's printer columns, first and in order")
		for _, c := range ov.AdditionalPrinterColumns[len(dv.AdditionalPrinterColumns):] {
			g.Expect(c.Priority).To(BeNumerically(">", 0), "added column %q stays out of the default view", c.Name)
		}

		w := &schemaWalk{}
		w.compare("", dv.Schema.OpenAPIV3Schema, ov.Schema.OpenAPIV3Schema)
		g.Expect(w.problems).To(BeEmpty())
		sort.Strings(w.extra)
		g.Expect(w.extra).To(Equal(extensionProperties), "properties ours adds")
		g.Expect(w.addedRules).To(Equal(addedRules), "CEL rules ours adds")
		g.Expect(w.replaced).To(BeTrue(), "druid's ordinal index rule is replaced by its generalization")
		g.Expect(w.visited).To(Equal(countNodes(dv.Schema.OpenAPIV3Schema)), "the walk reached druid's whole schema")
	}
}

// TestSchemaWalkFindsChanges shows the walk fails on the changes it exists to
// catch: a changed validation deep in druid's schema, a dropped CEL rule, a
// dropped property.
func TestSchemaWalkFindsChanges(t *testing.T) {
	druid, ours := loadCRDs(t)
	ds := druid.Spec.Versions[0].Schema.OpenAPIV3Schema
	tests := map[string]func(s *apiextensionsv1.JSONSchemaProps){
		"pattern changed": func(s *apiextensionsv1.JSONSchemaProps) {
			spec := s.Properties["spec"]
			p := spec.Properties["memberNamePrefix"]
			p.Pattern = "^.*$"
			spec.Properties["memberNamePrefix"] = p
			s.Properties["spec"] = spec
		},
		"CEL rule dropped": func(s *apiextensionsv1.JSONSchemaProps) {
			spec := s.Properties["spec"]
			spec.XValidations = slices.DeleteFunc(slices.Clone(spec.XValidations), func(r apiextensionsv1.ValidationRule) bool {
				return strings.Contains(r.Rule, "storageClass")
			})
			s.Properties["spec"] = spec
		},
		"property dropped": func(s *apiextensionsv1.JSONSchemaProps) {
			status := s.Properties["status"]
			delete(status.Properties, "lastErrors")
			s.Properties["status"] = status
		},
	}
	for name, mutate := range tests {
		t.Run(name, func(t *testing.T) {
			changed := ours.Spec.Versions[0].Schema.OpenAPIV3Schema.DeepCopy()
			mutate(changed)
			w := &schemaWalk{}
			w.compare("", ds, changed)
			if len(w.problems) == 0 {
				t.Fatal("the walk found nothing")
			}
			t.Log(w.problems)
		})
	}
}

func countNodes(s *apiextensionsv1.JSONSchemaProps) int {
	n := 1
	for _, p := range s.Properties {
		n += countNodes(&p)
	}
	if s.Items != nil && s.Items.Schema != nil {
		n += countNodes(s.Items.Schema)
	}
	if s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil {
		n += countNodes(s.AdditionalProperties.Schema)
	}
	return n
}

type schemaWalk struct {
	problems   []string
	extra      []string
	addedRules map[string]int
	replaced   bool
	visited    int
}

func (w *schemaWalk) fail(path, format string, args ...any) {
	w.problems = append(w.problems, fmt.Sprintf("%s: %s", displayPath(path), fmt.Sprintf(format, args...)))
}

func displayPath(p string) string {
	if p == "" {
		return "<root>"
	}
	return p
}

// compare checks that ours accepts exactly what druid accepts at path, and
// recurses.
func (w *schemaWalk) compare(path string, druid, ours *apiextensionsv1.JSONSchemaProps) {
	w.visited++
	if ours == nil {
		w.fail(path, "missing in ours")
		return
	}
	// Everything that decides validity, besides properties, items and
	// CEL rules, which are compared below.
	type constraints struct {
		Type, Format, Pattern                            string
		Minimum, Maximum                                 string
		ExclusiveMinimum, ExclusiveMaximum               bool
		MinLength, MaxLength, MinItems, MaxItems         string
		MinProperties, MaxProperties                     string
		UniqueItems, Nullable, IntOrString, Preserve     bool
		EmbeddedResource                                 bool
		Enum, Default                                    string
		Required, ListMapKeys                            []string
		ListType, MapType                                string
		HasAdditionalProperties, AdditionalPropertiesAll bool
	}
	of := func(s *apiextensionsv1.JSONSchemaProps) constraints {
		req := slices.Clone(s.Required)
		sort.Strings(req)
		c := constraints{
			Type: s.Type, Format: s.Format, Pattern: s.Pattern,
			Minimum: deref(s.Minimum), Maximum: deref(s.Maximum), ExclusiveMinimum: s.ExclusiveMinimum, ExclusiveMaximum: s.ExclusiveMaximum,
			MinLength: deref(s.MinLength), MaxLength: deref(s.MaxLength), MinItems: deref(s.MinItems), MaxItems: deref(s.MaxItems),
			MinProperties: deref(s.MinProperties), MaxProperties: deref(s.MaxProperties),
			UniqueItems: s.UniqueItems, Nullable: s.Nullable, IntOrString: s.XIntOrString,
			Preserve: s.XPreserveUnknownFields != nil && *s.XPreserveUnknownFields, EmbeddedResource: s.XEmbeddedResource,
			Enum:     fmt.Sprint(jsonValues(s.Enum)),
			Required: req, ListMapKeys: s.XListMapKeys,
			HasAdditionalProperties: s.AdditionalProperties != nil,
		}
		if s.Default != nil {
			c.Default = string(s.Default.Raw)
		}
		if s.XListType != nil {
			c.ListType = *s.XListType
		}
		if s.XMapType != nil {
			c.MapType = *s.XMapType
		}
		if s.AdditionalProperties != nil {
			c.AdditionalPropertiesAll = s.AdditionalProperties.Allows
		}
		return c
	}
	if d, o := of(druid), of(ours); !reflect.DeepEqual(d, o) {
		w.fail(path, "constraints differ:\n druid %+v\n ours  %+v", d, o)
	}
	w.compareRules(path, druid.XValidations, ours.XValidations)

	for name, dp := range druid.Properties {
		op, ok := ours.Properties[name]
		if !ok {
			w.fail(path+"."+name, "missing in ours")
			continue
		}
		w.compare(path+"."+name, &dp, &op)
	}
	for name := range ours.Properties {
		if _, ok := druid.Properties[name]; !ok {
			w.extra = append(w.extra, path+"."+name)
		}
	}
	if druid.Items != nil {
		if ours.Items == nil {
			w.fail(path+"[]", "missing in ours")
		} else {
			w.compare(path+"[]", druid.Items.Schema, ours.Items.Schema)
		}
	}
	if druid.AdditionalProperties != nil && druid.AdditionalProperties.Schema != nil {
		if ours.AdditionalProperties == nil || ours.AdditionalProperties.Schema == nil {
			w.fail(path+"{}", "missing in ours")
		} else {
			w.compare(path+"{}", druid.AdditionalProperties.Schema, ours.AdditionalProperties.Schema)
		}
	}
}

// compareRules checks that each of druid's CEL rules is in ours with the same
// rule and message (the replaced one excepted), and counts the rules ours adds.
func (w *schemaWalk) compareRules(path string, druid, ours apiextensionsv1.ValidationRules) {
	key := func(r apiextensionsv1.ValidationRule) string {
		return r.Rule + "\x00" + r.Message + "\x00" + r.MessageExpression + "\x00" + fmt.Sprint(r.Reason) + "\x00" + r.FieldPath + "\x00" + fmt.Sprint(r.OptionalOldSelf)
	}
	remaining := map[string]int{}
	for _, r := range ours {
		remaining[key(r)]++
	}
	for _, r := range druid {
		if r.Rule == replacedDruidRule && path == "" {
			found := false
			for _, o := range ours {
				if o.Rule == replacementRule {
					found = true
					remaining[key(o)]--
				}
			}
			w.replaced = found
			if !found {
				w.fail(path, "druid's index rule is neither kept nor replaced")
			}
			continue
		}
		if remaining[key(r)] == 0 {
			w.fail(path, "druid's CEL rule missing or changed: %q (%s)", r.Rule, r.Message)
			continue
		}
		remaining[key(r)]--
	}
	added := 0
	for _, n := range remaining {
		added += n
	}
	if added > 0 {
		if w.addedRules == nil {
			w.addedRules = map[string]int{}
		}
		w.addedRules[path] += added
	}
}

func jsonValues(vs []apiextensionsv1.JSON) []string {
	out := make([]string, 0, len(vs))
	for _, v := range vs {
		out = append(out, strings.TrimSpace(string(v.Raw)))
	}
	return out
}

// deref renders an optional bound, "-" when unset.
func deref[T any](p *T) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprint(*p)
}
