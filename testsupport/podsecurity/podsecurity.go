// Package podsecurity judges rendered manifests by a real kube-apiserver's
// PodSecurity and ResourceQuota admission, as a strict managed cluster
// configures them: every workload's pod must be admitted in its namespace
// as the manifests label it, and no workload may draw a warning.
//
// Pod Security admission enforces on Pods only; on a Deployment or
// DaemonSet it only warns and audits. So Admit creates (dry run) each
// workload and asserts that the apiserver answers without a warning, then
// creates (dry run) a Pod made from the workload's pod template, which is
// what the enforce level refuses.
package podsecurity

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// CriticalClasses are the priority classes a GKE-like cluster admits only
// in a namespace with a ResourceQuota for them (ResourceQuota admission's
// limitedResources; GKE's kube-system has gcp-critical-pods).
var CriticalClasses = []string{"system-node-critical", "system-cluster-critical"}

// admissionConfig makes the cluster strict: Pod Security "restricted"
// where a namespace has no label (enforce, warn and audit), and critical
// priority classes only under a matching ResourceQuota.
const admissionConfig = `apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: PodSecurity
  configuration:
    apiVersion: pod-security.admission.config.k8s.io/v1
    kind: PodSecurityConfiguration
    defaults:
      enforce: restricted
      enforce-version: latest
      warn: restricted
      warn-version: latest
      audit: restricted
      audit-version: latest
    exemptions: {usernames: [], runtimeClasses: [], namespaces: []}
- name: ResourceQuota
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: ResourceQuotaConfiguration
    limitedResources:
    - resource: pods
      matchScopes:
      - scopeName: PriorityClass
        operator: In
        values: [%s]
`

// APIServerFlags writes the admission configuration into dir and returns
// the kube-apiserver flags that load it (controlplane.Options
// ExtraAPIServerFlags).
func APIServerFlags(dir string) ([]string, error) {
	path := filepath.Join(dir, "admission.yaml")
	if err := os.WriteFile(path, []byte(fmt.Sprintf(admissionConfig, strings.Join(CriticalClasses, ", "))), 0o600); err != nil {
		return nil, err
	}
	return []string{"--admission-control-config-file=" + path}, nil
}

// warnings collects the apiserver's warnings per request.
type warnings struct {
	mu  sync.Mutex
	got []string
}

func (w *warnings) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.got = append(w.got, text)
}

func (w *warnings) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.got
	w.got = nil
	return out
}

// Workload is one Deployment's, DaemonSet's or Job's pod template.
type Workload struct {
	Kind, Namespace, Name string
	// Template is the pod template; a copy may be changed (negative
	// controls) before AdmitPod.
	Template corev1.PodTemplateSpec
	obj      runtime.Object
}

// Workloads gives the Deployments, DaemonSets and Jobs of objs.
func Workloads(objs []*unstructured.Unstructured) ([]Workload, error) {
	var out []Workload
	for _, u := range objs {
		switch u.GetKind() {
		case "Deployment":
			var d appsv1.Deployment
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &d); err != nil {
				return nil, fmt.Errorf("Deployment %s: %w", u.GetName(), err)
			}
			out = append(out, Workload{Kind: "Deployment", Namespace: d.Namespace, Name: d.Name, Template: d.Spec.Template, obj: &d})
		case "DaemonSet":
			var d appsv1.DaemonSet
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &d); err != nil {
				return nil, fmt.Errorf("DaemonSet %s: %w", u.GetName(), err)
			}
			out = append(out, Workload{Kind: "DaemonSet", Namespace: d.Namespace, Name: d.Name, Template: d.Spec.Template, obj: &d})
		case "Job":
			var j batchv1.Job
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &j); err != nil {
				return nil, fmt.Errorf("Job %s: %w", u.GetName(), err)
			}
			out = append(out, Workload{Kind: "Job", Namespace: j.Namespace, Name: j.Name, Template: j.Spec.Template, obj: &j})
		}
	}
	return out, nil
}

// Prepare creates for real what a Pod's admission looks up: the
// Namespaces (with the labels objs give them), the ServiceAccounts, and the
// ResourceQuotas, whose status it then writes as kube-controller-manager's
// quota controller would (hard from spec, nothing used), since quota
// admission refuses a quota without status.
func Prepare(ctx context.Context, admin kubernetes.Interface, objs []*unstructured.Unstructured) error {
	for _, kind := range []string{"Namespace", "ServiceAccount", "ResourceQuota"} {
		for _, u := range objs {
			if u.GetKind() != kind {
				continue
			}
			if err := prepare(ctx, admin, u); err != nil {
				return fmt.Errorf("%s %s: %w", kind, u.GetName(), err)
			}
		}
	}
	return nil
}

func prepare(ctx context.Context, admin kubernetes.Interface, u *unstructured.Unstructured) error {
	switch u.GetKind() {
	case "Namespace":
		ns, err := admin.CoreV1().Namespaces().Get(ctx, u.GetName(), metav1.GetOptions{})
		if err != nil {
			_, err = admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: u.GetName(), Labels: u.GetLabels()}}, metav1.CreateOptions{})
			return err
		}
		ns.Labels = u.GetLabels()
		_, err = admin.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{})
		return err
	case "ServiceAccount":
		_, err := admin.CoreV1().ServiceAccounts(u.GetNamespace()).Get(ctx, u.GetName(), metav1.GetOptions{})
		if err == nil {
			return nil
		}
		_, err = admin.CoreV1().ServiceAccounts(u.GetNamespace()).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: u.GetName()}}, metav1.CreateOptions{})
		return err
	case "ResourceQuota":
		var q corev1.ResourceQuota
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &q); err != nil {
			return err
		}
		_ = admin.CoreV1().ResourceQuotas(q.Namespace).Delete(ctx, q.Name, metav1.DeleteOptions{})
		created, err := admin.CoreV1().ResourceQuotas(q.Namespace).Create(ctx, &q, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		created.Status.Hard = q.Spec.Hard.DeepCopy()
		created.Status.Used = corev1.ResourceList{}
		for name, v := range q.Spec.Hard {
			zero := v.DeepCopy()
			zero.Set(0)
			created.Status.Used[name] = zero
		}
		_, err = admin.CoreV1().ResourceQuotas(q.Namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{})
		return err
	}
	return nil
}

// Admit creates (dry run) every workload, which must draw no warning, and
// a Pod from each workload's pod template, which must be admitted: one
// problem per failure, empty when all pass.
func Admit(ctx context.Context, cfg *rest.Config, workloads []Workload) ([]string, error) {
	w := &warnings{}
	c := rest.CopyConfig(cfg)
	c.WarningHandler = w
	client, err := kubernetes.NewForConfig(c)
	if err != nil {
		return nil, err
	}
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	var problems []string
	for _, wl := range workloads {
		id := wl.Kind + " " + wl.Namespace + "/" + wl.Name
		w.take()
		switch o := wl.obj.(type) {
		case *appsv1.Deployment:
			d := o.DeepCopy()
			d.Namespace, d.Spec.Template = wl.Namespace, *wl.Template.DeepCopy()
			_, err = client.AppsV1().Deployments(wl.Namespace).Create(ctx, d, dry)
		case *appsv1.DaemonSet:
			d := o.DeepCopy()
			d.Namespace, d.Spec.Template = wl.Namespace, *wl.Template.DeepCopy()
			_, err = client.AppsV1().DaemonSets(wl.Namespace).Create(ctx, d, dry)
		case *batchv1.Job:
			j := o.DeepCopy()
			j.Namespace, j.Spec.Template = wl.Namespace, *wl.Template.DeepCopy()
			_, err = client.BatchV1().Jobs(wl.Namespace).Create(ctx, j, dry)
		}
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: refused: %v", id, err))
		}
		if got := w.take(); len(got) > 0 {
			problems = append(problems, fmt.Sprintf("%s: warnings: %s", id, strings.Join(got, "; ")))
		}
		if err := AdmitPod(ctx, client, wl); err != nil {
			problems = append(problems, fmt.Sprintf("%s: its pod: %v", id, err))
		}
		if got := w.take(); len(got) > 0 {
			problems = append(problems, fmt.Sprintf("%s: its pod draws warnings: %s", id, strings.Join(got, "; ")))
		}
	}
	return problems, nil
}

// Pod is the Pod a controller would make from w's template.
func (w Workload) Pod() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:        w.Name + "-podsecurity",
			Namespace:   w.Namespace,
			Labels:      w.Template.Labels,
			Annotations: w.Template.Annotations,
		},
		Spec: *w.Template.Spec.DeepCopy(),
	}
}

// AdmitPod creates (dry run) w's Pod in namespace w.Namespace.
func AdmitPod(ctx context.Context, client kubernetes.Interface, w Workload) error {
	_, err := client.CoreV1().Pods(w.Namespace).Create(ctx, w.Pod(), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	return err
}

// Names lists the workloads as "Kind namespace/name", sorted.
func Names(ws []Workload) []string {
	var out []string
	for _, w := range ws {
		out = append(out, w.Kind+" "+w.Namespace+"/"+w.Name)
	}
	slices.Sort(out)
	return out
}
