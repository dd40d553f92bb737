// Package helm holds the tests of keyward's Helm chart (deploy/helm/keyward):
// its samples render, their configurations load with keyward's own loaders,
// the real kube-apiserver accepts every object, the schema rejects bad
// values by name, and the chart's RBAC is the generator's.
package helm
