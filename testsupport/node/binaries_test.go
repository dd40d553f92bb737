package node

import (
	"os"
	"regexp"
	"testing"
)

// The versions FindBinaries looks for are the ones `make node` builds
// (Makefile) from the pins in hack/node/go.mod.
func TestPinsMatchTheMakefile(t *testing.T) {
	mk, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	cni, err := os.ReadFile("../../hack/cni/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	mod, err := os.ReadFile("../../hack/node/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		makeVar, module, want string
		goMod                 []byte
	}{
		{"CONTAINERD_VERSION", "github.com/containerd/containerd/v2", ContainerdVersion, mod},
		{"RUNC_VERSION", "github.com/opencontainers/runc", RuncVersion, mod},
		{"CNI_PLUGINS_VERSION", "github.com/containernetworking/plugins", CNIPluginsVersion, cni},
	} {
		m := regexp.MustCompile(`(?m)^` + c.makeVar + `\s*:=\s*(\S+)`).FindSubmatch(mk)
		if m == nil || string(m[1]) != c.want {
			t.Errorf("Makefile %s = %q, testsupport/node wants %s", c.makeVar, m, c.want)
		}
		p := regexp.MustCompile(`(?m)^\s*(?:require\s+)?` + regexp.QuoteMeta(c.module) + `\s+(\S+)`).FindSubmatch(c.goMod)
		if p == nil || string(p[1]) != c.want {
			t.Errorf("hack/node or hack/cni go.mod pins %s at %q, testsupport/node wants %s", c.module, p, c.want)
		}
	}
}
