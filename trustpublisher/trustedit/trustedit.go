// Package trustedit holds what `keyward trust` and `keyward demo` share
// about an Authority's rotation: setting one generation's desired phase
// (activating demotes the current Active one), the refusal when a gate of
// the controller would hold the step, and reading the published bundles as
// kubelet selects them.
package trustedit

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"github.com/keyward/keyward/trustpublisher"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
)

// ErrGateHolds is matched (errors.Is) by a *GateError.
var ErrGateHolds = errors.New("a gate holds the transition")

// GateError is a refusal because the controller would hold the step.
type GateError struct {
	Step trustpublisher.Step
	// Unforceable is set when --force was given but cannot skip the gate.
	Unforceable bool
}

func (e *GateError) Error() string {
	s := e.Step
	// s.Message reads "Staged → Promoted: CanarySoak: canary soak 12m0s
	// of 1h0m0s, opens at …", every closed gate named.
	msg := fmt.Sprintf("refused: %s %s", s.Generation, s.Message)
	if s.OpensAt != nil {
		msg += fmt.Sprintf(" (%s opens in %s)", s.Gate, time.Until(*s.OpensAt).Round(time.Second))
	}
	if e.Unforceable {
		return msg + "; --force skips every gate but InvalidCertificate and KeyNotReady"
	}
	return msg + "; nothing changed (wait, or --force --reason TEXT)"
}

func (e *GateError) Is(target error) bool { return target == ErrGateHolds }

// SetPhase sets generation gen's desired phase to p in a; activating
// moves the current desired Active generation to Promoted. It returns the
// generations whose desired phase changed, with their new phase.
func SetPhase(a *v1alpha1.Authority, gen string, p v1alpha1.Phase) (map[string]v1alpha1.Phase, error) {
	i := -1
	for j, g := range a.Spec.Generations {
		if g.Name == gen {
			i = j
		}
	}
	if i < 0 {
		var names []string
		for _, g := range a.Spec.Generations {
			names = append(names, g.Name)
		}
		return nil, fmt.Errorf("Authority %s has no generation %s (it has %s)", a.Name, gen, strings.Join(names, ", "))
	}
	changed := map[string]v1alpha1.Phase{}
	if p == v1alpha1.PhaseActive {
		for j := range a.Spec.Generations {
			if g := &a.Spec.Generations[j]; j != i && g.Phase == v1alpha1.PhaseActive {
				g.Phase = v1alpha1.PhasePromoted
				changed[g.Name] = g.Phase
			}
		}
	}
	if a.Spec.Generations[i].Phase != p {
		a.Spec.Generations[i].Phase = p
		changed[gen] = p
	}
	return changed, nil
}

// KubeletView lists a signer's ClusterTrustBundles of one version exactly
// as kubelet selects them: a spec.signerName field selector plus the
// version label, every match merged, deduplicated by DER.
func KubeletView(ctx context.Context, c kubernetes.Interface, signerName, version string) ([]*x509.Certificate, error) {
	list, err := c.CertificatesV1().ClusterTrustBundles().List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.signerName", signerName).String(),
		LabelSelector: labels.SelectorFromSet(labels.Set{v1alpha1.BundleVersionLabel("keyward.dev"): version}).String(),
	})
	if err != nil {
		return nil, fmt.Errorf("listing the %s ClusterTrustBundles of %s: %w", version, signerName, err)
	}
	var out []*x509.Certificate
	for _, b := range list.Items {
		rest := []byte(b.Spec.TrustBundle)
		for {
			var blk *pem.Block
			if blk, rest = pem.Decode(rest); blk == nil {
				break
			}
			if slices.ContainsFunc(out, func(c *x509.Certificate) bool { return bytes.Equal(c.Raw, blk.Bytes) }) {
				continue
			}
			c, err := x509.ParseCertificate(blk.Bytes)
			if err != nil {
				return nil, fmt.Errorf("ClusterTrustBundle %s: %w", b.Name, err)
			}
			out = append(out, c)
		}
	}
	return out, nil
}
