package agent

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestLayers checks that the layers' imports point one way
// (docs/architecture.md): the device knows no path, no connection
// management and no control plane; a path knows no other path and not the
// agent; connection management knows no path; the links between agents
// (hostlink) know no path and no device: the tcp path uses them, not the
// other way round. Test files are included:
// a test that needs a higher layer lives in an external test package.
func TestLayers(t *testing.T) {
	forbidden := map[string][]string{
		"device":           {"agent", "cm", "transport", "manage", "control", "tcpwire", "testlink"},
		"transport/memcpy": {"agent", "cm", "transport/tcp", "manage", "control"},
		"transport/tcp":    {"agent", "cm", "transport/memcpy", "transport/rdma", "manage", "control"},
		"hostlink":         {"agent", "transport", "manage", "device"},
		"transport/rdma":   {"agent", "cm", "transport/memcpy", "transport/tcp", "manage", "control"},
		"cm":               {"agent", "transport", "manage", "control"},
		"rc":               {"agent", "cm", "transport", "manage", "control", "device"},
		"rc/requester":     {"agent", "cm", "transport", "manage", "control", "tcpwire", "rocewire"},
	}
	for pkg, bad := range forbidden {
		forEachImport(t, filepath.Join("..", filepath.FromSlash(pkg)), func(f, path, rel string) {
			for _, b := range bad {
				if rel == b || strings.HasPrefix(rel, b+"/") {
					t.Errorf("%s imports %s: package %s must not import %s (docs/architecture.md, Layers)", f, path, pkg, b)
				}
			}
		})
	}
}

// TestLayersLibrary checks that the client library (the repository's
// root package) is the thin driver DESIGN.md says: it imports of vrdma
// only the ABI it speaks, the system helpers and its diagnostics hooks
// (libdiag), never the agent's layers (device, paths, connection
// management, control plane).
func TestLayersLibrary(t *testing.T) {
	allowed := []string{"abi", "abi/mgmt", "sys", "locations", "libdiag"}
	n := 0
	forEachImport(t, filepath.Join("..", ".."), func(f, path, rel string) {
		n++
		if !slices.Contains(allowed, rel) {
			t.Errorf("%s imports %s: the library (package vrdma) imports only internal/%v (docs/architecture.md, Layers)", f, path, allowed)
		}
	})
	if n == 0 {
		t.Fatal("the library imports nothing of vrdma: is ../.. the repository's root?")
	}
}

// forEachImport calls check with each import of package vrdma's internal
// packages by the non-external Go files (tests included) in dir: the
// file, the import path and the path under internal/.
func forEachImport(t *testing.T, dir string, check func(f, path, rel string)) {
	t.Helper()
	const mod = "github.com/vrdma/vrdma/internal/"
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no Go files in %s (%v)", dir, err)
	}
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		af, err := parser.ParseFile(token.NewFileSet(), f, src, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(af.Name.Name, "_test") {
			continue // an external test package may use any layer
		}
		for _, im := range af.Imports {
			path, _ := strconv.Unquote(im.Path.Value)
			if rel, ok := strings.CutPrefix(path, mod); ok {
				check(f, path, rel)
			}
		}
	}
}
