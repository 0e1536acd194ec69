// SPDX-License-Identifier: Apache-2.0

// Package vmx reads and writes VMware VMX-format configuration files, the
// format that defines a VM in vrdma (and in VMware products).
//
// A .vmx file is a list of lines. Each line is one of:
//
//	key = "value"            a setting (the usual form)
//	key = value              a setting with an unquoted value (no spaces, quotes or #)
//	key =                    a setting with an empty value
//	# text                   a comment
//	                         a blank line (spaces and tabs only)
//
// Spaces and tabs may surround the key, the '=' and the value, and a setting
// may end with a "# comment". Keys are printable ASCII without spaces,
// '"', '|', '=' or '#', and are compared without regard to ASCII case
// ("memSize" and "memsize" are the same key); the spelling in the file is kept.
// Inside a value, VMware writes a double quote, a '|', DEL and every control
// byte except tab as '|' followed by two hex digits: "|22" is '"', "|7C" is
// '|', "|0A" is a newline. [File.Get] decodes these escapes and [File.Set]
// writes them.
//
// A file may start with a UTF-8 byte order mark and may use LF or CRLF line
// endings; its last line need not end with a newline. A setting that appears
// twice is not an error: the last one wins, as in VMware, and
// [File.Duplicates] lists the others.
//
// Parse is stricter than VMware's own reader, which keeps malformed lines and
// ignores them: here a malformed line, a bad escape, a NUL or control byte,
// or a file larger than [MaxSize] or longer than [MaxLines] is a
// [*ParseError] that names the line and says how to fix it. Every input is
// treated as hostile; Parse never panics, and the memory it uses is bounded
// by a small multiple of MaxSize.
//
// A File remembers every line's bytes. [File.Bytes] of an unmodified File
// returns exactly the bytes it was parsed from; [File.Set] and
// [File.Delete] change only the lines of the key they are given.
//
// A File is not safe for concurrent use when one of the goroutines modifies
// it.
package vmx

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
)

// MaxSize is the largest file, in bytes, that Parse accepts and that Set lets
// a File grow to. Real .vmx files are a few kilobytes.
const MaxSize = 1 << 20

// MaxLines is the most lines Parse accepts and that Set lets a File grow
// to. Real .vmx files have a few hundred; the limit keeps a file of empty
// lines from costing far more memory than its size.
const MaxLines = 1 << 16

// utf8BOM is the byte order mark some editors put at the start of a file.
const utf8BOM = "\xEF\xBB\xBF"

// ParseError is a problem found in a .vmx file: Line is the 1-based line
// number (0 when the problem concerns the whole file, such as its size) and
// Msg says what is wrong and what to do about it.
type ParseError struct {
	Line int
	Msg  string
}

// Error returns "line N: Msg", or Msg alone when Line is 0.
func (e *ParseError) Error() string {
	if e.Line <= 0 {
		return e.Msg
	}
	return "line " + strconv.Itoa(e.Line) + ": " + e.Msg
}

// Duplicate describes a setting whose key already appeared on an earlier
// line. The later setting is the one that counts.
type Duplicate struct {
	Key      string // the key as spelled on Line
	Line     int    // 1-based line of this setting
	Previous int    // 1-based line of the previous setting of the same key
}

// line is one line of the file.
type line struct {
	raw    []byte // the whole line, including its "\n" or "\r\n" (none on a final line)
	key    string // "" for blank and comment lines
	fold   string // key in ASCII lower case
	value  string // decoded value
	vStart int    // start of the value token in raw (at the opening quote if quoted)
	vEnd   int    // end of the value token in raw (after the closing quote if quoted)
}

// File is a parsed .vmx file. The zero value is an empty file, ready to use.
type File struct {
	bom   bool             // the file starts with a UTF-8 byte order mark
	crlf  bool             // the file's first line ending is CRLF: appended lines get CRLF too
	lines []line           // every line, in order
	index map[string][]int // folded key -> indexes in lines, ascending
	size  int              // len(f.Bytes())
}

// Parse parses a .vmx file. On failure the error is a *ParseError. Parse(nil)
// returns an empty File.
func Parse(data []byte) (*File, error) {
	if len(data) > MaxSize {
		return nil, &ParseError{Msg: fmt.Sprintf("the file is %d bytes, larger than the %d-byte limit for a .vmx file; "+
			"a .vmx file is normally a few kilobytes: check that this is the right file", len(data), MaxSize)}
	}
	f := &File{size: len(data)}
	// The File keeps slices of data for its lines: copy it, so that the
	// caller may reuse data, and count the lines to allocate them at once.
	data = bytes.Clone(data)
	if bytes.HasPrefix(data, []byte(utf8BOM)) {
		f.bom = true
		data = data[len(utf8BOM):]
	}
	nlines := bytes.Count(data, []byte("\n"))
	if len(data) > 0 && data[len(data)-1] != '\n' {
		nlines++
	}
	if nlines > MaxLines {
		return nil, &ParseError{Msg: fmt.Sprintf("the file has %d lines, more than the %d-line limit for a .vmx file; "+
			"a .vmx file normally has a few hundred: check that this is the right file", nlines, MaxLines)}
	}
	f.lines = make([]line, 0, nlines)
	sawEOL := false
	for n := 1; len(data) > 0; n++ {
		end := len(data)
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			end = i + 1
		}
		raw := data[:end:end]
		data = data[end:]
		text := raw
		if bytes.HasSuffix(text, []byte("\n")) {
			text = text[:len(text)-1]
			crlf := bytes.HasSuffix(text, []byte("\r"))
			if crlf {
				text = text[:len(text)-1]
			}
			if !sawEOL {
				sawEOL = true
				f.crlf = crlf
			}
		}
		l, err := parseLine(raw, text, n)
		if err != nil {
			return nil, err
		}
		f.lines = append(f.lines, l)
	}
	f.reindex()
	return f, nil
}

// parseLine parses text, the line raw without its line ending. n is the
// 1-based line number for errors.
func parseLine(raw, text []byte, n int) (line, error) {
	l := line{raw: raw}
	fail := func(format string, args ...any) (line, error) {
		return line{}, &ParseError{Line: n, Msg: fmt.Sprintf(format, args...)}
	}
	for i, c := range text {
		switch {
		case c == 0:
			return fail("NUL byte at column %d: this looks like binary data, not a text .vmx file", i+1)
		case c == '\r':
			return fail("carriage return at column %d that does not end the line; "+
				"use LF or CRLF line endings, and write a carriage return inside a value as |0D", i+1)
		case c < 0x20 && c != '\t' || c == 0x7F:
			return fail("control byte 0x%02X at column %d; a .vmx file is text: "+
				"remove the byte, or write it inside a value as |%02X", c, i+1, c)
		}
	}

	i := skipSpace(text, 0)
	if i == len(text) || text[i] == '#' {
		return l, nil // blank line or comment
	}

	// The key.
	kStart := i
	for i < len(text) && !isSpace(text[i]) && text[i] != '=' && text[i] != '#' {
		i++
	}
	key := string(text[kStart:i])
	if key == "" {
		return fail("nothing before the '='; a setting is written key = \"value\"")
	}
	if msg := checkKey(key); msg != "" {
		return fail("%s", msg)
	}
	name := shorten(key) // for messages
	i = skipSpace(text, i)
	if i == len(text) || text[i] != '=' {
		if i == len(text) || text[i] == '#' {
			return fail("%q has no '='; a setting is written key = \"value\", and a comment line starts with #", name)
		}
		return fail("key %q is followed by %q where '=' was expected; keys cannot contain spaces, "+
			"and a setting is written key = \"value\"", name, shorten(string(text[i:])))
	}
	i = skipSpace(text, i+1)

	// The value.
	var enc []byte
	l.vStart = i
	quoted := i < len(text) && text[i] == '"'
	if quoted {
		j := bytes.IndexByte(text[i+1:], '"')
		if j < 0 {
			return fail("the value of %q has no closing double quote; end the value with \", "+
				"and write a double quote inside a value as |22", name)
		}
		enc = text[i+1 : i+1+j]
		i += j + 2
	} else {
		if i < len(text) && text[i] == '=' {
			return fail("a second '=' at column %d after the key %q; a setting is written key = \"value\"", i+1, name)
		}
		for i < len(text) && !isSpace(text[i]) && text[i] != '#' {
			if text[i] == '"' {
				return fail("stray double quote at column %d in the value of %q; "+
					"put the whole value in double quotes (key = \"value\"), and write a double quote inside it as |22",
					i+1, name)
			}
			i++
		}
		enc = text[l.vStart:i]
	}
	l.vEnd = i
	i = skipSpace(text, i)
	if i < len(text) && text[i] != '#' {
		return fail("unexpected %q after the value of %q; a value that contains spaces must be in double quotes, "+
			"and a comment after a setting starts with #", shorten(string(text[i:])), name)
	}
	value, col, ok := unescape(enc)
	if !ok {
		bad := enc[col:min(col+3, len(enc))]
		return fail("bad escape %q at column %d in the value of %q: '|' must be followed by two hex digits; "+
			"write a literal | as |7C", bad, l.vStart+boolInt(quoted)+col+1, name)
	}
	l.key = key
	l.fold = fold(key)
	l.value = value
	return l, nil
}

// checkKey returns "" if key is a valid key, else what is wrong with it.
func checkKey(key string) string {
	if key == "" {
		return "the key is empty; a setting is written key = \"value\""
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		if c == '"' && i == 0 {
			return fmt.Sprintf("the key %s starts with a double quote; keys are not quoted: write %s = \"value\"",
				strconv.Quote(shorten(key)), shorten(strings.Trim(key, "\"")))
		}
		if !isKeyByte(c) {
			what := fmt.Sprintf("the byte 0x%02X", c)
			if ' ' < c && c < 0x7F {
				what = fmt.Sprintf("the character %c", c)
			}
			return fmt.Sprintf("the key %s contains %s at column %d; "+
				"keys may contain only printable ASCII other than space, '\"', '|', '=' and '#'",
				strconv.Quote(shorten(key)), what, i+1)
		}
	}
	return ""
}

// isKeyByte reports whether c may appear in a key.
func isKeyByte(c byte) bool {
	return c > ' ' && c < 0x7F && c != '"' && c != '|' && c != '=' && c != '#'
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' }

func skipSpace(b []byte, i int) int {
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	return i
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// shorten cuts s to a length that reads well in an error message.
func shorten(s string) string {
	const max = 40
	if len(s) <= max {
		return s
	}
	return s[:max] + "..."
}

// fold returns key in ASCII lower case. Only ASCII letters are folded, so
// that no non-ASCII key (which Parse and Set reject) can match a valid one.
func fold(key string) string {
	for i := 0; i < len(key); i++ {
		if c := key[i]; 'A' <= c && c <= 'Z' {
			b := []byte(key)
			for j := i; j < len(b); j++ {
				if 'A' <= b[j] && b[j] <= 'Z' {
					b[j] += 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return key
}

// unescape decodes the |XX escapes of enc. If an escape is bad, it returns
// the offset of its '|' in enc and ok == false.
func unescape(enc []byte) (value string, bad int, ok bool) {
	if bytes.IndexByte(enc, '|') < 0 {
		return string(enc), 0, true
	}
	out := make([]byte, 0, len(enc))
	for i := 0; i < len(enc); i++ {
		c := enc[i]
		if c != '|' {
			out = append(out, c)
			continue
		}
		if i+2 >= len(enc) {
			return "", i, false
		}
		hi, ok1 := unhex(enc[i+1])
		lo, ok2 := unhex(enc[i+2])
		if !ok1 || !ok2 {
			return "", i, false
		}
		out = append(out, hi<<4|lo)
		i += 2
	}
	return string(out), 0, true
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// needsEscape reports whether Set writes c as a |XX escape: a double quote,
// '|', DEL and every control byte except tab, as VMware does.
func needsEscape(c byte) bool {
	return c < 0x20 && c != '\t' || c == '"' || c == '|' || c == 0x7F
}

// Quote returns value as it is written in a .vmx file: in double quotes,
// with its special bytes written as |XX escapes.
func Quote(value string) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(value) + 2)
	b.WriteByte('"')
	for i := 0; i < len(value); i++ {
		c := value[i]
		if needsEscape(c) {
			b.WriteByte('|')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&0xF])
		} else {
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// reindex rebuilds f.index from f.lines.
func (f *File) reindex() {
	f.index = make(map[string][]int)
	for i := range f.lines {
		if l := &f.lines[i]; l.key != "" {
			f.index[l.fold] = append(f.index[l.fold], i)
		}
	}
}

// last returns the index in f.lines of the setting of key that counts, or -1.
func (f *File) last(key string) int {
	idx := f.index[fold(key)]
	if len(idx) == 0 {
		return -1
	}
	return idx[len(idx)-1]
}

// Get returns the decoded value of key (compared without regard to ASCII
// case) and whether the key is set. If the key is set more than once, the
// last setting wins.
func (f *File) Get(key string) (string, bool) {
	if i := f.last(key); i >= 0 {
		return f.lines[i].value, true
	}
	return "", false
}

// Line returns the 1-based line number of the setting of key that counts
// (the last one), or 0 if key is not set.
func (f *File) Line(key string) int {
	return f.last(key) + 1
}

// Keys returns every key that is set, once each, in the order and with the
// spelling of its first appearance in the file.
func (f *File) Keys() []string {
	var keys []string
	seen := make(map[string]bool, len(f.index))
	for i := range f.lines {
		l := &f.lines[i]
		if l.key != "" && !seen[l.fold] {
			seen[l.fold] = true
			keys = append(keys, l.key)
		}
	}
	return keys
}

// Duplicates lists, in line order, every setting whose key was already set
// on an earlier line. The line numbers are those of the File as it is now.
func (f *File) Duplicates() []Duplicate {
	var dups []Duplicate
	prev := make(map[string]int)
	for i := range f.lines {
		l := &f.lines[i]
		if l.key == "" {
			continue
		}
		if p, ok := prev[l.fold]; ok {
			dups = append(dups, Duplicate{Key: l.key, Line: i + 1, Previous: p})
		}
		prev[l.fold] = i + 1
	}
	return dups
}

// Set gives key the value value. If key is set already (in any case), Set
// rewrites only the value in the line that counts (the last one), keeping the
// key's spelling, the spacing and any trailing comment; if the value is
// unchanged it changes nothing. Otherwise Set appends the line
// key = "value" at the end of the file. The value may hold any bytes: Set
// writes special ones as |XX escapes.
//
// Set fails, changing nothing, if key is not a valid key or if the file would
// grow larger than MaxSize or longer than MaxLines.
func (f *File) Set(key, value string) error {
	if msg := checkKey(key); msg != "" {
		return fmt.Errorf("vmx: cannot set %s: %s", strconv.Quote(shorten(key)), msg)
	}
	q := Quote(value)
	if i := f.last(key); i >= 0 {
		l := &f.lines[i]
		if l.value == value {
			return nil
		}
		size := f.size - (l.vEnd - l.vStart) + len(q)
		if size > MaxSize {
			return fmt.Errorf("vmx: cannot set %s: the file would be %d bytes, over the %d-byte limit", strconv.Quote(shorten(key)), size, MaxSize)
		}
		raw := make([]byte, 0, len(l.raw)-(l.vEnd-l.vStart)+len(q))
		raw = append(raw, l.raw[:l.vStart]...)
		raw = append(raw, q...)
		raw = append(raw, l.raw[l.vEnd:]...)
		l.raw = raw
		l.value = value
		l.vEnd = l.vStart + len(q)
		f.size = size
		return nil
	}

	nl := "\n"
	if f.crlf {
		nl = "\r\n"
	}
	// If the file does not end in a newline, its last line gets one first.
	var fix []byte
	if n := len(f.lines); n > 0 && !bytes.HasSuffix(f.lines[n-1].raw, []byte("\n")) {
		fix = append(append(fix, f.lines[n-1].raw...), nl...)
	}
	text := key + " = " + q
	size := f.size + len(text) + len(nl)
	if fix != nil {
		size += len(nl)
	}
	if size > MaxSize {
		return fmt.Errorf("vmx: cannot set %s: the file would be %d bytes, over the %d-byte limit", strconv.Quote(shorten(key)), size, MaxSize)
	}
	if len(f.lines)+1 > MaxLines {
		return fmt.Errorf("vmx: cannot set %s: the file would have %d lines, over the %d-line limit", strconv.Quote(shorten(key)), len(f.lines)+1, MaxLines)
	}
	if fix != nil {
		f.lines[len(f.lines)-1].raw = fix
	}
	f.lines = append(f.lines, line{
		raw:    []byte(text + nl),
		key:    key,
		fold:   fold(key),
		value:  value,
		vStart: len(key) + 3,
		vEnd:   len(text),
	})
	if f.index == nil {
		f.index = make(map[string][]int)
	}
	f.index[fold(key)] = append(f.index[fold(key)], len(f.lines)-1)
	f.size = size
	return nil
}

// Delete removes every line that sets key (in any case) and reports whether
// there was one. Other lines are kept byte for byte.
func (f *File) Delete(key string) bool {
	k := fold(key)
	if len(f.index[k]) == 0 {
		return false
	}
	kept := f.lines[:0]
	for _, l := range f.lines {
		if l.key != "" && l.fold == k {
			f.size -= len(l.raw)
			continue
		}
		kept = append(kept, l)
	}
	clear(f.lines[len(kept):])
	f.lines = kept
	f.reindex()
	return true
}

// Bytes returns the file's contents: every line the File did not change,
// byte for byte, with the lines Set wrote or rewrote.
func (f *File) Bytes() []byte {
	out := make([]byte, 0, f.size)
	if f.bom {
		out = append(out, utf8BOM...)
	}
	for i := range f.lines {
		out = append(out, f.lines[i].raw...)
	}
	return out
}
