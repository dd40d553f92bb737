package app

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/keyward/keyward/deploy"
	"github.com/keyward/keyward/internal/controlplane"
	"github.com/keyward/keyward/internal/softhsm"
	"github.com/spf13/cobra"
)

type demoOptions struct {
	dir  string
	once bool
}

func newDemoCommand() *cobra.Command {
	o := &demoOptions{}
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run keyward locally: a real kube-apiserver + etcd and a SoftHSM2 token",
		Long: `demo starts a kube-apiserver and etcd on loopback (Node,RBAC authorization,
NodeRestriction admission), applies keyward's RBAC, makes a SoftHSM2 token,
prints how to reach them, and keeps them running until Ctrl-C. Everything it
made is removed when it stops.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer cancel()
			return runDemo(ctx, cmd.OutOrStdout(), o)
		},
	}
	cmd.Flags().StringVar(&o.dir, "dir", "", "directory for kubeconfigs and the SoftHSM token (default: a new temp dir, removed on exit)")
	cmd.Flags().BoolVar(&o.once, "once", false, "stop as soon as everything is up (for CI smoke runs)")
	return cmd
}

func runDemo(ctx context.Context, out io.Writer, o *demoOptions) error {
	dir := o.dir
	if dir == "" {
		d, err := os.MkdirTemp("", "keyward-demo-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		dir = d
	} else if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}

	hsm, err := softhsm.NewEnv(filepath.Join(dir, "softhsm"))
	if err != nil {
		return err
	}
	token, err := hsm.NewToken("keyward-demo")
	if err != nil {
		return err
	}

	fmt.Fprintln(out, "starting kube-apiserver and etcd ...")
	cp, err := controlplane.Start(ctx, controlplane.Options{})
	if err != nil {
		return fmt.Errorf("starting control plane: %w", err)
	}
	defer cp.Stop()
	manifest, err := deploy.Base.ReadFile("base/rbac.yaml")
	if err != nil {
		return err
	}
	if err := controlplane.ApplyManifest(ctx, cp.AdminConfig(), manifest); err != nil {
		return fmt.Errorf("applying deploy/base/rbac.yaml: %w", err)
	}

	admin := filepath.Join(dir, "admin.kubeconfig")
	if err := controlplane.WriteKubeconfig(cp.AdminConfig(), "admin", admin); err != nil {
		return err
	}
	signerCfg, err := cp.ServiceAccountConfig("keyward", "keyward-signer")
	if err != nil {
		return err
	}
	signer := filepath.Join(dir, "signer.kubeconfig")
	if err := controlplane.WriteKubeconfig(signerCfg, "keyward-signer", signer); err != nil {
		return err
	}

	fmt.Fprintf(out, `
control plane ready in %s at %s
  admin (system:masters):        export KUBECONFIG=%s
  signer (keyward/keyward-signer, shipped RBAC only): %s
SoftHSM2 token ready
  SOFTHSM2_CONF=%s
  module %s, token label %q, PIN in %s
  key URI prefix: pkcs11:token=%s?module-path=%s&pin-source=file:%s

`, cp.StartDuration.Round(time.Millisecond), cp.URL, admin, signer,
		hsm.ConfPath, token.ModulePath, token.Label, token.PINFile,
		token.Label, token.ModulePath, token.PINFile)
	if o.once {
		fmt.Fprintln(out, "--once: stopping")
		return nil
	}
	fmt.Fprintln(out, "press Ctrl-C to stop and remove everything")
	<-ctx.Done()
	fmt.Fprintln(out, "stopping ...")
	return nil
}
