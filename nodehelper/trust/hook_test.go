package trust

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

func TestCommandHook(t *testing.T) {
	dir := t.TempDir()
	marker := filepath.Join(dir, "ran")
	tests := []struct {
		name    string
		argv    []string
		timeout time.Duration
		check   func(t *testing.T, err error)
	}{
		{
			name: "a command that succeeds runs with its arguments and returns nil",
			argv: []string{"touch", marker},
			check: func(t *testing.T, err error) {
				if err != nil {
					t.Fatal(err)
				}
				if _, err := os.Stat(marker); err != nil {
					t.Fatalf("the hook did not run: %v", err)
				}
			},
		},
		{
			name: "a command that exits non-zero is an error carrying its exit status",
			argv: []string{"false"},
			check: func(t *testing.T, err error) {
				var exit *exec.ExitError
				if !errors.As(err, &exit) || exit.ExitCode() != 1 {
					t.Fatalf("got %v, want exit status 1", err)
				}
			},
		},
		{
			name:    "a command that outlives the timeout is killed and the error says deadline exceeded",
			argv:    []string{"sleep", "60"},
			timeout: 200 * time.Millisecond,
			check: func(t *testing.T, err error) {
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("got %v, want DeadlineExceeded", err)
				}
			},
		},
		{
			name: "a command that does not exist is an error",
			argv: []string{filepath.Join(dir, "no-such-command")},
			check: func(t *testing.T, err error) {
				if !errors.Is(err, os.ErrNotExist) {
					t.Fatalf("got %v, want ErrNotExist", err)
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.check(t, CommandHook(tc.argv, tc.timeout)(t.Context()))
		})
	}
}
