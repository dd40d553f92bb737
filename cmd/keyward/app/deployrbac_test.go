package app

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func runDeployRBAC(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := newDeployRBACCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&bytes.Buffer{})
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

func TestDeployRBACRendersTheBaseFile(t *testing.T) {
	base := filepath.Join("..", "..", "..", "deploy", "kustomize", "base")
	out, err := runDeployRBAC(t, "--namespace", "keyward", "--signer-config", filepath.Join(base, "signer-config.yaml"), "--approver",
		"--token-service-config", filepath.Join(base, "token-service-config.yaml"), "--node-agent", "--ca-admin")
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(filepath.Join(base, "rbac.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if out != string(want) {
		t.Error("the output differs from deploy/kustomize/base/rbac.yaml: run make generate")
	}
}

// The message names the file and the field (this test is about the text).
func TestDeployRBACErrorsNameTheFileAndField(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(path, []byte("apiVersion: keyward.dev/v1alpha1\nkind: SignerConfiguration\nsigners:\n- name: keyward.dev/a\n  profile: podIdentity\n  colour: blue\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := runDeployRBAC(t, "--signer-config", path)
	if err == nil || !strings.Contains(err.Error(), "bad.yaml") || !strings.Contains(err.Error(), "colour") {
		t.Fatalf("error %v, want one naming bad.yaml and the field colour", err)
	}
}

// With no configuration and no --node-agent there is nothing to render: an
// error, not a header with no objects and exit 0.
func TestDeployRBACWithNothingToRenderFails(t *testing.T) {
	out, err := runDeployRBAC(t)
	if err == nil || !strings.Contains(err.Error(), "--signer-config") {
		t.Fatalf("deploy rbac with no input: output %q, error %v; want an error naming --signer-config", out, err)
	}
}

// --authority SIGNER=NAME moves the Authority writes to the given name; the
// derived name is granted nothing then.
func TestDeployRBACAuthorityFlagNamesTheAuthority(t *testing.T) {
	base := filepath.Join("..", "..", "..", "deploy", "kustomize", "base")
	out, err := runDeployRBAC(t, "--token-service-config", filepath.Join(base, "token-service-config.yaml"),
		"--authority", "keyward.dev/registry-token=registry-token")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "  - registry-token\n") || strings.Contains(out, "keyward.dev.registry-token") {
		t.Errorf("with --authority keyward.dev/registry-token=registry-token the RBAC names:\n%s", out)
	}
}
