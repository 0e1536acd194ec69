package agent

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestLayers checks that the layers' imports point one way
// (docs/architecture.md): the device knows no path, no connection
// management and no control plane; a path knows no other path and not the
// agent; connection management knows no path. Test files are included:
// a test that needs a higher layer lives in an external test package.
func TestLayers(t *testing.T) {
	const mod = "github.com/vrdma/vrdma/internal/"
	forbidden := map[string][]string{
		"device":           {"agent", "cm", "transport", "manage", "control", "tcpwire", "testlink"},
		"transport/memcpy": {"agent", "cm", "transport/tcp", "manage", "control"},
		"transport/tcp":    {"agent", "transport/memcpy", "transport/rdma", "manage"},
		"transport/rdma":   {"agent", "cm", "transport/memcpy", "transport/tcp", "manage", "control"},
		"cm":               {"agent", "transport", "manage", "control"},
	}
	for pkg, bad := range forbidden {
		dir := filepath.Join("..", filepath.FromSlash(pkg))
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("package %s: no Go files in %s (%v)", pkg, dir, err)
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
			external := strings.HasSuffix(af.Name.Name, "_test")
			for _, im := range af.Imports {
				path, _ := strconv.Unquote(im.Path.Value)
				rel, ok := strings.CutPrefix(path, mod)
				if !ok || external {
					continue
				}
				for _, b := range bad {
					if rel == b || strings.HasPrefix(rel, b+"/") {
						t.Errorf("%s imports %s: package %s must not import %s (docs/architecture.md, Layers)", f, path, pkg, b)
					}
				}
			}
		}
	}
}
