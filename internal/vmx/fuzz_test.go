// SPDX-License-Identifier: Apache-2.0

package vmx

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

// fuzzSeeds are inputs for both fuzz targets, next to the files in
// testdata/fuzz.
var fuzzSeeds = []string{
	"",
	sample,
	"a = \"1\"\r\nb = 2 # c\r\n\r\n",
	"\xEF\xBB\xBFa = \"|22|7C|0a\"",
	"a = \"1\"\nA = \"2\"\na = \"3\"\n",
	"a = \"unterminated\n",
	"a = \"|zz\"\n",
	"= \"1\"\n",
	"a\x00 = 1\n",
	"a = b c\n",
}

// pairs returns the key/value settings of f that count, in Keys order.
func pairs(f *File) [][2]string {
	var out [][2]string
	for _, k := range f.Keys() {
		v, ok := f.Get(k)
		if !ok {
			panic("Keys returned " + k + ", which Get does not find")
		}
		out = append(out, [2]string{k, v})
	}
	return out
}

// FuzzParse checks that Parse never panics, that a parsed file comes back
// byte for byte, and that parsing the output again gives the same settings.
func FuzzParse(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		in := bytes.Clone(data)
		file, err := Parse(data)
		if !bytes.Equal(in, data) {
			t.Fatalf("Parse modified its input")
		}
		if err != nil {
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("error %T is not a *ParseError: %v", err, err)
			}
			if pe.Line < 0 || pe.Line > bytes.Count(data, []byte("\n"))+1 || pe.Msg == "" {
				t.Fatalf("bad error %+v for %d lines", pe, bytes.Count(data, []byte("\n"))+1)
			}
			if file != nil {
				t.Fatalf("Parse returned a File with an error")
			}
			return
		}
		out := file.Bytes()
		if !bytes.Equal(out, data) {
			t.Fatalf("Bytes() = %q; want the input %q", out, data)
		}
		again, err := Parse(out)
		if err != nil {
			t.Fatalf("Parse(Bytes()): %v", err)
		}
		if p, q := pairs(file), pairs(again); !reflect.DeepEqual(p, q) {
			t.Fatalf("settings changed on reparse: %q then %q", p, q)
		}
		if d, e := file.Duplicates(), again.Duplicates(); !reflect.DeepEqual(d, e) {
			t.Fatalf("duplicates changed on reparse: %v then %v", d, e)
		}
		for _, k := range file.Keys() {
			if file.Line(k) != again.Line(k) || file.Line(k) == 0 {
				t.Fatalf("Line(%q) = %d then %d", k, file.Line(k), again.Line(k))
			}
		}
	})
}

// FuzzSet checks that Set and Delete change only the lines of their key and
// that the result parses back to the expected settings.
func FuzzSet(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s), "a", "new \"value\" |\n")
		f.Add([]byte(s), "memSize", "")
	}
	f.Fuzz(func(t *testing.T, data []byte, key, value string) {
		file, err := Parse(data)
		if err != nil {
			return
		}
		before := pairs(file)
		lineNo := file.Line(key)
		nlines := len(file.lines)
		if err := file.Set(key, value); err != nil {
			if !bytes.Equal(file.Bytes(), data) {
				t.Fatalf("failed Set changed the file")
			}
			return
		}
		if v, ok := file.Get(key); !ok || v != value {
			t.Fatalf("Get after Set = %q, %v; want %q", v, ok, value)
		}
		out := file.Bytes()
		again, err := Parse(out)
		if err != nil {
			t.Fatalf("Parse after Set(%q, %q): %v\n%q", key, value, err, out)
		}
		if v, _ := again.Get(key); v != value {
			t.Fatalf("reparsed Get = %q; want %q", v, value)
		}
		// Every other setting is unchanged.
		for _, kv := range before {
			if fold(kv[0]) == fold(key) {
				continue
			}
			if v, _ := again.Get(kv[0]); v != kv[1] {
				t.Fatalf("Set(%q) changed %q from %q to %q", key, kv[0], kv[1], v)
			}
		}
		// Only the rewritten line changed, or one line was appended.
		oldLines := splitLines(data)
		newLines := splitLines(out)
		if lineNo > 0 {
			if len(newLines) != nlines {
				t.Fatalf("rewrite changed the line count from %d to %d", nlines, len(newLines))
			}
			for i := range newLines {
				if i != lineNo-1 && !bytes.Equal(oldLines[i], newLines[i]) {
					t.Fatalf("rewrite of line %d changed line %d: %q to %q", lineNo, i+1, oldLines[i], newLines[i])
				}
			}
		} else {
			if len(newLines) != nlines+1 {
				t.Fatalf("append changed the line count from %d to %d", nlines, len(newLines))
			}
			for i := range oldLines {
				o, n := oldLines[i], newLines[i]
				if i == len(oldLines)-1 {
					n = bytes.TrimSuffix(bytes.TrimSuffix(n, []byte("\n")), []byte("\r"))
					o = bytes.TrimSuffix(bytes.TrimSuffix(o, []byte("\n")), []byte("\r"))
				}
				if !bytes.Equal(o, n) {
					t.Fatalf("append changed line %d: %q to %q", i+1, oldLines[i], newLines[i])
				}
			}
		}

		// Delete removes the key and nothing else.
		if !again.Delete(key) {
			t.Fatalf("Delete(%q) = false after Set", key)
		}
		final, err := Parse(again.Bytes())
		if err != nil {
			t.Fatalf("Parse after Delete: %v", err)
		}
		if _, ok := final.Get(key); ok {
			t.Fatalf("%q still set after Delete", key)
		}
		for _, kv := range before {
			if fold(kv[0]) == fold(key) {
				continue
			}
			if v, _ := final.Get(kv[0]); v != kv[1] {
				t.Fatalf("Delete(%q) changed %q from %q to %q", key, kv[0], kv[1], v)
			}
		}
	})
}

// splitLines splits b after each "\n", without a BOM.
func splitLines(b []byte) [][]byte {
	b = bytes.TrimPrefix(b, []byte(utf8BOM))
	var out [][]byte
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			out = append(out, b)
			break
		}
		out = append(out, b[:i+1])
		b = b[i+1:]
	}
	return out
}
