package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ticketing-dev/ticketing/server/admin"
)

// version, if set at build time (go build -ldflags "-X main.version=v1.2.3"),
// replaces the module version that the go command stamps in the binary.
var version = ""

// develVersion is the version of a binary that carries no module version
// (admin.DevelVersion): built with -buildvcs=false, or outside a git
// clone, or from a git worktree (whose .git is a file, which the go
// command does not recognise).
const develVersion = admin.DevelVersion

// buildInfo identifies the running binary: `ticketingd version` and
// --version print it, /status has it as "build" (admin.Options.Build), and
// the ticketing_build_info metric carries it as labels. Its fields are
// admin.BuildInfo's.
type buildInfo admin.BuildInfo

// readBuildInfo returns the running binary's build information.
var readBuildInfo = sync.OnceValue(func() buildInfo {
	bi, _ := debug.ReadBuildInfo()
	return newBuildInfo(bi)
})

// newBuildInfo maps the go command's stamp (bi may be nil) and
// main.version to a buildInfo: admin.NewBuildInfo, with this module's path
// when the stamp names none, and main.version over the module version.
func newBuildInfo(bi *debug.BuildInfo) buildInfo {
	info := buildInfo(admin.NewBuildInfo(bi))
	if info.Path == "" {
		info.Path = "github.com/ticketing-dev/ticketing"
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
