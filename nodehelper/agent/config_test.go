package agent

import (
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// The example in docs/ is a configuration Load accepts.
func TestTheDocumentedExampleLoads(t *testing.T) {
	t.Setenv("NODE_NAME", "worker-7")
	cfg, err := Load("../../docs/node-agent-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.NodeName != "worker-7" || cfg.Bootstrap == nil || len(cfg.Credentials) != 1 || len(cfg.Trust) != 1 {
		t.Fatalf("decoded %+v", cfg)
	}
	if cfg.Bootstrap.SignerName != DefaultBootstrapSignerName || cfg.Bootstrap.KeyType != DefaultKeyType {
		t.Errorf("bootstrap defaults: %+v", cfg.Bootstrap)
	}
	if m := *cfg.Credentials[0].Output.Mode; m != 0o600 {
		t.Errorf("output mode = %#o, want 0600", m)
	}
}

func TestDefaults(t *testing.T) {
	t.Setenv("NODE_NAME", "")
	cfg, err := Load("testdata/base.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MetricsAddress != DefaultMetricsAddress || cfg.HealthAddress != DefaultHealthAddress {
		t.Errorf("addresses %q %q", cfg.MetricsAddress, cfg.HealthAddress)
	}
	if cfg.Renewal.RetryInitial.Duration != time.Second || cfg.Renewal.RetryMax.Duration != time.Minute || cfg.Renewal.WaitTimeout.Duration != DefaultWaitTimeout {
		t.Errorf("renewal %+v", cfg.Renewal)
	}
	a, b := cfg.Credentials[0], cfg.Credentials[1]
	if a.KeyType != DefaultKeyType || !slices.Equal(a.Usages, []string{"digital signature", "client auth"}) || a.Output.BundleFile != DefaultBundleFile || *a.Output.Mode != 0o600 {
		t.Errorf("credential defaults: %+v", a)
	}
	if *b.Output.Mode != 0o640 || *b.Output.UID != 1000 {
		t.Errorf("credential b: %+v", b.Output)
	}
	if tr := cfg.Trust[0]; tr.File != "ca-bundle.pem" || *tr.Mode != 0o644 || tr.LabelDomain != "keyward.dev" || tr.OnChangeTimeout.Duration != 30*time.Second {
		t.Errorf("trust defaults: %+v", tr)
	}
}

// fieldsOf returns the fields a validation error names.
func fieldsOf(err error) []string {
	var agg utilerrors.Aggregate
	if !errors.As(err, &agg) {
		return nil
	}
	var out []string
	for _, e := range agg.Errors() {
		var fe *field.Error
		if errors.As(e, &fe) {
			out = append(out, fe.Field)
		}
	}
	return out
}

// Every bad value is refused with an error naming its field.
func TestBadConfigurationsNameTheField(t *testing.T) {
	base, err := os.ReadFile("testdata/base.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name      string
		from, to  string
		wantField string
	}{
		{"a wrong apiVersion", "apiVersion: keyward.dev/v1alpha1", "apiVersion: v1", "apiVersion"},
		{"a wrong kind", "kind: NodeAgentConfiguration", "kind: AgentConfiguration", "kind"},
		{"no node name", "nodeName: worker-1", "nodeName: ''", "nodeName"},
		{"a node name that is no DNS name", "nodeName: worker-1", "nodeName: Worker_1", "nodeName"},
		{"a relative state directory", "stateDir: /var/lib/keyward-node", "stateDir: state", "stateDir"},
		{"a kubeconfig and bootstrap together", "renewal:", "bootstrap: {kubeconfig: /etc/b.conf}\nrenewal:", "kubeconfig"},
		{"bootstrap without a kubeconfig", "kubeconfig: /etc/kubernetes/kubelet.conf", "bootstrap: {keyType: ECDSAP256}", "bootstrap.kubeconfig"},
		{"a bootstrap key type the apiserver does not know", "kubeconfig: /etc/kubernetes/kubelet.conf", "bootstrap: {kubeconfig: /b, keyType: RSA2048}", "bootstrap.keyType"},
		{"a bootstrap lifetime under 600 seconds", "kubeconfig: /etc/kubernetes/kubelet.conf", "bootstrap: {kubeconfig: /b, expirationSeconds: 599}", "bootstrap.expirationSeconds"},
		{"a metrics address without a port", "renewal:", "metricsAddress: localhost\nrenewal:", "metricsAddress"},
		{"health and metrics on one address", "renewal:", "metricsAddress: 127.0.0.1:9000\nhealthAddress: 127.0.0.1:9000\nrenewal:", "healthAddress"},
		{"a negative retry", "retryInitial: 1s", "retryInitial: -1s", "renewal.retryInitial"},
		{"a retry maximum under the initial retry", "retryMax: 1m", "retryMax: 500ms", "renewal.retryMax"},
		{"a credential named identity", "name: daemon-a", "name: identity", "credentials[0].name"},
		{"a credential name with capitals", "name: daemon-a", "name: Daemon", "credentials[0].name"},
		{"two credentials of one name", "name: daemon-b", "name: daemon-a", "credentials[1].name"},
		{"a credential without a signer name", "signerName: keyward.dev/node-daemon\n  keyType", "signerName: ''\n  keyType", "credentials[1].signerName"},
		{"a signer name without a path", "signerName: keyward.dev/node-daemon\n  keyType", "signerName: keyward.dev\n  keyType", "credentials[1].signerName"},
		{"an unknown key type", "keyType: ED25519", "keyType: RSA2048", "credentials[1].keyType"},
		{"a credential without any name", "commonName: daemon-b", "commonName: ''", "credentials[1].commonName"},
		{"a DNS name with an underscore", `dnsNames: ["${NODE_NAME}.example.com"]`, `dnsNames: [a_b.example.com]`, "credentials[0].dnsNames[0]"},
		{"an IP address that is not one", "ipAddresses: [10.0.0.1]", "ipAddresses: [10.0.0.256]", "credentials[0].ipAddresses[0]"},
		{"a URI without a scheme", `uris: ["spiffe://cluster.local/node/${NODE_NAME}"]`, `uris: [node-a]`, "credentials[0].uris[0]"},
		{"an unknown usage", "usages: [digital signature, server auth]", "usages: [digital signature, tls server]", "credentials[1].usages[1]"},
		{"a usage given twice", "usages: [digital signature, server auth]", "usages: [server auth, server auth]", "credentials[1].usages[1]"},
		{"a lifetime under 600 seconds", "expirationSeconds: 3600", "expirationSeconds: 60", "credentials[0].expirationSeconds"},
		{"a relative output directory", "dir: /run/keyward/a", "dir: run/a", "credentials[0].output.dir"},
		{"a credential writing the state directory", "dir: /run/keyward/a", "dir: /var/lib/keyward-node/", "credentials[0].output.dir"},
		{"a trust file writing the state directory", "dir: /etc/keyward/registry", "dir: /var/lib/keyward-node", "trust[0].dir"},
		{"two credentials writing one directory", "dir: /run/keyward/b", "dir: /run/keyward/a/", "credentials[1].output.dir"},
		{"a key file in a subdirectory", "keyFile: key.pem", "keyFile: tls/key.pem", "credentials[1].output.keyFile"},
		{"a key file named like the chain file", "keyFile: key.pem", "keyFile: chain.pem", "credentials[1].output.chainFile"},
		{"a key file without a chain file", "    chainFile: chain.pem\n", "", "credentials[1].output.chainFile"},
		{"a mode beyond 0777", "mode: 0640", "mode: 01777", "credentials[1].output.mode"},
		{"a negative uid", "uid: 1000", "uid: -1", "credentials[1].output.uid"},
		{"a trust entry without a name", "- name: registry", "- name: ''", "trust[0].name"},
		{"a trust entry with a bundle name and a signer name", "signerName: keyward.dev/registry", "signerName: keyward.dev/registry\n  clusterTrustBundleName: x", "trust[0].signerName"},
		{"a trust version that is neither canary nor live", "nodeLabel: keyward.dev/trust-bundle", "version: stable", "trust[0].version"},
		{"a trust node label that is no label key", "nodeLabel: keyward.dev/trust-bundle", "nodeLabel: 'a b'", "trust[0].nodeLabel"},
		{"a trust file writing a credential's directory", "dir: /etc/keyward/registry", "dir: /run/keyward/b", "trust[0].dir"},
		{"a trust file name starting with dots", "dir: /etc/keyward/registry", "dir: /etc/keyward/registry\n  file: ..data", "trust[0].file"},
		{"an empty hook argument", "onChange: [systemctl, reload, containerd]", "onChange: [systemctl, '']", "trust[0].onChange[1]"},
		{"an additional bundle name outside the signer's prefix", "onChange: [systemctl, reload, containerd]", "onChange: [systemctl, reload, containerd]\n  additionalBundleNames: [other:attacker]", "trust[0].additionalBundleNames[0]"},
		{"a negative certificate cap", "onChange: [systemctl, reload, containerd]", "onChange: [systemctl, reload, containerd]\n  maxCertificates: -1", "trust[0].maxCertificates"},
		{"a negative hook debounce", "onChange: [systemctl, reload, containerd]", "onChange: [systemctl, reload, containerd]\n  onChangeDebounce: -1s", "trust[0].onChangeDebounce"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if !strings.Contains(string(base), tc.from) {
				t.Fatalf("base has no %q", tc.from)
			}
			_, err := Parse([]byte(strings.Replace(string(base), tc.from, tc.to, 1)))
			if err == nil {
				t.Fatal("accepted")
			}
			if got := fieldsOf(err); !slices.Contains(got, tc.wantField) {
				t.Errorf("error names %v, want %s: %v", got, tc.wantField, err)
			}
		})
	}
}

// Decoding is strict: an unknown or repeated field is an error that names
// it (this test is about the message's text).
func TestUnknownAndRepeatedFieldsAreRefused(t *testing.T) {
	base, err := os.ReadFile("testdata/base.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, from, to, want string }{
		{"an unknown top-level field", "renewal:", "renewals: {}\nrenewal:", `"renewals"`},
		{"an unknown output field", "dir: /run/keyward/a", "dir: /run/keyward/a\n    file: x", `"credentials[0].output.file"`},
		{"a repeated field", "nodeName: worker-1", "nodeName: worker-1\nnodeName: worker-2", `"nodeName"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(strings.Replace(string(base), tc.from, tc.to, 1)))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want one naming %s", err, tc.want)
			}
		})
	}
}

// ${NODE_NAME} takes the node name from the environment when nodeName is
// unset, and the credential's request carries it.
func TestNodeNameIsExpandedInTheRequest(t *testing.T) {
	t.Setenv("NODE_NAME", "worker-9")
	base, err := os.ReadFile("testdata/base.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := Parse([]byte(strings.Replace(string(base), "nodeName: worker-1\n", "", 1)))
	if err != nil {
		t.Fatal(err)
	}
	cfg.StateDir = t.TempDir()
	a, err := New(Options{Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	tmpl := a.byName["daemon-a"].request.Template
	if tmpl.Subject.CommonName != "daemon:worker-9" || tmpl.DNSNames[0] != "worker-9.example.com" || tmpl.URIs[0].String() != "spiffe://cluster.local/node/worker-9" {
		t.Errorf("template %+v", tmpl)
	}
}

// A missing node name is one error: names holding ${NODE_NAME} are not
// also reported invalid because the variable had nothing to expand to.
func TestAMissingNodeNameIsOneError(t *testing.T) {
	t.Setenv("NODE_NAME", "")
	_, err := Load("../../docs/node-agent-config.yaml")
	var agg utilerrors.Aggregate
	if !errors.As(err, &agg) {
		t.Fatalf("Load: %v, want an aggregate of field errors", err)
	}
	var fields []string
	for _, e := range agg.Errors() {
		var fe *field.Error
		if errors.As(e, &fe) {
			fields = append(fields, fe.Field)
		}
	}
	if len(fields) != 1 || fields[0] != "nodeName" {
		t.Fatalf("errors at %v (%v), want only nodeName", fields, err)
	}
}
