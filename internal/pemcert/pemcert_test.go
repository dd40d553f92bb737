package pemcert

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

func TestParse(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ca"},
		NotBefore: time.Unix(0, 0), NotAfter: time.Unix(1<<31, 0), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	other := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{1}})
	for _, tc := range []struct {
		name    string
		data    []byte
		want    int
		wantErr bool
	}{
		{name: "blank data holds no certificate", data: []byte(" \n"), want: 0},
		{name: "two blocks parse in order", data: append(append([]byte{}, cert...), cert...), want: 2},
		{name: "a block of another type is refused", data: append(append([]byte{}, cert...), other...), wantErr: true},
		{name: "text without a PEM block is refused", data: []byte("not pem"), wantErr: true},
		{name: "a CERTIFICATE block that is not DER is refused", data: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{1}}), wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse(tc.data)
			if (err != nil) != tc.wantErr {
				t.Fatalf("Parse: error %v, want error %v", err, tc.wantErr)
			}
			if len(got) != tc.want {
				t.Fatalf("Parse: %d certificates, want %d", len(got), tc.want)
			}
			for _, c := range got {
				if !bytes.Equal(c.Raw, der) {
					t.Fatal("Parse returned a certificate other than the one encoded")
				}
			}
		})
	}
}
