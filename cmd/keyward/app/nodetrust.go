package app

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/keyward/keyward/nodehelper/trust"
	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
)

type nodeTrustOptions struct {
	kube        kubeFlags
	name        string
	signerName  string
	version     string
	labelDomain string
	node        string
	nodeLabel   string
	dir         string
	file        string
	mode        string
	uid, gid    int
	onChange    string
	hookTimeout time.Duration
	debounce    time.Duration
	additional  []string
	maxCerts    int
	maxBytes    int
}

// errNodeTrustFlags is matched by flag errors of keyward node trust.
var errNodeTrustFlags = errors.New("invalid flags")

// newNodeTrustCommand is `keyward node trust`; the lead wires it under
// `keyward node`.
func newNodeTrustCommand() *cobra.Command {
	return newNodeTrustCommandWith(&nodeTrustOptions{})
}

// newNodeTrustCommandWith binds the command's flags to o.
func newNodeTrustCommandWith(o *nodeTrustOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "trust --dir DIR (--name NAME | --signer-name NAME [--version live|canary] [--node NAME --node-label KEY])",
		Short: "Project ClusterTrustBundles to a trust file on the node and keep it current",
		Long: `Writes the certificates of the selected ClusterTrustBundles to DIR/FILE (atomically,
kubelet's ..data symlink scheme), merged, without PEM headers or text between blocks,
each certificate once, in a stable order; rewrites it within seconds of a change (watch).
Select one bundle by --name, or a signer's bundles by --signer-name and the version label
<label-domain>/cluster-trust-bundle-version=canary|live: --version, or the value (canary or
live) of --node-label on this Node (--node, default $NODE_NAME). Only keyward's own bundle,
<signer name with / as :>:<version>, is merged, and any --additional-bundle-name: anyone with
attest on the signer name can create other bundles under its prefix. On errors, an empty
selection or one over --max-certificates or --max-bytes the last good file stays; an empty
file is never written. --on-change runs once, --on-change-debounce after a change, for the
file as it is then.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := o.kube.restConfig()
			if err != nil {
				return err
			}
			cs, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				return fmt.Errorf("building a client: %w", err)
			}
			opts, err := o.projectorOptions(cs)
			if err != nil {
				return err
			}
			p, err := trust.New(opts)
			if err != nil {
				return err
			}
			ctx, cancel := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer cancel()
			return p.Run(ctx)
		},
	}
	o.kube.addFlags(cmd)
	f := cmd.Flags()
	f.StringVar(&o.name, "name", "", "the ClusterTrustBundle to project")
	f.StringVar(&o.signerName, "signer-name", "", "project the ClusterTrustBundles of this signer (spec.signerName) with the selected version")
	f.StringVar(&o.version, "version", "", "canary or live (default live): the version taken when no Node label chooses")
	f.StringVar(&o.labelDomain, "label-domain", trust.DefaultLabelDomain, "domain of the <domain>/cluster-trust-bundle-version label")
	f.StringVar(&o.node, "node", "", "this node's name, whose --node-label chooses the version (default $NODE_NAME)")
	f.StringVar(&o.nodeLabel, "node-label", "", "label on the Node whose value, canary or live, chooses the version (e.g. keyward.dev/trust-bundle)")
	f.StringVar(&o.dir, "dir", "", "directory of the trust file (holds ..data and timestamped directories)")
	f.StringVar(&o.file, "file", trust.DefaultFileName, "trust file name in --dir")
	f.StringVar(&o.mode, "mode", "0644", "trust file mode, octal")
	f.IntVar(&o.uid, "uid", -1, "trust file owner uid (-1: unchanged)")
	f.IntVar(&o.gid, "gid", -1, "trust file owner gid (-1: unchanged)")
	f.StringVar(&o.onChange, "on-change", "", "command run after the file changed, arguments separated by spaces, no shell (e.g. \"systemctl reload containerd\"); its failure is logged")
	f.DurationVar(&o.hookTimeout, "on-change-timeout", trust.DefaultHookTimeout, "the --on-change command is killed after this long")
	f.DurationVar(&o.debounce, "on-change-debounce", trust.DefaultHookDebounce, "--on-change runs this long after a change, once for every change in that time")
	f.StringSliceVar(&o.additional, "additional-bundle-name", nil, "with --signer-name, a further ClusterTrustBundle name to merge besides keyward's <signer>:<version> (repeatable)")
	f.IntVar(&o.maxCerts, "max-certificates", trust.DefaultMaxCertificates, "most certificates the trust file may hold; over it the last good file stays")
	f.IntVar(&o.maxBytes, "max-bytes", trust.DefaultMaxBytes, "largest trust file in bytes; over it the last good file stays")
	return cmd
}

// projectorOptions turns the flags into the projector's options.
func (o *nodeTrustOptions) projectorOptions(cs kubernetes.Interface) (trust.Options, error) {
	mode, err := strconv.ParseUint(o.mode, 8, 32)
	if err != nil || mode == 0 || mode > 0o777 {
		return trust.Options{}, fmt.Errorf("%w: --mode %q is not an octal file mode like 0644", errNodeTrustFlags, o.mode)
	}
	if o.hookTimeout <= 0 {
		return trust.Options{}, fmt.Errorf("%w: --on-change-timeout must be positive", errNodeTrustFlags)
	}
	if o.debounce <= 0 {
		return trust.Options{}, fmt.Errorf("%w: --on-change-debounce must be positive", errNodeTrustFlags)
	}
	if o.maxCerts <= 0 || o.maxBytes <= 0 {
		return trust.Options{}, fmt.Errorf("%w: --max-certificates and --max-bytes must be positive", errNodeTrustFlags)
	}
	node := o.node
	if node == "" && o.nodeLabel != "" {
		node = os.Getenv("NODE_NAME")
		if node == "" {
			return trust.Options{}, fmt.Errorf("%w: --node-label needs --node or $NODE_NAME", errNodeTrustFlags)
		}
	}
	opts := trust.Options{
		Client:      cs,
		Name:        o.name,
		SignerName:  o.signerName,
		Version:     o.version,
		LabelDomain: o.labelDomain,
		NodeName:    node,
		NodeLabel:   o.nodeLabel,
		Dir:         o.dir,
		FileName:    o.file,
		Mode:        os.FileMode(mode),
		UID:         o.uid,
		GID:         o.gid,

		AdditionalBundleNames: o.additional,
		MaxCertificates:       o.maxCerts,
		MaxBytes:              o.maxBytes,
		OnChangeDebounce:      o.debounce,
	}
	if argv := strings.Fields(o.onChange); len(argv) > 0 {
		opts.OnChange = trust.CommandHook(argv, o.hookTimeout)
	}
	return opts, nil
}
