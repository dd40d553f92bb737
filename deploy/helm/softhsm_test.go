package helm

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/pkcs11"
)

// The softhsm sample's init container script, run for real against
// SoftHSM2 twice: the first run initialises the token from the PIN files
// and asks `keyward ca init` for one CA generation per signer name (with
// --create-key --skip-if-present, so a rerun is a no-op there); the second
// run leaves the token as it is. The key URIs it passes name that token and
// PIN: the real pkcs11 backend creates a key with each. (`keyward` itself is
// a stub recording its arguments: the CA side is ca init's own test; its
// `key init-token` runs the real keyward, which initialises the token
// through PKCS#11.) Neither PIN is on any command line the script runs.
func TestSoftHSMInitScriptIsIdempotent(t *testing.T) {
	for _, tool := range []string{"softhsm2-util", "sh"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is needed (make deps): %v", tool, err)
		}
	}
	objs := objects(t, mustTemplate(t, samples(t)["softhsm"]))
	pod := podTemplates(t, objs)["keyward-signer"]
	var init *corev1.Container
	for i := range pod.Spec.InitContainers {
		if pod.Spec.InitContainers[i].Name == "softhsm-init" {
			init = &pod.Spec.InitContainers[i]
		}
	}
	if init == nil || len(init.Command) == 0 || init.Command[0] != "/bin/sh" || len(init.Args) != 1 {
		t.Fatalf("no softhsm-init container running one /bin/sh script: %+v", init)
	}

	root := t.TempDir()
	host := func(p string) string { return filepath.Join(root, p) }
	tokens := host("tokens")
	conf := strings.ReplaceAll(string(configMapData(t, objs, "keyward-softhsm-conf", "softhsm2.conf")), "/var/lib/softhsm/tokens", tokens)
	files := map[string]string{
		"/etc/keyward/hsm/pin":                    "4321-user-pin",
		"/etc/keyward/softhsm/so-pin":             "8765-so-pin",
		"/etc/keyward/config/config.yaml":         string(configMapData(t, objs, "keyward-signer-config", "config.yaml")),
		"/etc/keyward/softhsm-conf/softhsm2.conf": conf,
		"/bin/keyward": "#!/bin/sh\nif [ \"$1 $2\" = 'key init-token' ]; then exec \"$KEYWARD_REAL\" \"$@\"; fi\n" +
			"printf '%s\\n' \"$*\" >> \"$KEYWARD_STUB_LOG\"\n",
	}
	for p, content := range files {
		if err := os.MkdirAll(filepath.Dir(host(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(host(p), []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(tokens, 0o755); err != nil {
		t.Fatal(err)
	}
	script := strings.ReplaceAll(init.Args[0], "/etc/keyward/", root+"/etc/keyward/")
	real := host("keyward-real")
	build := exec.Command("go", "build", "-o", real, "./cmd/keyward")
	build.Dir = repoRoot(t)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/keyward: %v\n%s", err, out)
	}
	env := []string{"PATH=" + host("/bin") + ":" + os.Getenv("PATH"), "KEYWARD_STUB_LOG=" + host("keyward.log"), "KEYWARD_REAL=" + real}
	for _, e := range init.Env {
		env = append(env, e.Name+"="+strings.ReplaceAll(e.Value, "/etc/keyward/", root+"/etc/keyward/"))
	}
	run := func() {
		t.Helper()
		// -x traces every command with its arguments expanded.
		cmd := exec.Command(init.Command[0], append(append(init.Command[1:], "-x"), script)...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("the init script failed: %v\n%s", err, out)
		}
		for _, pin := range []string{"4321-user-pin", "8765-so-pin"} {
			if strings.Contains(string(out), pin) {
				t.Errorf("a PIN is on a command line the script runs (sh -x trace):\n%s", out)
			}
		}
	}
	tokenSerials := func() []string {
		t.Helper()
		cmd := exec.Command("softhsm2-util", "--show-slots")
		cmd.Env = env
		out, err := cmd.Output()
		if err != nil {
			t.Fatal(err)
		}
		// Serial number comes before Label in each slot's token info.
		re := regexp.MustCompile(`Serial number:\s*(\S+)\s*\n(?:.*\n)*?\s*Label:\s*keyward\s*\n`)
		var serials []string
		for _, m := range re.FindAllStringSubmatch(string(out), -1) {
			serials = append(serials, m[1])
		}
		return serials
	}

	run()
	first := tokenSerials()
	if len(first) != 1 {
		t.Fatalf("after the first run: %d tokens labelled keyward, want 1", len(first))
	}
	run()
	if second := tokenSerials(); len(second) != 1 || second[0] != first[0] {
		t.Fatalf("the second run changed the token: serials %v, then %v", first, second)
	}

	log, err := os.ReadFile(host("keyward.log"))
	if err != nil {
		t.Fatal(err)
	}
	calls := strings.Split(strings.TrimSpace(string(log)), "\n")
	signers := []string{"keyward.dev/pod-identity", "keyward.dev/node-daemons"}
	if len(calls) != 2*len(signers) {
		t.Fatalf("keyward was called %d times over two runs, want %d (one ca init per signer name per run):\n%s", len(calls), 2*len(signers), log)
	}
	t.Setenv("SOFTHSM2_CONF", host("/etc/keyward/softhsm-conf/softhsm2.conf"))
	prov, err := pkcs11.New(pkcs11.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reg, err := backends.NewRegistry(prov)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	uris := map[string]bool{}
	for i, name := range signers {
		call := calls[i]
		for _, want := range []string{"ca init", "--signer " + name, "--create-key", "--skip-if-present", "--config " + root + "/etc/keyward/config/config.yaml"} {
			if !strings.Contains(call, want) {
				t.Errorf("call %q lacks %q", call, want)
			}
		}
		uri := flagValue(t, call, "--key-uri")
		if uris[uri] {
			t.Errorf("two signer names share the key URI %s", uri)
		}
		uris[uri] = true
		// The script's /etc/keyward paths point into root, the PIN file's too.
		local := uri
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		if _, err := reg.CreateKey(ctx, backends.CreateKeyRequest{URI: local, Algorithm: backends.ECDSAP256SHA256}); err != nil {
			t.Errorf("creating a key at %s on the initialised token: %v", local, err)
		}
		cancel()
	}
}

func flagValue(t *testing.T, call, flag string) string {
	t.Helper()
	fields := strings.Fields(call)
	for i, f := range fields {
		if f == flag && i+1 < len(fields) {
			return fields[i+1]
		}
	}
	t.Fatalf("no %s in %q", flag, call)
	return ""
}
