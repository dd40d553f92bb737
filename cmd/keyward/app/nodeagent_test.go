package app

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"

	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	fielderr "k8s.io/apimachinery/pkg/util/validation/field"
)

// `keyward node agent` is wired under `keyward node`, wants --config, and
// refuses a bad configuration before it starts anything, naming the field.
func TestNodeAgentCommandRefusesBadConfigurations(t *testing.T) {
	if _, _, err := newNodeCommand().Find([]string{"agent"}); err != nil {
		t.Fatalf("keyward node agent: %v", err)
	}
	bad := filepath.Join(t.TempDir(), "agent.yaml")
	if err := os.WriteFile(bad, []byte("apiVersion: keyward.dev/v1alpha1\nkind: NodeAgentConfiguration\nnodeName: n1\nstateDir: relative\nkubeconfig: /k\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		args      []string
		wantField string
	}{
		{"no --config is refused", nil, ""},
		{"a relative state directory is refused naming the field", []string{"--config", bad}, "stateDir"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := newNodeAgentCommand()
			cmd.SetArgs(tc.args)
			cmd.SetOut(io.Discard)
			cmd.SetErr(io.Discard)
			err := cmd.Execute()
			if err == nil {
				t.Fatal("accepted")
			}
			if tc.wantField == "" {
				return
			}
			var agg utilerrors.Aggregate
			if !errors.As(err, &agg) {
				t.Fatalf("err = %v, want a field error list", err)
			}
			var fields []string
			for _, e := range agg.Errors() {
				var fe *fielderr.Error
				if errors.As(e, &fe) {
					fields = append(fields, fe.Field)
				}
			}
			if !slices.Contains(fields, tc.wantField) {
				t.Errorf("fields %v, want %s", fields, tc.wantField)
			}
		})
	}
}
