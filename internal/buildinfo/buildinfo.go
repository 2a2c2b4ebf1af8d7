// Package buildinfo tells which drover this is.
package buildinfo

import (
	"runtime/debug"
)

// Set at link time: go build -ldflags "-X github.com/droverhq/drover/internal/buildinfo.Version=v0.1.0 -X github.com/droverhq/drover/internal/buildinfo.Commit=abc123".
var (
	Version = "dev"
	Commit  = ""
)

// Info is the version and commit of the running binary.
type Info struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	GoVersion string `json:"go_version"`
}

// Get returns the build information, falling back to what the Go toolchain
// stamped into the binary when the linker flags were not set.
func Get() Info {
	info := Info{Version: Version, Commit: Commit, GoVersion: "unknown"}
	if bi, ok := debug.ReadBuildInfo(); ok {
		info.GoVersion = bi.GoVersion
		if info.Version == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			info.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && info.Commit == "" {
				info.Commit = s.Value
			}
		}
	}
	if info.Commit == "" {
		info.Commit = "unknown"
	}
	return info
}
