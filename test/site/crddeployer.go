package site

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/druid-stretch/druid-stretch/internal/testing/druidcrds"
)

// CRDDeployer writes druid's own CRDs into a site over and over, as
// gardenlet's CRD deployer does on every seed reconcile (about once a
// minute): etcd-druid's API module ships them (crds.GetAll), and each
// write is a JSON merge patch of the whole spec, which replaces
// spec.versions whole. An extended Etcd CRD installed before is gone after
// the first write, and the API server prunes every field outside druid's
// schema at the next write of each Etcd.
type CRDDeployer struct {
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
	res    CRDDeployerResult
}

// CRDDeployerResult is how many times the loop wrote druid's CRDs, and
// its first error.
type CRDDeployerResult struct {
	Writes int
	Err    error
}

// DeployDruidCRDs writes druid's CRDs into s once before it returns, then
// every interval until Stop or the site stops.
func (s *Site) DeployDruidCRDs(ctx context.Context, every time.Duration) (*CRDDeployer, error) {
	all, err := druidcrds.All()
	if err != nil {
		return nil, err
	}
	patches := map[string][]byte{}
	for _, crd := range all {
		spec, err := json.Marshal(map[string]any{"spec": crd.Spec})
		if err != nil {
			return nil, err
		}
		patches[crd.Name] = spec
	}
	apply := func(ctx context.Context) error {
		for name, spec := range patches {
			target := &unstructured.Unstructured{}
			target.SetGroupVersionKind(apiextensionsv1.SchemeGroupVersion.WithKind("CustomResourceDefinition"))
			target.SetName(name)
			if err := s.Client.Patch(ctx, target, client.RawPatch(types.MergePatchType, spec)); err != nil {
				return fmt.Errorf("writing druid's CRD %s: %w", name, err)
			}
		}
		return nil
	}
	if err := apply(ctx); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	d := &CRDDeployer{cancel: cancel, done: make(chan struct{}), res: CRDDeployerResult{Writes: 1}}
	go func() {
		defer close(d.done)
		// The first run comes at once, a second write right after the
		// one above: gardenlet's writes come as often as its reconciles.
		wait.UntilWithContext(ctx, func(ctx context.Context) {
			if err := apply(ctx); err != nil {
				if ctx.Err() == nil {
					d.res.Err = cmp.Or(d.res.Err, err)
				}
				return
			}
			d.res.Writes++
		}, every)
	}()
	s.onStop(func() error { d.Stop(); return nil })
	return d, nil
}

// Stop ends the loop and returns what it did. Safe to call twice.
func (d *CRDDeployer) Stop() CRDDeployerResult {
	d.once.Do(func() {
		d.cancel()
		<-d.done
	})
	return d.res
}
