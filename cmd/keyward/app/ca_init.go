package app

import (
	"context"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/uri"
	"github.com/keyward/keyward/ca"
	authclient "github.com/keyward/keyward/kubeclient/authority/client"
	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

type caInitOptions struct {
	caOptions
	createKey                 bool
	skipIfPresent             bool
	algorithm                 string
	subject                   string
	lifetime                  time.Duration
	pathLen                   int
	permittedDNS, excludedDNS []string
	csrOut                    string
	alg                       backends.Algorithm
	cert                      ca.Options
}

// algorithmNames are the short names ca init accepts for --algorithm.
var algorithmNames = map[string]backends.Algorithm{
	"ECDSAP256": backends.ECDSAP256SHA256,
	"RSA2048":   backends.RSA2048PKCS1SHA256, // known so that it is refused as weak, by name
	"ECDSAP384": backends.ECDSAP384SHA384,
	"RSA3072":   backends.RSA3072PKCS1SHA256,
	"RSA4096":   backends.RSA4096PKCS1SHA256,
}

func (o *caInitOptions) Complete() error {
	if err := o.caOptions.Complete(); err != nil {
		return err
	}
	subject := pkix.Name{CommonName: o.signer + " CA " + o.generation}
	if o.subject != "" {
		var err error
		if subject, err = ca.ParseSubject(o.subject); err != nil {
			return fmt.Errorf("--subject: %w", err)
		}
	}
	o.cert = ca.Options{
		Subject:      subject,
		Lifetime:     o.lifetime,
		PathLen:      o.pathLen,
		PermittedDNS: o.permittedDNS,
		ExcludedDNS:  o.excludedDNS,
	}
	if o.createKey {
		if o.algorithm == "" {
			o.algorithm = "ECDSAP256"
		}
		alg, ok := algorithmNames[strings.ToUpper(o.algorithm)]
		if !ok {
			var err error
			if alg, err = backends.ParseAlgorithm(o.algorithm); err != nil {
				return fmt.Errorf("--algorithm: %w (or one of ECDSAP256, ECDSAP384, RSA3072, RSA4096)", err)
			}
		}
		o.alg = alg
	}
	return nil
}

func (o *caInitOptions) Validate() error {
	if err := o.caOptions.Validate(); err != nil {
		return err
	}
	if !o.createKey && o.algorithm != "" {
		return errors.New("--algorithm applies only with --create-key")
	}
	if o.createKey {
		if bits := o.alg.RSABits(); bits > 0 && bits < ca.MinRSABits {
			return fmt.Errorf("--algorithm %s: %w", o.alg, &ca.WeakError{What: "key", Reason: fmt.Sprintf("RSA %d bits is below %d", bits, ca.MinRSABits)})
		}
		if c := o.alg.Curve(); c != nil && c.Params().BitSize < 256 {
			return fmt.Errorf("--algorithm %s: %w", o.alg, &ca.WeakError{What: "key", Reason: "curve below P-256"})
		}
	}
	if o.csrOut != "" && o.skipIfPresent {
		return errors.New("--skip-if-present applies to a self-signed root: with --csr-out nothing is written to the cluster")
	}
	if o.csrOut != "" && o.phase != "" {
		return errors.New("--phase applies to a self-signed root: with --csr-out nothing is written to the cluster (ca import adds the generation)")
	}
	return o.cert.Validate()
}

func newCAInitCommand() *cobra.Command {
	o := &caInitOptions{}
	cmd := &cobra.Command{
		Use:   "init --signer NAME --generation GEN --key-uri URI [--create-key --algorithm ALG] [--csr-out FILE]",
		Short: "Make a CA generation: a self-signed root added to the signer's Authority, or a CSR for an external root",
		Long: `Make a CA generation for a signer.

The key is created with --create-key (in any backend: pkcs11:, gcpkms:,
awskms:, file:) or taken as it is from --key-uri. Then either

  - a root is self-signed (basicConstraints CA:TRUE critical with --path-len,
    keyUsage keyCertSign|cRLSign critical, subject key id, optional name
    constraints) and added as generation GEN to the signer's Authority,
    created if missing: the first generation is Active, later ones Staged
    (--phase overrides); or
  - with --csr-out, a PKCS#10 request for an intermediate CA is written to
    FILE for an external or offline root to sign, and nothing in the cluster
    changes: add the signed certificate with keyward ca import.

Weak parameters are refused (RSA below 3072 bits, curves below P-256, path
length above 1, lifetimes above 20 years), and so is a lifetime shorter than
the leaf maximum plus the rotation windows of the Authority's gates.`,
		Args: cobra.NoArgs,
		RunE: runCA(o),
	}
	o.addFlags(cmd)
	f := cmd.Flags()
	f.BoolVar(&o.createKey, "create-key", false, "create the key at --key-uri (in the HSM or KMS) instead of opening an existing one")
	f.BoolVar(&o.skipIfPresent, "skip-if-present", false, "do nothing (and exit 0) when the signer's Authority already has generation GEN with this --key-uri; a generation GEN with another key is an error (for init containers)")
	f.StringVar(&o.algorithm, "algorithm", "", "with --create-key: ECDSAP256 (default), ECDSAP384, RSA3072, RSA4096, or a backend algorithm name")
	f.StringVar(&o.subject, "subject", "", "subject distinguished name, e.g. 'CN=workload CA 2026-11,O=Example,C=DE' (CN, O, OU, C, ST, L; default: CN=<signer> CA <generation>)")
	f.DurationVar(&o.lifetime, "lifetime", 365*24*time.Hour, "how long the self-signed root is valid")
	f.IntVar(&o.pathLen, "path-len", 0, "basicConstraints path length: 0 (the CA signs leaves only) or 1")
	f.StringSliceVar(&o.permittedDNS, "permitted-dns", nil, "name constraints: DNS names (and .suffixes) leaves may carry")
	f.StringSliceVar(&o.excludedDNS, "excluded-dns", nil, "name constraints: DNS names (and .suffixes) leaves may not carry")
	f.StringVar(&o.csrOut, "csr-out", "", "write a PKCS#10 request for an external root to this file instead of self-signing; the cluster is not touched")
	return cmd
}

func (o *caInitOptions) openKey(ctx context.Context, reg *backends.Registry) (backends.Signer, error) {
	if o.createKey {
		return reg.CreateKey(ctx, backends.CreateKeyRequest{URI: o.keyURI, Algorithm: o.alg})
	}
	return reg.Open(ctx, backends.OpenRequest{URI: o.keyURI})
}

func (o *caInitOptions) Run(ctx context.Context, out io.Writer) error {
	if o.csrOut != "" {
		return o.withKey(ctx, o.openKey, func(key backends.Signer) error {
			der, err := ca.CreateCSR(ctx, key, o.cert)
			if err != nil {
				return err
			}
			if err := os.WriteFile(o.csrOut, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), 0o644); err != nil {
				return fmt.Errorf("writing the CSR: %w", err)
			}
			fmt.Fprintf(out, "key:  %s (sha256:%s)\ncsr:  %s (subject %q, path length %d)\nHave the external root sign it as a CA certificate, then:\n  keyward ca import --signer %s --generation %s --key-uri '%s' --certificate SIGNED.pem --chain ISSUERS.pem\n",
				key.URI(), key.Fingerprint(), o.csrOut, o.cert.Subject, o.cert.PathLen, o.signer, o.generation, key.URI())
			return nil
		})
	}
	ac, cs, err := o.kube.clients()
	if err != nil {
		return err
	}
	if o.skipIfPresent {
		present, err := o.generationPresent(ctx, ac, out)
		if err != nil || present {
			return err
		}
	}
	// Everything the cluster can refuse is checked before a key is made.
	tgt, err := o.resolve(ctx, ac)
	if err != nil {
		return err
	}
	if err := ca.CheckLifetime(o.lifetime, o.leafMax, tgt.windows()); err != nil {
		return err
	}
	if err := checkWriteAccess(ctx, cs, tgt); err != nil {
		return err
	}
	return o.withKey(ctx, o.openKey, func(key backends.Signer) error {
		root, err := ca.SelfSign(ctx, key, o.cert)
		if err != nil {
			if o.createKey {
				// Nothing was written: the root was never made.
				return o.destroyCreated(out, ac, tgt.name, key, err, true)
			}
			return err
		}
		a, err := o.addGeneration(ctx, ac, tgt.name, v1alpha1.Generation{Name: o.generation, KeyURI: key.URI(), CertificatePEM: ca.EncodePEM(root)})
		if err != nil {
			if o.createKey {
				return o.destroyCreated(out, ac, tgt.name, key, err, notWritten(err))
			}
			return err
		}
		if err := printAdded(out, a, o.generation, key); err != nil {
			return err
		}
		_, err = fmt.Fprintf(out, "root: %q, valid %s to %s, path length %d\n", root.Subject, root.NotBefore.UTC().Format(time.RFC3339), root.NotAfter.UTC().Format(time.RFC3339), root.MaxPathLen)
		return err
	})
}

// refusedLocally marks an error of addGeneration's own checks (the
// generation exists, another is Active, the Authority is another
// signer's): returned before any write.
type refusedLocally struct{ error }

func (r refusedLocally) Unwrap() error { return r.error }

// notWritten reports whether err proves the generation was not stored:
// one of addGeneration's own checks refused it, or the apiserver answered
// with a refusal (4xx but 408 and 429). A timeout, a dropped connection, a
// 5xx or the command's deadline leave it open whether the write landed.
func notWritten(err error) bool {
	var local refusedLocally
	if errors.As(err, &local) {
		return true
	}
	var st apierrors.APIStatus
	if errors.As(err, &st) {
		c := st.Status().Code
		return c >= 400 && c < 500 && c != 408 && c != 429
	}
	return false
}

// destroyCreated deals with the key ca init created when the root or the
// generation failed (cause), so that a failed try leaves no orphaned key
// in the HSM or KMS and never destroys a key an Authority names:
//   - the Authority is read again: if generation GEN names the key, the
//     write landed after all, and that is success;
//   - refused (the write provably did not happen): the key is destroyed;
//   - otherwise (a timeout, a dropped connection, a 5xx: the write may
//     still land), or when the Authority cannot be read, the key is kept
//     and the message says how to finish by hand.
//
// It gets its own short deadline, since cause is often the command's own.
func (o *caInitOptions) destroyCreated(out io.Writer, ac *authclient.Client, authority string, key backends.Signer, cause error, refused bool) error {
	keep := func(why string) error {
		return fmt.Errorf("%w\nthe key %s was created and is kept: %s", cause, key.URI(), why)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, err := ac.Get(ctx, authority)
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return keep(fmt.Sprintf("Authority %s could not be read again to see whether it names the key (%v); if it has no generation %s, re-run with --key-uri '%s' and without --create-key, or remove the key", authority, err, o.generation, key.URI()))
	default:
		for _, g := range a.Spec.Generations {
			if g.KeyURI != key.URI() {
				continue
			}
			if g.Name == o.generation {
				// The write landed although the call reported an error.
				fmt.Fprintf(out, "the write reported %v, but Authority %s has generation %s with the new key:\n", cause, authority, g.Name)
				return printAdded(out, a, o.generation, key)
			}
			return keep(fmt.Sprintf("Authority %s names it in generation %s", authority, g.Name))
		}
	}
	if !refused {
		return keep(fmt.Sprintf("the apiserver did not say whether it stored generation %s, and the write may still land; check `kubectl get authority %s -o yaml`: if generation %s is absent, re-run with --key-uri '%s' and without --create-key", o.generation, authority, o.generation, key.URI()))
	}
	d, ok := key.(backends.Destroyer)
	if !ok {
		return keep(fmt.Sprintf("its backend cannot destroy keys: re-run with --key-uri '%s' and without --create-key, or remove it", key.URI()))
	}
	what, err := d.Destroy(ctx)
	if err != nil {
		return fmt.Errorf("%w; destroying the key created for it failed too (%v): remove %s by hand", cause, err, key.URI())
	}
	return fmt.Errorf("%w (the key created for it is gone: %s)", cause, what)
}

// ErrGenerationKeyDiffers: --skip-if-present found generation GEN in the
// signer's Authority, with a key other than --key-uri.
var ErrGenerationKeyDiffers = errors.New("the generation exists with another key")

// generationPresent reports whether the signer's Authority already has
// generation GEN with the key --key-uri names (and says so in one line);
// the generation with another key is ErrGenerationKeyDiffers.
func (o *caInitOptions) generationPresent(ctx context.Context, ac *authclient.Client, out io.Writer) (bool, error) {
	a, err := authorityForSigner(ctx, ac, o.signer)
	if err != nil || a == nil {
		return false, err
	}
	want := uri.RedactURI(o.keyURI)
	for _, g := range a.Spec.Generations {
		if g.Name != o.generation {
			continue
		}
		same, err := o.sameKey(ctx, g.KeyURI)
		if err != nil {
			return false, fmt.Errorf("authority/%s, generation %s: %w", a.Name, o.generation, err)
		}
		if !same {
			return false, fmt.Errorf("authority/%s: generation %s has key %s, not --key-uri %s: %w", a.Name, o.generation, g.KeyURI, want, ErrGenerationKeyDiffers)
		}
		_, err = fmt.Fprintf(out, "authority/%s: generation %s already present with key %s: nothing to do\n", a.Name, o.generation, g.KeyURI)
		return true, err
	}
	return false, nil
}

// sameKey reports whether --key-uri names the key stored is the URI of.
// The stored URI is the one the backend returned, which may carry more
// than the one given (a PKCS#11 key's id, added when it was created): when
// the two differ as text, both are opened and their public keys compared.
func (o *caInitOptions) sameKey(ctx context.Context, stored string) (bool, error) {
	if stored == uri.RedactURI(o.keyURI) {
		return true, nil
	}
	reg, err := o.backends.registry()
	if err != nil {
		return false, err
	}
	defer reg.Close()
	have, err := reg.Open(ctx, backends.OpenRequest{URI: stored})
	if err != nil {
		return false, fmt.Errorf("opening the generation's key %s: %w", stored, err)
	}
	defer have.Close()
	given, err := reg.Open(ctx, backends.OpenRequest{URI: o.keyURI})
	if errors.Is(err, backends.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("opening --key-uri %s: %w", uri.RedactURI(o.keyURI), err)
	}
	defer given.Close()
	return given.Fingerprint() == have.Fingerprint(), nil
}

func printAdded(out io.Writer, a *v1alpha1.Authority, gen string, key backends.Signer) error {
	var phase v1alpha1.Phase
	for _, g := range a.Spec.Generations {
		if g.Name == gen {
			phase = g.Phase
		}
	}
	_, err := fmt.Fprintf(out, "authority/%s: generation %s added (desired phase %s) for signer %s\nkey: %s (sha256:%s)\n",
		a.Name, gen, phase, a.Spec.SignerName, key.URI(), key.Fingerprint())
	return err
}
