package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/all"
	"github.com/keyward/keyward/backends/pkcs11"
	"github.com/keyward/keyward/backends/uri"
	"github.com/keyward/keyward/ca"
	authclient "github.com/keyward/keyward/kubeclient/authority/client"
	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/trustpublisher"
	"github.com/spf13/cobra"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
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
	cmd.Flags().StringSliceVar(&b.modules, "pkcs11-module", nil, "allowed PKCS#11 module paths (default: --config's backends.pkcs11.allowedModules, else SoftHSM2's usual paths; the module-path of --key-uri is always allowed)")
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
		if len(o.backends.modules) == 0 {
			o.backends.modules = slices.Clone(cfg.Backends.PKCS11.AllowedModules)
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
	o.allowKeyURIModule()
	return nil
}

// allowKeyURIModule adds the PKCS#11 module --key-uri names to the allowed
// modules. The signer loads only its configured modules because key URIs
// reach it from Authorities others may write; --key-uri is typed by the
// operator running this command, who could as well pass --pkcs11-module.
// Without this an HSM vendor's module is refused unless repeated in a flag.
func (o *caOptions) allowKeyURIModule() {
	u, err := uri.Parse(o.keyURI)
	if err != nil || u.Scheme != "pkcs11" {
		return
	}
	m := u.Attr("module-path")
	if m == "" {
		return
	}
	if len(o.backends.modules) == 0 {
		o.backends.modules = pkcs11.DefaultAllowedModules()
	}
	if !slices.Contains(o.backends.modules, m) {
		o.backends.modules = append(o.backends.modules, m)
	}
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

// checkWriteAccess asks the apiserver (SelfSubjectAccessReview) whether the
// caller may write tgt: create the Authority, or update the existing one.
// It runs before any key is made, so that a caller without the grant (the
// signer's own ServiceAccount, say) is told so and leaves no key behind.
func checkWriteAccess(ctx context.Context, cs kubernetes.Interface, tgt target) error {
	verb := "update"
	if tgt.existing == nil {
		verb = "create"
	}
	ra := &authorizationv1.ResourceAttributes{Group: v1alpha1.GroupName, Resource: v1alpha1.Resource.Resource, Verb: verb, Name: tgt.name}
	if verb == "create" {
		ra.Name = "" // RBAC cannot restrict create by name
	}
	r, err := cs.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
		Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: ra},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("asking the apiserver whether you may %s authorities.%s (before any key is made): %w", verb, v1alpha1.GroupName, err)
	}
	if r.Status.Allowed {
		return nil
	}
	who := "you"
	if ssr, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{}); err == nil {
		who = fmt.Sprintf("%q", ssr.Status.UserInfo.Username)
	}
	what := "authorities." + v1alpha1.GroupName
	if ra.Name != "" {
		what += " " + ra.Name
	}
	reason := ""
	if r.Status.Reason != "" || r.Status.EvaluationError != "" {
		reason = " (" + strings.TrimSpace(r.Status.Reason+" "+r.Status.EvaluationError) + ")"
	}
	return fmt.Errorf("%s may not %s %s%s, so nothing was written and no key was made: run keyward ca as an identity bound to the CA administrator's ClusterRole (keyward-ca-admin; Helm: <release>-ca-admin; docs/production/ca-admin.md)", who, verb, what, reason)
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
			return refusedLocally{fmt.Errorf("Authority %s is for signer %s, not %s", name, a.Spec.SignerName, o.signer)}
		}
		if err := checkNewGeneration(a, gen.Name); err != nil {
			return refusedLocally{err}
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
					return refusedLocally{fmt.Errorf("generation %s is already Active in Authority %s: add %s Staged and rotate with keyward trust", g.Name, name, gen.Name)}
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
