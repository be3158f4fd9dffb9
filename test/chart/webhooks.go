package chart

import (
	"encoding/base64"
	"fmt"
	"net/url"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// PointWebhooksAt rewrites every webhook of the rendered
// MutatingWebhookConfigurations and ValidatingWebhookConfigurations in objs
// to call baseURL plus the path the chart configured, trusting caBundle
// (PEM). Rules, selectors, match conditions, failure policies and timeouts
// stay as rendered: the API server then decides which requests reach a
// webhook server running in the test exactly as it would for the chart's
// Service. It edits objs in place and returns how many webhooks it changed.
//
// It exists because the chart's Service cannot route to a test process: the
// API server dials Service IPs, which nothing serves under envtest.
func PointWebhooksAt(objs []*unstructured.Unstructured, baseURL string, caBundle []byte) (int, error) {
	base, err := url.Parse(baseURL)
	if err != nil || base.Scheme != "https" || base.Host == "" {
		return 0, fmt.Errorf("webhook base URL %q: must be https://host:port", baseURL)
	}
	changed := 0
	for _, o := range objs {
		if o.GetKind() != "MutatingWebhookConfiguration" && o.GetKind() != "ValidatingWebhookConfiguration" {
			continue
		}
		hooks, _, err := unstructured.NestedSlice(o.Object, "webhooks")
		if err != nil {
			return changed, fmt.Errorf("%s %s: reading webhooks: %w", o.GetKind(), o.GetName(), err)
		}
		for i, h := range hooks {
			hm, ok := h.(map[string]any)
			if !ok {
				return changed, fmt.Errorf("%s %s: webhooks[%d] is not an object", o.GetKind(), o.GetName(), i)
			}
			path, _, _ := unstructured.NestedString(hm, "clientConfig", "service", "path")
			if path == "" {
				return changed, fmt.Errorf("%s %s: webhook %v has no clientConfig.service.path", o.GetKind(), o.GetName(), hm["name"])
			}
			u := *base
			u.Path = path
			hm["clientConfig"] = map[string]any{
				"url":      u.String(),
				"caBundle": base64.StdEncoding.EncodeToString(caBundle),
			}
			hooks[i] = hm
			changed++
		}
		if err := unstructured.SetNestedSlice(o.Object, hooks, "webhooks"); err != nil {
			return changed, fmt.Errorf("%s %s: writing webhooks: %w", o.GetKind(), o.GetName(), err)
		}
		// cert-manager's cainjector would overwrite the caBundle.
		ann := o.GetAnnotations()
		delete(ann, "cert-manager.io/inject-ca-from")
		o.SetAnnotations(ann)
	}
	return changed, nil
}
