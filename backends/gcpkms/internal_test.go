package gcpkms

import (
	"errors"
	"testing"

	"cloud.google.com/go/kms/apiv1/kmspb"
	"github.com/keyward/keyward/backends"
)

func TestEveryCloudKMSAlgorithmMapsToItsKeywardAlgorithmOrIsRefused(t *testing.T) {
	want := map[string]backends.Algorithm{
		"EC_SIGN_P256_SHA256":        backends.ECDSAP256SHA256,
		"EC_SIGN_P384_SHA384":        backends.ECDSAP384SHA384,
		"EC_SIGN_ED25519":            backends.Ed25519,
		"RSA_SIGN_PKCS1_2048_SHA256": backends.RSA2048PKCS1SHA256,
		"RSA_SIGN_PKCS1_3072_SHA256": backends.RSA3072PKCS1SHA256,
		"RSA_SIGN_PKCS1_4096_SHA256": backends.RSA4096PKCS1SHA256,
		"RSA_SIGN_PKCS1_4096_SHA512": backends.RSA4096PKCS1SHA512,
		"RSA_SIGN_PSS_2048_SHA256":   backends.RSA2048PSSSHA256,
		"RSA_SIGN_PSS_3072_SHA256":   backends.RSA3072PSSSHA256,
		"RSA_SIGN_PSS_4096_SHA256":   backends.RSA4096PSSSHA256,
		"RSA_SIGN_PSS_4096_SHA512":   backends.RSA4096PSSSHA512,
	}
	for n, name := range kmspb.CryptoKeyVersion_CryptoKeyVersionAlgorithm_name {
		kalg := kmsAlgorithm(n)
		got, err := fromKMS(kalg)
		if w, ok := want[name]; ok {
			if err != nil || got != w {
				t.Errorf("fromKMS(%s) = %q, %v; want %s", name, got, err, w)
			}
			if back, err := toKMS(w); err != nil || back != kalg {
				t.Errorf("toKMS(%s) = %s, %v; want %s", w, back, err, name)
			}
			continue
		}
		if !errors.Is(err, backends.ErrUnsupportedAlgorithm) {
			t.Errorf("fromKMS(%s) = %q, %v; want ErrUnsupportedAlgorithm", name, got, err)
		}
	}
	for _, name := range []string{"EC_SIGN_SECP256K1_SHA256", "RSA_SIGN_RAW_PKCS1_2048", "HMAC_SHA256", "RSA_DECRYPT_OAEP_2048_SHA256", "GOOGLE_SYMMETRIC_ENCRYPTION"} {
		if _, ok := kmspb.CryptoKeyVersion_CryptoKeyVersionAlgorithm_value[name]; !ok {
			t.Errorf("the kmspb version in go.mod has no %s: the loop above did not check it", name)
		}
	}
	offered := map[backends.Algorithm]bool{}
	for _, w := range want {
		offered[w] = true
	}
	for _, a := range backends.AllAlgorithms() {
		if _, err := toKMS(a); !offered[a] && !errors.Is(err, backends.ErrUnsupportedAlgorithm) {
			t.Errorf("toKMS(%s) = %v, want ErrUnsupportedAlgorithm", a, err)
		}
	}
}
