package validation_test

import (
	"fmt"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/validation"
)

// ExampleValidateEtcd validates an Etcd as the webhook does before storing
// it; each error names the field. The table tests that compare every rule
// with the CRD's are in the root module (test/crdschema), which has the
// apiserver's validator.
func ExampleValidateEtcd() {
	e := &v1alpha1.Etcd{Spec: v1alpha1.EtcdSpec{EtcdSpec: druidv1alpha1.EtcdSpec{Replicas: 3}}}
	e.Name, e.Namespace = "etcd-main", "shoot--p--s"
	e.Spec.ExternalMembers = []v1alpha1.ExternalMember{{Name: "seed-a-etcd-main-0", PeerURLs: []string{"http://etcd-main-0.seed-a.example:2380"}}}
	fmt.Println(len(validation.ValidateEtcd(e)), "errors")

	e.Spec.ExternalMembers = append(e.Spec.ExternalMembers, e.Spec.ExternalMembers[0])
	for _, err := range validation.ValidateEtcd(e) {
		fmt.Println(err.Field)
	}
	// Output:
	// 0 errors
	// spec.externalMembers[1].name
}
