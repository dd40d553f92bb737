package config_test

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/signer/tokenservice/config"
)

const exampleFile = "../../../docs/token-service-config.yaml"

const minimal = `apiVersion: keyward.dev/v1alpha1
kind: TokenServiceConfiguration
listen:
  tlsCertFile: /tls/tls.crt
  tlsKeyFile: /tls/tls.key
signerName: keyward.dev/registry-token
issuer: keyward
audience: keyward.dev/registry
registries:
- service: registry.example.com
rules:
- namespaces: ["*"]
  repositories: ["${namespace}/**"]
`

func TestTheExampleFileLoads(t *testing.T) {
	cfg, err := config.Load(exampleFile)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Registries) != 2 || len(cfg.Rules) != 3 || cfg.SignerName != "keyward.dev/registry-token" {
		t.Fatalf("decoded %+v", cfg)
	}
	if got := cfg.Registries[0].Hosts; !reflect.DeepEqual(got, []string{"registry.example.com"}) {
		t.Errorf("registries[0].hosts = %v, want the service", got)
	}
	if got := cfg.Rules[2].ServiceAccountAnnotations["keyward.dev/vendor-images"]; got != "*" {
		t.Errorf("rules[2] annotation selector = %q", got)
	}
}

func TestDefaults(t *testing.T) {
	cfg, err := config.Parse([]byte(minimal))
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"listen.address", cfg.Listen.Address, ":8443"},
		{"metricsAddress differs from the signer's :9090", cfg.MetricsAddress, ":9092"},
		{"healthAddress differs from the signer's :9091", cfg.HealthAddress, ":9093"},
		{"tokenLifetime", cfg.TokenLifetime.Duration, 5 * time.Minute},
		{"keyIdentifier", cfg.KeyIdentifier, config.KeyIdentifierX5C},
		{"reviewCacheTTL", cfg.ReviewCacheTTL.Duration, 10 * time.Second},
		{"kubeClient.qps", cfg.KubeClient.QPS, float32(300)},
		{"kubeClient.burst", cfg.KubeClient.Burst, 600},
		{"leaderElection.enabled", *cfg.LeaderElection.Enabled, true},
		{"leaderElection.namespace", cfg.LeaderElection.Namespace, "keyward"},
		{"leaderElection.leaseName", cfg.LeaderElection.LeaseName, "keyward-token-service"},
		{"leaderElection.leaseDuration", cfg.LeaderElection.LeaseDuration.Duration, 15 * time.Second},
		{"leaderElection.renewDeadline", cfg.LeaderElection.RenewDeadline.Duration, 10 * time.Second},
		{"leaderElection.retryPeriod", cfg.LeaderElection.RetryPeriod.Duration, 2 * time.Second},
		{"trustPublisher.enabled", *cfg.TrustPublisher.Enabled, true},
		{"registries[0].hosts", cfg.Registries[0].Hosts, []string{"registry.example.com"}},
		{"rules[0].serviceAccounts", cfg.Rules[0].ServiceAccounts, []string{"*"}},
		{"rules[0].actions", cfg.Rules[0].Actions, []string{"pull"}},
		{"rules[0].registries stay empty (all)", len(cfg.Rules[0].Registries), 0},
	}
	for _, c := range checks {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	t.Run("an explicit zero review cache TTL is kept", func(t *testing.T) {
		cfg, err := config.Parse([]byte(minimal + "reviewCacheTTL: 0s\n"))
		if err != nil {
			t.Fatal(err)
		}
		if cfg.ReviewCacheTTL.Duration != 0 {
			t.Errorf("reviewCacheTTL = %v, want 0 (no cache)", cfg.ReviewCacheTTL.Duration)
		}
	})
}

// Every bad input is refused with an error that names the field.
func TestBadConfigurationsNameTheField(t *testing.T) {
	base, err := os.ReadFile(exampleFile)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name      string
		from, to  string
		wantField string
	}{
		{"an unknown top-level field", "tokenLifetime: 5m", "tokenLifetime: 5m\ntokenLifetme: 3m", `"tokenLifetme"`},
		{"an unknown rule field", "- namespaces: [ci]", "- namespaces: [ci]\n  verbs: [get]", `"rules[1].verbs"`},
		{"an unknown listen field", "address: \":8443\"", "address: \":8443\"\n  port: 8443", `"listen.port"`},
		{"a field given twice", "tokenLifetime: 5m", "tokenLifetime: 5m\ntokenLifetime: 6m", `"tokenLifetime" already set`},
		{"a wrong kind", "kind: TokenServiceConfiguration", "kind: SignerConfiguration", "kind"},
		{"a wrong apiVersion", "apiVersion: keyward.dev/v1alpha1", "apiVersion: v1", "apiVersion"},
		{"a negative qps", "qps: 300", "qps: -1", "kubeClient"},
		{"leader election timings out of order", "renewDeadline: 10s", "renewDeadline: 20s", "leaderElection"},
		{"a bad backend setting", "backends: {}", "backends: {pkcs11: {allowedModules: [libsofthsm2.so]}}", "backends.pkcs11.allowedModules[0]"},
		{"a listen address without a port", `address: ":8443"`, `address: "0.0.0.0"`, "listen.address"},
		{"a metrics address with a bad port", `metricsAddress: ":9092"`, `metricsAddress: ":99999"`, "metricsAddress"},
		{"the health address equal to the metrics address", `healthAddress: ":9093"`, `healthAddress: ":9092"`, "healthAddress"},
		{"no certificate file", "tlsCertFile: /etc/keyward/tls/tls.crt", "tlsCertFile: ''", "listen.tlsCertFile"},
		{"no key file", "tlsKeyFile: /etc/keyward/tls/tls.key", "tlsKeyFile: ''", "listen.tlsKeyFile"},
		{"no signer name", "signerName: keyward.dev/registry-token", "signerName: ''", "signerName"},
		{"a signer name without a path", "signerName: keyward.dev/registry-token", "signerName: keyward.dev", "signerName"},
		{"no issuer", "issuer: keyward-token-service", "issuer: ''", "issuer"},
		{"a blank issuer", "issuer: keyward-token-service", "issuer: '  '", "issuer"},
		{"no audience", "audience: keyward.dev/registry", "audience: ''", "audience"},
		{"a token lifetime under a minute", "tokenLifetime: 5m", "tokenLifetime: 30s", "tokenLifetime"},
		{"a token lifetime over an hour", "tokenLifetime: 5m", "tokenLifetime: 2h", "tokenLifetime"},
		{"an unknown key identifier", "keyIdentifier: x5c", "keyIdentifier: jku", "keyIdentifier"},
		{"a review cache TTL over a minute", "reviewCacheTTL: 10s", "reviewCacheTTL: 5m", "reviewCacheTTL"},
		{"a negative review cache TTL", "reviewCacheTTL: 10s", "reviewCacheTTL: -1s", "reviewCacheTTL"},
		{"no registries", "- service: registry.example.com\n- service: build-cache\n  hosts: [cache.example.com:5000, cache.internal:5000]", "", "registries"},
		{"a registry without a service", "- service: build-cache", "- service: ''", "registries[1].service"},
		{"a duplicate service", "- service: build-cache", "- service: registry.example.com", "registries[1].service"},
		{"a registry audience with spaces", "audience: keyward.dev/build-cache", "audience: ' keyward.dev/cache'", "registries[1].audience"},
		{"a host that is a URL", "hosts: [cache.example.com:5000, cache.internal:5000]", "hosts: [https://cache.example.com]", "registries[1].hosts[0]"},
		{"a host named twice across registries", "hosts: [cache.example.com:5000, cache.internal:5000]", "hosts: [cache.example.com:5000, Registry.Example.com]", "registries[1].hosts[1]"},
		{"a service that is no host and no hosts listed", "- service: build-cache\n  hosts: [cache.example.com:5000, cache.internal:5000]", "- service: build cache", "registries[1].hosts"},
		{"a rule without namespaces", "- namespaces: [ci]", "- namespaces: []", "rules[1].namespaces"},
		{"a namespace that is no namespace name", "- namespaces: [ci]", "- namespaces: [CI]", "rules[1].namespaces[0]"},
		{"a service account that is no name", "serviceAccounts: [builder]", "serviceAccounts: [Builder_1]", "rules[1].serviceAccounts[0]"},
		{"an annotation key that is no key", "keyward.dev/vendor-images: \"*\"", "keyward.dev/vendor images: \"*\"", "rules[2].serviceAccountAnnotations[keyward.dev/vendor images]"},
		{"a rule naming an unknown registry", "registries: [build-cache]", "registries: [cache.example.com:5000]", "rules[1].registries[0]"},
		{"a rule without repositories", "  repositories: [vendor/**]", "  repositories: []", "rules[2].repositories"},
		{"a double star in the middle of a pattern", "repositories: [vendor/**]", "repositories: [vendor/**/x]", "rules[2].repositories[0]"},
		{"an unknown placeholder", `repositories: ["${namespace}/**", "base/*"]`, `repositories: ["${namespace}/**", "${pod}/*"]`, "rules[0].repositories[1]"},
		{"an uppercase pattern", "repositories: [vendor/**]", "repositories: [Vendor/**]", "rules[2].repositories[0]"},
		{"a question mark in a pattern", "repositories: [vendor/**]", "repositories: ['vendor/?']", "rules[2].repositories[0]"},
		{"an unknown action", "actions: [pull, push]", "actions: [pull, admin]", "rules[1].actions[1]"},
		{"a star action", "actions: [pull, push]", "actions: ['*']", "rules[1].actions[0]"},
		{"a duplicate action", "actions: [pull, push]", "actions: [pull, pull]", "rules[1].actions[1]"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if !strings.Contains(string(base), tc.from) {
				t.Fatalf("example lacks %q", tc.from)
			}
			data := strings.Replace(string(base), tc.from, tc.to, 1)
			_, err := config.Parse([]byte(data))
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), tc.wantField) {
				t.Fatalf("error %q does not name %s", err, tc.wantField)
			}
		})
	}
}

func TestNoRulesIsRefused(t *testing.T) {
	data := minimal[:strings.Index(minimal, "rules:")]
	_, err := config.Parse([]byte(data))
	if err == nil || !strings.Contains(err.Error(), "rules: Required value") {
		t.Fatalf("Parse = %v, want rules required", err)
	}
}

func TestLoad(t *testing.T) {
	t.Run("a missing file is an error that wraps the cause", func(t *testing.T) {
		_, err := config.Load(filepath.Join(t.TempDir(), "none.yaml"))
		if !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("Load = %v, want ErrNotExist", err)
		}
	})
	t.Run("an error from a file names the file", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "bad.yaml")
		if err := os.WriteFile(path, []byte(strings.Replace(minimal, "issuer: keyward", "issuer: ''", 1)), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := config.Load(path)
		if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "issuer") {
			t.Fatalf("Load = %v, want an error naming %s and issuer", err, path)
		}
	})
}

func TestRepositoryPatterns(t *testing.T) {
	cases := []struct {
		name    string
		pattern string
		valid   bool
	}{
		{"a literal name", "team/app", true},
		{"a star component", "team/*", true},
		{"a star inside a component", "team/app-*", true},
		{"a trailing double star", "team/**", true},
		{"a double star alone", "**", true},
		{"placeholders", "${namespace}/${serviceAccount}/**", true},
		{"a placeholder inside a component", "ns-${namespace}", true},
		{"an empty pattern", "", false},
		{"a bare trailing double star", "/**", false},
		{"a double star in the middle", "a/**/b", false},
		{"a double star inside a component", "a**", false},
		{"a triple star", "a/***", false},
		{"an unknown placeholder", "${podName}", false},
		{"an unclosed placeholder", "${namespace", false},
		{"a dollar sign", "a$b", false},
		{"uppercase", "Team", false},
		{"a dot-dot component", "a/../b", false},
		{"an empty component", "a//b", false},
		{"a leading slash", "/a", false},
		{"a character class", "[ab]", false},
		{"a question mark", "a?", false},
		{"a component that can match nothing", "a/-*", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := config.CheckRepositoryPattern(tc.pattern)
			if tc.valid && err != nil {
				t.Fatalf("CheckRepositoryPattern(%q) = %v", tc.pattern, err)
			}
			if !tc.valid && !errors.Is(err, config.ErrInvalidPattern) {
				t.Fatalf("CheckRepositoryPattern(%q) = %v, want ErrInvalidPattern", tc.pattern, err)
			}
		})
	}
}
