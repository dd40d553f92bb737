//go:build unix

package agent

import (
	"io/fs"
	"syscall"

	"github.com/keyward/keyward/nodehelper/atomicdir"
)

// ownedAs reports whether fi has the owner uid and group gid, each
// atomicdir.KeepOwner meaning any.
func ownedAs(fi fs.FileInfo, uid, gid int) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return true
	}
	return (uid == atomicdir.KeepOwner || int(st.Uid) == uid) && (gid == atomicdir.KeepOwner || int(st.Gid) == gid)
}
