package demo

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/keyward/keyward/internal/pemcert"
	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"github.com/keyward/keyward/nodehelper/atomicdir"
	"github.com/keyward/keyward/nodehelper/trust"
	"github.com/keyward/keyward/testsupport/controlplane"
	"github.com/keyward/keyward/trustpublisher"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// demoTrustLabel is the Node label that chooses which bundle version a
// node's trust file follows.
const demoTrustLabel = "keyward.dev/trust-bundle"

// demoTrustFile is one node's trust file, kept by the node helper's
// projector (what `keyward node trust` runs) as that node's identity.
type demoTrustFile struct {
	node, version, path string
	// shown is the content last printed.
	shown []byte
}

// startDemoTrust labels a canary node and the demo node (live) and runs a
// trust projector for demoSigner's bundles on each until ctx ends; stop
// waits for them.
func startDemoTrust(ctx context.Context, out io.Writer, cp *controlplane.ControlPlane, dir string) (files []*demoTrustFile, stop func(), err error) {
	admin := cp.AdminClient()
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	stop = func() { cancel(); wg.Wait() }
	defer func() {
		if err != nil {
			stop()
		}
	}()
	for _, n := range []struct{ node, version string }{{"demo-canary-node", v1alpha1.BundleCanary}, {"demo-node", v1alpha1.BundleLive}} {
		if _, err := controlplane.EnsureNode(ctx, admin, n.node); err != nil {
			return nil, nil, err
		}
		patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, demoTrustLabel, n.version)
		if _, err := admin.CoreV1().Nodes().Patch(ctx, n.node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			return nil, nil, fmt.Errorf("labelling Node %s: %w", n.node, err)
		}
		cfg, err := cp.NodeConfig(n.node)
		if err != nil {
			return nil, nil, err
		}
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return nil, nil, err
		}
		f := &demoTrustFile{node: n.node, version: n.version, path: filepath.Join(dir, "trust-"+n.node, trust.DefaultFileName)}
		p, err := trust.New(trust.Options{
			Client: cs, SignerName: demoSigner, NodeName: n.node, NodeLabel: demoTrustLabel,
			Dir: filepath.Dir(f.path), UID: atomicdir.KeepOwner, GID: atomicdir.KeepOwner,
		})
		if err != nil {
			return nil, nil, err
		}
		wg.Go(func() {
			if err := p.Run(ctx); err != nil {
				fmt.Fprintf(out, "trust projection on %s stopped: %v\n", n.node, err)
			}
		})
		fmt.Fprintf(out, "\n$ kubectl label node %s %s=%s\n$ keyward node trust --signer-name %s --node %s --node-label %s --dir %s   # as system:node:%s\n",
			n.node, demoTrustLabel, n.version, demoSigner, n.node, demoTrustLabel, filepath.Dir(f.path), n.node)
		files = append(files, f)
	}
	return files, stop, nil
}

// showTrustFiles waits until every trust file holds the roots a's phases
// put in its version's bundle, then prints each (and whether it changed
// since last shown) and the roots the canary node trusts that the live
// node does not.
func showTrustFiles(ctx context.Context, out io.Writer, files []*demoTrustFile, a *v1alpha1.Authority) error {
	wantCanary, wantLive := trustpublisher.BundleContents(a)
	roots := make([][]*x509.Certificate, len(files))
	for i, f := range files {
		want := wantLive
		if f.version == v1alpha1.BundleCanary {
			want = wantCanary
		}
		var data []byte
		err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, demoWait, true, func(context.Context) (bool, error) {
			var err error
			if data, err = os.ReadFile(f.path); errors.Is(err, os.ErrNotExist) {
				return false, nil
			} else if err != nil {
				return false, err
			}
			if roots[i], err = pemcert.Parse(data); err != nil {
				return false, nil // a projector never writes a torn file; poll again
			}
			return sameRoots(roots[i], want), nil
		})
		if err != nil {
			return fmt.Errorf("waiting for the trust file of %s to hold the %s bundle: %w", f.node, f.version, err)
		}
		change := "unchanged"
		switch {
		case f.shown == nil:
			change = "written"
		case !bytes.Equal(f.shown, data):
			change = "rewritten"
		}
		f.shown = data
		// Printed by subject; the file orders by DER, which differs per run.
		bySubject := slices.SortedFunc(slices.Values(roots[i]), func(a, b *x509.Certificate) int { return strings.Compare(a.Subject.String(), b.Subject.String()) })
		fmt.Fprintf(out, "trust file on %s (%s=%s): %s [%s]\n", f.node, demoTrustLabel, f.version, subjects(bySubject), change)
	}
	for i, f := range files {
		if f.version != v1alpha1.BundleCanary {
			continue
		}
		for j, g := range files {
			if g.version != v1alpha1.BundleLive {
				continue
			}
			var only []*x509.Certificate
			for _, c := range roots[i] {
				if !slices.ContainsFunc(roots[j], c.Equal) {
					only = append(only, c)
				}
			}
			if len(only) > 0 {
				fmt.Fprintf(out, "  the canary node %s trusts %s; the live node %s does not yet\n", f.node, subjects(only), g.node)
			}
		}
	}
	return nil
}
