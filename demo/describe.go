package demo

import (
	"crypto/x509"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/signer/profile"
)

// DescribeChain prints each certificate of a chain for people: subject,
// issuer, names or PodIdentity, validity, key and serial.
func DescribeChain(w io.Writer, chain []*x509.Certificate) {
	for i, c := range chain {
		role := "leaf"
		if c.IsCA {
			role = "CA"
		}
		fmt.Fprintf(w, "[%d] %s\n", i, role)
		fmt.Fprintf(w, "    subject:   %s\n", orNone(c.Subject.String()))
		fmt.Fprintf(w, "    issuer:    %s\n", c.Issuer.String())
		fmt.Fprintf(w, "    serial:    %s\n", c.SerialNumber.Text(16))
		fmt.Fprintf(w, "    validity:  %s .. %s (%s)\n", c.NotBefore.UTC().Format(time.RFC3339), c.NotAfter.UTC().Format(time.RFC3339), c.NotAfter.Sub(c.NotBefore))
		fmt.Fprintf(w, "    key:       %s, signed with %s\n", backends.DescribeKey(c.PublicKey), c.SignatureAlgorithm)
		var sans []string
		sans = append(sans, c.DNSNames...)
		for _, u := range c.URIs {
			sans = append(sans, u.String())
		}
		if len(sans) > 0 {
			fmt.Fprintf(w, "    SANs:      %s\n", strings.Join(sans, ", "))
		}
		if pi, err := profile.ParsePodIdentity(c); err == nil {
			crit := "non-critical"
			for _, e := range c.Extensions {
				if e.Id.Equal(profile.OIDPodIdentity) && e.Critical {
					crit = "critical"
				}
			}
			fmt.Fprintf(w, "    PodIdentity (1.3.6.1.4.1.57683.1, %s):\n", crit)
			fmt.Fprintf(w, "      namespace %s, service account %s (uid %s)\n", pi.Namespace, pi.ServiceAccountName, pi.ServiceAccountUID)
			fmt.Fprintf(w, "      pod %s (uid %s), node %s (uid %s)\n", pi.PodName, pi.PodUID, pi.NodeName, pi.NodeUID)
		}
	}
}

func orNone(s string) string {
	if s == "" {
		return "(empty)"
	}
	return s
}
