package app

import (
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/all"
	"github.com/keyward/keyward/backends/uri"
	"github.com/keyward/keyward/ca"
	"github.com/keyward/keyward/internal/pemcert"
	authclient "github.com/keyward/keyward/kubeclient/authority/client"
	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/trustpublisher"
	"github.com/spf13/cobra"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/util/retry"
)

func newCACommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "ca",
		Short: "Create CA generations (self-signed or signed by an external root) and add them to a signer's Authority",
	}
	cmd.AddCommand(newCAInitCommand(), newCAImportCommand())
	return cmd
}

// backendFlags build the key registry.
type backendFlags struct {
	modules []string
	// gcpEndpoint points the gcpkms backend at an emulator or test server:
	// plaintext gRPC, no credentials.
	gcpEndpoint string
}

func (b *backendFlags) addFlags(cmd *cobra.Command) {
	cmd.Flags().StringSliceVar(&b.modules, "pkcs11-module", nil, "allowed PKCS#11 module paths (default: SoftHSM2's usual paths)")
	cmd.Flags().StringVar(&b.gcpEndpoint, "gcpkms-emulator", "", "host:port of a Cloud KMS emulator or test server (plaintext, no credentials)")
}

func (b *backendFlags) registry() (*backends.Registry, error) {
	opts := all.Options{}
	opts.PKCS11.AllowedModules = b.modules
	if b.gcpEndpoint != "" {
		opts.GCPKMS.ClientOptions = []option.ClientOption{
			option.WithEndpoint(b.gcpEndpoint), option.WithoutAuthentication(),
			option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())),
		}
	}
	return all.NewRegistry(opts)
}

// caOptions are shared by ca init and ca import.
type caOptions struct {
	kube     kubeFlags
	backends backendFlags

	signer, generation, authority, phase string
	keyURI                               string
	maxLeafLifetime                      time.Duration
	configFile                           string
	timeout                              time.Duration

	// Completed.
	leafMax time.Duration
}

func (o *caOptions) addFlags(cmd *cobra.Command) {
	o.kube.addFlags(cmd)
	o.backends.addFlags(cmd)
	f := cmd.Flags()
	f.StringVar(&o.signer, "signer", "", "signer name, <domain>/<path> (required)")
	f.StringVar(&o.generation, "generation", "", "the new generation's name, a DNS label, e.g. 2026-11 (required)")
	f.StringVar(&o.authority, "authority", "", "Authority name (default: the signer's existing Authority, else derived from the signer name: example.com/x → example.com.x)")
	f.StringVar(&o.phase, "phase", "", "desired phase of the new generation (default: Active if the Authority has no generation yet, else Staged)")
	f.StringVar(&o.keyURI, "key-uri", "", "the CA key's URI (pkcs11:, gcpkms:, awskms:, file:) (required)")
	f.DurationVar(&o.maxLeafLifetime, "max-leaf-lifetime", 0, "the longest leaf the signer issues (default: the signer's maxLifetime in --config, else 24h)")
	f.StringVar(&o.configFile, "config", "", "the SignerConfiguration file, to read --signer's maxLifetime from")
	f.DurationVar(&o.timeout, "timeout", 2*time.Minute, "give up after this long")
	_ = cmd.MarkFlagRequired("signer")
	_ = cmd.MarkFlagRequired("generation")
	_ = cmd.MarkFlagRequired("key-uri")
}

// caRunner is a ca subcommand's options.
type caRunner interface {
	Complete() error
	Validate() error
	Run(ctx context.Context, out io.Writer) error
	deadline() time.Duration
}

// runCA completes and validates o, then runs it within --timeout.
func runCA(o caRunner) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, _ []string) error {
		if err := o.Complete(); err != nil {
			return err
		}
		if err := o.Validate(); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(cmd.Context(), o.deadline())
		defer cancel()
		return o.Run(ctx, cmd.OutOrStdout())
	}
}

func (o *caOptions) deadline() time.Duration { return o.timeout }

// Complete fills in the leaf maximum.
func (o *caOptions) Complete() error {
	switch {
	case o.maxLeafLifetime > 0 && o.configFile != "":
		return errors.New("--max-leaf-lifetime and --config both set the leaf maximum: give one")
	case o.maxLeafLifetime > 0:
		o.leafMax = o.maxLeafLifetime
	case o.configFile != "":
		cfg, err := config.Load(o.configFile)
		if err != nil {
			return err
		}
		for _, s := range cfg.Signers {
			if s.Name == o.signer {
				o.leafMax = s.MaxLifetime.Duration
			}
		}
		if o.leafMax == 0 {
			return fmt.Errorf("%s has no signer %s: its maxLifetime is the leaf maximum", o.configFile, o.signer)
		}
	default:
		o.leafMax = config.DefaultMaxLifetime
	}
	return nil
}

func (o *caOptions) Validate() error {
	if errs := validation.IsDNS1123Label(o.generation); len(errs) > 0 {
		return fmt.Errorf("--generation %q: %s", o.generation, strings.Join(errs, "; "))
	}
	if !strings.Contains(o.signer, "/") {
		return fmt.Errorf("--signer %q is not a signer name <domain>/<path>", o.signer)
	}
	if o.phase != "" {
		if _, err := parsePhase(o.phase); err != nil {
			return fmt.Errorf("--phase: %w", err)
		}
	}
	if o.authority != "" {
		if errs := validation.IsDNS1123Subdomain(o.authority); len(errs) > 0 {
			return fmt.Errorf("--authority %q: %s", o.authority, strings.Join(errs, "; "))
		}
	}
	return nil
}

var phases = []v1alpha1.Phase{v1alpha1.PhaseStaged, v1alpha1.PhasePromoted, v1alpha1.PhaseActive, v1alpha1.PhaseRetiring, v1alpha1.PhaseRetired}

func parsePhase(s string) (v1alpha1.Phase, error) {
	for _, p := range phases {
		if strings.EqualFold(s, string(p)) {
			return p, nil
		}
	}
	return "", fmt.Errorf("unknown phase %q (one of %v)", s, phases)
}

// target is where a new generation goes: the existing Authority for the
// signer, or the name of one to create.
type target struct {
	existing *v1alpha1.Authority
	name     string
}

// windows are the rotation windows the Authority's gates set, else the
// CRD's defaults.
func (t target) windows() ca.Windows {
	soak, window := trustpublisher.GateDurations(t.existing)
	return ca.Windows{CanarySoak: soak, PropagationWindow: window}
}

// resolve finds the signer's Authority (or the name of the one to create)
// and checks that the generation's name is free.
func (o *caOptions) resolve(ctx context.Context, ac *authclient.Client) (target, error) {
	a, err := authorityForSigner(ctx, ac, o.signer)
	if err != nil {
		return target{}, err
	}
	if a != nil {
		if o.authority != "" && o.authority != a.Name {
			return target{}, fmt.Errorf("signer %s already has Authority %s, not %s", o.signer, a.Name, o.authority)
		}
		if err := checkNewGeneration(a, o.generation); err != nil {
			return target{}, err
		}
		return target{existing: a, name: a.Name}, nil
	}
	name := o.authority
	if name == "" {
		if name, err = authorityNameFor(o.signer); err != nil {
			return target{}, err
		}
	}
	other, err := ac.Get(ctx, name)
	switch {
	case err == nil:
		return target{}, fmt.Errorf("Authority %s exists for signer %s, not %s: pass another --authority", name, other.Spec.SignerName, o.signer)
	case !apierrors.IsNotFound(err):
		return target{}, fmt.Errorf("reading Authority %s: %w", name, err)
	}
	return target{name: name}, nil
}

func checkNewGeneration(a *v1alpha1.Authority, gen string) error {
	for _, g := range a.Spec.Generations {
		if g.Name == gen {
			return fmt.Errorf("Authority %s already has a generation %s: choose another --generation", a.Name, gen)
		}
	}
	return nil
}

// addGeneration writes gen into the signer's Authority, creating it if
// missing. Its phase is --phase, else Active for the first generation and
// Staged after. It retries on a conflicting write.
func (o *caOptions) addGeneration(ctx context.Context, ac *authclient.Client, name string, gen v1alpha1.Generation) (*v1alpha1.Authority, error) {
	var explicit v1alpha1.Phase
	if o.phase != "" {
		explicit, _ = parsePhase(o.phase)
	}
	var out *v1alpha1.Authority
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		a, err := ac.Get(ctx, name)
		if apierrors.IsNotFound(err) {
			gen.Phase = v1alpha1.PhaseActive
			if explicit != "" {
				gen.Phase = explicit
			}
			out, err = ac.Create(ctx, &v1alpha1.Authority{
				ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec:       v1alpha1.AuthoritySpec{SignerName: o.signer, Generations: []v1alpha1.Generation{gen}},
			}, metav1.CreateOptions{FieldManager: v1alpha1.FieldManagerCLI})
			if apierrors.IsAlreadyExists(err) {
				// Someone created it meanwhile: read it and add to it.
				return apierrors.NewConflict(v1alpha1.Resource.GroupResource(), name, err)
			}
			return err
		}
		if err != nil {
			return err
		}
		if a.Spec.SignerName != o.signer {
			return fmt.Errorf("Authority %s is for signer %s, not %s", name, a.Spec.SignerName, o.signer)
		}
		if err := checkNewGeneration(a, gen.Name); err != nil {
			return err
		}
		gen.Phase = v1alpha1.PhaseStaged
		if len(a.Spec.Generations) == 0 {
			gen.Phase = v1alpha1.PhaseActive
		}
		if explicit != "" {
			gen.Phase = explicit
		}
		if gen.Phase == v1alpha1.PhaseActive {
			for _, g := range a.Spec.Generations {
				if g.Phase == v1alpha1.PhaseActive {
					return fmt.Errorf("generation %s is already Active in Authority %s: add %s Staged and rotate with keyward trust", g.Name, name, gen.Name)
				}
			}
		}
		a.Spec.Generations = append(a.Spec.Generations, gen)
		out, err = ac.Update(ctx, a, metav1.UpdateOptions{FieldManager: v1alpha1.FieldManagerCLI})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("adding generation %s to Authority %s: %w", gen.Name, name, err)
	}
	return out, nil
}

// withKey builds the registry and runs fn with the opened or created key.
func (o *caOptions) withKey(ctx context.Context, get func(context.Context, *backends.Registry) (backends.Signer, error), fn func(backends.Signer) error) error {
	reg, err := o.backends.registry()
	if err != nil {
		return err
	}
	defer reg.Close()
	key, err := get(ctx, reg)
	if err != nil {
		return err
	}
	defer key.Close()
	return fn(key)
}

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
	ac, _, err := o.kube.clients()
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
	return o.withKey(ctx, o.openKey, func(key backends.Signer) error {
		root, err := ca.SelfSign(ctx, key, o.cert)
		if err != nil {
			return err
		}
		a, err := o.addGeneration(ctx, ac, tgt.name, v1alpha1.Generation{Name: o.generation, KeyURI: key.URI(), CertificatePEM: ca.EncodePEM(root)})
		if err != nil {
			if o.createKey {
				return fmt.Errorf("%w (the key was created: re-run with --key-uri '%s' and without --create-key)", err, key.URI())
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

type caImportOptions struct {
	caOptions
	certificate, chain string
}

func newCAImportCommand() *cobra.Command {
	o := &caImportOptions{}
	cmd := &cobra.Command{
		Use:   "import --signer NAME --generation GEN --key-uri URI --certificate FILE [--chain FILE]",
		Short: "Add a CA certificate signed by an external root (after ca init --csr-out) as a generation",
		Long: `Add a CA certificate signed elsewhere as generation GEN of the signer's
Authority (created if missing).

The key at --key-uri is opened and must be the certificate's key. The
certificate must be a CA (basicConstraints CA:TRUE, keyUsage keyCertSign,
path length 0 or 1). The issuers, from --chain and any certificates after the
first in --certificate, must link it up to a self-signed root, which must be
given too: the generation's chainPEM holds them nearest first, and the root
is what the trust bundles publish. Weak keys or signatures and a chain that
ends sooner than the leaf maximum plus the rotation windows are refused.`,
		Args: cobra.NoArgs,
		RunE: runCA(o),
	}
	o.addFlags(cmd)
	cmd.Flags().StringVar(&o.certificate, "certificate", "", "PEM file: the CA certificate, optionally followed by its issuers (required)")
	cmd.Flags().StringVar(&o.chain, "chain", "", "PEM file: the issuers up to and including the self-signed root")
	_ = cmd.MarkFlagRequired("certificate")
	return cmd
}

func (o *caImportOptions) Run(ctx context.Context, out io.Writer) error {
	var certs []*x509.Certificate
	for _, f := range []string{o.certificate, o.chain} {
		if f == "" {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("reading certificates: %w", err)
		}
		parsed, err := pemcert.Parse(data)
		if err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if len(parsed) == 0 {
			return fmt.Errorf("%s: no certificate", f)
		}
		certs = append(certs, parsed...)
	}
	ac, _, err := o.kube.clients()
	if err != nil {
		return err
	}
	tgt, err := o.resolve(ctx, ac)
	if err != nil {
		return err
	}
	return o.withKey(ctx, func(ctx context.Context, reg *backends.Registry) (backends.Signer, error) {
		return reg.Open(ctx, backends.OpenRequest{URI: o.keyURI})
	}, func(key backends.Signer) error {
		im, err := ca.CheckImport(certs, key.Public())
		if err != nil {
			return err
		}
		from := time.Now()
		if nb := im.NotBefore(); nb.After(from) {
			from = nb
		}
		if err := ca.CheckLifetime(im.NotAfter().Sub(from).Truncate(time.Second), o.leafMax, tgt.windows()); err != nil {
			return fmt.Errorf("the chain ends %s: %w", im.NotAfter().UTC().Format(time.RFC3339), err)
		}
		a, err := o.addGeneration(ctx, ac, tgt.name, v1alpha1.Generation{
			Name: o.generation, KeyURI: key.URI(), CertificatePEM: im.CertificatePEM(), ChainPEM: im.ChainPEM(),
		})
		if err != nil {
			return err
		}
		if err := printAdded(out, a, o.generation, key); err != nil {
			return err
		}
		root := im.Certificate
		if len(im.Issuers) > 0 {
			root = im.Issuers[len(im.Issuers)-1]
		}
		_, err = fmt.Fprintf(out, "certificate: %q, valid until %s; root %q\n", im.Certificate.Subject, im.NotAfter().UTC().Format(time.RFC3339), root.Subject)
		return err
	})
}
