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

const tokenServiceComponent = "../../../deploy/kustomize/components/token-service"

// The Makefile's BASE_RBAC_FLAGS and TOKEN_SERVICE_RBAC_FLAGS render the
// shipped files.
func TestDeployRBACRendersTheBaseFile(t *testing.T) {
	base := filepath.Join("..", "..", "..", "deploy", "kustomize", "base")
	for file, args := range map[string][]string{
		filepath.Join(base, "rbac.yaml"): {"--namespace", "keyward", "--signer-config", filepath.Join(base, "signer-config.yaml"), "--approver",
			"--node-agent", "--node-agent-namespace", "keyward-node", "--ca-admin"},
		filepath.Join(tokenServiceComponent, "rbac.yaml"): {"--namespace", "keyward",
			"--token-service-config", filepath.Join(tokenServiceComponent, "token-service-config.yaml")},
	} {
		out, err := runDeployRBAC(t, args...)
		if err != nil {
			t.Fatal(err)
		}
		want, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if out != string(want) {
			t.Errorf("the output differs from %s: run make generate", file)
		}
	}
}

// The node agent's ServiceAccount goes to --node-agent-namespace (default
// keyward-node), never to --namespace: its namespace is Pod Security
// privileged, keyward's restricted.
func TestDeployRBACNodeAgentNamespace(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"the default is keyward-node", []string{"--namespace", "ops", "--node-agent"}, "keyward-node"},
		{"the flag names it", []string{"--namespace", "ops", "--node-agent", "--node-agent-namespace", "ops-node"}, "ops-node"},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, err := runDeployRBAC(t, c.args...)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(out, "  name: keyward-node-agent\n  namespace: "+c.want+"\n") {
				t.Errorf("the node agent's ServiceAccount is not in %s:\n%s", c.want, out)
			}
		})
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
	out, err := runDeployRBAC(t, "--token-service-config", filepath.Join(tokenServiceComponent, "token-service-config.yaml"),
		"--authority", "keyward.dev/registry-token=registry-token")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "  - registry-token\n") || strings.Contains(out, "keyward.dev.registry-token") {
		t.Errorf("with --authority keyward.dev/registry-token=registry-token the RBAC names:\n%s", out)
	}
}
