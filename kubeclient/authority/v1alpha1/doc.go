// Package v1alpha1 holds the keyward.dev/v1alpha1 API: the cluster-scoped
// Authority resource that stores a signer's CA generations and reports where
// each one stands in a canary-then-live rotation. The signer and the trust
// publisher meet only through this resource and never import each other.
//
// The CRD in deploy/crds and zz_generated.deepcopy.go are generated from
// these types by `make generate`; edit the types, never the outputs.
//
// +kubebuilder:object:generate=true
// +groupName=keyward.dev
package v1alpha1
