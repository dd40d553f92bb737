package app

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/keyward/keyward/internal/version"
)

func TestVersionCommand(t *testing.T) {
	want := version.Get()
	t.Run("json output decodes to the running binary's version info", func(t *testing.T) {
		var out bytes.Buffer
		cmd := NewCommand()
		cmd.SetOut(&out)
		cmd.SetArgs([]string{"version", "--output", "json"})
		if err := cmd.Execute(); err != nil {
			t.Fatalf("keyward version --output json: %v", err)
		}
		var got version.Info
		if err := json.Unmarshal(out.Bytes(), &got); err != nil {
			t.Fatalf("decoding %q: %v", out.String(), err)
		}
		if got != want {
			t.Errorf("got %+v, want %+v", got, want)
		}
	})
	t.Run("text output starts with keyward and the version", func(t *testing.T) {
		var out bytes.Buffer
		cmd := NewCommand()
		cmd.SetOut(&out)
		cmd.SetArgs([]string{"version"})
		if err := cmd.Execute(); err != nil {
			t.Fatalf("keyward version: %v", err)
		}
		if first, _, _ := strings.Cut(out.String(), "\n"); first != "keyward "+want.Version {
			t.Errorf("first line %q, want %q", first, "keyward "+want.Version)
		}
		for _, s := range []string{want.GoVersion, want.Platform} {
			if !strings.Contains(out.String(), s) {
				t.Errorf("output %q lacks %q", out.String(), s)
			}
		}
	})
	t.Run("an unknown output format is refused", func(t *testing.T) {
		cmd := NewCommand()
		cmd.SetOut(&bytes.Buffer{})
		cmd.SetErr(&bytes.Buffer{})
		cmd.SetArgs([]string{"version", "-o", "xml"})
		if err := cmd.Execute(); !errors.Is(err, errUnknownOutput) {
			t.Errorf("got %v, want errUnknownOutput", err)
		}
	})
}
