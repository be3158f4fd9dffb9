package chart

import (
	"context"
	"fmt"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Create creates objs in order, as Helm does after sorting them, with strict
// field validation: an unknown or misspelled field is refused, not dropped.
// It stops at the first refusal and names the object. The objects are left
// unchanged; the stored versions are not returned.
func Create(ctx context.Context, c client.Client, objs []*unstructured.Unstructured) error {
	for _, o := range objs {
		obj := o.DeepCopy()
		if err := c.Create(ctx, obj, client.FieldValidation("Strict")); err != nil {
			return fmt.Errorf("creating %s %s: %w", o.GetKind(), objectName(o), err)
		}
	}
	return nil
}

// Delete deletes objs in reverse order, ignoring those already gone, and
// waits until they are (no namespace controller runs under envtest, so
// namespaces themselves are not deleted by tests).
func Delete(ctx context.Context, c client.Client, objs []*unstructured.Unstructured) error {
	rev := slices.Clone(objs)
	slices.Reverse(rev)
	for _, o := range rev {
		if err := c.Delete(ctx, o.DeepCopy()); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting %s %s: %w", o.GetKind(), objectName(o), err)
		}
	}
	for _, o := range rev {
		probe := &unstructured.Unstructured{}
		probe.SetGroupVersionKind(o.GroupVersionKind())
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			err := c.Get(ctx, client.ObjectKeyFromObject(o), probe)
			if apierrors.IsNotFound(err) {
				return true, nil
			}
			return false, err
		})
		if err != nil {
			return fmt.Errorf("waiting for %s %s to go: %w", o.GetKind(), objectName(o), err)
		}
	}
	return nil
}

// InstallCRDs creates the CRDs, or updates them to the given content when
// they exist (as `kubectl apply` of crds/ on upgrade does), and waits until
// the API server serves each one.
func InstallCRDs(ctx context.Context, c client.Client, crds []*unstructured.Unstructured) error {
	for _, o := range crds {
		want := o.DeepCopy()
		cur := &unstructured.Unstructured{}
		cur.SetGroupVersionKind(want.GroupVersionKind())
		err := c.Get(ctx, client.ObjectKeyFromObject(want), cur)
		switch {
		case apierrors.IsNotFound(err):
			err = c.Create(ctx, want, client.FieldValidation("Strict"))
		case err == nil:
			want.SetResourceVersion(cur.GetResourceVersion())
			err = c.Update(ctx, want, client.FieldValidation("Strict"))
		}
		if err != nil {
			return fmt.Errorf("installing CRD %s: %w", want.GetName(), err)
		}
	}
	for _, o := range crds {
		if err := waitEstablished(ctx, c, o.GetName()); err != nil {
			return err
		}
	}
	return nil
}

func waitEstablished(ctx context.Context, c client.Client, name string) error {
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		crd := &unstructured.Unstructured{}
		crd.SetGroupVersionKind(crdGVK)
		if err := c.Get(ctx, client.ObjectKey{Name: name}, crd); err != nil {
			return false, err
		}
		// Where the API server tracks it, an established condition counts
		// only once it speaks of the current generation.
		if og, ok, _ := unstructured.NestedInt64(crd.Object, "status", "observedGeneration"); ok && og < crd.GetGeneration() {
			return false, nil
		}
		conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
		for _, cond := range conds {
			if m, ok := cond.(map[string]any); ok && m["type"] == "Established" && m["status"] == "True" {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for CRD %s to be established: %w", name, err)
	}
	return nil
}

var crdGVK = schema.GroupVersionKind{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"}

func objectName(o *unstructured.Unstructured) string {
	if o.GetNamespace() == "" {
		return o.GetName()
	}
	return o.GetNamespace() + "/" + o.GetName()
}
