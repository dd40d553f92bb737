package config_test

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/signer/config"
)

func TestFullExampleLoadsWithDefaults(t *testing.T) {
	cfg, err := config.Load("testdata/full.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Signers) != 3 || cfg.Workers != 8 || cfg.FailAfter.Duration != 10*time.Minute {
		t.Fatalf("decoded %+v", cfg)
	}
	spiffe := cfg.Signers[1]
	if *spiffe.RefreshPoint != 0.5 || spiffe.Backdate.Duration != 2*time.Minute || spiffe.MaxLifetime.Duration != 24*time.Hour {
		t.Errorf("defaults not applied: refresh %v backdate %v maxLifetime %v", *spiffe.RefreshPoint, spiffe.Backdate, spiffe.MaxLifetime)
	}
	if len(spiffe.AllowedKeyTypes) != 6 {
		t.Errorf("default key types = %v, want all six the apiserver accepts", spiffe.AllowedKeyTypes)
	}
	if b := cfg.Backends; b.PKCS11.MaxSessions != 32 || b.GCPKMS.Endpoint != "cloudkms.googleapis.com:443" || b.AWSKMS.MaxAttempts != 4 {
		t.Errorf("backends section: %+v", b)
	}
	if in := cfg.Signers[0].Intermediate; in == nil || !in.Enabled || in.RenewBefore.Duration != 24*time.Hour || in.Validity.Duration != 30*time.Hour {
		t.Errorf("intermediate defaults: %+v, want renewBefore maxLifetime (24h), validity 6h more", in)
	}
	if cfg.Signers[1].Intermediate != nil {
		t.Errorf("intermediate on a signer that did not ask for one")
	}
	if !*cfg.LeaderElection.Enabled || cfg.LeaderElection.LeaseName != "keyward-signer" {
		t.Errorf("leader election defaults: %+v", cfg.LeaderElection)
	}
}

// Every bad input is refused with an error that names the field.
func TestBadConfigurationsNameTheField(t *testing.T) {
	base, err := os.ReadFile("testdata/full.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name      string
		from, to  string
		wantField string
	}{
		{"an unknown top-level field", "workers: 8", "workers: 8\nworkerz: 3", `"workerz"`},
		{"an unknown signer field", "profile: podIdentity", "profile: podIdentity\n  lifetime: 1h", `"signers[0].lifetime"`},
		{"a wrong kind", "kind: SignerConfiguration", "kind: Config", "kind"},
		{"a wrong apiVersion", "apiVersion: keyward.dev/v1alpha1", "apiVersion: v1", "apiVersion"},
		{"an unknown profile", "profile: podIdentity", "profile: mtls", "signers[0].profile"},
		{"a signer name without a path", "name: keyward.dev/pod-identity", "name: keyward.dev", "signers[0].name"},
		{"a reserved signer name", "name: keyward.dev/pod-identity", "name: kubernetes.io/kube-apiserver-client-pod", "signers[0].name"},
		{"a duplicate signer name", "name: keyward.dev/spiffe", "name: keyward.dev/pod-identity", "signers[1].name"},
		{"a key type the apiserver does not know", "[ECDSAP256, ECDSAP384, ED25519]", "[ECDSAP256, RSA2048]", "signers[0].allowedKeyTypes[1]"},
		{"a lifetime under an hour", "maxLifetime: 24h", "maxLifetime: 30m", "signers[0].maxLifetime"},
		{"a refresh point of 1", "refreshPoint: 0.6", "refreshPoint: 1", "signers[2].refreshPoint"},
		{"a backdate of 5 minutes", "backdate: 1m", "backdate: 5m", "signers[2].backdate"},
		{"a SPIFFE signer without a trust domain", "trustDomain: cluster.local", "trustDomain: ''", "signers[1].spiffe.trustDomain"},
		{"a server signer not reading its annotation", "unverifiedUserAnnotations: [keyward.dev/dns-names]", "unverifiedUserAnnotations: [example.com/x]", "signers[2].unverifiedUserAnnotations"},
		{"an unknown DNS placeholder", "{serviceAccount}.{namespace}.svc", "{pod}.{namespace}.svc", "signers[2].server.allowedDNSNames[0]"},
		{"a relative PKCS#11 module path", "[/usr/lib/softhsm/libsofthsm2.so]", "[libsofthsm2.so]", "backends.pkcs11.allowedModules[0]"},
		{"a duplicate PKCS#11 module path", "[/usr/lib/softhsm/libsofthsm2.so]", "[/usr/lib/softhsm/libsofthsm2.so, /usr/lib/softhsm/libsofthsm2.so]", "backends.pkcs11.allowedModules[1]"},
		{"a negative session pool", "maxSessions: 32", "maxSessions: -1", "backends.pkcs11.maxSessions"},
		{"a negative pool wait", "poolWaitTimeout: 3s", "poolWaitTimeout: -3s", "backends.pkcs11.poolWaitTimeout"},
		{"a Cloud KMS endpoint without a port", "endpoint: cloudkms.googleapis.com:443", "endpoint: cloudkms.googleapis.com", "backends.gcpkms.endpoint"},
		{"a Cloud KMS endpoint given as a URL", "endpoint: cloudkms.googleapis.com:443", "endpoint: https://cloudkms.googleapis.com:443", "backends.gcpkms.endpoint"},
		{"a negative AWS KMS attempt count", "  awskms:\n    callTimeout: 5s\n    maxAttempts: 4", "  awskms:\n    callTimeout: 5s\n    maxAttempts: -4", "backends.awskms.maxAttempts"},
		{"an unknown backend field", "maxSessions: 32", "maxSessions: 32\n    slot: 0", `"backends.pkcs11.slot"`},
		{"a rate limit without qps", "perNode: {qps: 10, burst: 20}", "perNode: {qps: 0, burst: 20}", "signers[2].rateLimits.perNode"},
		{"an unknown limit action", "onLimit: deny", "onLimit: drop", "signers[2].rateLimits.onLimit"},
		{"a negative failAfter", "failAfter: 10m", "failAfter: -1m", "failAfter"},
		{"an unknown PodCertificateRequest version", "workers: 8", "workers: 8\npodCertificateRequestVersion: v2", "podCertificateRequestVersion"},
		{"a field given twice", "workers: 8", "workers: 8\nworkers: 3", `"workers" already set`},
		{"a Lease of a fraction of a second", "workers: 8", "workers: 8\nleaderElection: {leaseDuration: 1500ms}", "leaderElection.leaseDuration"},
		{"a renew deadline as long as the Lease", "workers: 8", "workers: 8\nleaderElection: {leaseDuration: 1s, renewDeadline: 1s}", "leaderElection"},
		{"an intermediate renewed after a leaf could end", "intermediate: {enabled: true}", "intermediate: {enabled: true, renewBefore: 1h}", "signers[0].intermediate.renewBefore"},
		{"an intermediate not outliving renewBefore", "intermediate: {enabled: true}", "intermediate: {enabled: true, validity: 24h}", "signers[0].intermediate.validity"},
		{"a negative intermediate validity", "intermediate: {enabled: true}", "intermediate: {validity: -1h}", "signers[0].intermediate.validity"},
		{"an unknown intermediate field", "intermediate: {enabled: true}", "intermediate: {enabled: true, lifetime: 1h}", `"signers[0].intermediate.lifetime"`},
		{"a signer field given twice", "maxLifetime: 24h", "maxLifetime: 24h\n  maxLifetime: 2h", `"maxLifetime" already set`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if !strings.Contains(string(base), tc.from) {
				t.Fatalf("fixture lacks %q", tc.from)
			}
			checkRefused(t, strings.Replace(string(base), tc.from, tc.to, 1), tc.wantField)
		})
	}
}

// A file that still has a signers[].ca block is refused with one error
// that names the field and points to the migration, whatever the block
// holds (a PIN in it is not shown).
func TestCABlockIsRefusedWithTheMigration(t *testing.T) {
	base, err := os.ReadFile("testdata/full.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name      string
		block     string
		wantField string
	}{
		{"a ca block with a certificate file and a key URI", "  ca:\n    certificateFile: /etc/keyward/ca.crt\n    keyURI: file:/etc/keyward/ca.key\n", "signers[1].ca"},
		{"an empty ca block", "  ca: {}\n", "signers[1].ca"},
		{"a ca block whose key URI has a PIN", "  ca:\n    keyURI: pkcs11:token=t;object=o?pin-value=9731\n", "signers[1].ca"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			data := strings.Replace(string(base), "  profile: spiffe\n", "  profile: spiffe\n"+tc.block, 1)
			_, err := config.Parse([]byte(data))
			if !errors.Is(err, config.ErrCABlockRemoved) {
				t.Fatalf("Parse = %v, want ErrCABlockRemoved", err)
			}
			checkRefused(t, data, tc.wantField)
			for _, want := range []string{"keyward ca import", config.MigrationDoc} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not point to %s", err, want)
				}
			}
			if strings.Count(err.Error(), "signers[") != 1 {
				t.Errorf("error %q: want one error, about the ca block only", err)
			}
		})
	}
}

// podIdentity.critical is read per signer, absent means non-critical, and
// it is refused, with its path, where it cannot apply.
func TestPodIdentityCriticality(t *testing.T) {
	base, err := os.ReadFile("testdata/full.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	if pi := cfg.Signers[0].PodIdentity; pi != nil && pi.Critical {
		t.Fatalf("podIdentity settings %+v without any in the file, want non-critical", *pi)
	}
	cfg, err = config.Parse([]byte(strings.Replace(string(base), "profile: podIdentity", "profile: podIdentity\n  podIdentity: {critical: true}", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if pi := cfg.Signers[0].PodIdentity; pi == nil || !pi.Critical {
		t.Fatalf("podIdentity settings %+v, want critical", pi)
	}
	cases := []struct {
		name      string
		from, to  string
		wantField string
	}{
		{"podIdentity settings on a spiffe signer", "profile: spiffe", "profile: spiffe\n  podIdentity: {critical: true}", "signers[1].podIdentity"},
		{"a misspelt podIdentity setting", "profile: podIdentity", "profile: podIdentity\n  podIdentity: {critcal: true}", `"signers[0].podIdentity.critcal"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			checkRefused(t, strings.Replace(string(base), tc.from, tc.to, 1), tc.wantField)
		})
	}
}

// checkRefused parses data and wants an error that names wantField and
// shows no part of the test PIN (9731, "97 31").
func checkRefused(t *testing.T, data, wantField string) {
	t.Helper()
	_, err := config.Parse([]byte(data))
	if err == nil {
		t.Fatal("accepted")
	}
	if !strings.Contains(err.Error(), wantField) {
		t.Fatalf("error %q does not name %s", err, wantField)
	}
	if strings.Contains(err.Error(), "9731") || strings.Contains(err.Error(), " 31") {
		t.Fatalf("error %q shows the PIN", err)
	}
}

func TestWorkersFor(t *testing.T) {
	for _, tc := range []struct {
		rate    float64
		latency time.Duration
		want    int
	}{
		{400, 20 * time.Millisecond, 16},
		{100, 100 * time.Millisecond, 20},
		{1000, 200 * time.Microsecond, config.DefaultWorkers}, // a local key: the default
		{0, time.Second, config.DefaultWorkers},
		{401, 20 * time.Millisecond, 17}, // rounds up
	} {
		if got := config.WorkersFor(tc.rate, tc.latency); got != tc.want {
			t.Errorf("WorkersFor(%v, %v) = %d, want %d", tc.rate, tc.latency, got, tc.want)
		}
	}
}

// A configuration silent on rate limits still bounds each node: the
// default per-node bucket, in delay mode (a Denied PCR is permanent for
// kubelet). An explicit bucket or deny mode is taken as written.
func TestDefaultPerNodeRateLimit(t *testing.T) {
	cfg, err := config.Load("testdata/full.yaml")
	if err != nil {
		t.Fatal(err)
	}
	silent := cfg.Signers[1]
	if r := silent.RateLimits; r.PerNode == nil || r.PerNode.QPS != config.DefaultPerNodeQPS || r.PerNode.Burst != config.DefaultPerNodeBurst || r.OnLimit != "delay" {
		t.Errorf("signer %s, silent on rateLimits: perNode %+v onLimit %q, want the default bucket in delay mode", silent.Name, r.PerNode, r.OnLimit)
	}
	if r := silent.RateLimits; r.PerNamespace != nil {
		t.Errorf("perNamespace %+v, want none by default", r.PerNamespace)
	}
	explicit := cfg.Signers[2]
	if r := explicit.RateLimits; r.PerNode == nil || r.PerNode.QPS != 10 || r.PerNode.Burst != 20 || r.OnLimit != "deny" {
		t.Errorf("signer %s: perNode %+v onLimit %q, want the configured 10/s, burst 20, deny", explicit.Name, r.PerNode, r.OnLimit)
	}
}

// maxLifetime's floor: 1h for PodCertificateRequest profiles (the
// apiserver's), 2m for CertificateSigningRequest profiles.
func TestMaxLifetimeFloorByKindOfRequest(t *testing.T) {
	for _, c := range []struct {
		profile, lifetime string
		ok                bool
	}{
		{config.ProfilePodIdentity, "1h", true},
		{config.ProfilePodIdentity, "59m", false},
		{config.ProfileKubeAPIServerClientKubelet, "2m", true},
		{config.ProfileKubeAPIServerClientKubelet, "119s", false},
		{config.ProfileKubeletServing, "3m", true},
	} {
		name := "keyward.dev/x"
		if n, ok := config.KubernetesSignerNames[c.profile]; ok {
			name = n
		}
		cfg := &config.SignerConfiguration{APIVersion: config.APIVersion, Kind: config.Kind, Signers: []config.Signer{{Name: name, Profile: c.profile}}}
		cfg.Default()
		d, err := time.ParseDuration(c.lifetime)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Signers[0].MaxLifetime.Duration = d
		errs := cfg.Validate()
		bad := false
		for _, e := range errs {
			if e.Field == "signers[0].maxLifetime" {
				bad = true
			}
		}
		if bad == c.ok {
			t.Errorf("%s maxLifetime %s: errors %v, want accepted=%v", c.profile, c.lifetime, errs, c.ok)
		}
	}
}
