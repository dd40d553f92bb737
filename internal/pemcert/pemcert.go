// Package pemcert parses PEM certificate lists. It is a leaf package so that
// both the CA rules (ca/) and trustpublisher can use it
// without importing each other.
package pemcert

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
)

// Parse parses every CERTIFICATE block of data, in order; any other block
// is an error (a private key never belongs in a chain). Data that holds no
// PEM block but is not blank is an error; blank data is no certificate.
func Parse(data []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("a %s block where only CERTIFICATE blocks belong", b.Type)
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	if len(bytes.TrimSpace(data)) > 0 && len(out) == 0 {
		return nil, errors.New("no PEM data")
	}
	return out, nil
}
