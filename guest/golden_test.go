// SPDX-License-Identifier: Apache-2.0

package guest

import (
	"bufio"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/vrdma/vrdma/internal/abi"
)

// goldenDir holds internal/abi's golden vectors.
var goldenDir = filepath.Join("..", "internal", "abi", "testdata", "golden")

// verbsHeader is what the drop-in compiles against.
const verbsHeader = "/usr/include/infiniband/verbs.h"

// needC skips tb without gcc or libibverbs-dev's headers.
func needC(tb testing.TB) {
	tb.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		tb.Skip("no gcc: apt-get install -y gcc libibverbs-dev")
	}
	if _, err := os.Stat(verbsHeader); err != nil {
		tb.Skipf("no %s: apt-get install -y libibverbs-dev", verbsHeader)
	}
}

// buildC compiles the test program ibverbs/tests/NAME.c with the library
// sources srcs (of ibverbs/) and extra gcc flags into dir, -Wall -Wextra
// clean.
func buildC(tb testing.TB, dir, name string, srcs []string, flags ...string) string {
	tb.Helper()
	bin := filepath.Join(dir, name)
	args := append([]string{"-std=gnu11", "-Wall", "-Wextra", "-Werror", "-g", "-o", bin, filepath.Join("ibverbs", "tests", name+".c")}, flags...)
	for _, s := range srcs {
		args = append(args, filepath.Join("ibverbs", s))
	}
	args = append(args, "-lpthread")
	if out, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
		tb.Fatalf("gcc %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return bin
}

// parseHexDump reads a hexdump -C listing (the golden files' format).
func parseHexDump(s string) ([]byte, error) {
	var out []byte
	for n, line := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		bar := strings.IndexByte(line, '|')
		if len(line) < 10 || bar < 10 {
			return nil, fmt.Errorf("line %d: %q is not a hexdump -C line", n+1, line)
		}
		b, err := hex.DecodeString(strings.Join(strings.Fields(line[10:bar]), ""))
		if err != nil {
			return nil, fmt.Errorf("line %d: %v", n+1, err)
		}
		out = append(out, b...)
	}
	return out, nil
}

// cHarness is a running C test program answering one line per line.
type cHarness struct {
	mu  sync.Mutex
	in  io.WriteCloser
	out *bufio.Reader
	cmd *exec.Cmd
}

func startHarness(t *testing.T, bin string) *cHarness {
	cmd := exec.Command(bin)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &cHarness{in: in, out: bufio.NewReaderSize(out, 1<<21), cmd: cmd}
	t.Cleanup(func() { in.Close(); cmd.Wait() })
	return h
}

func (h *cHarness) ask(t *testing.T, line string) string {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, err := io.WriteString(h.in, line+"\n"); err != nil {
		t.Fatalf("harness: %v", err)
	}
	ans, err := h.out.ReadString('\n')
	if err != nil {
		t.Fatalf("harness died on %.80q: %v", line, err)
	}
	return strings.TrimSuffix(ans, "\n")
}

// TestCGoldenVectors runs every golden vector of internal/abi through the
// C drop-in's own code (ibverbs/tests/abi_golden.c over wqe.h, session.c,
// layout.c and json.c): each send and receive WQE, decoded by package abi
// from its file, is written again by the C encoder into a zeroed slot and
// must give the file's bytes; each CQE file is read by the C decoder into
// an ibv_wc that must hold abi's decoding; a request's header is written
// by C and a reply is checked and read by C. A vector of a kind the test
// does not know fails it, so a new vector gets a C check too.
func TestCGoldenVectors(t *testing.T) {
	needC(t)
	bin := buildC(t, t.TempDir(), "abi_golden", []string{"json.c", "session.c", "layout.c"})
	h := startHarness(t, bin)
	files, err := filepath.Glob(filepath.Join(goldenDir, "*.hex"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden vectors in %s (%v)", goldenDir, err)
	}
	seen := map[string]int{}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".hex")
		t.Run(name, func(t *testing.T) {
			text, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			b, err := parseHexDump(string(text))
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			switch {
			case strings.HasPrefix(name, "sq-"):
				seen["send"]++
				goldenSend(t, h, b)
			case strings.HasPrefix(name, "rq-"):
				seen["recv"]++
				goldenRecv(t, h, b)
			case strings.HasPrefix(name, "cqe-"):
				seen["cqe"]++
				goldenCQE(t, h, b)
			case strings.HasSuffix(name, "-request"):
				seen["request"]++
				hdr, _, err := abi.ParseMessage(b)
				if err != nil {
					t.Fatal(err)
				}
				want := "hdr " + hex.EncodeToString(b[:abi.CmdHeaderSize])
				if got := h.ask(t, fmt.Sprintf("reqhdr %d %d %d", hdr.Op, hdr.Seq, hdr.Len)); got != want {
					t.Fatalf("C header:\n got %s\nwant %s", got, want)
				}
			case strings.HasSuffix(name, "-reply"):
				seen["reply"]++
				goldenReply(t, h, b)
			default:
				t.Fatalf("vector %s is of no kind this test knows: teach it (and abi_golden.c)", name)
			}
		})
	}
	for _, k := range []string{"send", "recv", "cqe", "request", "reply"} {
		if seen[k] == 0 {
			t.Errorf("no %s vector was checked", k)
		}
	}
}

func goldenSend(t *testing.T, h *cHarness, b []byte) {
	var w abi.SendWQE
	maxSGE := min(uint32(len(b)-abi.SendHdr)/abi.SGESize, abi.MaxSGE)
	maxInline := min(uint32(len(b)-abi.SendHdr), abi.MaxInline)
	if st := abi.DecodeSend(b, &w, maxSGE, maxInline); st != abi.WCSuccess {
		t.Fatalf("abi.DecodeSend: %s", st)
	}
	var flags []string
	for _, f := range []struct {
		f    abi.SendFlags
		name string
	}{{abi.SendSignaled, "signaled"}, {abi.SendSolicited, "solicited"}, {abi.SendFence, "fence"}, {abi.SendInline, "inline"}} {
		if w.Flags&f.f != 0 {
			flags = append(flags, f.name)
		}
	}
	fl, inline := "-", "-"
	if len(flags) > 0 {
		fl = strings.Join(flags, ",")
	}
	if w.Flags&abi.SendInline != 0 {
		inline = hex.EncodeToString(abi.Inline(b, &w))
	}
	line := fmt.Sprintf("send %d %d %d %s %d %d %d %d %d %s %d", len(b), w.WRID, w.Opcode, fl, w.Imm, w.RemoteAddr, w.RKey,
		w.CompareAdd, w.Swap, inline, w.NumSGE)
	for _, s := range w.SGE[:w.NumSGE] {
		line += fmt.Sprintf(" %d %d %d", s.Addr, s.Length, s.LKey)
	}
	if got, want := h.ask(t, line), "slot "+hex.EncodeToString(b); got != want {
		t.Fatalf("C wrote another slot for %+v:\n got %s\nwant %s", w, got, want)
	}
}

func goldenRecv(t *testing.T, h *cHarness, b []byte) {
	var w abi.RecvWQE
	if st := abi.DecodeRecv(b, &w, abi.MaxSGE); st != abi.WCSuccess {
		t.Fatalf("abi.DecodeRecv: %s", st)
	}
	line := fmt.Sprintf("recv %d %d %d", len(b), w.WRID, w.NumSGE)
	for _, s := range w.SGE[:w.NumSGE] {
		line += fmt.Sprintf(" %d %d %d", s.Addr, s.Length, s.LKey)
	}
	if got, want := h.ask(t, line), "slot "+hex.EncodeToString(b); got != want {
		t.Fatalf("C wrote another slot for %+v:\n got %s\nwant %s", w, got, want)
	}
}

func goldenCQE(t *testing.T, h *cHarness, b []byte) {
	var c abi.CQE
	abi.DecodeCQE(b, &c)
	withImm := 0
	if c.Flags&abi.WCWithImm != 0 {
		withImm = 1
	}
	want := fmt.Sprintf("wc %d %d %d %d %d %d %d %d %d", c.WRID, c.QPNum, c.Opcode, c.Status, withImm, c.ByteLen, c.Imm,
		c.SrcQP, c.VendorErr)
	if got := h.ask(t, "cqe "+hex.EncodeToString(b)); got != want {
		t.Fatalf("C read another completion:\n got %s\nwant %s", got, want)
	}
}

// codeErrno is wire-local.md §3's errno for the error codes the vectors use
// (for ops other than attach and the ones the table names).
var codeErrno = map[string]syscall.Errno{abi.CodeInvalid: syscall.EINVAL}

func goldenReply(t *testing.T, h *cHarness, b []byte) {
	hdr, body, err := abi.ParseMessage(b)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("reply %d %d %d ", hdr.Op, hdr.Seq, hdr.Flags)
	switch {
	case hdr.Flags&abi.FlagError != 0:
		var e abi.Error
		if err := json.Unmarshal(body, &e); err != nil {
			t.Fatal(err)
		}
		errno, ok := codeErrno[e.Code]
		if !ok {
			t.Fatalf("code %s: add its errno (wire-local.md §3) to codeErrno", e.Code)
		}
		want += fmt.Sprintf("error %s %d", e.Code, errno)
	case hdr.Op == abi.OpHello:
		var r abi.HelloReply
		if err := json.Unmarshal(body, &r); err != nil {
			t.Fatal(err)
		}
		want += fmt.Sprintf("hello %d", r.Caps)
	case hdr.Op == abi.OpCreateQP:
		var r abi.CreateQPReply
		if err := json.Unmarshal(body, &r); err != nil {
			t.Fatal(err)
		}
		l, c := r.Layout, r.Caps
		want += fmt.Sprintf("qp %d %d %d %d %d %d %d %d %d %d %d %d", l.SQEntries, l.SQStride, l.RQEntries, l.RQStride,
			l.SQOffset, l.RQOffset, l.Size, c.MaxSendWR, c.MaxRecvWR, c.MaxSendSGE, c.MaxRecvSGE, c.MaxInlineData)
	default:
		t.Fatalf("a %s reply: teach this test and abi_golden.c what to check of it", hdr.Op)
	}
	if got := h.ask(t, "reply "+hex.EncodeToString(b)); got != want {
		t.Fatalf("C read another reply:\n got %s\nwant %s", got, want)
	}
}
