package caadmin_test

import (
	"context"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/keyward/keyward/cmd/keyward/app"
	"github.com/keyward/keyward/deploy"
	caadmin "github.com/keyward/keyward/deploy/examples/ca-admin"
	"github.com/keyward/keyward/testsupport/controlplane"
	"github.com/keyward/keyward/testsupport/podsecurity"
)

func job(t *testing.T) *batchv1.Job {
	t.Helper()
	var j batchv1.Job
	if err := yaml.UnmarshalStrict(caadmin.Job, &j); err != nil {
		t.Fatalf("job.yaml: %v", err)
	}
	return &j
}

// The container's arguments are a keyward command and flags it knows, and
// the Job runs as keyward-ca-admin (the shipped role), once.
func TestJobRunsCAInitAsTheCAAdmin(t *testing.T) {
	j := job(t)
	spec := j.Spec.Template.Spec
	if spec.ServiceAccountName != "keyward-ca-admin" {
		t.Errorf("serviceAccountName %q, want keyward-ca-admin", spec.ServiceAccountName)
	}
	if j.Spec.BackoffLimit == nil || *j.Spec.BackoffLimit != 0 {
		t.Error("backoffLimit must be 0: a retried ca init for one generation is refused")
	}
	args := spec.Containers[0].Args
	cmd, rest, err := app.NewCommand().Find(args)
	if err != nil {
		t.Fatalf("args %v: %v", args, err)
	}
	if cmd.CommandPath() != "keyward ca init" {
		t.Fatalf("args run %q, want keyward ca init", cmd.CommandPath())
	}
	if err := cmd.ParseFlags(rest); err != nil {
		t.Fatalf("keyward ca init refuses the Job's flags: %v", err)
	}
	for _, f := range []string{"signer", "generation", "key-uri", "max-leaf-lifetime"} {
		if !cmd.Flags().Changed(f) {
			t.Errorf("the Job does not set --%s", f)
		}
	}
	if uri := cmd.Flags().Lookup("key-uri").Value.String(); !strings.Contains(uri, "pin-source=file:/etc/keyward/hsm/pin") {
		t.Errorf("--key-uri %q does not read the PIN from the mounted Secret", uri)
	}
}

// On a real kube-apiserver, in the keyward namespace labelled as shipped
// for the control plane (Pod Security "restricted", enforced), with the
// shipped RBAC: the Job is admitted without a warning, and so is a Pod of
// its template (enforce applies to Pods only).
func TestJobIsAdmittedUnderRestricted(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kube-apiserver")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cp, err := controlplane.Start(ctx, controlplane.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Stop)
	admin := cp.AdminClient()
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: "keyward",
		Labels: map[string]string{
			"pod-security.kubernetes.io/enforce": "restricted",
			"pod-security.kubernetes.io/warn":    "restricted",
		},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The base's RBAC puts the node agent's ServiceAccount in its own
	// namespace.
	if err := controlplane.EnsureNamespace(ctx, admin, "keyward-node"); err != nil {
		t.Fatal(err)
	}
	rbacYAML, err := deploy.Base.ReadFile("kustomize/base/rbac.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := controlplane.ApplyManifest(ctx, cp.AdminConfig(), rbacYAML); err != nil {
		t.Fatalf("applying the shipped RBAC: %v", err)
	}

	var u unstructured.Unstructured
	if err := yaml.Unmarshal(caadmin.Job, &u.Object); err != nil {
		t.Fatal(err)
	}
	workloads, err := podsecurity.Workloads([]*unstructured.Unstructured{&u})
	if err != nil || len(workloads) != 1 {
		t.Fatalf("the Job as a workload: %v (%d)", err, len(workloads))
	}
	problems, err := podsecurity.Admit(ctx, cp.AdminConfig(), workloads)
	if err != nil {
		t.Fatal(err)
	}
	if len(problems) > 0 {
		t.Fatalf("the Job under restricted:\n%s", strings.Join(problems, "\n"))
	}
}
