package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"
)

// files names the files kubelet projects into the pod: a credential bundle
// (key and chain in one file) or a key file and a chain file, and a trust
// bundle.
type files struct {
	bundle, key, chain, trust string
}

func (f *files) register(fs *flag.FlagSet) {
	fs.StringVar(&f.bundle, "credential-bundle", "", "PEM file with the private key and the certificate chain, leaf first (a podCertificate credentialBundlePath)")
	fs.StringVar(&f.key, "key", "", "PEM private key file (a podCertificate keyPath); with --chain, instead of --credential-bundle")
	fs.StringVar(&f.chain, "chain", "", "PEM certificate chain file, leaf first (a podCertificate certificateChainPath)")
	fs.StringVar(&f.trust, "trust", "", "PEM trust bundle: the roots to verify against (a clusterTrustBundle projection)")
}

func (f *files) validate() error {
	switch {
	case f.bundle != "" && (f.key != "" || f.chain != ""):
		return errors.New("--credential-bundle and --key/--chain exclude each other")
	case f.bundle == "" && (f.key == "" || f.chain == ""):
		return errors.New("give --credential-bundle, or both --key and --chain")
	case f.trust == "":
		return errors.New("--trust is required")
	}
	return nil
}

// material is what the files held when they were read.
type material struct {
	key   crypto.PrivateKey
	chain []*x509.Certificate // leaf first
	roots []*x509.Certificate
	// sum covers every file's name and content (or read error): it changes
	// when any file does.
	sum [sha256.Size]byte
}

// load reads and parses the files. The error names the file at fault; the
// returned material is nil then, but sum is always set.
func load(f files) (*material, [sha256.Size]byte, error) {
	h := sha256.New()
	read := func(what, path string) ([]byte, error) {
		b, err := os.ReadFile(path)
		fmt.Fprintf(h, "%s\x00%d\x00", path, len(b))
		h.Write(b)
		if err != nil {
			fmt.Fprintf(h, "error\x00%v\x00", err)
			return nil, fmt.Errorf("reading the %s: %w", what, err)
		}
		return b, nil
	}
	m := &material{}
	var errs []error
	if f.bundle != "" {
		if b, err := read("credential bundle", f.bundle); err != nil {
			errs = append(errs, err)
		} else {
			m.key, m.chain, err = parseCredentials("credential bundle "+f.bundle, b, b)
			errs = append(errs, err)
		}
	} else {
		kb, kerr := read("key file", f.key)
		cb, cerr := read("chain file", f.chain)
		errs = append(errs, kerr, cerr)
		if kerr == nil {
			var err error
			m.key, _, err = parseCredentials("key file "+f.key, kb, nil)
			errs = append(errs, err)
		}
		if cerr == nil {
			var err error
			_, m.chain, err = parseCredentials("chain file "+f.chain, nil, cb)
			errs = append(errs, err)
		}
	}
	if b, err := read("trust bundle", f.trust); err != nil {
		errs = append(errs, err)
	} else if m.roots, err = parseCertificates("trust bundle "+f.trust, b); err != nil {
		errs = append(errs, err)
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	m.sum = sum
	if err := errors.Join(errs...); err != nil {
		return nil, sum, err
	}
	return m, sum, nil
}

// parseCredentials finds exactly one private key in keyPEM (unless it is
// nil) and one or more certificates in chainPEM (unless it is nil); the
// two may be the same bytes. Any other block is an error.
func parseCredentials(name string, keyPEM, chainPEM []byte) (crypto.PrivateKey, []*x509.Certificate, error) {
	var key crypto.PrivateKey
	var chain []*x509.Certificate
	src := keyPEM
	if src == nil {
		src = chainPEM
	}
	rest := src
	for i := 1; ; i++ {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		switch block.Type {
		case "CERTIFICATE":
			if chainPEM == nil {
				return nil, nil, fmt.Errorf("%s: PEM block %d is a CERTIFICATE; only the private key belongs here", name, i)
			}
			c, err := x509.ParseCertificate(block.Bytes)
			if err != nil {
				return nil, nil, fmt.Errorf("%s: certificate in PEM block %d: %w", name, i, err)
			}
			chain = append(chain, c)
		case "PRIVATE KEY", "EC PRIVATE KEY", "RSA PRIVATE KEY":
			if keyPEM == nil {
				return nil, nil, fmt.Errorf("%s: PEM block %d is a %s; only certificates belong here", name, i, block.Type)
			}
			if key != nil {
				return nil, nil, fmt.Errorf("%s: PEM block %d is a second private key", name, i)
			}
			k, err := parseKey(block)
			if err != nil {
				return nil, nil, fmt.Errorf("%s: %s in PEM block %d: %w", name, block.Type, i, err)
			}
			key = k
		default:
			return nil, nil, fmt.Errorf("%s: PEM block %d has unexpected type %q", name, i, block.Type)
		}
	}
	if keyPEM != nil && key == nil {
		return nil, nil, fmt.Errorf("%s: no private key PEM block", name)
	}
	if chainPEM != nil && len(chain) == 0 {
		return nil, nil, fmt.Errorf("%s: no CERTIFICATE PEM block", name)
	}
	return key, chain, nil
}

func parseKey(block *pem.Block) (crypto.PrivateKey, error) {
	switch block.Type {
	case "EC PRIVATE KEY":
		return x509.ParseECPrivateKey(block.Bytes)
	case "RSA PRIVATE KEY":
		return x509.ParsePKCS1PrivateKey(block.Bytes)
	default:
		return x509.ParsePKCS8PrivateKey(block.Bytes)
	}
}

func parseCertificates(name string, b []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	for i := 1; ; i++ {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("%s: PEM block %d has type %q, want CERTIFICATE", name, i, block.Type)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%s: certificate in PEM block %d: %w", name, i, err)
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, fmt.Errorf("%s: no CERTIFICATE PEM block", name)
	}
	return certs, nil
}

// keyMatches says whether the private key belongs to the leaf.
func (m *material) keyMatches() error {
	s, ok := m.key.(crypto.Signer)
	if !ok {
		return fmt.Errorf("private key of type %T cannot sign", m.key)
	}
	pub, ok := s.Public().(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(m.chain[0].PublicKey) {
		return fmt.Errorf("the private key (%s) does not match the leaf certificate's public key (%s)", keyType(s.Public()), keyType(m.chain[0].PublicKey))
	}
	return nil
}

// verifyChain verifies certs[0] with certs[1:] as intermediates against
// roots, for any extended key usage: keyward's pod profiles differ in their
// EKUs (podIdentity is client-only, spiffe both), and what the workload
// checks is the chain.
func verifyChain(certs, roots []*x509.Certificate, now time.Time) ([][]*x509.Certificate, error) {
	rootPool := x509.NewCertPool()
	for _, r := range roots {
		rootPool.AddCert(r)
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	return certs[0].Verify(x509.VerifyOptions{
		Roots: rootPool, Intermediates: inter, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	})
}

func keyType(pub crypto.PublicKey) string {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		return "ECDSA" + k.Curve.Params().Name[:1] + k.Curve.Params().Name[2:] // P-256 -> P256
	case *rsa.PublicKey:
		return fmt.Sprintf("RSA%d", k.N.BitLen())
	case ed25519.PublicKey:
		return "ED25519"
	default:
		return fmt.Sprintf("%T", pub)
	}
}

func serial(c *x509.Certificate) string { return c.SerialNumber.Text(16) }

func fingerprint(c *x509.Certificate) string {
	sum := sha256.Sum256(c.Raw)
	return hex.EncodeToString(sum[:])
}
