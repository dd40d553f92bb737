// Package version holds what a release build stamps into the keyward binary
// (hack/build-release.sh sets the variables below with -ldflags -X) and
// fills in what a development build can learn from its own build info.
package version

import (
	"runtime"
	"runtime/debug"
	"time"
)

// Set at link time by hack/build-release.sh:
//
//	-X github.com/keyward/keyward/internal/version.version=v0.1.0
//
// They stay empty in a plain `go build`, and Get falls back to the build info.
var (
	version   string
	gitCommit string
	buildDate string // RFC 3339, UTC
)

// Devel is the version a build reports when none was injected.
const Devel = "devel"

// Info is what `keyward version` prints. Its JSON field names are part of
// the command's output contract.
type Info struct {
	Version   string `json:"version"`
	GitCommit string `json:"gitCommit"`
	BuildDate string `json:"buildDate"`
	GoVersion string `json:"goVersion"`
	Platform  string `json:"platform"`
}

// Get returns the running binary's version information. Injected values win.
// Otherwise a binary installed with `go install …@vX.Y.Z` reports that module
// version, and any other build reports Devel, with the commit and date from the
// VCS stamp Go records in a build from a git checkout (empty when there is
// none, e.g. with -buildvcs=false). A "-dirty" suffix marks a commit built
// with uncommitted changes.
func Get() Info {
	bi, _ := debug.ReadBuildInfo()
	return get(version, gitCommit, buildDate, bi)
}

func get(injectedVersion, injectedCommit, injectedDate string, bi *debug.BuildInfo) Info {
	info := Info{
		Version:   injectedVersion,
		GitCommit: injectedCommit,
		BuildDate: injectedDate,
		GoVersion: runtime.Version(),
		Platform:  runtime.GOOS + "/" + runtime.GOARCH,
	}
	var revision, vcsTime string
	var modified bool
	if bi != nil {
		if bi.GoVersion != "" {
			info.GoVersion = bi.GoVersion
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				revision = s.Value
			case "vcs.time":
				vcsTime = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	if info.Version == "" {
		info.Version = Devel
		// A module version without a VCS stamp came from the module proxy
		// (go install …@version); one with a stamp is Go's pseudo-version of a
		// local checkout, which says less than "devel" plus the commit.
		if bi != nil && revision == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			info.Version = bi.Main.Version
		}
	}
	if info.GitCommit == "" && revision != "" {
		info.GitCommit = revision
		if modified {
			info.GitCommit += "-dirty"
		}
	}
	if info.BuildDate == "" && vcsTime != "" {
		// vcs.time is the commit's time, the best a development build knows.
		if t, err := time.Parse(time.RFC3339, vcsTime); err == nil {
			info.BuildDate = t.UTC().Format(time.RFC3339)
		}
	}
	return info
}
