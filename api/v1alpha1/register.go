package v1alpha1

import (
	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is druid's group and version: the extended Etcd is served in
// place of druid's, so a druid client and a druid-stretch client talk to the
// same resource.
var GroupVersion = schema.GroupVersion{Group: druidv1alpha1.GroupName, Version: "v1alpha1"}

var (
	// SchemeBuilder registers the extended Etcd, and druid's other kinds of
	// the group unchanged, so that this package's scheme is a drop-in
	// replacement for druid's.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds the group's kinds to a scheme. Do not also add druid's
	// AddToScheme to the same scheme: both register the kind Etcd.
	AddToScheme = SchemeBuilder.AddToScheme
)

// Resource is the group-qualified resource for an unqualified resource name,
// as used in API errors.
func Resource(resource string) schema.GroupResource {
	return GroupVersion.WithResource(resource).GroupResource()
}

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(GroupVersion,
		&Etcd{},
		&EtcdList{},
		&druidv1alpha1.EtcdCopyBackupsTask{},
		&druidv1alpha1.EtcdCopyBackupsTaskList{},
		&druidv1alpha1.EtcdOpsTask{},
		&druidv1alpha1.EtcdOpsTaskList{},
	)
	metav1.AddToGroupVersion(scheme, GroupVersion)
	return nil
}
