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
	if in.Program != "vrdmad" || in.Release != Release || in.Module != "github.com/vrdma/vrdma" || in.Version != bi.Main.Version ||
		in.Revision != "5f91d3105603d3166921ad40d58b061912b28c33" || in.Time != "2026-12-03T16:04:51Z" ||
		in.Modified == nil || !*in.Modified || in.GoVersion != "go1.99.1" || in.Platform != "linux/arm64" {
		t.Fatalf("FromBuildInfo: %+v", in)
	}
	s := in.String()
	for _, want := range []string{"vrdmad " + Release + "\n", "module   github.com/vrdma/vrdma v0.0.0-20261203160451-5f91d3105603\n",
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
	if in := FromBuildInfo("vrdmactl", nil); in.Module != "" || in.Release != Release || in.GoVersion != runtime.Version() {
		t.Errorf("nil build info: %+v", in)
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
