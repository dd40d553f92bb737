package app

import (
	"testing"

	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
)

// --force is refused for exactly the gates the controller's override does
// not skip (trustpublisher's always(): InvalidCertificate, KeyNotReady,
// and NotYetValid on the way to Active). A NotYetValid that --force
// "forced past" would leave the override waiting while the command says
// the gates were skipped.
func TestForceIsRefusedForTheGatesNoOverrideSkips(t *testing.T) {
	cases := []struct {
		gate        string
		unforceable bool
	}{
		{v1alpha1.GateInvalidCertificate, true},
		{v1alpha1.GateKeyNotReady, true},
		{v1alpha1.GateNotYetValid, true},
		{v1alpha1.GateCanarySoak, false},
		{v1alpha1.GatePropagationWindow, false},
		{v1alpha1.GateLeavesValid, false},
	}
	for _, tc := range cases {
		t.Run(tc.gate, func(t *testing.T) {
			if got := unforceable(tc.gate); got != tc.unforceable {
				t.Fatalf("unforceable(%s) = %v, want %v", tc.gate, got, tc.unforceable)
			}
		})
	}
}
