package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/keyward/keyward/nodehelper/atomicdir"
)

// checkDirs makes the state, output and trust directories (as certstore and
// atomicdir would) and checks that a file can be created in each, so that a
// directory that is a file, sits under a file or is read-only stops Run at
// start with the field's name, instead of failing every renewal (and, for
// an output, only after a certificate was already requested).
func (a *Agent) checkDirs() error {
	type dir struct {
		field, path string
		mode        os.FileMode
	}
	dirs := []dir{{"stateDir", a.cfg.StateDir, 0o700}}
	for i, c := range a.cfg.Credentials {
		dirs = append(dirs, dir{fmt.Sprintf("credentials[%d].output.dir", i), c.Output.Dir, 0o755})
	}
	for i, t := range a.cfg.Trust {
		dirs = append(dirs, dir{fmt.Sprintf("trust[%d].dir", i), t.Dir, 0o755})
	}
	for _, d := range dirs {
		if err := writableDir(d.path, d.mode); err != nil {
			return fmt.Errorf("%s: %w", d.field, err)
		}
	}
	return nil
}

// writableDir makes path (mode perm) if it is missing and creates and
// removes a file in it.
func writableDir(path string, perm os.FileMode) error {
	if fi, err := os.Stat(path); err == nil && !fi.IsDir() {
		return fmt.Errorf("%s is not a directory: %w", path, syscall.ENOTDIR)
	} else if err != nil {
		if err := os.MkdirAll(path, perm); err != nil {
			return fmt.Errorf("making the directory: %w", err)
		}
		// As certstore does: the new directory survives a crash.
		if err := atomicdir.SyncDir(filepath.Dir(path)); err != nil {
			return err
		}
	}
	f, err := os.CreateTemp(path, ".keyward-node-agent-check-*")
	if err != nil {
		return fmt.Errorf("checking that the directory is writable: %w", err)
	}
	name := f.Name()
	f.Close()
	if err := os.Remove(name); err != nil {
		return fmt.Errorf("removing %s: %w", filepath.Base(name), err)
	}
	return nil
}
