package kustomize_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/deploy/rbac"
	authclient "github.com/keyward/keyward/kubeclient/authority/client"
	signerconfig "github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/testsupport/controlplane"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// softhsmModules are where distributions put SoftHSM2's PKCS#11 module.
var softhsmModules = []string{
	"/usr/lib/softhsm/libsofthsm2.so",
	"/usr/lib/x86_64-linux-gnu/softhsm/libsofthsm2.so",
	"/usr/lib/aarch64-linux-gnu/softhsm/libsofthsm2.so",
	"/usr/local/lib/softhsm/libsofthsm2.so",
}

// The softhsm overlay's signer ClusterRole is the one the RBAC generator
// renders for the base's configuration with BootstrapAuthorities: the
// overlay's added rule is no hand-made grant.
func TestSoftHSMOverlayRBACIsGenerated(t *testing.T) {
	cfg, err := signerconfig.Load(filepath.Join(root, "deploy/kustomize/base/signer-config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	s := rbac.FromSignerConfig(cfg)
	s.BootstrapAuthorities = true
	objs, err := rbac.Render(rbac.Input{Namespace: "keyward", Signer: &s})
	if err != nil {
		t.Fatal(err)
	}
	var want []rbacv1.PolicyRule
	for _, o := range objs {
		if cr, ok := o.(*rbacv1.ClusterRole); ok && cr.Name == "keyward-signer" {
			want = cr.Rules
		}
	}
	if want == nil {
		t.Fatal("the generator rendered no ClusterRole keyward-signer")
	}
	var got []rbacv1.PolicyRule
	for _, u := range render(t, "overlays/softhsm").objs {
		if u.GetKind() == "ClusterRole" && u.GetName() == "keyward-signer" {
			got = convert[rbacv1.ClusterRole](t, u).Rules
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("the softhsm overlay's ClusterRole keyward-signer:\n%v\nthe generator's (--bootstrap-authorities):\n%v", got, want)
	}
}

// The softhsm overlay's init script, run for real twice against a fresh
// SoftHSM2 token and a real kube-apiserver, as the signer's ServiceAccount
// with the overlay's RBAC (applied for real): the first run initialises the
// token and makes generation g1 of each signer name; the second changes
// neither the token's key objects nor the Authorities. Neither PIN is ever
// on a command line (/proc/<pid>/cmdline shows those to every process):
// the script's text passes none, and `sh -x`'s trace of every command it
// runs, arguments expanded, holds neither PIN.
func TestSoftHSMInitScriptRunsTwice(t *testing.T) {
	for _, tool := range []string{"sh"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is needed (make deps): %v", tool, err)
		}
	}
	module := ""
	for _, m := range softhsmModules {
		if _, err := os.Stat(m); err == nil {
			module = m
			break
		}
	}
	if module == "" {
		t.Fatalf("no SoftHSM2 module in %v (make deps)", softhsmModules)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := t.TempDir()

	bin := filepath.Join(dir, "keyward")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/keyward")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/keyward: %v\n%s", err, out)
	}

	cp, err := controlplane.Start(ctx, controlplane.Options{})
	if err != nil {
		t.Fatalf("starting the control plane: %v", err)
	}
	defer cp.Stop()
	if _, err := controlplane.InstallAuthorityCRD(ctx, cp.AdminConfig()); err != nil {
		t.Fatal(err)
	}
	// The namespace and the overlay's RBAC, for real.
	r := render(t, "overlays/softhsm")
	var rbacObjs bytes.Buffer
	var initEnv []corev1.EnvVar
	for _, u := range r.objs {
		switch u.GetKind() {
		case "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding":
			if err := writeObject(&rbacObjs, u); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, c := range r.deployments["keyward-signer"].Spec.Template.Spec.InitContainers {
		if c.Name == "softhsm-init" {
			initEnv = c.Env
		}
	}
	if initEnv == nil {
		t.Fatal("the softhsm overlay's signer has no init container softhsm-init")
	}
	if err := controlplane.ApplyManifest(ctx, cp.AdminConfig(), rbacObjs.Bytes()); err != nil {
		t.Fatalf("applying the overlay's RBAC: %v", err)
	}
	saCfg, err := cp.ServiceAccountConfig("keyward", "keyward-signer")
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(dir, "signer.kubeconfig")
	if err := controlplane.WriteKubeconfig(saCfg, "keyward-signer", kubeconfig); err != nil {
		t.Fatal(err)
	}

	tokens := filepath.Join(dir, "tokens")
	if err := os.Mkdir(tokens, 0o700); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "softhsm2.conf")
	files := map[string]string{
		conf:                         "directories.tokendir = " + tokens + "\nobjectstore.backend = file\nlog.level = INFO\n",
		filepath.Join(dir, "pin"):    userPIN + "\n",
		filepath.Join(dir, "so-pin"): soPIN,
	}
	for name, content := range files {
		if err := os.WriteFile(name, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	env := append(os.Environ(),
		"SOFTHSM2_CONF="+conf,
		"KUBECONFIG="+kubeconfig,
		"MODULE="+module,
		"PIN_FILE="+filepath.Join(dir, "pin"),
		"SO_PIN_FILE="+filepath.Join(dir, "so-pin"),
		"CONFIG="+filepath.Join(root, "deploy/kustomize/base/signer-config.yaml"),
		"KEYWARD="+bin,
	)
	var signers []string
	for _, e := range initEnv {
		env = append(env, e.Name+"="+e.Value)
		if e.Name == "SIGNERS" {
			signers = strings.Fields(e.Value)
		}
	}
	script := filepath.Join(root, "deploy/kustomize/overlays/softhsm/softhsm-init.sh")
	text, err := os.ReadFile(script)
	if err != nil {
		t.Fatal(err)
	}
	for _, flag := range []string{"--pin ", "--so-pin ", "--pin=", "--so-pin=", "$(cat"} {
		if bytes.Contains(text, []byte(flag)) {
			t.Errorf("softhsm-init.sh passes %q: a PIN on a command line", flag)
		}
	}
	run := func() string {
		t.Helper()
		// -x traces every command the script runs with its arguments
		// expanded: what /proc/<pid>/cmdline would show.
		cmd := exec.CommandContext(ctx, "sh", "-x", script)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("softhsm-init.sh: %v\n%s", err, out)
		}
		for name, pin := range map[string]string{"user PIN": userPIN, "SO PIN": soPIN} {
			if strings.Contains(string(out), pin) {
				t.Errorf("the %s is on a command line the script runs (sh -x trace):\n%s", name, out)
			}
		}
		return string(out)
	}

	if out := run(); !strings.Contains(out, "softhsm: token ") || !strings.Contains(out, " initialised") {
		t.Errorf("first run:\n%s\nwant the token initialised", out)
	}
	ac, err := authclient.New(cp.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	authorities := func() map[string]string {
		t.Helper()
		list, err := ac.List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, a := range list.Items {
			for _, g := range a.Spec.Generations {
				out[a.Spec.SignerName+" "+g.Name] = a.ResourceVersion
			}
		}
		return out
	}
	first := authorities()
	for _, s := range signers {
		if _, ok := first[s+" g1"]; !ok {
			t.Errorf("after the first run, signer %s has no generation g1 (Authorities: %v)", s, first)
		}
	}
	if len(signers) == 0 {
		t.Fatal("the init container names no SIGNERS")
	}
	tokenFiles := snapshot(t, tokens)

	out := run()
	if got := authorities(); !reflect.DeepEqual(got, first) {
		t.Errorf("the second run changed the Authorities: %v, then %v", first, got)
	}
	if got := snapshot(t, tokens); !reflect.DeepEqual(got, tokenFiles) {
		t.Errorf("the second run changed the token's files:\n%v\nthen\n%v", tokenFiles, got)
	}
	if !strings.Contains(out, "softhsm: token ") || !strings.Contains(out, " present") {
		t.Errorf("second run:\n%s\nwant the token found present", out)
	}
	if n := strings.Count(out, "nothing to do"); n != len(signers) {
		t.Errorf("second run:\n%s\nwant %d lines saying nothing to do", out, len(signers))
	}
}

// The init script's PINs: distinctive, so that a trace holding them is
// found.
const (
	userPIN = "user-pin-7c1e9a"
	soPIN   = "so-pin-4b2a8f"
)

// snapshot is every file under dir with its content's hash, except each
// token's token.object, where SoftHSM2 itself records login state (it is
// rewritten on every C_Login); a new or re-initialised token, or a new key,
// changes the set of files or their contents.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() == "token.object" {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		out[path] = fmt.Sprintf("%x", sha256.Sum256(data))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
