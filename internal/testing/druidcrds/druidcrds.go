// Package druidcrds is etcd-druid's own CRDs, as its API module ships them
// and as gardenlet's CRD deployer writes them into every seed: the schema
// druid-stretch runs under and must never replace.
package druidcrds

import (
	"fmt"
	"slices"
	"strings"

	druidcrds "github.com/gardener/etcd-druid/api/core/v1alpha1/crds"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

// KubernetesVersion selects the CRD variant druid's API module renders
// (it differs below Kubernetes 1.29, which lacks CEL in CRDs): the
// version of the Kubernetes control plane the tests run.
const KubernetesVersion = "1.35"

// EtcdCRDName is the name of druid's Etcd CRD.
const EtcdCRDName = "etcds.druid.gardener.cloud"

// Manifests are druid's CRDs by name, YAML, exactly as its API module
// renders them.
func Manifests() (map[string][]byte, error) {
	all, err := druidcrds.GetAll(KubernetesVersion)
	if err != nil {
		return nil, fmt.Errorf("etcd-druid's CRDs: %w", err)
	}
	out := map[string][]byte{}
	for _, m := range all {
		crd, err := decode([]byte(m))
		if err != nil {
			return nil, err
		}
		out[crd.Name] = []byte(m)
	}
	return out, nil
}

// All are druid's CRDs, sorted by name.
func All() ([]*apiextensionsv1.CustomResourceDefinition, error) {
	ms, err := Manifests()
	if err != nil {
		return nil, err
	}
	var out []*apiextensionsv1.CustomResourceDefinition
	for _, m := range ms {
		crd, err := decode(m)
		if err != nil {
			return nil, err
		}
		out = append(out, crd)
	}
	slices.SortFunc(out, func(a, b *apiextensionsv1.CustomResourceDefinition) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

func decode(m []byte) (*apiextensionsv1.CustomResourceDefinition, error) {
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.Unmarshal(m, crd); err != nil {
		return nil, fmt.Errorf("decoding an etcd-druid CRD: %w", err)
	}
	if crd.Name == "" {
		return nil, fmt.Errorf("an etcd-druid CRD without a name")
	}
	return crd, nil
}
