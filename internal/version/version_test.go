package version

import (
	"runtime"
	"runtime/debug"
	"testing"
)

func TestGet(t *testing.T) {
	checkout := &debug.BuildInfo{
		GoVersion: "go1.26.8",
		Main:      debug.Module{Path: "github.com/keyward/keyward", Version: "v0.0.0-20261123220000-c60bcf7aaaaa+dirty"},
		Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "c60bcf7aaaaa"},
			{Key: "vcs.time", Value: "2026-11-23T22:00:00+01:00"},
			{Key: "vcs.modified", Value: "true"},
		},
	}
	proxy := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/keyward/keyward", Version: "v0.3.0"}}
	cases := []struct {
		name                  string
		version, commit, date string
		bi                    *debug.BuildInfo
		want                  Info
	}{
		{
			name:    "injected values win over the build info",
			version: "v1.2.3", commit: "abc", date: "2026-11-23T00:00:00Z",
			bi:   checkout,
			want: Info{Version: "v1.2.3", GitCommit: "abc", BuildDate: "2026-11-23T00:00:00Z", GoVersion: "go1.26.8"},
		},
		{
			name: "a build from a dirty checkout is devel with the commit marked dirty and the commit time in UTC",
			bi:   checkout,
			want: Info{Version: Devel, GitCommit: "c60bcf7aaaaa-dirty", BuildDate: "2026-11-23T21:00:00Z", GoVersion: "go1.26.8"},
		},
		{
			name: "a go install of a tagged module reports the module version",
			bi:   proxy,
			want: Info{Version: "v0.3.0", GoVersion: "go1.26.8"},
		},
		{
			name: "a build without build info is devel with the running Go version",
			want: Info{Version: Devel, GoVersion: runtime.Version()},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.want.Platform = runtime.GOOS + "/" + runtime.GOARCH
			if got := get(tc.version, tc.commit, tc.date, tc.bi); got != tc.want {
				t.Errorf("get() = %+v, want %+v", got, tc.want)
			}
		})
	}
}
