package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupName is the API group of keyward's custom resources.
const GroupName = "keyward.dev"

// SchemeGroupVersion is the group and version of the types in this package.
var SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: "v1alpha1"}

// Resource is the plural resource name of Authority, as served.
var Resource = SchemeGroupVersion.WithResource("authorities")

// AddToScheme registers Authority and AuthorityList with a scheme.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(SchemeGroupVersion, &Authority{}, &AuthorityList{})
	metav1.AddToGroupVersion(s, SchemeGroupVersion)
	return nil
}
