// Package testsupport is the room for what keyward's tests import and
// production code never does: the control plane (kube-apiserver + etcd),
// the real node (kubelet + containerd + runc, in private namespaces) and
// its images, SoftHSM2 tokens, the in-process Cloud KMS and AWS KMS fakes and their
// fault injection, test CAs and keys, the test registry, the lint gate,
// Prometheus CRDs and throwaway serving certificates, one package each.
//
// The one deliberate exception is the demo (`keyward demo`), which runs the
// same control plane and SoftHSM2 tokens for a person to look at; nothing
// else outside _test.go files imports a package under testsupport/.
package testsupport
