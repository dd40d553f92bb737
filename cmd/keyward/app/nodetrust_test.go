package app

import (
	"errors"
	"testing"

	"github.com/keyward/keyward/nodehelper/trust"
	"k8s.io/client-go/kubernetes/fake"
)

func TestNodeTrustFlags(t *testing.T) {
	parse := func(t *testing.T, env string, args ...string) (trust.Options, error) {
		t.Helper()
		t.Setenv("NODE_NAME", env)
		o := &nodeTrustOptions{}
		if err := newNodeTrustCommandWith(o).ParseFlags(args); err != nil {
			t.Fatal(err)
		}
		return o.projectorOptions(fake.NewClientset())
	}
	tests := []struct {
		name    string
		env     string
		args    []string
		wantErr error
		check   func(t *testing.T, o trust.Options)
	}{
		{
			name: "a signer, node and label are passed through with owner, mode and defaults",
			args: []string{"--signer-name", "keyward.dev/x", "--node", "n1", "--node-label", "keyward.dev/trust-bundle", "--dir", "/d", "--mode", "0640", "--uid", "0", "--gid", "5"},
			check: func(t *testing.T, o trust.Options) {
				if o.SignerName != "keyward.dev/x" || o.NodeName != "n1" || o.NodeLabel != "keyward.dev/trust-bundle" || o.Dir != "/d" {
					t.Fatalf("got %+v", o)
				}
				if o.Mode != 0o640 || o.UID != 0 || o.GID != 5 || o.FileName != trust.DefaultFileName || o.LabelDomain != trust.DefaultLabelDomain {
					t.Fatalf("got mode %o uid %d gid %d file %q domain %q", o.Mode, o.UID, o.GID, o.FileName, o.LabelDomain)
				}
				if o.OnChange != nil {
					t.Fatal("a hook without --on-change")
				}
			},
		},
		{
			name: "the node name defaults to $NODE_NAME when a node label is given",
			env:  "from-env",
			args: []string{"--signer-name", "keyward.dev/x", "--node-label", "k", "--dir", "/d"},
			check: func(t *testing.T, o trust.Options) {
				if o.NodeName != "from-env" {
					t.Fatalf("node %q, want from-env", o.NodeName)
				}
			},
		},
		{
			name: "owner defaults to unchanged and --on-change makes a hook",
			args: []string{"--name", "b", "--dir", "/d", "--on-change", "true --flag"},
			check: func(t *testing.T, o trust.Options) {
				if o.UID != -1 || o.GID != -1 || o.OnChange == nil {
					t.Fatalf("uid %d gid %d hook %v", o.UID, o.GID, o.OnChange != nil)
				}
			},
		},
		{name: "a node label without a node name or $NODE_NAME is refused", args: []string{"--signer-name", "s", "--node-label", "k", "--dir", "/d"}, wantErr: errNodeTrustFlags},
		{name: "a mode that is not octal is refused", args: []string{"--name", "b", "--dir", "/d", "--mode", "644x"}, wantErr: errNodeTrustFlags},
		{name: "a mode beyond 0777 is refused", args: []string{"--name", "b", "--dir", "/d", "--mode", "01777"}, wantErr: errNodeTrustFlags},
		{
			name: "bundle names, caps and the hook debounce are passed through",
			args: []string{"--signer-name", "keyward.dev/x", "--dir", "/d", "--additional-bundle-name", "keyward.dev:x:extra", "--max-certificates", "5", "--max-bytes", "4096", "--on-change-debounce", "1m"},
			check: func(t *testing.T, o trust.Options) {
				if len(o.AdditionalBundleNames) != 1 || o.AdditionalBundleNames[0] != "keyward.dev:x:extra" || o.MaxCertificates != 5 || o.MaxBytes != 4096 || o.OnChangeDebounce.String() != "1m0s" {
					t.Fatalf("got names %v, caps %d/%d, debounce %v", o.AdditionalBundleNames, o.MaxCertificates, o.MaxBytes, o.OnChangeDebounce)
				}
			},
		},
		{name: "a hook debounce of zero is refused", args: []string{"--name", "b", "--dir", "/d", "--on-change-debounce", "0s"}, wantErr: errNodeTrustFlags},
		{name: "a certificate cap of zero is refused", args: []string{"--name", "b", "--dir", "/d", "--max-certificates", "0"}, wantErr: errNodeTrustFlags},
		{name: "a hook timeout of zero is refused", args: []string{"--name", "b", "--dir", "/d", "--on-change-timeout", "0s"}, wantErr: errNodeTrustFlags},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parse(t, tc.env, tc.args...)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("got %v, want %v", err, tc.wantErr)
			}
			if err == nil && tc.check != nil {
				tc.check(t, o)
			}
		})
	}
}

// The projector refuses what the flags let through but cannot work.
func TestNodeTrustOptionsRefusedByProjector(t *testing.T) {
	for _, args := range [][]string{
		{"--dir", "/d"},
		{"--name", "b", "--signer-name", "s", "--dir", "/d"},
		{"--name", "b", "--version", "live", "--dir", "/d"},
		{"--signer-name", "s", "--version", "beta", "--dir", "/d"},
		{"--signer-name", "s"},
		{"--signer-name", "s", "--dir", "/d", "--file", "../x"},
	} {
		o := &nodeTrustOptions{}
		if err := newNodeTrustCommandWith(o).ParseFlags(args); err != nil {
			t.Fatal(err)
		}
		opts, err := o.projectorOptions(fake.NewClientset())
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if _, err := trust.New(opts); !errors.Is(err, trust.ErrInvalidOptions) {
			t.Fatalf("%v: got %v, want ErrInvalidOptions", args, err)
		}
	}
}
