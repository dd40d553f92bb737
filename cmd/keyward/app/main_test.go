package app

import (
	"os"
	"testing"
)

// runAsKeyward, set in a child's environment, makes this test binary act
// as the keyward command (os.Args[1:]) instead of running tests: the demo
// runs `keyward credential-provider` as kubelet would, as a separate
// process, without a second build.
const runAsKeyward = "KEYWARD_TEST_RUN_AS_KEYWARD"

func TestMain(m *testing.M) {
	if os.Getenv(runAsKeyward) == "1" {
		cmd := NewCommand()
		cmd.SetArgs(os.Args[1:])
		os.Exit(ExitCode(cmd.Execute()))
	}
	os.Exit(m.Run())
}
