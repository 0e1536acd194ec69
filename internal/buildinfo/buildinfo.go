// SPDX-License-Identifier: Apache-2.0

// Package buildinfo says which vrdma a binary is: its version, derived
// from git's tags, the release, the module version, the commit it was
// built from and the Go toolchain, read from the build information the go
// command embeds (runtime/debug) and from the version packaging/build-deb
// stamps (-ldflags -X). vrdmad --version and vrdmactl version print it.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// Release is the vrdma release: what the agent reports in its hello and
// host record (agent.Version).
const Release = "0.1.0"

// version is the version packaging/build-deb stamps into the binaries
// (go build -ldflags "-X github.com/vrdma/vrdma/internal/buildinfo.version=V"),
// derived from git's tags by packaging/version; empty in other builds.
var version string

// Info is what a binary knows of its build.
type Info struct {
	Program string `json:"program"` // "vrdmad", "vrdmactl"
	// Version is the binary's version, derived from git's tags: the one
	// stamped by packaging/build-deb (0.1.0 for a tagged commit,
	// 0.1.0+5.gc9fd62cf6a63 five commits after it, CHANGELOG.md); else the
	// version the go command gave the module from its tag (go install
	// ...@v0.1.0, or a build from a tagged clone: 0.1.0; a pseudo-version
	// for other commits), without its "v"; else, built from a checkout
	// without either, the Release with "-devel".
	Version       string `json:"version"`
	Release       string `json:"release"`                  // Release
	Module        string `json:"module,omitempty"`         // the main module's path
	ModuleVersion string `json:"module_version,omitempty"` // the main module's version as the go command recorded it: "(devel)" when it derived none
	Revision      string `json:"revision,omitempty"`       // vcs.revision: the commit
	Time          string `json:"time,omitempty"`           // vcs.time: the commit's time, RFC 3339
	// Modified is vcs.modified: the work tree had uncommitted changes;
	// nil when the build carries no VCS information.
	Modified  *bool  `json:"modified,omitempty"`
	GoVersion string `json:"go_version"` // the toolchain that built it
	Platform  string `json:"platform"`   // GOOS/GOARCH
}

// Read returns the build information of the running binary, for the
// program named program.
func Read(program string) Info {
	bi, _ := debug.ReadBuildInfo()
	return FromBuildInfo(program, bi)
}

// FromBuildInfo returns the Info of a binary whose build information is bi
// (nil when the binary has none: then only the release, Go version and
// platform are known).
func FromBuildInfo(program string, bi *debug.BuildInfo) Info {
	in := Info{Program: program, Version: buildVersion(version, bi), Release: Release, GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi == nil {
		return in
	}
	in.Module, in.ModuleVersion = bi.Main.Path, bi.Main.Version
	if bi.GoVersion != "" {
		in.GoVersion = bi.GoVersion
	}
	var goos, goarch string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			in.Revision = s.Value
		case "vcs.time":
			in.Time = s.Value
		case "vcs.modified":
			m := s.Value == "true"
			in.Modified = &m
		case "GOOS":
			goos = s.Value
		case "GOARCH":
			goarch = s.Value
		}
	}
	if goos != "" && goarch != "" {
		in.Platform = goos + "/" + goarch
	}
	return in
}

// buildVersion is Info.Version of a binary stamped with version stamped
// (empty: none) whose build information is bi.
func buildVersion(stamped string, bi *debug.BuildInfo) string {
	if stamped != "" {
		return stamped
	}
	if bi != nil {
		if v, ok := strings.CutPrefix(bi.Main.Version, "v"); ok {
			return v // v0.1.0, v0.1.1-0.20261206160451-5f91d3105603, v0.1.0+dirty
		}
	}
	return Release + "-devel"
}

// String formats the information on a few lines:
//
//	vrdmad 0.1.0+5.gc9fd62cf6a63
//	  release  0.1.0
//	  module   github.com/vrdma/vrdma (devel)
//	  commit   5f91d3105603d3166921ad40d58b061912b28c33 (2026-12-03T16:04:51Z)
//	  go       go1.26.8 linux/amd64
//
// A build with uncommitted changes says "modified" after the commit; one
// without VCS information (go build -buildvcs=false, or from a git
// worktree, which the go command does not stamp) says "commit unknown".
func (in Info) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s\n", in.Program, in.Version)
	fmt.Fprintf(&b, "  release  %s\n", in.Release)
	if in.Module != "" {
		fmt.Fprintf(&b, "  module   %s %s\n", in.Module, in.ModuleVersion)
	}
	switch {
	case in.Revision == "":
		b.WriteString("  commit   unknown (built without VCS information)\n")
	default:
		fmt.Fprintf(&b, "  commit   %s", in.Revision)
		if in.Time != "" {
			fmt.Fprintf(&b, " (%s)", in.Time)
		}
		if in.Modified != nil && *in.Modified {
			b.WriteString(" modified")
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "  go       %s %s\n", in.GoVersion, in.Platform)
	return b.String()
}
