package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// version, if set at build time (go build -ldflags "-X main.version=v1.2.3"),
// replaces the module version that the go command stamps in the binary.
var version = ""

// develVersion is the version of a binary that carries no module version:
// built with -buildvcs=false, or outside a git clone, or from a git
// worktree (whose .git is a file, which the go command does not recognise).
const develVersion = "(devel)"

// buildInfo identifies the running binary: `ticketingd version` and
// --version print it, /status has it as "build", and the
// ticketing_build_info metric carries it as labels.
type buildInfo struct {
	// Version is the module version: vX.Y.Z for `go install
	// MODULE@vX.Y.Z`, a pseudo-version such as
	// v0.0.0-20261201193522-ef5cbb39c1f1 (+dirty when modified) for a
	// build in a git clone, or "(devel)" when the go command stamped none;
	// main.version overrides it.
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

// readBuildInfo returns the running binary's build information.
var readBuildInfo = sync.OnceValue(func() buildInfo {
	bi, _ := debug.ReadBuildInfo()
	return newBuildInfo(bi)
})

// newBuildInfo maps the go command's stamp (bi may be nil) and
// main.version to a buildInfo.
func newBuildInfo(bi *debug.BuildInfo) buildInfo {
	info := buildInfo{Version: develVersion, Path: "github.com/ticketing-dev/ticketing", GoVersion: runtime.Version()}
	if bi != nil {
		if bi.Main.Path != "" {
			info.Path = bi.Main.Path
		}
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
	}
	if version != "" {
		info.Version = version
	}
	return info
}

// modifiedLabel is Modified as "true", "false" or "unknown".
func (b buildInfo) modifiedLabel() string {
	if b.Modified == nil {
		return "unknown"
	}
	return strconv.FormatBool(*b.Modified)
}

// String is the text of `ticketingd version`.
func (b buildInfo) String() string {
	var s strings.Builder
	fmt.Fprintf(&s, "ticketingd %s\n", b.Version)
	fmt.Fprintf(&s, "module:   %s\n", b.Path)
	switch {
	case b.Revision == "":
		s.WriteString("revision: unknown (built without VCS information: with -buildvcs=false, outside a git clone, or in a git worktree)\n")
	case b.RevisionTime != "":
		fmt.Fprintf(&s, "revision: %s (%s)\n", b.Revision, b.RevisionTime)
	default:
		fmt.Fprintf(&s, "revision: %s\n", b.Revision)
	}
	fmt.Fprintf(&s, "modified: %s\n", b.modifiedLabel())
	fmt.Fprintf(&s, "go:       %s %s/%s\n", b.GoVersion, runtime.GOOS, runtime.GOARCH)
	return s.String()
}

// newBuildInfoGauge is ticketing_build_info: always 1, with the build as
// labels (version, revision, go_version, modified).
func newBuildInfoGauge(b buildInfo) prometheus.Gauge {
	revision := b.Revision
	if revision == "" {
		revision = "unknown"
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "ticketing",
		Name:      "build_info",
		Help:      "Always 1; the labels identify the running ticketingd binary: module version, VCS revision, Go version, and whether the tree was modified.",
		ConstLabels: prometheus.Labels{
			"version":    b.Version,
			"revision":   revision,
			"go_version": b.GoVersion,
			"modified":   b.modifiedLabel(),
		},
	})
	g.Set(1)
	return g
}
