package crdschema

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel/model"
	structuraldefaulting "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	structurallisttype "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/listtype"
	structuralpruning "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	apiextensionsvalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	celcommon "k8s.io/apiserver/pkg/cel/common"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/internal/testing/extendedcrd"
)

// crdValidator runs the generated CRD's OpenAPI schema, list-type and CEL
// rules in process, with the code and in the order the apiserver's
// customresource strategy uses, so the fuzz test needs no server.
type crdValidator struct {
	structural *structuralschema.Structural
	openAPI    apiextensionsvalidation.SchemaValidator
	cel        *cel.Validator
	// raw is the CRD file, for tests that check its rules' text.
	raw *apiextensionsv1.CustomResourceDefinition
}

func loadCRDValidator(t testing.TB) *crdValidator {
	t.Helper()
	crd, err := extendedcrd.CRD()
	if err != nil {
		t.Fatal(err)
	}
	if len(crd.Spec.Versions) != 1 || crd.Spec.Versions[0].Schema == nil {
		t.Fatalf("the extended Etcd CRD: want one version with a schema")
	}
	internal := &apiextensions.JSONSchemaProps{}
	if err := apiextensionsv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(crd.Spec.Versions[0].Schema.OpenAPIV3Schema, internal, nil); err != nil {
		t.Fatalf("converting the schema: %v", err)
	}
	s, err := structuralschema.NewStructural(internal)
	if err != nil {
		t.Fatalf("structural schema: %v", err)
	}
	openAPI, _, err := apiextensionsvalidation.NewSchemaValidator(internal)
	if err != nil {
		t.Fatalf("schema validator: %v", err)
	}
	return &crdValidator{
		structural: s,
		openAPI:    openAPI,
		cel:        cel.NewValidator(s, true, celconfig.PerCallLimit),
		raw:        crd,
	}
}

// toStored turns an Etcd into the map the apiserver validates: JSON, with
// non-nullable nulls and unknown fields pruned and defaults applied.
func (v *crdValidator) toStored(e *v1alpha1.Etcd) (map[string]any, error) {
	data, err := json.Marshal(e)
	if err != nil {
		return nil, fmt.Errorf("encoding the Etcd: %w", err)
	}
	obj := map[string]any{}
	if err := utiljson.Unmarshal(data, &obj); err != nil {
		return nil, fmt.Errorf("decoding the Etcd: %w", err)
	}
	obj["apiVersion"] = v1alpha1.GroupVersion.String()
	obj["kind"] = "Etcd"
	structuraldefaulting.PruneNonNullableNullsWithoutDefaults(obj, v.structural)
	structuralpruning.Prune(obj, v.structural, true)
	structuraldefaulting.Default(obj, v.structural)
	return obj, nil
}

// validate is the CRD's verdict on creating e (old nil) or updating old to e.
func (v *crdValidator) validate(e, old *v1alpha1.Etcd) (field.ErrorList, error) {
	obj, err := v.toStored(e)
	if err != nil {
		return nil, err
	}
	ctx := context.Background()
	var errs field.ErrorList
	if old == nil {
		errs = append(errs, apiextensionsvalidation.ValidateCustomResource(nil, obj, v.openAPI)...)
		errs = append(errs, structurallisttype.ValidateListSetsAndMaps(nil, v.structural, obj)...)
		if !hasBlockingErr(errs) {
			celErrs, _ := v.cel.Validate(ctx, nil, v.structural, obj, nil, celconfig.RuntimeCELCostBudget)
			errs = append(errs, celErrs...)
		}
		return errs, nil
	}

	oldObj, err := v.toStored(old)
	if err != nil {
		return nil, err
	}
	// Ratcheting is on in the apiserver: errors on values unchanged from the
	// old object are dropped.
	corr := celcommon.NewCorrelatedObject(obj, oldObj, &model.Structural{Structural: v.structural})
	errs = append(errs, apiextensionsvalidation.ValidateCustomResourceUpdate(nil, obj, oldObj, v.openAPI, apiextensionsvalidation.WithRatcheting(corr))...)
	if len(structurallisttype.ValidateListSetsAndMaps(nil, v.structural, oldObj)) == 0 {
		errs = append(errs, structurallisttype.ValidateListSetsAndMaps(nil, v.structural, obj)...)
	}
	if !hasBlockingErr(errs) {
		celErrs, _ := v.cel.Validate(ctx, nil, v.structural, obj, oldObj, celconfig.RuntimeCELCostBudget, cel.WithRatcheting(corr))
		errs = append(errs, celErrs...)
	}
	return errs, nil
}

// hasBlockingErr is the apiserver's rule: after one of these errors the CEL
// rules are not evaluated at all.
func hasBlockingErr(errs field.ErrorList) bool {
	for _, err := range errs {
		switch err.Type {
		case field.ErrorTypeNotSupported, field.ErrorTypeRequired, field.ErrorTypeTooLong, field.ErrorTypeTooMany, field.ErrorTypeTypeInvalid:
			return true
		}
	}
	return false
}

// extensionPaths are the fields Go validation is responsible for.
var extensionPaths = []string{"spec.ordinalStart", "spec.externalMembers", "spec.externalMembersPolicy", "spec.retainedExternalMembers", "spec.learnerReplicas"}

func isExtensionPath(p string) bool {
	for _, e := range extensionPaths {
		if isPathWithin(p, e) {
			return true
		}
	}
	return false
}

// isPathWithin says whether path is prefix or a field or element below it.
func isPathWithin(path, prefix string) bool {
	if !strings.HasPrefix(path, prefix) {
		return false
	}
	rest := path[len(prefix):]
	return rest == "" || rest[0] == '.' || rest[0] == '['
}

func onlyExtension(errs field.ErrorList) field.ErrorList {
	var out field.ErrorList
	for _, e := range errs {
		if isExtensionPath(e.Field) {
			out = append(out, e)
		}
	}
	return out
}
