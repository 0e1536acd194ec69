// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
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
// root package) is the thin driver docs/architecture.md says: it imports of vrdma
// only the ABI it speaks, the system helpers (sys, bulkcopy) and its
// diagnostics hooks (libdiag), never the agent's layers (device, paths,
// connection management, control plane).
func TestLayersLibrary(t *testing.T) {
	allowed := []string{"abi", "abi/mgmt", "sys", "bulkcopy", "locations", "libdiag"}
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

// deviceObjects are the device's own types, which no path names: a path
// reaches the device only through the interfaces made for it
// (device.Source for its requester, device.Target and device.Targets for
// its responder; device.Path for what it is).
var deviceObjects = []string{"QP", "Device", "Adapter", "Context", "PD", "MR", "CQ"}

// TestLayersPaths checks the device-path boundary (docs/architecture.md,
// Layers): the non-test Go files of every package under
// internal/transport name none of the device's objects (deviceObjects).
func TestLayersPaths(t *testing.T) {
	root := filepath.Join("..", "transport")
	users := 0
	err := filepath.WalkDir(root, func(f string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(f, ".go") || strings.HasSuffix(f, "_test.go") {
			return err
		}
		src, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		named, imports, err := namedDeviceObjects(f, src)
		if err != nil {
			return err
		}
		if imports {
			users++
		}
		for _, n := range named {
			t.Errorf("%s names %s: a path uses the device only through device.Source, device.Target and device.Targets (docs/architecture.md)", n.pos, n.name)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if users < 3 {
		t.Fatalf("only %d files under %s import the device: is that the paths' directory?", users, root)
	}
}

// TestLayersPathsCheck holds namedDeviceObjects to what TestLayersPaths
// needs of it: it finds a device object however the device's package is
// imported, and nothing in a file that only uses the interfaces.
func TestLayersPathsCheck(t *testing.T) {
	for _, c := range []struct {
		src  string
		want []string
	}{
		{`package p; import "github.com/vrdma/vrdma/internal/device"; func f(t device.Target) { _ = t.(*device.QP) }`, []string{"device.QP"}},
		{`package p; import dev "github.com/vrdma/vrdma/internal/device"; type s struct{ d *dev.Device; a *dev.Adapter }`, []string{"dev.Device", "dev.Adapter"}},
		{`package p; import . "github.com/vrdma/vrdma/internal/device"; var _ Path`, []string{"a dot import of the device"}},
		{`package p; import "github.com/vrdma/vrdma/internal/device"; func f(q device.Source, ts device.Targets) device.Target { return ts.Target(q.QPN()) }`, nil},
	} {
		named, _, err := namedDeviceObjects("x.go", []byte(c.src))
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, n := range named {
			got = append(got, n.name)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: found %q, want %q", c.src, got, c.want)
		}
	}
}

// deviceName is a device object a file names, and where.
type deviceName struct {
	pos  token.Position
	name string
}

// namedDeviceObjects returns where the Go file f (its source src) names
// one of deviceObjects, and whether it imports the device at all.
func namedDeviceObjects(f string, src []byte) (named []deviceName, imports bool, err error) {
	const dev = "github.com/vrdma/vrdma/internal/device"
	fset := token.NewFileSet()
	af, err := parser.ParseFile(fset, f, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, false, err
	}
	name := ""
	for _, im := range af.Imports {
		if path, _ := strconv.Unquote(im.Path.Value); path == dev {
			name = "device"
			if im.Name != nil {
				name = im.Name.Name
			}
		}
	}
	switch name {
	case "":
		return nil, false, nil
	case ".":
		return []deviceName{{fset.Position(af.Package), "a dot import of the device"}}, true, nil
	}
	ast.Inspect(af, func(n ast.Node) bool {
		sel, ok := n.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		if x, ok := sel.X.(*ast.Ident); ok && x.Name == name && slices.Contains(deviceObjects, sel.Sel.Name) {
			named = append(named, deviceName{fset.Position(sel.Pos()), name + "." + sel.Sel.Name})
		}
		return true
	})
	return named, true, nil
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
