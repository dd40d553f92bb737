package lintgate_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"fmt"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/testsupport/lintgate"
)

// Every CA generation keyward makes (each ca init algorithm, the full set
// of ca init's certificate options, an intermediate from --csr-out) passes
// zlint's RFC 5280/5480/8813 lints without an error or a warning.
func TestLintGateCAGenerations(t *testing.T) {
	reg := lintgate.Registry(t)
	for _, g := range lintgate.Generations(t) {
		t.Run(g.Name, func(t *testing.T) {
			if len(g.Made) == 0 {
				t.Fatal("the generation lists no certificate keyward made")
			}
			for _, c := range g.Made {
				lintgate.Clean(t, reg, c)
			}
		})
	}
}

// recorder is a testing.TB that keeps what Clean reports instead of
// failing the test that checks Clean itself.
type recorder struct {
	testing.TB
	errors []string
}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}
func (r *recorder) Fatalf(format string, args ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}
func (r *recorder) Fatal(args ...any) { r.errors = append(r.errors, fmt.Sprint(args...)) }

// badCA is a CA certificate RFC 5280 forbids: its subject (and so its
// issuer) is empty.
func badCA(t *testing.T) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// The gate can fail: it names the lints a bad CA breaks; an exemption
// hides only its own lint; a stale exemption is itself reported.
func TestLintGateFailsOnABadCertificate(t *testing.T) {
	reg := lintgate.Registry(t)
	bad := badCA(t)
	const want = "e_ca_subject_field_empty"

	r := &recorder{TB: t}
	lintgate.Clean(r, reg, bad)
	if len(r.errors) != 1 || !strings.Contains(r.errors[0], want) {
		t.Fatalf("Clean of a CA without a subject reported %q, want one report naming %s", r.errors, want)
	}

	problems, err := lintgate.Problems(reg, bad)
	if err != nil {
		t.Fatal(err)
	}
	var all []lintgate.Exemption
	for name := range problems {
		all = append(all, lintgate.Exemption{Lint: name, Reason: "test"})
	}
	r = &recorder{TB: t}
	lintgate.Clean(r, reg, bad, all...)
	if len(r.errors) != 0 {
		t.Fatalf("with every problem exempted, Clean reported %q", r.errors)
	}

	r = &recorder{TB: t}
	lintgate.Clean(r, reg, bad, append(all, lintgate.Exemption{Lint: "e_sub_cert_not_is_ca", Reason: "no such problem here"})...)
	if len(r.errors) != 1 || !strings.Contains(r.errors[0], "stale") || !strings.Contains(r.errors[0], "e_sub_cert_not_is_ca") {
		t.Fatalf("Clean with an exemption for a lint that passes reported %q, want it named as stale", r.errors)
	}
}
