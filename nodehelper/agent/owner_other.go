//go:build !unix

package agent

import "io/fs"

// ownedAs cannot tell owners here: any owner matches.
func ownedAs(fs.FileInfo, int, int) bool { return true }
