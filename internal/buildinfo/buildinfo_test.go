// SPDX-License-Identifier: Apache-2.0

package buildinfo

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestFromBuildInfo(t *testing.T) {
	bi := &debug.BuildInfo{GoVersion: "go1.99.1", Main: debug.Module{Path: "github.com/vrdma/vrdma", Version: "v0.0.0-20261203160451-5f91d3105603"},
		Settings: []debug.BuildSetting{
			{Key: "vcs", Value: "git"},
			{Key: "vcs.revision", Value: "5f91d3105603d3166921ad40d58b061912b28c33"},
			{Key: "vcs.time", Value: "2026-12-03T16:04:51Z"},
			{Key: "vcs.modified", Value: "true"},
			{Key: "GOOS", Value: "linux"},
			{Key: "GOARCH", Value: "arm64"},
		}}
	in := FromBuildInfo("vrdmad", bi)
	if in.Program != "vrdmad" || in.Release != Release || in.Module != "github.com/vrdma/vrdma" || in.ModuleVersion != bi.Main.Version || in.Version != "0.0.0-20261203160451-5f91d3105603" ||
		in.Revision != "5f91d3105603d3166921ad40d58b061912b28c33" || in.Time != "2026-12-03T16:04:51Z" ||
		in.Modified == nil || !*in.Modified || in.GoVersion != "go1.99.1" || in.Platform != "linux/arm64" {
		t.Fatalf("FromBuildInfo: %+v", in)
	}
	s := in.String()
	for _, want := range []string{"vrdmad 0.0.0-20261203160451-5f91d3105603\n", "release  " + Release + "\n", "module   github.com/vrdma/vrdma v0.0.0-20261203160451-5f91d3105603\n",
		"commit   5f91d3105603d3166921ad40d58b061912b28c33 (2026-12-03T16:04:51Z) modified\n", "go       go1.99.1 linux/arm64\n"} {
		if !strings.Contains(s, want) {
			t.Errorf("String lacks %q:\n%s", want, s)
		}
	}

	// A clean tree: no "modified".
	bi.Settings[3].Value = "false"
	if s := FromBuildInfo("vrdmad", bi).String(); strings.Contains(s, "modified") {
		t.Errorf("clean build says modified:\n%s", s)
	}
}

func TestFromBuildInfoWithoutVCS(t *testing.T) {
	in := FromBuildInfo("vrdmactl", &debug.BuildInfo{Main: debug.Module{Path: "github.com/vrdma/vrdma", Version: "(devel)"}})
	if in.Revision != "" || in.Modified != nil || in.GoVersion != runtime.Version() || in.Platform != runtime.GOOS+"/"+runtime.GOARCH {
		t.Fatalf("%+v", in)
	}
	if s := in.String(); !strings.Contains(s, "commit   unknown") {
		t.Errorf("no VCS information, but:\n%s", s)
	}
	if in.Version != Release+"-devel" || !strings.HasPrefix(in.String(), "vrdmactl "+Release+"-devel\n") {
		t.Errorf("a build from a checkout without VCS information: version %q, want %s-devel", in.Version, Release)
	}
	if in := FromBuildInfo("vrdmactl", nil); in.Module != "" || in.Release != Release || in.GoVersion != runtime.Version() || in.Version != Release+"-devel" {
		t.Errorf("nil build info: %+v", in)
	}
}

// TestVersionFromTags: the version is the stamped one (packaging/build-deb,
// from git describe), else the one the go command derived from the
// module's tag, else the release's development build.
func TestVersionFromTags(t *testing.T) {
	for _, c := range []struct {
		stamped, module, want string
	}{
		{"0.1.0+5.gc9fd62cf6a63", "(devel)", "0.1.0+5.gc9fd62cf6a63"},
		{"0.1.0", "v0.1.0", "0.1.0"},
		{"", "v0.2.0", "0.2.0"},                                                             // go install github.com/vrdma/vrdma/cmd/vrdmad@v0.2.0, or a build of the commit tagged v0.2.0
		{"", "v0.2.0+dirty", "0.2.0+dirty"},                                                 // ... with uncommitted changes
		{"", "v0.2.1-0.20261206160451-5f91d3105603", "0.2.1-0.20261206160451-5f91d3105603"}, // a commit after the tag v0.2.0
		{"", "(devel)", Release + "-devel"},
		{"", "", Release + "-devel"},
	} {
		if got := buildVersion(c.stamped, &debug.BuildInfo{Main: debug.Module{Version: c.module}}); got != c.want {
			t.Errorf("stamped %q, module version %q: version %q, want %q", c.stamped, c.module, got, c.want)
		}
	}
}

// TestRead reads the test binary's own build information, which the go
// command always embeds.
func TestRead(t *testing.T) {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		t.Fatal("the test binary has no build information")
	}
	in := Read("x")
	if in.GoVersion != bi.GoVersion || in.Module != bi.Main.Path {
		t.Errorf("Read = %+v, build info %v", in, bi)
	}
}
