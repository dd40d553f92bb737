// Package atomicdir writes a set of files that must agree (a private key and
// its certificate chain, a trust bundle and its sidecar) so that a reader
// never sees files from two different writes. It uses kubelet's atomic writer
// scheme (pkg/volume/util/atomic_writer.go):
//
//	dir/..2026_11_23_15_04_05.123456789/   one directory per Write, fsynced
//	dir/..data -> ..2026_11_23_15_04_05.…  swapped by one rename
//	dir/<name> -> ..data/<name>            the names consumers use
//
// Opening dir/<name> resolves ..data at each open, so two files opened one
// after the other may come from two writes. Consumers that need a
// consistent set read it with Read, which resolves ..data once.
package atomicdir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// DataLink is the symlink that names the current timestamped directory.
const DataLink = "..data"

const (
	dataTmpLink = "..data_tmp"
	// KeepOwner in Options.UID or Options.GID leaves that id unchanged.
	KeepOwner = -1
	// readAttempts bounds how often Read re-resolves ..data when a
	// concurrent Write removes the directory it resolved.
	readAttempts = 10
)

// File is one file of a set written together.
type File struct {
	Data []byte
	// Mode is the file's permission bits; zero means 0644. A private key
	// should be 0600.
	Mode os.FileMode
}

// Options control ownership of what Write creates.
type Options struct {
	// UID and GID own every file and the timestamped directory; -1
	// (KeepOwner) leaves the id unchanged. The zero value means root.
	UID, GID int
}

// ErrInvalidName is returned for a file name that is empty, holds a path
// separator, or starts with "..".
var ErrInvalidName = errors.New("invalid file name")

// hooks lets tests fail a Write at a chosen step.
type hooks struct {
	beforeSwap func() error
}

// Write replaces the set of files in dir as one: a new timestamped directory
// (..<timestamp>) holding every file, fsynced, then the ..data symlink swapped
// by one rename, the directory fsynced; each visible name is a symlink
// <name> -> ..data/<name> (kubelet's atomic writer scheme). Old timestamped
// directories are removed after the swap. Owner (uid/gid, -1 = unchanged).
//
// On an error before the swap the previous set stays as it was. Write must
// not run concurrently with another Write to the same dir; readers may.
func Write(dir string, files map[string]File, opts Options) error {
	return write(dir, files, opts, hooks{})
}

func write(dir string, files map[string]File, opts Options, h hooks) error {
	for name := range files {
		if err := validName(name); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating directory %s: %w", dir, err)
	}
	oldTarget, err := os.Readlink(filepath.Join(dir, DataLink))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("reading %s link in %s: %w", DataLink, dir, err)
	}
	var oldNames []string
	if oldTarget != "" {
		// A ..data naming a directory someone removed by hand is no reason
		// to refuse a new set: it has no names to drop.
		if oldNames, err = listNames(filepath.Join(dir, oldTarget)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}

	tsDir, err := os.MkdirTemp(dir, time.Now().UTC().Format("..2006_01_02_15_04_05."))
	if err != nil {
		return fmt.Errorf("creating timestamped directory in %s: %w", dir, err)
	}
	swapped := false
	defer func() {
		if !swapped {
			_ = os.RemoveAll(tsDir)
		}
	}()
	if err := os.Chmod(tsDir, 0o755); err != nil {
		return fmt.Errorf("setting mode of %s: %w", tsDir, err)
	}
	if err := chown(tsDir, opts); err != nil {
		return err
	}
	for name, f := range files {
		if err := writeFile(filepath.Join(tsDir, name), f, opts); err != nil {
			return err
		}
	}
	if err := SyncDir(tsDir); err != nil {
		return err
	}
	if h.beforeSwap != nil {
		if err := h.beforeSwap(); err != nil {
			return err
		}
	}

	// The swap: ..data_tmp -> new dir, renamed over ..data.
	tmpLink := filepath.Join(dir, dataTmpLink)
	if err := os.Remove(tmpLink); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing stale %s: %w", tmpLink, err)
	}
	if err := os.Symlink(filepath.Base(tsDir), tmpLink); err != nil {
		return fmt.Errorf("creating %s: %w", tmpLink, err)
	}
	if err := os.Rename(tmpLink, filepath.Join(dir, DataLink)); err != nil {
		_ = os.Remove(tmpLink)
		return fmt.Errorf("swapping %s in %s: %w", DataLink, dir, err)
	}
	swapped = true

	// Visible names: add the new ones, drop the ones the new set lacks.
	for name := range files {
		if err := ensureLink(dir, name); err != nil {
			return err
		}
	}
	for _, name := range oldNames {
		if _, ok := files[name]; ok {
			continue
		}
		if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("removing stale link %s: %w", name, err)
		}
	}
	if err := SyncDir(dir); err != nil {
		return err
	}
	return removeOldDirs(dir, filepath.Base(tsDir))
}

func validName(name string) error {
	if name == "" || name == "." || strings.ContainsRune(name, '/') || strings.HasPrefix(name, "..") {
		return fmt.Errorf("checking file name %q: %w", name, ErrInvalidName)
	}
	return nil
}

func listNames(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", dir, err)
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names, nil
}

func writeFile(path string, f File, opts Options) error {
	mode := f.Mode.Perm()
	if mode == 0 {
		mode = 0o644
	}
	fh, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return fmt.Errorf("creating %s: %w", path, err)
	}
	err = func() error {
		if _, err := fh.Write(f.Data); err != nil {
			return fmt.Errorf("writing %s: %w", path, err)
		}
		// The umask may have cleared bits of mode at creation.
		if err := fh.Chmod(mode); err != nil {
			return fmt.Errorf("setting mode of %s: %w", path, err)
		}
		if err := chown(path, opts); err != nil {
			return err
		}
		if err := fh.Sync(); err != nil {
			return fmt.Errorf("syncing %s: %w", path, err)
		}
		return nil
	}()
	if cerr := fh.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("closing %s: %w", path, cerr)
	}
	return err
}

func chown(path string, opts Options) error {
	if opts.UID == KeepOwner && opts.GID == KeepOwner {
		return nil
	}
	if err := os.Lchown(path, opts.UID, opts.GID); err != nil {
		return fmt.Errorf("setting owner of %s: %w", path, err)
	}
	return nil
}

// ensureLink makes dir/name a symlink to ..data/name, replacing whatever is
// there by a rename so the name never disappears.
func ensureLink(dir, name string) error {
	want := filepath.Join(DataLink, name)
	path := filepath.Join(dir, name)
	if got, err := os.Readlink(path); err == nil && got == want {
		return nil
	}
	tmp := filepath.Join(dir, "..tmp_"+name)
	_ = os.Remove(tmp)
	if err := os.Symlink(want, tmp); err != nil {
		return fmt.Errorf("creating link for %s: %w", name, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("placing link for %s: %w", name, err)
	}
	return nil
}

// SyncDir fsyncs the directory dir, so that entries just created, renamed
// or removed in it survive a crash. A file system that cannot sync a
// directory (os.ErrInvalid) is no error. It is the one directory fsync of
// the node helper's packages (nodehelper.WriteFileAtomic, certstore).
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("opening %s to sync: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, os.ErrInvalid) {
		return fmt.Errorf("syncing %s: %w", dir, err)
	}
	return nil
}

// removeOldDirs removes every timestamped directory but keep, including
// ones a crashed Write left behind.
func removeOldDirs(dir, keep string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("listing %s: %w", dir, err)
	}
	var errs []error
	for _, e := range entries {
		name := e.Name()
		if !e.IsDir() || name == keep || !strings.HasPrefix(name, "..") {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, name)); err != nil {
			errs = append(errs, fmt.Errorf("removing old directory %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// Read returns the named files of the set currently in dir, all from the
// same Write: it resolves ..data once and reads every file under the
// directory it names. When a concurrent Write removes that directory midway,
// Read resolves ..data again (a bounded number of times).
func Read(dir string, names ...string) (map[string][]byte, error) {
	var lastErr error
	for range readAttempts {
		target, err := os.Readlink(filepath.Join(dir, DataLink))
		if err != nil {
			return nil, fmt.Errorf("reading %s link in %s: %w", DataLink, dir, err)
		}
		out, err := readAll(filepath.Join(dir, target), names)
		if err == nil {
			return out, nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		lastErr = err
		// A file missing from the directory the link still names is not a
		// race: the set lacks it.
		if now, lerr := os.Readlink(filepath.Join(dir, DataLink)); lerr == nil && now == target {
			return nil, err
		}
	}
	return nil, fmt.Errorf("reading a consistent set in %s (it changed %d times): %w", dir, readAttempts, lastErr)
}

func readAll(tsDir string, names []string) (map[string][]byte, error) {
	out := make(map[string][]byte, len(names))
	for _, name := range names {
		if err := validName(name); err != nil {
			return nil, err
		}
		b, err := os.ReadFile(filepath.Join(tsDir, name))
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", name, err)
		}
		out[name] = b
	}
	return out, nil
}
