// Package ca holds keyward's CA certificate rules, below both the signer and
// the trust publisher: it builds a self-signed root or a PKCS#10 request for
// an external root with a backend key, and holds the checks a CA
// certificate and chain must pass (strength, path length, chain links,
// lifetime long enough for a rotation) and the key identifiers (SKI/AKI)
// leaves and CAs carry. `keyward ca init|import`, signer/authority and the
// trust publisher all use it. It knows nothing about Kubernetes.
package ca

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"slices"
	"strings"
	"time"

	"github.com/keyward/keyward/backends"
	"golang.org/x/crypto/cryptobyte"
	cbasn1 "golang.org/x/crypto/cryptobyte/asn1"
)

// Limits on what keyward accepts as a CA.
const (
	// MinRSABits is the smallest RSA modulus accepted (the apiserver itself
	// refuses RSA subject keys below 3072 bits).
	MinRSABits = 3072
	// MaxPathLen is the largest basicConstraints path length accepted: 0
	// (the CA signs leaves only) or 1.
	MaxPathLen = 1
	// MaxLifetime is the longest CA lifetime accepted.
	MaxLifetime = 20 * 365 * 24 * time.Hour
	// Backdate moves a self-signed root's notBefore into the past, for
	// clock skew between the machine that signs and the cluster.
	Backdate = 5 * time.Minute
)

// ErrWeak is matched (errors.Is) by a *WeakError.
var ErrWeak = errors.New("weak CA parameter")

// WeakError names a CA parameter keyward refuses and why.
type WeakError struct {
	// What is the parameter, e.g. "key", "path length", "signature algorithm".
	What string
	// Reason says what was found and what is accepted.
	Reason string
}

func (e *WeakError) Error() string        { return fmt.Sprintf("refusing %s: %s", e.What, e.Reason) }
func (e *WeakError) Is(target error) bool { return target == ErrWeak }

// ErrLifetimeTooShort is matched (errors.Is) by a *LifetimeError.
var ErrLifetimeTooShort = errors.New("CA lifetime too short for a rotation")

// Windows are the rotation gates a CA must live through besides its
// leaves' lifetime (an Authority's spec.gates).
type Windows struct {
	CanarySoak        time.Duration
	PropagationWindow time.Duration
}

// Counts of each window in the shortest rotation a CA must outlive: its own
// way in (Staged soak, then a propagation window before Promoted and one
// before Active) and its successor's, during which it still issues.
const (
	soaksPerRotation        = 2
	propagationsPerRotation = 4
)

// Total is the time the rotation windows take: the canary soak twice and
// the propagation window four times (this generation's way from Staged to
// Active, and its successor's, while this one still issues).
func (w Windows) Total() time.Duration {
	return soaksPerRotation*w.CanarySoak + propagationsPerRotation*w.PropagationWindow
}

func (w Windows) String() string {
	return fmt.Sprintf("canary soak %s ×%d, propagation window %s ×%d",
		w.CanarySoak, soaksPerRotation, w.PropagationWindow, propagationsPerRotation)
}

// MinCALifetime is the shortest CA lifetime that lets a leaf of leafMax be
// issued until the successor is Active, through the rotation windows w.
func MinCALifetime(leafMax time.Duration, w Windows) time.Duration {
	return leafMax + w.Total()
}

// LifetimeError says a CA lives too short for leaves of LeafMax and a
// rotation through Windows, or too long.
type LifetimeError struct {
	// Lifetime is the CA's (remaining) lifetime.
	Lifetime time.Duration
	LeafMax  time.Duration
	Windows  Windows
	// TooLong is set when Lifetime exceeds MaxLifetime.
	TooLong bool
}

func (e *LifetimeError) Error() string {
	if e.TooLong {
		return fmt.Sprintf("CA lifetime %s is longer than the maximum %s", e.Lifetime, MaxLifetime)
	}
	return fmt.Sprintf("CA lifetime %s is shorter than leaf maximum %s + rotation windows %s (%s) = %s",
		e.Lifetime, e.LeafMax, e.Windows.Total(), e.Windows, MinCALifetime(e.LeafMax, e.Windows))
}

// Is matches ErrLifetimeTooShort (not for TooLong, which matches ErrWeak).
func (e *LifetimeError) Is(target error) bool {
	if e.TooLong {
		return target == ErrWeak
	}
	return target == ErrLifetimeTooShort
}

// CheckLifetime refuses a CA lifetime shorter than MinCALifetime(leafMax, w)
// or longer than MaxLifetime.
func CheckLifetime(lifetime, leafMax time.Duration, w Windows) error {
	if lifetime > MaxLifetime {
		return &LifetimeError{Lifetime: lifetime, LeafMax: leafMax, Windows: w, TooLong: true}
	}
	if lifetime < MinCALifetime(leafMax, w) {
		return &LifetimeError{Lifetime: lifetime, LeafMax: leafMax, Windows: w}
	}
	return nil
}

// CheckKey refuses a CA public key that is too weak: RSA below MinRSABits,
// an elliptic curve below P-256. Ed25519 is accepted.
func CheckKey(pub crypto.PublicKey) error {
	switch k := pub.(type) {
	case *rsa.PublicKey:
		if n := k.N.BitLen(); n < MinRSABits {
			return &WeakError{What: "key", Reason: fmt.Sprintf("RSA %d bits is below %d", n, MinRSABits)}
		}
	case *ecdsa.PublicKey:
		if n := k.Curve.Params().BitSize; n < 256 {
			return &WeakError{What: "key", Reason: fmt.Sprintf("curve %s (%d bits) is below P-256", k.Curve.Params().Name, n)}
		}
	case ed25519.PublicKey:
	default:
		return &WeakError{What: "key", Reason: fmt.Sprintf("key type %T is not RSA, ECDSA or Ed25519", pub)}
	}
	return nil
}

// checkSignatureAlgorithm refuses SHA-1 and MD5 signatures.
func checkSignatureAlgorithm(c *x509.Certificate) error {
	switch c.SignatureAlgorithm {
	case x509.MD2WithRSA, x509.MD5WithRSA, x509.SHA1WithRSA, x509.DSAWithSHA1, x509.DSAWithSHA256, x509.ECDSAWithSHA1, x509.UnknownSignatureAlgorithm:
		return &WeakError{What: "signature algorithm", Reason: fmt.Sprintf("certificate %q is signed with %s", c.Subject, c.SignatureAlgorithm)}
	}
	return nil
}

// Options describe a CA certificate (self-signed) or the request for one.
type Options struct {
	Subject pkix.Name
	// Lifetime is how long a self-signed root is valid from now (its
	// notBefore is Backdate earlier). Ignored for a request.
	Lifetime time.Duration
	// PathLen is the basicConstraints path length: 0 (leaves only) or 1.
	PathLen int
	// PermittedDNS and ExcludedDNS become a critical name constraints
	// extension when either is set.
	PermittedDNS, ExcludedDNS []string
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Validate checks what does not depend on the key.
func (o Options) Validate() error {
	if o.Subject.CommonName == "" && len(o.Subject.Organization) == 0 {
		return errors.New("a CA needs a subject: set at least a common name")
	}
	if o.PathLen < 0 || o.PathLen > MaxPathLen {
		return &WeakError{What: "path length", Reason: fmt.Sprintf("%d is not 0 or %d", o.PathLen, MaxPathLen)}
	}
	for _, d := range append(append([]string{}, o.PermittedDNS...), o.ExcludedDNS...) {
		if d == "" || strings.ContainsAny(d, " */") {
			return fmt.Errorf("name constraint %q is not a DNS name or .suffix", d)
		}
	}
	return nil
}

// SelfSign makes a root CA certificate for signer's key, signed by it:
// basicConstraints CA:TRUE (critical) with o.PathLen, keyUsage
// keyCertSign|cRLSign (critical), a subject key id (RFC 7093 method 1),
// and name constraints if o has any. It refuses a weak key or options
// (ErrWeak); the lifetime against a rotation is the caller's to check
// (CheckLifetime).
func SelfSign(ctx context.Context, signer backends.Signer, o Options) (*x509.Certificate, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.Lifetime <= 0 {
		return nil, errors.New("a root CA needs a positive lifetime")
	}
	if o.Lifetime > MaxLifetime {
		return nil, &LifetimeError{Lifetime: o.Lifetime, TooLong: true}
	}
	if err := CheckKey(signer.Public()); err != nil {
		return nil, err
	}
	now := time.Now
	if o.Now != nil {
		now = o.Now
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	skid, err := SubjectKeyID(signer.Public())
	if err != nil {
		return nil, err
	}
	t := now()
	tmpl := &x509.Certificate{
		SerialNumber:                serial,
		Subject:                     o.Subject,
		NotBefore:                   t.Add(-Backdate).Truncate(time.Second),
		NotAfter:                    t.Add(o.Lifetime).Truncate(time.Second),
		KeyUsage:                    x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid:       true,
		IsCA:                        true,
		MaxPathLen:                  o.PathLen,
		MaxPathLenZero:              o.PathLen == 0,
		SubjectKeyId:                skid,
		SignatureAlgorithm:          signer.SignatureAlgorithm(),
		PermittedDNSDomains:         o.PermittedDNS,
		ExcludedDNSDomains:          o.ExcludedDNS,
		PermittedDNSDomainsCritical: len(o.PermittedDNS)+len(o.ExcludedDNS) > 0,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, signer.Public(), &contextSigner{ctx: ctx, s: signer})
	if err != nil {
		return nil, fmt.Errorf("self-signing root %q with %s: %w", o.Subject, signer.URI(), err)
	}
	return x509.ParseCertificate(der)
}

// Extension OIDs requested in a CSR.
var (
	oidBasicConstraints = asn1.ObjectIdentifier{2, 5, 29, 19}
	oidKeyUsage         = asn1.ObjectIdentifier{2, 5, 29, 15}
	oidNameConstraints  = asn1.ObjectIdentifier{2, 5, 29, 30}
)

// CreateCSR makes a PKCS#10 request, signed by signer's key, for an
// intermediate CA certificate as o describes it: it requests (in the
// extensionRequest attribute) basicConstraints CA:TRUE with o.PathLen,
// keyUsage keyCertSign|cRLSign and o's name constraints, all critical. The
// external CA decides what it grants; ca import checks it. It returns DER.
func CreateCSR(ctx context.Context, signer backends.Signer, o Options) ([]byte, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if err := CheckKey(signer.Public()); err != nil {
		return nil, err
	}
	bc, err := asn1.Marshal(struct {
		IsCA       bool
		MaxPathLen int
	}{true, o.PathLen})
	if err != nil {
		return nil, fmt.Errorf("encoding basicConstraints: %w", err)
	}
	// keyCertSign (bit 5) and cRLSign (bit 6), most significant bit first.
	ku, err := asn1.Marshal(asn1.BitString{Bytes: []byte{0x06}, BitLength: 7})
	if err != nil {
		return nil, fmt.Errorf("encoding keyUsage: %w", err)
	}
	exts := []pkix.Extension{
		{Id: oidBasicConstraints, Critical: true, Value: bc},
		{Id: oidKeyUsage, Critical: true, Value: ku},
	}
	if len(o.PermittedDNS)+len(o.ExcludedDNS) > 0 {
		nc, err := marshalNameConstraints(o.PermittedDNS, o.ExcludedDNS)
		if err != nil {
			return nil, err
		}
		exts = append(exts, pkix.Extension{Id: oidNameConstraints, Critical: true, Value: nc})
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject:            o.Subject,
		SignatureAlgorithm: signer.SignatureAlgorithm(),
		ExtraExtensions:    exts,
	}, &contextSigner{ctx: ctx, s: signer})
	if err != nil {
		return nil, fmt.Errorf("making a certificate request for %q with %s: %w", o.Subject, signer.URI(), err)
	}
	return der, nil
}

// marshalNameConstraints encodes RFC 5280 NameConstraints with dNSName
// subtrees only.
func marshalNameConstraints(permitted, excluded []string) ([]byte, error) {
	var b cryptobyte.Builder
	b.AddASN1(cbasn1.SEQUENCE, func(b *cryptobyte.Builder) {
		for i, names := range [][]string{permitted, excluded} {
			if len(names) == 0 {
				continue
			}
			b.AddASN1(cbasn1.Tag(i).ContextSpecific().Constructed(), func(b *cryptobyte.Builder) {
				for _, n := range names {
					b.AddASN1(cbasn1.SEQUENCE, func(b *cryptobyte.Builder) {
						b.AddASN1(cbasn1.Tag(2).ContextSpecific(), func(b *cryptobyte.Builder) {
							b.AddBytes([]byte(n))
						})
					})
				}
			})
		}
	})
	der, err := b.Bytes()
	if err != nil {
		return nil, fmt.Errorf("encoding name constraints: %w", err)
	}
	return der, nil
}

// ErrNotForKey means a certificate's public key is not the key's.
var ErrNotForKey = errors.New("certificate is not for this key")

// ErrChain is matched (errors.Is) when an imported chain does not link up
// to a self-signed root.
var ErrChain = errors.New("chain does not link up to a self-signed root")

// Imported is a CA certificate with its issuers, checked by CheckImport.
type Imported struct {
	Certificate *x509.Certificate
	// Issuers are the certificates above Certificate, nearest first, the
	// self-signed root last; empty when Certificate is itself a root.
	Issuers []*x509.Certificate
}

// NotAfter is the earliest notAfter of the chain: no leaf can outlive it.
func (im *Imported) NotAfter() time.Time {
	end := im.Certificate.NotAfter
	for _, c := range im.Issuers {
		if c.NotAfter.Before(end) {
			end = c.NotAfter
		}
	}
	return end
}

// NotBefore is the latest notBefore of the chain.
func (im *Imported) NotBefore() time.Time {
	start := im.Certificate.NotBefore
	for _, c := range im.Issuers {
		if c.NotBefore.After(start) {
			start = c.NotBefore
		}
	}
	return start
}

// CertificatePEM and ChainPEM are what an Authority generation stores.
func (im *Imported) CertificatePEM() string { return EncodePEM(im.Certificate) }
func (im *Imported) ChainPEM() string       { return EncodePEM(im.Issuers...) }

// CheckImport takes the CA certificate (the first of certs) and its
// issuers (the rest of certs, in any order) and checks that: the
// certificate is a CA (basicConstraints CA:TRUE, keyUsage keyCertSign) for
// pub with a path length of at most MaxPathLen; every certificate's key and
// signature are strong enough (ErrWeak); the issuers link it up to a
// self-signed root, which must be among certs (ErrChain), each allowing a
// CA below it. Issuers that are not on the path are dropped.
func CheckImport(certs []*x509.Certificate, pub crypto.PublicKey) (*Imported, error) {
	if len(certs) == 0 {
		return nil, errors.New("no certificate given")
	}
	cert := certs[0]
	want, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, fmt.Errorf("encoding the key's public key: %w", err)
	}
	if string(cert.RawSubjectPublicKeyInfo) != string(want) {
		fp, _ := backends.Fingerprint(cert.PublicKey)
		kfp, _ := backends.Fingerprint(pub)
		return nil, fmt.Errorf("%w: certificate %q has key sha256:%s, the key is sha256:%s", ErrNotForKey, cert.Subject, fp, kfp)
	}
	if !cert.BasicConstraintsValid || !cert.IsCA {
		return nil, fmt.Errorf("certificate %q is not a CA (basicConstraints CA:TRUE missing)", cert.Subject)
	}
	if cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, fmt.Errorf("CA certificate %q lacks keyUsage keyCertSign", cert.Subject)
	}
	switch {
	case cert.MaxPathLen < 0 || (cert.MaxPathLen == 0 && !cert.MaxPathLenZero):
		return nil, &WeakError{What: "path length", Reason: fmt.Sprintf("certificate %q sets no path length: ask for %d (leaves only) or %d", cert.Subject, 0, MaxPathLen)}
	case cert.MaxPathLen > MaxPathLen:
		return nil, &WeakError{What: "path length", Reason: fmt.Sprintf("certificate %q allows %d CAs below it, at most %d accepted", cert.Subject, cert.MaxPathLen, MaxPathLen)}
	}
	im := &Imported{Certificate: cert}
	pool := slices.Clone(certs[1:]) // entries used are set to nil
	cur := cert
	for !selfSigned(cur) {
		next := -1
		for i, c := range pool {
			if c != nil && string(c.RawSubject) == string(cur.RawIssuer) && cur.CheckSignatureFrom(c) == nil {
				next = i
				break
			}
		}
		if next < 0 {
			for _, c := range pool {
				if c != nil && string(c.RawSubject) == string(cur.RawIssuer) {
					fp, _ := backends.Fingerprint(c.PublicKey)
					return nil, fmt.Errorf("%w: %q given in the chain (key sha256:%s) did not sign %q: %v; is it another CA of the same name (a re-issued root)? give the issuer whose key signed it", ErrChain, c.Subject, fp, cur.Subject, cur.CheckSignatureFrom(c))
				}
			}
			return nil, fmt.Errorf("%w: no issuer of %q (issuer %q) given: put the issuers up to the root in --chain or after the certificate", ErrChain, cur.Subject, cur.Issuer)
		}
		issuer := pool[next]
		pool[next] = nil
		// Path length counts the CAs below an issuer on a leaf's path:
		// the imported CA and every issuer between.
		if below := len(im.Issuers) + 1; issuer.BasicConstraintsValid && (issuer.MaxPathLen > 0 || issuer.MaxPathLenZero) && issuer.MaxPathLen < below {
			return nil, fmt.Errorf("%w: %q allows %d CAs below it, the path has %d", ErrChain, issuer.Subject, issuer.MaxPathLen, below)
		}
		if !issuer.IsCA {
			return nil, fmt.Errorf("%w: issuer %q is not a CA", ErrChain, issuer.Subject)
		}
		im.Issuers = append(im.Issuers, issuer)
		cur = issuer
		if len(im.Issuers) > 8 {
			return nil, fmt.Errorf("%w: more than 8 issuers", ErrChain)
		}
	}
	for _, c := range append([]*x509.Certificate{cert}, im.Issuers...) {
		if err := CheckKey(c.PublicKey); err != nil {
			return nil, fmt.Errorf("certificate %q: %w", c.Subject, err)
		}
		if err := checkSignatureAlgorithm(c); err != nil {
			return nil, err
		}
	}
	// Name constraints and the rest of RFC 5280, as Go verifies a path, at
	// a moment every certificate is valid.
	roots := x509.NewCertPool()
	inter := x509.NewCertPool()
	if len(im.Issuers) > 0 {
		roots.AddCert(im.Issuers[len(im.Issuers)-1])
		for _, c := range im.Issuers[:len(im.Issuers)-1] {
			inter.AddCert(c)
		}
		at := im.NotBefore()
		if at.After(im.NotAfter()) {
			return nil, fmt.Errorf("%w: the certificates are never valid at the same time", ErrChain)
		}
		if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: at, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrChain, err)
		}
	}
	return im, nil
}

func selfSigned(c *x509.Certificate) bool {
	return string(c.RawSubject) == string(c.RawIssuer) && c.CheckSignatureFrom(c) == nil
}

// EncodePEM encodes certs as concatenated CERTIFICATE blocks.
func EncodePEM(certs ...*x509.Certificate) string {
	var b strings.Builder
	for _, c := range certs {
		b.Write(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw}))
	}
	return b.String()
}

func randomSerial() (*big.Int, error) {
	s, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("generating serial number: %w", err)
	}
	return s.Add(s, big.NewInt(1)), nil
}

// contextSigner lets x509's Sign call carry ctx to the backend.
type contextSigner struct {
	ctx context.Context
	s   backends.Signer
}

func (c *contextSigner) Public() crypto.PublicKey { return c.s.Public() }
func (c *contextSigner) Sign(_ io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	return c.s.SignContext(c.ctx, digest, opts)
}

// ParseSubject parses a distinguished name written as comma-separated
// ATTR=value pairs (CN, O, OU, C, ST, L; a comma inside a value is
// escaped as "\,"), e.g. "CN=workload CA,O=Example,C=DE".
func ParseSubject(s string) (pkix.Name, error) {
	var n pkix.Name
	var parts []string
	var cur strings.Builder
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '\\' && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
		case s[i] == ',':
			parts = append(parts, cur.String())
			cur.Reset()
		default:
			cur.WriteByte(s[i])
		}
	}
	parts = append(parts, cur.String())
	for _, p := range parts {
		k, v, ok := strings.Cut(strings.TrimSpace(p), "=")
		v = strings.TrimSpace(v)
		if !ok || v == "" {
			return n, fmt.Errorf("%q is not ATTR=value", p)
		}
		switch strings.ToUpper(strings.TrimSpace(k)) {
		case "CN":
			n.CommonName = v
		case "O":
			n.Organization = append(n.Organization, v)
		case "OU":
			n.OrganizationalUnit = append(n.OrganizationalUnit, v)
		case "C":
			n.Country = append(n.Country, v)
		case "ST":
			n.Province = append(n.Province, v)
		case "L":
			n.Locality = append(n.Locality, v)
		default:
			return n, fmt.Errorf("attribute %q: want CN, O, OU, C, ST or L", k)
		}
	}
	return n, nil
}

// CheckLinked checks that each of certs (a CA certificate followed by its
// issuers, nearest first) is a CA certificate and is signed by the next.
func CheckLinked(certs []*x509.Certificate) error {
	for i, c := range certs {
		if !c.BasicConstraintsValid || !c.IsCA {
			return fmt.Errorf("certificate %d (%s) is not a CA certificate", i, c.Subject)
		}
		if i+1 < len(certs) {
			if err := c.CheckSignatureFrom(certs[i+1]); err != nil {
				return fmt.Errorf("certificate %d (%s) is not signed by the next one (%s): %w", i, c.Subject, certs[i+1].Subject, err)
			}
		}
	}
	return nil
}
