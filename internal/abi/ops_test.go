// SPDX-License-Identifier: Apache-2.0

package abi

import (
	"fmt"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

// TestOpTable checks the table of operations: every op once, in order,
// named, with a request body (or marked External), and Known, String and
// NewRequest agreeing with it for every 16-bit number.
func TestOpTable(t *testing.T) {
	if err := checkOpTable(opTable[:]); err != nil {
		t.Fatal(err)
	}
	rows := map[Op]OpInfo{}
	for _, in := range Ops() {
		rows[in.Op] = in
		if in.External {
			continue
		}
		a, b := in.Request(), in.Request()
		if reflect.TypeOf(a).Kind() != reflect.Pointer || a == b && reflect.TypeOf(a).Elem().Size() != 0 {
			t.Errorf("%s: Request returns %T, want a new pointer each call", in.Name, a)
		}
		if got := NewRequest(in.Op); reflect.TypeOf(got) != reflect.TypeOf(a) {
			t.Errorf("%s: NewRequest gives %T, the table %T", in.Name, got, a)
		}
	}
	for o := 0; o < 1<<16; o++ {
		op := Op(o)
		in, ok := rows[op]
		if op.Known() != ok {
			t.Errorf("op %d: Known %v, in the table %v", o, op.Known(), ok)
		}
		if want := fmt.Sprintf("op(%d)", o); ok {
			want = in.Name
			if op.String() != want {
				t.Errorf("op %d: String %q, want %q", o, op.String(), want)
			}
		} else if op.String() != want || NewRequest(op) != nil {
			t.Errorf("op %d is not an op, but String is %q and NewRequest %v", o, op.String(), NewRequest(op))
		}
	}
	// The checker itself refuses what the table must not hold.
	mk := body[Empty]()
	for name, bad := range map[string][]OpInfo{
		"duplicate number": {{Op: 1, Name: "a", Request: mk}, {Op: 1, Name: "b", Request: mk}},
		"out of order":     {{Op: 2, Name: "a", Request: mk}, {Op: 1, Name: "b", Request: mk}},
		"duplicate name":   {{Op: 1, Name: "a", Request: mk}, {Op: 2, Name: "a", Request: mk}},
		"no name":          {{Op: 1, Request: mk}},
		"no request":       {{Op: 1, Name: "a"}},
		"both":             {{Op: 1, Name: "a", Request: mk, External: true}},
		"zero":             {{Op: 0, Name: "a", Request: mk}},
		"blocking, no VM":  {{Op: 1, Name: "a", Request: mk, Blocking: true}},
		"past opMax":       {{Op: opMax, Name: "a", Request: mk}},
	} {
		if checkOpTable(bad) == nil {
			t.Errorf("checkOpTable accepts a table with %s", name)
		}
	}
}

// TestOpTableDoc holds the table to docs/wire-local.md: §4's table of
// ops (number, name, request type, "blocks", the attach mark) row by row,
// and the ops §4 leaves to its subsections by "`name` (number".
func TestOpTableDoc(t *testing.T) {
	b, err := os.ReadFile("../../docs/wire-local.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	row := regexp.MustCompile(`(?m)^\| (\d+) \| ([a-z-]+) \|([^|]*)\|[^|]*\|([^|]*)\|$`)
	sec, _, _ := strings.Cut(doc[strings.Index(doc, "## 4. Commands")+1:], "\n### ")
	inTable := map[string]bool{}
	for _, m := range row.FindAllStringSubmatch(sec, -1) {
		var n int
		fmt.Sscan(m[1], &n)
		name, reqrep, attach := m[2], m[3], strings.TrimSpace(m[4])
		inTable[name] = true
		in, ok := Op(n).Info()
		if !ok || in.Name != name {
			t.Errorf("wire-local.md: op %d is %q, the table says %q (known %v)", n, name, in.Name, ok)
			continue
		}
		if got := attach == "✓"; got != in.Attach {
			t.Errorf("%s: wire-local.md attach %v, the table %v", name, got, in.Attach)
		}
		if got := strings.Contains(reqrep, "blocks"); got != in.Blocking {
			t.Errorf("%s: wire-local.md blocks %v, the table %v", name, got, in.Blocking)
		}
		if !in.External {
			req := strings.Fields(reqrep)[0]
			if got := reflect.TypeOf(in.Request()).Elem().Name(); got != req {
				t.Errorf("%s: wire-local.md request %s, the table %s", name, req, got)
			}
		}
	}
	if len(inTable) == 0 {
		t.Fatal("wire-local.md: no table of ops found")
	}
	flat := strings.Join(strings.Fields(doc), " ")
	for _, in := range Ops() {
		if !inTable[in.Name] && !strings.Contains(flat, fmt.Sprintf("`%s` (%d", in.Name, in.Op)) {
			t.Errorf("op %d (%s) is neither in wire-local.md §4's table nor named as \"`%s` (%d\"", in.Op, in.Name, in.Name, in.Op)
		}
	}
}
