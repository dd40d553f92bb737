package controlplane

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Workload describes a pod that mounts a podCertificate projected volume,
// bound to a node, as kubelet would see it. With no kubelet running, a Pod
// object with spec.nodeName is all NodeRestriction needs to admit a
// PodCertificateRequest from system:node:<Node> for it.
type Workload struct {
	Namespace      string
	Node           string
	ServiceAccount string
	Pod            string
	// SignerNames get one podCertificate projection each.
	SignerNames []string
	// KeyType is the podCertificate volumes' keyType (default ECDSAP256).
	KeyType string
}

// WorkloadObjects are the objects CreateWorkload made or found.
type WorkloadObjects struct {
	Node           *corev1.Node
	ServiceAccount *corev1.ServiceAccount
	Pod            *corev1.Pod
}

// CreateWorkload creates (or reuses) the namespace, node and service account
// of w and creates the pod. Without kube-controller-manager nothing creates
// service accounts, so this does; NodeRestriction checks their UIDs.
func CreateWorkload(ctx context.Context, admin kubernetes.Interface, w Workload) (*WorkloadObjects, error) {
	if w.Namespace == "" || w.Node == "" || w.Pod == "" || len(w.SignerNames) == 0 {
		return nil, fmt.Errorf("workload needs namespace, node, pod and signer name: %+v", w)
	}
	if w.ServiceAccount == "" {
		w.ServiceAccount = "default"
	}
	if w.KeyType == "" {
		w.KeyType = "ECDSAP256"
	}
	if err := EnsureNamespace(ctx, admin, w.Namespace); err != nil {
		return nil, err
	}
	node, err := EnsureNode(ctx, admin, w.Node)
	if err != nil {
		return nil, err
	}
	sa, err := admin.CoreV1().ServiceAccounts(w.Namespace).Get(ctx, w.ServiceAccount, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		sa, err = admin.CoreV1().ServiceAccounts(w.Namespace).Create(ctx, &corev1.ServiceAccount{
			ObjectMeta: metav1.ObjectMeta{Name: w.ServiceAccount},
		}, metav1.CreateOptions{})
	}
	if err != nil {
		return nil, fmt.Errorf("ensuring service account %s/%s: %w", w.Namespace, w.ServiceAccount, err)
	}
	var sources []corev1.VolumeProjection
	for i, name := range w.SignerNames {
		sources = append(sources, corev1.VolumeProjection{PodCertificate: &corev1.PodCertificateProjection{
			SignerName:           name,
			KeyType:              w.KeyType,
			CredentialBundlePath: fmt.Sprintf("credentialbundle-%d.pem", i),
		}})
	}
	automount := false
	pod, err := admin.CoreV1().Pods(w.Namespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: w.Pod},
		Spec: corev1.PodSpec{
			NodeName:                     w.Node,
			ServiceAccountName:           w.ServiceAccount,
			AutomountServiceAccountToken: &automount,
			Containers: []corev1.Container{{
				Name:  "app",
				Image: "registry.k8s.io/pause:3.10",
				VolumeMounts: []corev1.VolumeMount{{
					Name: "pod-certificate", MountPath: "/var/run/keyward", ReadOnly: true,
				}},
			}},
			Volumes: []corev1.Volume{{
				Name: "pod-certificate",
				VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
					Sources: sources,
				}},
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("creating pod %s/%s: %w", w.Namespace, w.Pod, err)
	}
	return &WorkloadObjects{Node: node, ServiceAccount: sa, Pod: pod}, nil
}

// EnsureNamespace creates namespace name unless it exists.
func EnsureNamespace(ctx context.Context, admin kubernetes.Interface, name string) error {
	_, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{Name: name},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", name, err)
	}
	return nil
}

// EnsureNode creates Node name unless it exists and returns it.
func EnsureNode(ctx context.Context, admin kubernetes.Interface, name string) (*corev1.Node, error) {
	node, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
	}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		node, err = admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	}
	if err != nil {
		return nil, fmt.Errorf("ensuring node %s: %w", name, err)
	}
	return node, nil
}
