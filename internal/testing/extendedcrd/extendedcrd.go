// Package extendedcrd holds the extended Etcd CRD: druid's own Etcd schema
// plus druid-stretch's fields inline (ordinalStart, externalMembers, ...,
// status.membership), generated from api/v1alpha1 by `make generate`.
//
// Earlier releases of druid-stretch installed it in place of druid's Etcd
// CRD. No release ships it any more: a Gardener seed keeps druid's own
// CRD, which gardenlet writes back every minute. It lives on for the tests
// of the upgrade from it (an Etcd stored with the inline fields has them
// copied into its EtcdMembership, with no membership change) and of the
// rules those inline fields obey.
package extendedcrd

import (
	_ "embed"
	"fmt"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

// Name is the extended CRD's name, the same as druid's Etcd CRD's.
const Name = "etcds.druid.gardener.cloud"

//go:embed druid.gardener.cloud_etcds.yaml
var manifest []byte

// Manifest is the CRD as generated, YAML.
func Manifest() []byte { return manifest }

// CRD is the extended Etcd CRD.
func CRD() (*apiextensionsv1.CustomResourceDefinition, error) {
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.UnmarshalStrict(manifest, crd); err != nil {
		return nil, fmt.Errorf("decoding the extended Etcd CRD: %w", err)
	}
	return crd, nil
}
