// SPDX-License-Identifier: Apache-2.0

package abi

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// The golden vectors pin the bytes of the ABI for implementations in other
// languages (a C libibverbs): each vector is encoded here, compared with its
// checked-in hex dump in testdata/golden, decoded back from that file and
// compared with the value, and compared with the copy printed in
// docs/wire-local.md, so that neither the encoders, the files nor the
// document can drift. go test -run Golden -update rewrites the files and the
// document's blocks from the encoders.

var update = flag.Bool("update", false, "rewrite testdata/golden and the vector blocks of docs/wire-local.md from the encoders")

const (
	goldenDir = "testdata/golden"
	wireDoc   = "../../docs/wire-local.md"
	// docFence opens a vector's block in the document: "```hexdump NAME".
	docFence = "```hexdump "
)

// goldenVector is one vector: its bytes, and a check that decodes bytes
// (read back from the file) into the value the vector was made from.
type goldenVector struct {
	name   string
	bytes  []byte
	decode func(t *testing.T, b []byte)
}

// The values the vectors encode. A QP created with goldenCaps has a send
// stride of 128 bytes and a receive stride of 64 (goldenLayout): the send
// and receive vectors are whole slots of that QP.
var (
	goldenCaps = QPCaps{MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 2, MaxRecvSGE: 2, MaxInlineData: 64}
	goldenQPN  = uint32(0x1a2b)
	goldenPeer = uint32(0x3c4d)
)

func goldenLayout(t *testing.T) (QPLayout, QPCaps) {
	l, c, err := NewQPLayout(goldenCaps)
	if err != nil {
		t.Fatal(err)
	}
	if l.SQStride != 128 || l.RQStride != 64 {
		t.Fatalf("strides %d and %d: the vectors assume 128 and 64", l.SQStride, l.RQStride)
	}
	return l, c
}

func goldenVectors(t *testing.T) []goldenVector {
	layout, caps := goldenLayout(t)
	var vs []goldenVector

	// Command messages: the whole message as it travels on the socket.
	frame := func(name string, h Header, body any, request bool) {
		b, err := AppendMessage(nil, h, body)
		if err != nil {
			t.Fatal(err)
		}
		vs = append(vs, goldenVector{name: name, bytes: b, decode: func(t *testing.T, b []byte) {
			got, rb, err := ParseMessage(b)
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			want := h
			want.Len = uint32(len(b) - CmdHeaderSize)
			if got != want {
				t.Fatalf("header %+v, want %+v", got, want)
			}
			v := reflect.New(reflect.TypeOf(body).Elem())
			if err := json.Unmarshal(rb, v.Interface()); err != nil {
				t.Fatalf("body: %v", err)
			}
			if !reflect.DeepEqual(v.Interface(), body) {
				t.Fatalf("body %+v, want %+v", v.Elem(), reflect.ValueOf(body).Elem())
			}
			if request {
				_, req, err := DecodeRequest(b)
				if err != nil || !reflect.DeepEqual(req, body) {
					t.Fatalf("DecodeRequest: %+v, %v", req, err)
				}
			}
		}})
	}
	frame("hello-request", Header{Version: Version, Op: OpHello, Seq: 1},
		&Hello{Client: "libibverbs-vrdma/0.1", Caps: CapAsyncMode | CapFence | CapPathMemcpy | CapPathTCP | CapCM}, true)
	frame("hello-reply", Header{Version: Version, Flags: FlagResponse, Op: OpHello, Seq: 1},
		&HelloReply{Host: "esx1", HostID: "5f1d3c0a9b8e4f7d2c6a1b0e9d8c7f6a", AgentVersion: "0.1.0", Caps: CapsKnown}, false)
	frame("create-qp-request", Header{Version: Version, Op: OpCreateQP, Seq: 7},
		&CreateQP{PD: 1, SendCQ: 2, RecvCQ: 2, Type: QPTypeRC, Caps: goldenCaps}, true)
	frame("create-qp-reply", Header{Version: Version, Flags: FlagResponse, Op: OpCreateQP, Seq: 7},
		&CreateQPReply{Handle: 3, QPN: goldenQPN, Caps: caps, Layout: layout}, false)
	_, _, lerr := NewQPLayout(QPCaps{MaxRecvWR: 64})
	frame("error-reply", Header{Version: Version, Flags: FlagResponse | FlagError, Op: OpCreateQP, Seq: 8},
		&Error{Code: CodeInvalid, Field: "caps", Message: lerr.Error()}, false)

	// Send WQEs: one whole SQ slot of the QP above, written into a zeroed
	// slot (a fresh ring), as the library writes it.
	send := func(name string, w SendWQE, inline []byte) {
		slot := make([]byte, layout.SQStride)
		EncodeSend(slot, &w, inline)
		vs = append(vs, goldenVector{name: name, bytes: slot, decode: func(t *testing.T, b []byte) {
			var got SendWQE
			if st := DecodeSend(b, &got, caps.MaxSendSGE, caps.MaxInlineData); st != WCSuccess {
				t.Fatalf("DecodeSend: %s", st)
			}
			if got != w {
				t.Fatalf("decoded %+v, want %+v", got, w)
			}
			if w.Flags&SendInline != 0 && !bytes.Equal(Inline(b, &got), inline) {
				t.Fatalf("inline bytes %q, want %q", Inline(b, &got), inline)
			}
		}})
	}
	sges := func(s ...SGE) (n uint8, a [MaxSGE]SGE) {
		copy(a[:], s)
		return uint8(len(s)), a
	}
	w := SendWQE{WRID: 0x1122334455667788, Opcode: OpSend, Flags: SendSignaled}
	w.NumSGE, w.SGE = sges(SGE{Addr: 0x10000, Length: 100, LKey: 0x101}, SGE{Addr: 0x20040, Length: 28, LKey: 0x101})
	send("sq-send-sge", w, nil)
	inline := []byte("hello, rdma")
	send("sq-send-inline", SendWQE{WRID: 2, Opcode: OpSend, Flags: SendSignaled | SendInline, InlineLen: uint32(len(inline))}, inline)
	w = SendWQE{WRID: 3, Opcode: OpRDMAWriteWithImm, Flags: SendSignaled, Imm: 0xdeadbeef, RemoteAddr: 0x7f0012345000, RKey: 0x202}
	w.NumSGE, w.SGE = sges(SGE{Addr: 0x10000, Length: 4096, LKey: 0x101})
	send("sq-write-imm", w, nil)
	w = SendWQE{WRID: 4, Opcode: OpRDMARead, Flags: SendSignaled, RemoteAddr: 0x30000, RKey: 0x303}
	w.NumSGE, w.SGE = sges(SGE{Addr: 0x11000, Length: 512, LKey: 0x101})
	send("sq-read", w, nil)
	w = SendWQE{WRID: 5, Opcode: OpAtomicCmpAndSwp, Flags: SendSignaled, RemoteAddr: 0x1000, RKey: 0x404,
		CompareAdd: 0x0123456789abcdef, Swap: 0xfedcba9876543210}
	w.NumSGE, w.SGE = sges(SGE{Addr: 0x12000, Length: 8, LKey: 0x101})
	send("sq-cmp-swp", w, nil)
	w = SendWQE{WRID: 6, Opcode: OpAtomicFetchAdd, Flags: SendSignaled | SendFence, RemoteAddr: 0x1008, RKey: 0x404, CompareAdd: 1}
	w.NumSGE, w.SGE = sges(SGE{Addr: 0x12008, Length: 8, LKey: 0x101})
	send("sq-fetch-add", w, nil)

	// A receive WQE: one whole RQ slot.
	r := RecvWQE{WRID: 0x42}
	r.NumSGE, r.SGE = sges(SGE{Addr: 0x40000, Length: 2048, LKey: 0x505}, SGE{Addr: 0x50000, Length: 2048, LKey: 0x505})
	slot := make([]byte, layout.RQStride)
	EncodeRecv(slot, &r)
	vs = append(vs, goldenVector{name: "rq-recv", bytes: slot, decode: func(t *testing.T, b []byte) {
		var got RecvWQE
		if st := DecodeRecv(b, &got, caps.MaxRecvSGE); st != WCSuccess || got != r {
			t.Fatalf("DecodeRecv: %s, %+v, want %+v", st, got, r)
		}
	}})

	// Completions: one CQ slot each.
	cqe := func(name string, c CQE) {
		slot := make([]byte, CQESize)
		EncodeCQE(slot, &c)
		vs = append(vs, goldenVector{name: name, bytes: slot, decode: func(t *testing.T, b []byte) {
			var got CQE
			DecodeCQE(b, &got)
			if got != c {
				t.Fatalf("DecodeCQE: %+v, want %+v", got, c)
			}
		}})
	}
	cqe("cqe-recv-imm", CQE{WRID: 0x42, QPNum: goldenQPN, Opcode: WCRecvRDMAWithImm, Status: WCSuccess, Flags: WCWithImm,
		ByteLen: 4096, Imm: 0xdeadbeef, SrcQP: goldenPeer})
	cqe("cqe-send-error", CQE{WRID: 0x1122334455667788, QPNum: goldenPeer, Opcode: WCRDMAWrite, Status: WCRemAccessErr})
	return vs
}

// TestGoldenVectors compares every vector with its file and decodes the
// file back.
func TestGoldenVectors(t *testing.T) {
	vs := goldenVectors(t)
	if *update {
		if err := os.MkdirAll(goldenDir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, v := range vs {
			if err := os.WriteFile(goldenPath(v.name), []byte(hexDump(v.bytes)), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	seen := map[string]bool{}
	for _, v := range vs {
		t.Run(v.name, func(t *testing.T) {
			if seen[v.name] {
				t.Fatalf("two vectors are called %s", v.name)
			}
			seen[v.name] = true
			file, err := os.ReadFile(goldenPath(v.name))
			if err != nil {
				t.Fatalf("%v (go test -run Golden -update writes it)", err)
			}
			if want := hexDump(v.bytes); string(file) != want {
				t.Fatalf("%s differs from the encoding (an ABI change? then bump abi.Version or add a capability bit, and run with -update):\nfile:\n%s\nencoder:\n%s",
					goldenPath(v.name), file, want)
			}
			b, err := parseHexDump(string(file))
			if err != nil {
				t.Fatalf("%s: %v", goldenPath(v.name), err)
			}
			if !bytes.Equal(b, v.bytes) {
				t.Fatalf("%s parses to other bytes than the encoding", goldenPath(v.name))
			}
			v.decode(t, b)
		})
	}
	// No stale files.
	files, _ := filepath.Glob(filepath.Join(goldenDir, "*.hex"))
	for _, f := range files {
		if name := strings.TrimSuffix(filepath.Base(f), ".hex"); !seen[name] {
			t.Errorf("%s is no vector's file: remove it", f)
		}
	}
}

// TestGoldenDoc checks that docs/wire-local.md prints every vector exactly
// as its file holds it, once, and no block that is not a vector.
func TestGoldenDoc(t *testing.T) {
	vs := goldenVectors(t)
	doc, err := os.ReadFile(wireDoc)
	if err != nil {
		t.Fatal(err)
	}
	if *update {
		want := map[string]string{}
		for _, v := range vs {
			want[v.name] = hexDump(v.bytes)
		}
		out, err := rewriteDocBlocks(string(doc), want)
		if err != nil {
			t.Fatal(err)
		}
		if out != string(doc) {
			if err := os.WriteFile(wireDoc, []byte(out), 0o644); err != nil {
				t.Fatal(err)
			}
			doc = []byte(out)
		}
	}
	blocks, err := docBlocks(string(doc))
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, v := range vs {
		known[v.name] = true
		got, ok := blocks[v.name]
		if !ok {
			t.Errorf("%s prints no %q block for vector %s: add one (-update fills it)", wireDoc, docFence+v.name, v.name)
			continue
		}
		file, err := os.ReadFile(goldenPath(v.name))
		if err != nil {
			t.Fatal(err)
		}
		if got != string(file) {
			t.Errorf("%s: block %s differs from %s (run go test -run Golden -update):\ndoc:\n%s\nfile:\n%s", wireDoc, v.name, goldenPath(v.name), got, file)
		}
	}
	for name := range blocks {
		if !known[name] {
			t.Errorf("%s prints a block %s that is no vector", wireDoc, name)
		}
	}
}

func goldenPath(name string) string { return filepath.Join(goldenDir, name+".hex") }

// hexDump lays b out as hexdump -C does: an 8-digit offset, 16 bytes in two
// groups of 8, and their printable ASCII between bars; every line ends in
// a newline.
func hexDump(b []byte) string {
	var sb strings.Builder
	for off := 0; off < len(b); off += 16 {
		sb.WriteString(dumpLine(off, b[off:min(off+16, len(b))]))
	}
	return sb.String()
}

// dumpLine is the line of hexDump for the bytes line at offset off.
func dumpLine(off int, line []byte) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "%08x  ", off)
	for i := range 16 {
		if i < len(line) {
			fmt.Fprintf(&sb, "%02x ", line[i])
		} else {
			sb.WriteString("   ")
		}
		if i == 7 {
			sb.WriteByte(' ')
		}
	}
	sb.WriteString(" |")
	for _, c := range line {
		if c < 0x20 || c > 0x7e {
			c = '.'
		}
		sb.WriteByte(c)
	}
	sb.WriteString("|\n")
	return sb.String()
}

// parseHexDump reads what hexDump writes back into bytes, checking every
// line's offset and its ASCII column.
func parseHexDump(s string) ([]byte, error) {
	var out []byte
	sc := bufio.NewScanner(strings.NewReader(s))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		bar := strings.IndexByte(line, '|')
		if len(line) < 10 || bar < 10 || !strings.HasSuffix(line, "|") {
			return nil, fmt.Errorf("line %d: %q is not a hexdump -C line", n, line)
		}
		off, err := strconv.ParseUint(line[:8], 16, 32)
		if err != nil || off != uint64(len(out)) {
			return nil, fmt.Errorf("line %d: offset %q, want %08x", n, line[:8], len(out))
		}
		b, err := hex.DecodeString(strings.Join(strings.Fields(line[10:bar]), ""))
		if err != nil || len(b) == 0 || len(b) > 16 {
			return nil, fmt.Errorf("line %d: bytes %q: %v", n, line[10:bar], err)
		}
		if want := dumpLine(int(off), b); want != line+"\n" {
			return nil, fmt.Errorf("line %d: %q, want %q", n, line, strings.TrimSuffix(want, "\n"))
		}
		out = append(out, b...)
	}
	return out, sc.Err()
}

// docBlocks returns the contents of the document's vector blocks by name.
func docBlocks(doc string) (map[string]string, error) {
	blocks := map[string]string{}
	lines := strings.SplitAfter(doc, "\n")
	for i := 0; i < len(lines); i++ {
		name, ok := strings.CutPrefix(strings.TrimRight(lines[i], "\n"), docFence)
		if !ok {
			continue
		}
		if _, dup := blocks[name]; dup {
			return nil, fmt.Errorf("%s prints vector %s twice", wireDoc, name)
		}
		var sb strings.Builder
		for i++; i < len(lines) && strings.TrimRight(lines[i], "\n") != "```"; i++ {
			sb.WriteString(lines[i])
		}
		if i == len(lines) {
			return nil, fmt.Errorf("%s: block %s is not closed", wireDoc, name)
		}
		blocks[name] = sb.String()
	}
	return blocks, nil
}

// rewriteDocBlocks replaces the contents of the document's vector blocks
// with want's; it does not add blocks.
func rewriteDocBlocks(doc string, want map[string]string) (string, error) {
	var sb strings.Builder
	lines := strings.SplitAfter(doc, "\n")
	for i := 0; i < len(lines); i++ {
		sb.WriteString(lines[i])
		name, ok := strings.CutPrefix(strings.TrimRight(lines[i], "\n"), docFence)
		if !ok {
			continue
		}
		body, known := want[name]
		j := i + 1
		for j < len(lines) && strings.TrimRight(lines[j], "\n") != "```" {
			if !known {
				sb.WriteString(lines[j])
			}
			j++
		}
		if j == len(lines) {
			return "", fmt.Errorf("%s: block %s is not closed", wireDoc, name)
		}
		if known {
			sb.WriteString(body)
		}
		i = j - 1
	}
	return sb.String(), nil
}
