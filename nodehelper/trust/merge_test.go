package trust

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"testing"
	"time"
)

func testCert(t testing.TB, cn string) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

func pemOf(der []byte, headers map[string]string) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Headers: headers, Bytes: der}))
}

// ders returns the DER of each block of a merged file and fails on
// anything but bare CERTIFICATE blocks back to back.
func ders(t *testing.T, data []byte) [][]byte {
	t.Helper()
	var out [][]byte
	for rest := data; len(rest) > 0; {
		block, r := pem.Decode(rest)
		if block == nil {
			t.Fatalf("data outside PEM blocks: %q", rest)
		}
		if block.Type != "CERTIFICATE" || len(block.Headers) != 0 {
			t.Fatalf("block %s with headers %v", block.Type, block.Headers)
		}
		if !bytes.Equal(pem.EncodeToMemory(block), rest[:len(rest)-len(r)]) {
			t.Fatalf("block not in canonical form: %q", rest[:len(rest)-len(r)])
		}
		out = append(out, block.Bytes)
		rest = r
	}
	return out
}

func TestMerge(t *testing.T) {
	a, b, c := testCert(t, "a"), testCert(t, "b"), testCert(t, "c")
	sorted := sortedOf(a, b, c)
	junk := "# comment between blocks\nsome text\n\n"
	tests := []struct {
		name    string
		bundles []string
		want    [][]byte
	}{
		{
			name:    "one bundle with text between and around blocks gives bare blocks only",
			bundles: []string{junk + pemOf(a, nil) + junk + pemOf(b, nil) + junk + pemOf(c, nil) + junk},
			want:    sorted,
		},
		{
			name:    "PEM headers are dropped",
			bundles: []string{pemOf(a, map[string]string{"Comment": "old root"}) + pemOf(b, map[string]string{"X-Source": "ctb"})},
			want:    sortedOf(a, b),
		},
		{
			name:    "a certificate in two bundles and twice in one is written once",
			bundles: []string{pemOf(a, nil) + pemOf(a, nil), pemOf(b, nil) + junk + pemOf(a, map[string]string{"K": "v"})},
			want:    sortedOf(a, b),
		},
		{
			name:    "blocks that are not certificates are dropped",
			bundles: []string{string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{1, 2}})) + pemOf(c, nil)},
			want:    [][]byte{c},
		},
		{
			name:    "bundles with no certificate give no file",
			bundles: []string{junk, "", string(pem.EncodeToMemory(&pem.Block{Type: "X509 CRL", Bytes: []byte{1}}))},
			want:    nil,
		},
		{
			name:    "no bundles give no file",
			bundles: nil,
			want:    nil,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var in [][]byte
			for _, s := range tc.bundles {
				in = append(in, []byte(s))
			}
			got := Merge(in...)
			if tc.want == nil {
				if got != nil {
					t.Fatalf("got %q, want nil", got)
				}
				return
			}
			gotDERs := ders(t, got)
			if len(gotDERs) != len(tc.want) {
				t.Fatalf("got %d certificates, want %d", len(gotDERs), len(tc.want))
			}
			for i := range gotDERs {
				if !bytes.Equal(gotDERs[i], tc.want[i]) {
					t.Fatalf("certificate %d differs from the expected order", i)
				}
			}
		})
	}
}

func sortedOf(ds ...[]byte) [][]byte {
	for i := range ds {
		for j := i + 1; j < len(ds); j++ {
			if bytes.Compare(ds[j], ds[i]) < 0 {
				ds[i], ds[j] = ds[j], ds[i]
			}
		}
	}
	return ds
}

// The file is the same whatever the order of bundles and of blocks in
// them, so a relist or a reordered bundle rewrites nothing.
func TestMergeOrderIsStable(t *testing.T) {
	a, b, c := testCert(t, "a"), testCert(t, "b"), testCert(t, "c")
	want := Merge([]byte(pemOf(a, nil)+pemOf(b, nil)), []byte(pemOf(c, nil)))
	for _, in := range [][]string{
		{pemOf(c, nil), pemOf(b, nil) + pemOf(a, nil)},
		{pemOf(b, nil) + "junk\n" + pemOf(c, nil) + pemOf(a, nil)},
		{pemOf(a, nil), pemOf(c, nil), pemOf(b, nil), pemOf(a, nil)},
	} {
		var bs [][]byte
		for _, s := range in {
			bs = append(bs, []byte(s))
		}
		if got := Merge(bs...); !bytes.Equal(got, want) {
			t.Fatalf("merge of a reordered input differs:\n%s\nwant\n%s", got, want)
		}
	}
}
