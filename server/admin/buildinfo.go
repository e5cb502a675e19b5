package admin

import (
	"runtime"
	"runtime/debug"
	"strconv"
	"sync"
)

// DevelVersion is BuildInfo.Version of a binary that carries no module
// version: built with -buildvcs=false, or outside a git clone, or from a
// git worktree (whose .git is a file, which the go command does not
// recognise).
const DevelVersion = "(devel)"

// BuildInfo identifies the running binary: /status has it as "build"
// (ticketingd prints it as `ticketingd version` too, and has it as the
// labels of its ticketing_build_info metric).
type BuildInfo struct {
	// Version is the module version: vX.Y.Z for `go install
	// MODULE@vX.Y.Z`, a pseudo-version such as
	// v0.0.0-20261201193522-ef5cbb39c1f1 (+dirty when modified) for a
	// build in a git clone, or DevelVersion when the go command stamped
	// none. (ticketingd's main.version, set with -ldflags -X, overrides
	// it.)
	Version string `json:"version"`
	// Path is the main module's path.
	Path string `json:"module"`
	// Revision is the VCS commit the binary was built from (vcs.revision),
	// empty when unknown.
	Revision string `json:"revision"`
	// RevisionTime is that commit's time (vcs.time), empty when unknown.
	RevisionTime string `json:"revision_time,omitempty"`
	// Modified tells whether the working tree had changes against
	// Revision (vcs.modified); nil when unknown.
	Modified *bool `json:"modified"`
	// GoVersion is the Go toolchain that built the binary.
	GoVersion string `json:"go_version"`
}

// ReadBuildInfo returns the running binary's BuildInfo, from what the go
// command stamped in it (runtime/debug.ReadBuildInfo, read once):
// NewBuildInfo of that. It is /status's "build" when Options.Build is nil.
func ReadBuildInfo() BuildInfo { return readBuildInfo() }

var readBuildInfo = sync.OnceValue(func() BuildInfo {
	bi, _ := debug.ReadBuildInfo()
	return NewBuildInfo(bi)
})

// NewBuildInfo maps the go command's stamp to a BuildInfo: the main
// module's path and version (DevelVersion if it has none), the VCS
// settings vcs.revision, vcs.time and vcs.modified, and the Go version
// of the running binary. bi may be nil: then Version is DevelVersion,
// Path is empty and nothing is known of the VCS.
func NewBuildInfo(bi *debug.BuildInfo) BuildInfo {
	info := BuildInfo{Version: DevelVersion, GoVersion: runtime.Version()}
	if bi == nil {
		return info
	}
	info.Path = bi.Main.Path
	if v := bi.Main.Version; v != "" {
		info.Version = v
	}
	for _, kv := range bi.Settings {
		switch kv.Key {
		case "vcs.revision":
			info.Revision = kv.Value
		case "vcs.time":
			info.RevisionTime = kv.Value
		case "vcs.modified":
			if m, err := strconv.ParseBool(kv.Value); err == nil {
				info.Modified = &m
			}
		}
	}
	return info
}
