// Command registry is the CNCF Distribution registry (v3, the version in
// keyward's go.mod) with only what keyward's demo and docs use: token
// authentication and the filesystem and in-memory storage drivers. It is
// Distribution's own serve command and configuration parser, unchanged:
//
//	registry serve config.yml
//
// `make registry` builds it into bin/registry; `make demo` runs it. The
// cloud storage drivers of the upstream binary are left out only to keep
// keyward's module free of their SDKs.
package main

import (
	"os"

	"github.com/distribution/distribution/v3/registry"

	// Each registers itself by name for the configuration to select.
	_ "github.com/distribution/distribution/v3/registry/auth/token"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/inmemory"
)

func main() {
	if err := registry.RootCmd.Execute(); err != nil {
		os.Exit(1)
	}
}
