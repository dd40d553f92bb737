// Package servingcert makes a throwaway TLS serving certificate (for
// 127.0.0.1, or the hosts given) under a throwaway CA, as files: for the token service in the
// demo, the tests and the benchmarks, where production would use the
// cluster's usual issuer. Nothing here is for production keys.
package servingcert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Files are the written PEM files and the CA as a pool for clients.
type Files struct {
	CertFile, KeyFile, CAFile string
	Pool                      *x509.CertPool
}

// Write makes an ECDSA P-256 CA and a serving certificate for 127.0.0.1,
// valid for a day from a minute ago, and writes prefix.crt, prefix.key
// (PKCS#8, 0600) and prefix-ca.crt into dir.
func Write(dir, prefix string) (Files, error) { return WriteFor(dir, prefix, "127.0.0.1") }

// WriteFor is Write for other hosts: each an IP address or a DNS name.
func WriteFor(dir, prefix string, hosts ...string) (Files, error) {
	var ips []net.IP
	var names []string
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			ips = append(ips, ip)
		} else {
			names = append(names, h)
		}
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Files{}, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: prefix + " test CA"},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caKey.Public(), caKey)
	if err != nil {
		return Files{}, fmt.Errorf("making the serving CA: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return Files{}, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Files{}, err
	}
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: prefix},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: ips, DNSNames: names,
	}, ca, key.Public(), caKey)
	if err != nil {
		return Files{}, fmt.Errorf("making the serving certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return Files{}, err
	}
	f := Files{Pool: x509.NewCertPool()}
	f.Pool.AddCert(ca)
	for _, w := range []struct {
		path *string
		name string
		typ  string
		der  []byte
	}{
		{&f.CAFile, prefix + "-ca.crt", "CERTIFICATE", caDER},
		{&f.CertFile, prefix + ".crt", "CERTIFICATE", der},
		{&f.KeyFile, prefix + ".key", "PRIVATE KEY", keyDER},
	} {
		*w.path = filepath.Join(dir, w.name)
		if err := os.WriteFile(*w.path, pem.EncodeToMemory(&pem.Block{Type: w.typ, Bytes: w.der}), 0o600); err != nil {
			return Files{}, err
		}
	}
	return f, nil
}
