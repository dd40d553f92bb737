//go:build unix

package certstore

import (
	"io/fs"
	"syscall"
)

// ownerOf is the uid owning fi; ok is false where the platform does not say.
func ownerOf(fi fs.FileInfo) (uid int, ok bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return int(st.Uid), true
}
