package app

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/signer/config"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	validation "k8s.io/apimachinery/pkg/util/validation/field"
)

// The backends section reaches the registry's options; the flag replaces
// the module allowlist; an empty section leaves every default.
func TestBackendOptionsFromConfiguration(t *testing.T) {
	b := config.Backends{
		PKCS11: config.PKCS11Backend{AllowedModules: []string{"/opt/hsm/lib.so"}, MaxSessions: 32, PoolWaitTimeout: metav1.Duration{Duration: 3 * time.Second}},
		GCPKMS: config.GCPKMSBackend{Endpoint: "kms.example.internal:443", CallTimeout: metav1.Duration{Duration: 4 * time.Second}, MaxAttempts: 3},
		AWSKMS: config.AWSKMSBackend{CallTimeout: metav1.Duration{Duration: 6 * time.Second}, MaxAttempts: 7},
	}
	o := backendOptions(b, nil)
	if !slices.Equal(o.PKCS11.AllowedModules, []string{"/opt/hsm/lib.so"}) || o.PKCS11.MaxSessions != 32 || o.PKCS11.PoolWaitTimeout != 3*time.Second {
		t.Errorf("pkcs11 options: %+v", o.PKCS11)
	}
	if len(o.GCPKMS.ClientOptions) != 1 || o.GCPKMS.CallTimeout != 4*time.Second || o.GCPKMS.Retry.MaxAttempts != 3 {
		t.Errorf("gcpkms options: %+v", o.GCPKMS)
	}
	if o.AWSKMS.CallTimeout != 6*time.Second || o.AWSKMS.Retry.MaxAttempts != 7 {
		t.Errorf("awskms options: %+v", o.AWSKMS)
	}
	if o := backendOptions(b, []string{"/flag/lib.so"}); !slices.Equal(o.PKCS11.AllowedModules, []string{"/flag/lib.so"}) {
		t.Errorf("--pkcs11-module did not replace the configured modules: %v", o.PKCS11.AllowedModules)
	}
	o = backendOptions(config.Backends{}, nil)
	if o.PKCS11.AllowedModules != nil || o.PKCS11.MaxSessions != 0 || o.GCPKMS.ClientOptions != nil || o.AWSKMS.CallTimeout != 0 {
		t.Errorf("an empty section set options: %+v", o)
	}
}

// --check-config validates a file and exits: a valid one is reported valid,
// a bad one fails naming the field, and neither starts a signer.
func TestSignerCheckConfig(t *testing.T) {
	run := func(args ...string) (string, error) {
		cmd := NewCommand()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(io.Discard)
		cmd.SetArgs(args)
		err := cmd.Execute()
		return out.String(), err
	}
	out, err := run("signer", "--check-config", "../../../signer/config/testdata/full.yaml")
	if err != nil {
		t.Fatalf("valid file: %v", err)
	}
	if !strings.Contains(out, "valid "+config.APIVersion+" "+config.Kind) {
		t.Errorf("output %q does not say the file is valid", out)
	}

	bad := filepath.Join(t.TempDir(), "bad.yaml")
	full, err := os.ReadFile("../../../signer/config/testdata/full.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, bytes.Replace(full, []byte("maxLifetime: 24h"), []byte("maxLifetime: 30m"), 1), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = run("signer", "--check-config", bad)
	if fe := fieldError(err, "signers[0].maxLifetime"); fe == nil || fe.Type != validation.ErrorTypeInvalid {
		t.Fatalf("bad file: got %v, want a field.Error of type %s for signers[0].maxLifetime", err, validation.ErrorTypeInvalid)
	}
}

// fieldError finds the *field.Error for path in err, which is one or wraps
// one, or wraps an aggregate of them (field.ErrorList.ToAggregate).
func fieldError(err error, path string) *validation.Error {
	errs := []error{err}
	var agg utilerrors.Aggregate
	if errors.As(err, &agg) {
		errs = agg.Errors()
	}
	for _, e := range errs {
		var fe *validation.Error
		if errors.As(e, &fe) && fe.Field == path {
			return fe
		}
	}
	return nil
}
