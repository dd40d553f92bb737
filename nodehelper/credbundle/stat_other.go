//go:build !unix

package credbundle

import "os"

func fileIDOf(st os.FileInfo) fileID {
	return fileID{size: st.Size(), mtime: st.ModTime().UnixNano()}
}
