package registrytoken

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
)

// RenderTrust is certs as a registry's auth.token trust file: PEM
// (rootcertbundle) or, for format "jwks", a JWKS (jwks); what `keyward
// trust bundle` writes.
func RenderTrust(certs []*x509.Certificate, format string) ([]byte, error) {
	if format == "jwks" {
		b, err := JWKS(certs)
		if err != nil {
			return nil, err
		}
		return append(b, '\n'), nil
	}
	var buf bytes.Buffer
	for _, c := range certs {
		if err := pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw}); err != nil {
			return nil, err
		}
	}
	return buf.Bytes(), nil
}
