// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// TestChecklocksAnnotationsRead checks that gVisor's checklocks analyzer
// (.ci/run) reads every lock annotation of the tree's Go files. It reads
// one only from a comment that starts with it (a field's trailing
// comment, or a line of its own in a doc comment), so one written after
// other text in a comment is checked by nothing. And it matches a
// struct's fields to their declarations by position in the list, so a
// field list declaring several names ("a, b int") moves the annotations
// of every field after it onto the wrong field: declare those names one
// a line.
func TestChecklocksAnnotationsRead(t *testing.T) {
	const mark = "+checklocks"
	root := filepath.Join("..", "..")
	files := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		files++
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			t.Errorf("parse %s: %v", path, err)
			return nil
		}
		annotated := func(cg *ast.CommentGroup) bool {
			if cg == nil {
				return false
			}
			for _, c := range cg.List {
				if strings.HasPrefix(c.Text, "// "+mark) {
					return true
				}
			}
			return false
		}
		for _, cg := range f.Comments {
			for _, c := range cg.List {
				if strings.Contains(c.Text, mark) && !strings.HasPrefix(c.Text, "// "+mark) {
					t.Errorf("%s: %q: the analyzer does not read an annotation in the middle of a comment: give it a comment line of its own (// %s...)", fset.Position(c.Pos()), c.Text, mark)
				}
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			st, ok := n.(*ast.StructType)
			if !ok {
				return true
			}
			var multi *ast.Field
			for _, fl := range st.Fields.List {
				if multi == nil && len(fl.Names) > 1 {
					multi = fl
				}
				if multi != nil && (annotated(fl.Doc) || annotated(fl.Comment)) {
					t.Errorf("%s: the analyzer puts this field's annotation on another field, because %s declares several names before it: declare them one a line", fset.Position(fl.Pos()), fset.Position(multi.Pos()))
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("found %d Go files under %s: is it the repository's root?", files, root)
	}
}
