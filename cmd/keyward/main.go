// Command keyward is the keyward signer, node helper and operator tool.
package main

import (
	"os"

	"github.com/keyward/keyward/cmd/keyward/app"
)

func main() {
	// Exit codes: 0 done, 1 error, 3 a gate holds (nothing changed), 4
	// --wait timed out (docs/cli.md).
	os.Exit(app.ExitCode(app.NewCommand().Execute()))
}
