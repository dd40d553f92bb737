// Command keyward is the keyward signer, node helper and operator tool.
package main

import (
	"os"

	"github.com/keyward/keyward/cmd/keyward/app"
)

func main() {
	if err := app.NewCommand().Execute(); err != nil {
		os.Exit(1)
	}
}
