package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is druid-stretch's own group and version.
var GroupVersion = schema.GroupVersion{Group: "druid-stretch.druid.gardener.cloud", Version: "v1alpha1"}

var (
	// SchemeBuilder registers the group's kinds.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds the group's kinds to a scheme. It goes beside the
	// scheme of druid's group (druid's own or druid-stretch's extended one).
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(GroupVersion, &EtcdMembership{}, &EtcdMembershipList{})
	metav1.AddToGroupVersion(scheme, GroupVersion)
	return nil
}
