package pcr

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keyward/keyward/signer/profile"
	"github.com/keyward/keyward/testsupport/testkeys"
	certv1beta1 "k8s.io/api/certificates/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
)

const popPodUID = "7b1e0c6a-3f0e-4f52-9d7e-2f6a1c9b8e11"

// v1beta1PKIX is a v1beta1 request in the pkixPublicKey form with the given
// proof.
func v1beta1PKIX(t *testing.T, pub crypto.PublicKey, proof []byte) *certv1beta1.PodCertificateRequest {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return &certv1beta1.PodCertificateRequest{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "pcr", UID: "pcr-uid"},
		Spec: certv1beta1.PodCertificateRequestSpec{
			SignerName: "keyward.dev/unit", PodName: "pod", PodUID: popPodUID,
			ServiceAccountName: "sa", ServiceAccountUID: "sa-uid", NodeName: "node", NodeUID: "node-uid",
			PKIXPublicKey: der, ProofOfPossession: proof,
		},
	}
}

// kubeletProof signs podUID as kubelets before 1.37 do.
func kubeletProof(t *testing.T, key crypto.Signer, podUID string) []byte {
	t.Helper()
	sig, err := testkeys.ProofOfPossession(key, podUID)
	if err != nil {
		t.Fatal(err)
	}
	return sig
}

func TestV1beta1ProofOfPossession(t *testing.T) {
	var pool, otherPool testkeys.Pool
	get := func(p *testkeys.Pool, shape string) crypto.Signer {
		k, err := p.Get(shape)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	key := func(shape string) crypto.Signer { return get(&pool, shape) }
	other := func(shape string) crypto.Signer { return get(&otherPool, shape) }
	type tc struct {
		name       string
		key        crypto.Signer
		proof      func(t *testing.T, key crypto.Signer) []byte
		wantReason string // "": the key is accepted
	}
	var cases []tc
	for _, shape := range []string{testkeys.Ed25519, testkeys.P256, testkeys.P384, testkeys.P521, testkeys.RSA3072, testkeys.RSA4096} {
		cases = append(cases,
			tc{name: shape + ": a proof signed as kubelet signs is accepted", key: key(shape),
				proof: func(t *testing.T, k crypto.Signer) []byte { return kubeletProof(t, k, popPodUID) }},
			tc{name: shape + ": a proof over another pod's UID is denied", key: key(shape),
				proof:      func(t *testing.T, k crypto.Signer) []byte { return kubeletProof(t, k, "another-pod-uid") },
				wantReason: ReasonInvalidProofOfPossession},
			tc{name: shape + ": a proof made by another key is denied", key: key(shape),
				proof: func(t *testing.T, _ crypto.Signer) []byte {
					otherShape := shape
					if shape == testkeys.RSA4096 {
						otherShape = testkeys.RSA3072 // spares a second 4096-bit key
					}
					return kubeletProof(t, other(otherShape), popPodUID)
				},
				wantReason: ReasonInvalidProofOfPossession},
			tc{name: shape + ": an empty proof is denied", key: key(shape),
				proof:      func(*testing.T, crypto.Signer) []byte { return nil },
				wantReason: ReasonInvalidProofOfPossession},
			tc{name: shape + ": a proof with one bit flipped is denied", key: key(shape),
				proof: func(t *testing.T, k crypto.Signer) []byte {
					p := kubeletProof(t, k, popPodUID)
					p[len(p)/2] ^= 1
					return p
				},
				wantReason: ReasonInvalidProofOfPossession},
		)
	}
	digest := sha256.Sum256([]byte(popPodUID))
	cases = append(cases,
		tc{name: "Ed25519 over the SHA-256 digest instead of the UID's bytes is denied", key: key(testkeys.Ed25519),
			proof: func(t *testing.T, k crypto.Signer) []byte {
				return ed25519.Sign(k.(ed25519.PrivateKey), digest[:])
			},
			wantReason: ReasonInvalidProofOfPossession},
		tc{name: "ECDSA over the UID's bytes instead of their digest is denied", key: key(testkeys.P256),
			proof: func(t *testing.T, k crypto.Signer) []byte {
				sig, err := ecdsa.SignASN1(rand.Reader, k.(*ecdsa.PrivateKey), []byte(popPodUID))
				if err != nil {
					t.Fatal(err)
				}
				return sig
			},
			wantReason: ReasonInvalidProofOfPossession},
		tc{name: "RSA with PKCS#1 v1.5 padding instead of PSS is denied", key: key(testkeys.RSA3072),
			proof: func(t *testing.T, k crypto.Signer) []byte {
				sig, err := rsa.SignPKCS1v15(rand.Reader, k.(*rsa.PrivateKey), crypto.SHA256, digest[:])
				if err != nil {
					t.Fatal(err)
				}
				return sig
			},
			wantReason: ReasonInvalidProofOfPossession},
		tc{name: "RSA-PSS with the salt as long as the hash is accepted (the verifier detects the salt length)", key: key(testkeys.RSA3072),
			proof: func(t *testing.T, k crypto.Signer) []byte {
				sig, err := rsa.SignPSS(rand.Reader, k.(*rsa.PrivateKey), crypto.SHA256, digest[:], &rsa.PSSOptions{SaltLength: rsa.PSSSaltLengthEqualsHash})
				if err != nil {
					t.Fatal(err)
				}
				return sig
			}},
	)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := decodeV1beta1(v1beta1PKIX(t, c.key.Public(), c.proof(t, c.key)))
			if c.wantReason == "" {
				if r.keyErr != nil {
					t.Fatalf("key refused: %v", r.keyErr)
				}
				if !c.key.Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(r.publicKey) {
					t.Fatal("decoded key is not the requested key")
				}
				return
			}
			var d *profile.Denial
			if !errors.As(r.keyErr, &d) {
				t.Fatalf("keyErr %v, want a *profile.Denial", r.keyErr)
			}
			if d.Reason != c.wantReason {
				t.Fatalf("reason %s (%s), want %s", d.Reason, d.Message, c.wantReason)
			}
			if r.publicKey != nil {
				t.Fatal("a key whose possession is not proven is still returned")
			}
		})
	}

	t.Run("a key type without a proof scheme (X25519) is denied UnsupportedKeyType", func(t *testing.T) {
		k, err := ecdh.X25519().GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		r := decodeV1beta1(v1beta1PKIX(t, k.PublicKey(), []byte("proof")))
		var d *profile.Denial
		if !errors.As(r.keyErr, &d) || d.Reason != ReasonUnsupportedKeyType {
			t.Fatalf("keyErr %v, want an UnsupportedKeyType denial", r.keyErr)
		}
	})
}

// A signer reading through v1beta1 whose apiserver stops serving it says
// what to do, at the default verbosity.
func TestV1beta1NoLongerServedSaysRestart(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	defer srv.Close()
	client := kubernetes.NewForConfigOrDie(&rest.Config{Host: srv.URL})
	inf := v1beta1API{client}.newInformer("keyward.dev/unit")
	var logged syncBuffer
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(),
		textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(&logged)))))
	defer cancel()
	go inf.RunWithContext(ctx)
	err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return strings.Contains(logged.String(), "restart keyward to read them through v1"), nil
	})
	if err != nil {
		t.Fatalf("no advice to restart logged: %v\n%s", err, logged.String())
	}
}

// syncBuffer is a bytes.Buffer safe for a logger and a reader at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
