// SPDX-License-Identifier: Apache-2.0

package vmx

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"
)

const sample = `.encoding = "UTF-8"
# A PVRDMA VM.
config.version = "8"
virtualHW.version = "20"

memSize = "8192"   # MB
sched.mem.pin = TRUE
ethernet1.virtualDev = "vrdma"
ethernet1.dvs.switchId = "50 1d 0b 8e 8d 95 4e 2b-b2 5c 2f 3a a6 1a 9e 1d"
annotation = "say |22hi|22 |7C a#b|0Anext line"
`

func mustParse(t *testing.T, s string) *File {
	t.Helper()
	f, err := Parse([]byte(s))
	if err != nil {
		t.Fatalf("Parse(%q): %v", s, err)
	}
	return f
}

func TestParseValues(t *testing.T) {
	f := mustParse(t, sample)
	tests := []struct {
		key, want string
		line      int
	}{
		{".encoding", "UTF-8", 1},
		{"config.version", "8", 3},
		{"memSize", "8192", 6},
		{"MEMSIZE", "8192", 6},
		{"memsize", "8192", 6},
		{"sched.mem.pin", "TRUE", 7},
		{"ethernet1.VIRTUALDEV", "vrdma", 8},
		{"ethernet1.dvs.switchId", "50 1d 0b 8e 8d 95 4e 2b-b2 5c 2f 3a a6 1a 9e 1d", 9},
		{"annotation", "say \"hi\" | a#b\nnext line", 10},
	}
	for _, tt := range tests {
		got, ok := f.Get(tt.key)
		if !ok || got != tt.want {
			t.Errorf("Get(%q) = %q, %v; want %q, true", tt.key, got, ok, tt.want)
		}
		if got := f.Line(tt.key); got != tt.line {
			t.Errorf("Line(%q) = %d; want %d", tt.key, got, tt.line)
		}
	}
	if v, ok := f.Get("nosuch"); ok || v != "" {
		t.Errorf("Get(nosuch) = %q, %v; want \"\", false", v, ok)
	}
	if n := f.Line("nosuch"); n != 0 {
		t.Errorf("Line(nosuch) = %d; want 0", n)
	}
	wantKeys := []string{".encoding", "config.version", "virtualHW.version", "memSize", "sched.mem.pin",
		"ethernet1.virtualDev", "ethernet1.dvs.switchId", "annotation"}
	if got := f.Keys(); !reflect.DeepEqual(got, wantKeys) {
		t.Errorf("Keys() = %q; want %q", got, wantKeys)
	}
	if !bytes.Equal(f.Bytes(), []byte(sample)) {
		t.Errorf("Bytes() changed the file:\n%s", f.Bytes())
	}
}

func TestLineForms(t *testing.T) {
	tests := []struct {
		name, in string
		key      string
		want     string
		set      bool
	}{
		{"quoted", `a = "b"`, "a", "b", true},
		{"no spaces", `a="b"`, "a", "b", true},
		{"tabs", "\ta\t=\t\"b\"\t", "a", "b", true},
		{"unquoted", `a = b`, "a", "b", true},
		{"unquoted then comment", `a = b#c`, "a", "b", true},
		{"empty quoted", `a = ""`, "a", "", true},
		{"empty unquoted", `a =`, "a", "", true},
		{"empty then comment", `a = # c`, "a", "", true},
		{"trailing comment", `a = "b" # c "d"`, "a", "b", true},
		{"hash in quotes", `a = "b # c"`, "a", "b # c", true},
		{"equals in value", `a = "x=y"`, "a", "x=y", true},
		{"spaces kept in value", `a = "  b  "`, "a", "  b  ", true},
		{"tab in value", "a = \"b\tc\"", "a", "b\tc", true},
		{"utf-8 value", `a = "héllo"`, "a", "héllo", true},
		{"latin-1 value", "a = \"h\xE9llo\"", "a", "h\xE9llo", true},
		{"key with colon", `scsi0:0.fileName = "disk.vmdk"`, "SCSI0:0.FILENAME", "disk.vmdk", true},
		{"comment", `# a = "b"`, "a", "", false},
		{"indented comment", "  \t# a = \"b\"", "a", "", false},
		{"blank", "  \t ", "a", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := mustParse(t, tt.in)
			got, ok := f.Get(tt.key)
			if ok != tt.set || got != tt.want {
				t.Errorf("Get(%q) = %q, %v; want %q, %v", tt.key, got, ok, tt.want, tt.set)
			}
			if !bytes.Equal(f.Bytes(), []byte(tt.in)) {
				t.Errorf("Bytes() = %q; want %q", f.Bytes(), tt.in)
			}
		})
	}
}

func TestEscapes(t *testing.T) {
	tests := []struct {
		enc, dec string
	}{
		{"|22", `"`},
		{"|7C", "|"},
		{"|7c", "|"},
		{"|0A", "\n"},
		{"|0D|0A", "\r\n"},
		{"|00", "\x00"},
		{"|7F", "\x7F"},
		{"|41", "A"},
		{"a|7Cb|7Cc", "a|b|c"},
		{"|FF", "\xFF"},
		{"|1b[31m", "\x1b[31m"},
	}
	for _, tt := range tests {
		f := mustParse(t, `k = "`+tt.enc+`"`)
		if got, _ := f.Get("k"); got != tt.dec {
			t.Errorf("Get of %q = %q; want %q", tt.enc, got, tt.dec)
		}
		// Unquoted values are decoded too.
		f = mustParse(t, `k = `+tt.enc)
		if got, _ := f.Get("k"); got != tt.dec {
			t.Errorf("Get of unquoted %q = %q; want %q", tt.enc, got, tt.dec)
		}
	}
}

func TestQuote(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", `""`},
		{"plain text", `"plain text"`},
		{`say "hi"`, `"say |22hi|22"`},
		{"a|b", `"a|7Cb"`},
		{"tab\tkept", "\"tab\tkept\""},
		{"line\nbreak\r", `"line|0Abreak|0D"`},
		{"\x00\x01\x1f\x7f", `"|00|01|1F|7F"`},
		{"héllo \xFF", "\"héllo \xFF\""},
		{"#=", `"#="`},
	}
	for _, tt := range tests {
		if got := Quote(tt.in); got != tt.want {
			t.Errorf("Quote(%q) = %q; want %q", tt.in, got, tt.want)
		}
		f := mustParse(t, "k = "+Quote(tt.in)+"\n")
		if got, _ := f.Get("k"); got != tt.in {
			t.Errorf("Get after Quote(%q) = %q", tt.in, got)
		}
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		in   string
		line int
		msg  string // a substring of the message
	}{
		{"no equals", "a = \"1\"\nhello\n", 2, `"hello" has no '='`},
		{"no equals before comment", "hello # x\n", 1, `"hello" has no '='`},
		{"space in key", "bad key = \"1\"\n", 1, `key "bad" is followed by "key = \"1\""`},
		{"unterminated quote", "a = \"1\"\nb = \"2\n", 2, `the value of "b" has no closing double quote`},
		{"unterminated quote at EOF", `a = "`, 1, "no closing double quote"},
		{"bad escape letters", `a = "x|GG"`, 1, `bad escape "|GG" at column 7 in the value of "a"`},
		{"bad escape short", `a = "x|7"`, 1, `bad escape "|7" at column 7`},
		{"bad escape at end", `a = "x|"`, 1, `bad escape "|" at column 7`},
		{"bad escape unquoted", `a = x|Z1`, 1, `bad escape "|Z1" at column 6`},
		{"empty key", "= \"1\"\n", 1, "nothing before the '='"},
		{"empty key indented", "  = 1\n", 1, "nothing before the '='"},
		{"quoted key", "\"memSize\" = \"1\"\n", 1, "keys are not quoted"},
		{"pipe in key", "a|b = \"1\"\n", 1, `contains the character | at column 2`},
		{"quote in key", "a\"b = \"1\"\n", 1, `contains the character " at column 2`},
		{"non-ASCII key", "\n\nkéy = \"1\"\n", 3, "contains the byte 0xC3 at column 2"},
		{"NUL", "a = \"1\"\nb = \"x\x00\"\n", 2, "NUL byte at column 7"},
		{"NUL in comment", "# \x00\n", 1, "NUL byte"},
		{"control byte", "a = \"\x01\"\n", 1, "control byte 0x01 at column 6"},
		{"escape byte", "a = \"\x1b[2J\"\n", 1, "control byte 0x1B"},
		{"DEL", "a = \"\x7f\"\n", 1, "control byte 0x7F"},
		{"bare CR", "a = \"1\"\rb = \"2\"\n", 1, "carriage return at column 8"},
		{"CR at EOF", "a = \"1\"\r", 1, "carriage return at column 8"},
		{"CR CR LF", "a = \"1\"\r\r\n", 1, "carriage return"},
		{"text after value", `a = "1" "2"`, 1, `unexpected "\"2\"" after the value of "a"`},
		{"unquoted with space", `a = b c`, 1, `unexpected "c" after the value of "a"`},
		{"stray quote", `a = b"c`, 1, `stray double quote at column 6`},
		{"double equals", `a == "1"`, 1, `a second '=' at column 4 after the key "a"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := Parse([]byte(tt.in))
			if err == nil {
				t.Fatalf("Parse(%q) succeeded; want an error", tt.in)
			}
			if f != nil {
				t.Errorf("Parse returned a File with its error")
			}
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("error %T is not a *ParseError: %v", err, err)
			}
			if pe.Line != tt.line {
				t.Errorf("Line = %d; want %d (%v)", pe.Line, tt.line, err)
			}
			if !strings.Contains(pe.Msg, tt.msg) {
				t.Errorf("Msg = %q; want it to contain %q", pe.Msg, tt.msg)
			}
			if !strings.HasPrefix(err.Error(), "line ") {
				t.Errorf("Error() = %q; want it to start with the line number", err)
			}
		})
	}
}

func TestSizeLimit(t *testing.T) {
	ok := bytes.Repeat([]byte("# 34567890123456789012345678901\n"), MaxSize/32)
	if _, err := Parse(ok); err != nil {
		t.Fatalf("Parse of a %d-byte file: %v", len(ok), err)
	}
	_, err := Parse(append(ok, '#'))
	var pe *ParseError
	if !errors.As(err, &pe) || pe.Line != 0 || !strings.Contains(pe.Msg, "larger than the 1048576-byte limit") {
		t.Fatalf("Parse of a %d-byte file: %v; want a size error on line 0", len(ok)+1, err)
	}
	if err.Error() != pe.Msg {
		t.Errorf("Error() = %q; want the bare message for line 0", err)
	}

	// Set refuses to grow a file past MaxSize.
	f := mustParse(t, string(ok[:MaxSize-20]))
	if err := f.Set("k", strings.Repeat("x", 100)); err == nil {
		t.Fatalf("Set past MaxSize succeeded")
	}
	if err := f.Set("k", "x"); err != nil {
		t.Fatalf("Set within MaxSize: %v", err)
	}
	if err := f.Set("k", strings.Repeat("x", 100)); err == nil {
		t.Fatalf("rewrite past MaxSize succeeded")
	}
	if got := len(f.Bytes()); got > MaxSize {
		t.Fatalf("file grew to %d bytes", got)
	}
	if v, _ := f.Get("k"); v != "x" {
		t.Fatalf("failed Set changed the value to %q", v)
	}
}

func TestVMXLineLimit(t *testing.T) {
	for _, tt := range []struct {
		name string
		in   string
		ok   bool
	}{
		{"MaxLines newlines", strings.Repeat("\n", MaxLines), true},
		{"MaxLines lines, the last unterminated", strings.Repeat("\n", MaxLines-1) + "a = 1", true},
		{"MaxLines with a BOM", utf8BOM + strings.Repeat("#\n", MaxLines), true},
		{"one line more", strings.Repeat("\n", MaxLines+1), false},
		{"one unterminated line more", strings.Repeat("\r\n", MaxLines) + "#", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f, err := Parse([]byte(tt.in))
			if tt.ok {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				if !bytes.Equal(f.Bytes(), []byte(tt.in)) {
					t.Fatalf("the file does not round-trip")
				}
				return
			}
			var pe *ParseError
			if !errors.As(err, &pe) || pe.Line != 0 || !strings.Contains(pe.Msg, "more than the 65536-line limit") {
				t.Fatalf("Parse: %v; want a line-count error", err)
			}
		})
	}

	// Set does not grow a file past MaxLines, so that what it writes
	// parses again.
	f := mustParse(t, strings.Repeat("#\n", MaxLines-1))
	if err := f.Set("a", "1"); err != nil {
		t.Fatalf("Set of line %d: %v", MaxLines, err)
	}
	if err := f.Set("b", "2"); err == nil || !strings.Contains(err.Error(), "65536-line limit") {
		t.Fatalf("Set past MaxLines: %v", err)
	}
	if err := f.Set("a", "rewritten"); err != nil {
		t.Fatalf("rewrite at MaxLines: %v", err)
	}
	if _, err := Parse(f.Bytes()); err != nil {
		t.Fatalf("Parse(Bytes()): %v", err)
	}
}

func TestBOMAndLineEndings(t *testing.T) {
	tests := []struct {
		name, in string
	}{
		{"BOM", "\xEF\xBB\xBFa = \"1\"\nb = \"2\"\n"},
		{"CRLF", "a = \"1\"\r\n# c\r\n\r\nb = \"2\"\r\n"},
		{"no final newline", "a = \"1\"\nb = \"2\""},
		{"CRLF no final newline", "a = \"1\"\r\nb = \"2\""},
		{"mixed", "a = \"1\"\nb = \"2\"\r\n"},
		{"empty", ""},
		{"only newlines", "\n\n\r\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := mustParse(t, tt.in)
			if !bytes.Equal(f.Bytes(), []byte(tt.in)) {
				t.Fatalf("Bytes() = %q; want %q", f.Bytes(), tt.in)
			}
			if tt.in == "" || tt.in[0] == '\n' {
				return
			}
			if v, _ := f.Get("a"); v != "1" {
				t.Errorf("Get(a) = %q; want 1", v)
			}
			if v, _ := f.Get("b"); v != "2" {
				t.Errorf("Get(b) = %q; want 2", v)
			}
		})
	}
}

func TestDuplicates(t *testing.T) {
	in := "memSize = \"1024\"\na = \"x\"\nMEMSIZE = \"2048\"\nmemsize = \"4096\"\n"
	f := mustParse(t, in)
	if v, _ := f.Get("memSize"); v != "4096" {
		t.Errorf("Get(memSize) = %q; want the last value 4096", v)
	}
	if n := f.Line("memSize"); n != 4 {
		t.Errorf("Line(memSize) = %d; want 4", n)
	}
	want := []Duplicate{{Key: "MEMSIZE", Line: 3, Previous: 1}, {Key: "memsize", Line: 4, Previous: 3}}
	if got := f.Duplicates(); !reflect.DeepEqual(got, want) {
		t.Errorf("Duplicates() = %+v; want %+v", got, want)
	}
	if got := f.Keys(); !reflect.DeepEqual(got, []string{"memSize", "a"}) {
		t.Errorf("Keys() = %q", got)
	}

	// Set rewrites the setting that counts, the last one.
	if err := f.Set("MemSize", "8192"); err != nil {
		t.Fatal(err)
	}
	wantOut := "memSize = \"1024\"\na = \"x\"\nMEMSIZE = \"2048\"\nmemsize = \"8192\"\n"
	if got := string(f.Bytes()); got != wantOut {
		t.Errorf("after Set: %q; want %q", got, wantOut)
	}
	// Delete removes all of them.
	if !f.Delete("MEMSIZE") {
		t.Fatal("Delete(MEMSIZE) = false")
	}
	if got := string(f.Bytes()); got != "a = \"x\"\n" {
		t.Errorf("after Delete: %q", got)
	}
	if d := f.Duplicates(); len(d) != 0 {
		t.Errorf("Duplicates() after Delete = %+v", d)
	}
	if f.Delete("memSize") {
		t.Error("second Delete(memSize) = true")
	}
}

func TestSetExisting(t *testing.T) {
	tests := []struct {
		name, in, key, value, want string
	}{
		{"simple", "a = \"1\"\nb = \"2\"\nc = \"3\"\n", "b", "20", "a = \"1\"\nb = \"20\"\nc = \"3\"\n"},
		{"keeps spelling", "memSize = \"1\"\n", "MEMSIZE", "2", "memSize = \"2\"\n"},
		{"keeps spacing and comment", "\t b\t=   \"2\"  # two\n", "b", "3", "\t b\t=   \"3\"  # two\n"},
		{"keeps CRLF", "a = \"1\"\r\nb = \"2\"\r\n", "a", "x", "a = \"x\"\r\nb = \"2\"\r\n"},
		{"no final newline", "a = \"1\"", "a", "2", "a = \"2\""},
		{"unquoted becomes quoted", "a = 1 # c\n", "a", "two words", "a = \"two words\" # c\n"},
		{"empty unquoted", "a =\n", "a", "v", "a =\"v\"\n"},
		{"empty before comment", "a =# c\n", "a", "v", "a =\"v\"# c\n"},
		{"escapes", "a = \"1\"\n", "a", "say \"hi\" | bye\n", "a = \"say |22hi|22 |7C bye|0A\"\n"},
		{"same value changes nothing", "a = 1\n", "a", "1", "a = 1\n"},
		{"same value after decoding", "a = \"|41\"\n", "a", "A", "a = \"|41\"\n"},
		{"to empty", "a = \"1\"\n", "a", "", "a = \"\"\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := mustParse(t, tt.in)
			if err := f.Set(tt.key, tt.value); err != nil {
				t.Fatal(err)
			}
			if got := string(f.Bytes()); got != tt.want {
				t.Errorf("Bytes() = %q; want %q", got, tt.want)
			}
			if v, _ := f.Get(tt.key); v != tt.value {
				t.Errorf("Get = %q; want %q", v, tt.value)
			}
			g := mustParse(t, tt.want)
			if v, _ := g.Get(tt.key); v != tt.value {
				t.Errorf("Get after reparse = %q; want %q", v, tt.value)
			}
		})
	}
}

func TestSetNew(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"empty file", "", "k = \"v\"\n"},
		{"LF", "a = \"1\"\n", "a = \"1\"\nk = \"v\"\n"},
		{"CRLF", "a = \"1\"\r\n", "a = \"1\"\r\nk = \"v\"\r\n"},
		{"no final newline", "a = \"1\"", "a = \"1\"\nk = \"v\"\n"},
		{"CRLF no final newline", "a = \"1\"\r\nb = 2", "a = \"1\"\r\nb = 2\r\nk = \"v\"\r\n"},
		{"comment last", "a = \"1\"\n# end", "a = \"1\"\n# end\nk = \"v\"\n"},
		{"BOM", "\xEF\xBB\xBF# x\n", "\xEF\xBB\xBF# x\nk = \"v\"\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := mustParse(t, tt.in)
			if err := f.Set("k", "v"); err != nil {
				t.Fatal(err)
			}
			if got := string(f.Bytes()); got != tt.want {
				t.Errorf("Bytes() = %q; want %q", got, tt.want)
			}
			if n, want := f.Line("k"), strings.Count(tt.want, "\n"); n != want {
				t.Errorf("Line(k) = %d; want %d", n, want)
			}
			g := mustParse(t, tt.want)
			if v, _ := g.Get("K"); v != "v" {
				t.Errorf("reparsed Get(K) = %q", v)
			}
		})
	}

	var zero File
	if err := zero.Set("a", "1"); err != nil {
		t.Fatal(err)
	}
	if got := string(zero.Bytes()); got != "a = \"1\"\n" {
		t.Errorf("zero File after Set: %q", got)
	}
}

func TestSetInvalidKey(t *testing.T) {
	for _, key := range []string{"", "a b", "a=b", "a#b", "a\"b", "a|b", "a\nb", "\x00", "ké", "a\t"} {
		f := mustParse(t, "a = \"1\"\n")
		if err := f.Set(key, "v"); err == nil {
			t.Errorf("Set(%q) succeeded; want an error", key)
		}
		if got := string(f.Bytes()); got != "a = \"1\"\n" {
			t.Errorf("failed Set(%q) changed the file to %q", key, got)
		}
	}
}

func TestDeleteKeepsOtherBytes(t *testing.T) {
	in := "# head\r\na = \"1\"\r\n\r\nB = \"2\" # c\r\nc = \"3\"\r\nb = \"4\""
	f := mustParse(t, in)
	if !f.Delete("b") {
		t.Fatal("Delete(b) = false")
	}
	want := "# head\r\na = \"1\"\r\n\r\nc = \"3\"\r\n"
	if got := string(f.Bytes()); got != want {
		t.Errorf("Bytes() = %q; want %q", got, want)
	}
	if f.Line("c") != 4 {
		t.Errorf("Line(c) = %d; want 4", f.Line("c"))
	}
	if _, ok := f.Get("B"); ok {
		t.Error("B still set")
	}
	if err := f.Set("d", "5"); err != nil {
		t.Fatal(err)
	}
	want += "d = \"5\"\r\n"
	if got := string(f.Bytes()); got != want {
		t.Errorf("after Set: %q; want %q", got, want)
	}
}

func TestSetGetAnyValue(t *testing.T) {
	var all []byte
	for c := 0; c < 256; c++ {
		all = append(all, byte(c))
	}
	f := mustParse(t, "")
	if err := f.Set("all", string(all)); err != nil {
		t.Fatal(err)
	}
	g := mustParse(t, string(f.Bytes()))
	if v, _ := g.Get("all"); v != string(all) {
		t.Errorf("value of all bytes did not survive a round trip: %q", v)
	}
}

func TestParseCopiesInput(t *testing.T) {
	data := []byte("a = \"1\"\n")
	f := mustParse(t, string(data))
	f2, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	copy(data, "b = \"2\"\n")
	if got := string(f2.Bytes()); got != "a = \"1\"\n" {
		t.Errorf("changing the input changed the File: %q", got)
	}
	if !bytes.Equal(f.Bytes(), f2.Bytes()) {
		t.Error("Files differ")
	}
}

func TestErrorText(t *testing.T) {
	_, err := Parse([]byte("a = \"1\"\nmemSize = \"4096\n"))
	want := `line 2: the value of "memSize" has no closing double quote; end the value with ", ` +
		`and write a double quote inside a value as |22`
	if err == nil || err.Error() != want {
		t.Errorf("err = %v\nwant  %s", err, want)
	}
}
