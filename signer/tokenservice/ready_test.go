package tokenservice

import (
	"crypto"
	"crypto/sha256"
	"errors"
	"testing"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/signer"
	"github.com/keyward/keyward/testsupport/testca"
)

// fakeGens is the part of generations.Manager /readyz reads.
type fakeGens struct {
	err  error
	keys []backends.Signer
}

func (f *fakeGens) Err() error              { return f.err }
func (f *fakeGens) Keys() []backends.Signer { return f.keys }

// TestReadyzReportsAKeyBackendThatFails: with an Active generation whose
// key is open but whose backend fails every signature (an HSM down for
// minutes), the replica is not ready, as the signer is not: a Service
// then sends pulls to replicas that can sign.
func TestReadyzReportsAKeyBackendThatFails(t *testing.T) {
	auth, _ := testca.New(t)
	guarded, err := signer.GuardKey(&failingSigner{Signer: auth.Signer().(backends.Signer)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = guarded.Close() })
	g := &fakeGens{keys: []backends.Signer{guarded}}
	if err := readiness(g); err != nil {
		t.Fatalf("before any signature: %v, want ready", err)
	}
	d := sha256.Sum256([]byte("x"))
	if _, err := guarded.SignContext(t.Context(), d[:], crypto.SHA256); !errors.Is(err, errBackend) {
		t.Fatalf("signature: %v, want the backend's error", err)
	}
	if err := readiness(g); err == nil {
		t.Error("ready with a key whose backend failed its last signature")
	}
}
