// Package atomicdir: LOCAL STAND-IN for helper A's package, deleted before
// the final commit. Same signature as NODE.md.
package atomicdir

import (
	"fmt"
	"os"
	"path/filepath"
	"time"
)

type File struct {
	Data []byte
	Mode os.FileMode
}

type Options struct{ UID, GID int }

func Write(dir string, files map[string]File, opts Options) error {
	ts := filepath.Join(dir, "..stamp"+fmt.Sprint(time.Now().UnixNano()))
	if err := os.MkdirAll(ts, 0o755); err != nil {
		return err
	}
	for n, f := range files {
		if err := os.WriteFile(filepath.Join(ts, n), f.Data, f.Mode); err != nil {
			return err
		}
	}
	tmp := filepath.Join(dir, "..data_tmp")
	_ = os.Remove(tmp)
	if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		return err
	}
	for n := range files {
		p := filepath.Join(dir, n)
		if _, err := os.Lstat(p); err != nil {
			if err := os.Symlink(filepath.Join("..data", n), p); err != nil {
				return err
			}
		}
	}
	return nil
}
