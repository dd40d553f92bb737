// Package lintgate runs zlint over a certificate keyward issues and reports
// every result of warning level or worse. Tests of every package that makes
// certificates (profiles, CSR signers, CA generations, the registry token
// chain) call Clean, so one list of lint sources and one list of
// exemptions applies to all of them.
package lintgate

import (
	"crypto/x509"
	"fmt"
	"slices"
	"strings"
	"testing"

	zx509 "github.com/zmap/zcrypto/x509"
	"github.com/zmap/zlint/v3"
	"github.com/zmap/zlint/v3/lint"
)

// Sources are the zlint sources that apply to a private PKI: the IETF
// profiles of X.509 and its key algorithms. CA/Browser Forum, Mozilla,
// Apple and ETSI rules are for publicly trusted certificates, which keyward
// never issues.
var Sources = lint.SourceList{lint.RFC5280, lint.RFC5480, lint.RFC8813}

// Exemption lets one named lint fail for one certificate, with the reason
// written where the certificate is linted. An exemption whose lint passes
// is itself a failure, so it cannot outlive the problem it names.
type Exemption struct {
	Lint   string
	Reason string
}

// Registry is zlint's registry filtered to Sources. It fails t when the
// filter leaves no lint: a renamed source would otherwise lint nothing and
// pass.
func Registry(t testing.TB) lint.Registry {
	t.Helper()
	reg, err := lint.GlobalRegistry().Filter(lint.FilterOptions{IncludeSources: Sources})
	if err != nil {
		t.Fatalf("filtering zlint's registry to %v: %v", Sources, err)
	}
	if len(reg.Names()) == 0 {
		t.Fatalf("no zlint lints for sources %v", Sources)
	}
	return reg
}

// Problems maps the name of every lint of reg that c fails at warning
// level or worse to "name (status): details".
func Problems(reg lint.Registry, c *x509.Certificate) (bad map[string]string, err error) {
	zc, err := zx509.ParseCertificate(c.Raw)
	if err != nil {
		return nil, fmt.Errorf("zcrypto cannot parse the certificate %q: %w", c.Subject, err)
	}
	bad = map[string]string{}
	for name, r := range zlint.LintCertificateEx(zc, reg).Results {
		if r.Status >= lint.Warn {
			bad[name] = fmt.Sprintf("%s (%s): %s", name, r.Status, r.Details)
		}
	}
	return bad, nil
}

// Clean fails t naming every zlint problem of c (warning or worse) that
// exempt does not cover, and every exemption that covered nothing.
func Clean(t testing.TB, reg lint.Registry, c *x509.Certificate, exempt ...Exemption) {
	t.Helper()
	bad, err := Problems(reg, c)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range exempt {
		if _, ok := bad[e.Lint]; !ok {
			t.Errorf("zlint exemption for %s (%s) is stale: the lint passes for %q; remove it", e.Lint, e.Reason, c.Subject)
		}
		delete(bad, e.Lint)
	}
	if len(bad) == 0 {
		return
	}
	lines := make([]string, 0, len(bad))
	for _, l := range bad {
		lines = append(lines, l)
	}
	slices.Sort(lines)
	t.Errorf("zlint %v found %d problems in %q:\n  %s", Sources, len(lines), c.Subject, strings.Join(lines, "\n  "))
}
