// Package kmstest holds the test helpers that the Cloud KMS and AWS KMS
// backends' tests share.
package kmstest

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/keyward/keyward/backends"
)

// Digest is what SignContext takes for alg over msg: msg's digest, or for
// Ed25519 msg itself.
func Digest(alg backends.Algorithm, msg string) []byte {
	if alg.Hash() == 0 {
		return []byte(msg)
	}
	h := alg.Hash().New()
	h.Write([]byte(msg))
	return h.Sum(nil)
}

// CheckError fails t unless err matches want (errors.Is), is exactly one of
// transient and permanent, is a *backends.Error, and blames part when part
// is not empty.
func CheckError(t testing.TB, err, want error, part string) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("got %v, want %v", err, want)
	}
	if backends.IsTransient(err) == errors.Is(err, backends.ErrPermanent) {
		t.Errorf("error %v is transient: %v, permanent: %v; want exactly one", err, backends.IsTransient(err), errors.Is(err, backends.ErrPermanent))
	}
	var be *backends.Error
	if !errors.As(err, &be) {
		t.Fatalf("error %v is a %T, not a *backends.Error", err, err)
	}
	if part != "" && be.Part != part {
		t.Errorf("error %v blames part %q, want %q", err, be.Part, part)
	}
}

// AWSEnv makes the AWS SDK's default credential chain, as a command reads
// it, find accessKeyID and secret in the environment and nothing else: no
// shared files, no instance metadata.
func AWSEnv(t testing.TB, accessKeyID, secret string) {
	t.Helper()
	t.Setenv("AWS_ACCESS_KEY_ID", accessKeyID)
	t.Setenv("AWS_SECRET_ACCESS_KEY", secret)
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(t.TempDir(), "none"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(t.TempDir(), "none"))
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
}
