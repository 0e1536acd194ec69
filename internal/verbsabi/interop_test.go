// SPDX-License-Identifier: Apache-2.0

package verbsabi

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/testenv"
)

// TestVerbsABIInterop connects a C program on the drop-in
// (guest/ibverbs/tests/interop.c, VM vmC) and a Go program on the Go
// library (this test, VM vmGo) out of band, as perftest does: each side's
// remote addresses are the other's own (the C side's virtual addresses, in
// an MR with an iova; the Go side's guest addresses). Go WRITEs into and
// SENDs to C; C WRITEs into Go and does a FETCH_ADD on a Go word.
func TestVerbsABIInterop(t *testing.T) {
	lib := Build(t)
	env := testenv.StartProcess(t, testenv.ProcessOptions{})
	env.Define(t, "vmGo", testenv.VMOptions{})
	env.Define(t, "vmC", testenv.VMOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	v := openVM(t, env.Socket, "vmGo")
	ad := v.Adapters()[0]
	pd, err := ad.AllocPD(ctx)
	if err != nil {
		t.Fatal(err)
	}
	buf, err := v.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	mr, err := pd.RegMR(ctx, buf, vrdma.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	cq, err := ad.CreateCQ(ctx, 16)
	if err != nil {
		t.Fatal(err)
	}
	qp, err := pd.CreateQP(ctx, vrdma.QPInitAttr{SendCQ: cq, RecvCQ: cq, Caps: vrdma.QPCaps{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}

	bin := filepath.Join(t.TempDir(), "interop")
	cc := exec.Command("gcc", "-Wall", "-Wextra", "-Werror", "-o", bin, filepath.Join(SourceDir(), "tests", "interop.c"),
		filepath.Join(lib, "libibverbs.so.1"))
	if out, err := cc.CombinedOutput(); err != nil {
		t.Fatalf("gcc interop.c: %v\n%s", err, out)
	}
	cmd := exec.CommandContext(ctx, bin)
	cmd.Env = Env(lib, env.Socket, "vmC")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	lines := bufio.NewScanner(stdout)
	var all strings.Builder
	next := func() string {
		if !lines.Scan() {
			t.Fatalf("the C side ended: %v\n%s%s", lines.Err(), all.String(), stderr.String())
		}
		all.WriteString(lines.Text() + "\n")
		return lines.Text()
	}

	var cQPN, cPSN, cRKey uint32
	var cGID string
	var cAddr uint64
	if _, err := fmt.Sscanf(next(), "C %d %d %s %d %d", &cQPN, &cPSN, &cGID, &cRKey, &cAddr); err != nil {
		t.Fatalf("the C side's endpoint: %v\n%s", err, all.String())
	}
	gid, err := vrdma.ParseGID(cGID)
	if err != nil {
		t.Fatal(err)
	}
	if err := qp.ConnectTo(ctx, vrdma.Endpoint{GID: gid, QPN: cQPN, PSN: cPSN}); err != nil {
		t.Fatal(err)
	}
	ep := qp.Endpoint()
	fmt.Fprintf(stdin, "G %d %d %s %d %d\n", ep.QPN, ep.PSN, ep.GID, mr.RKey(), mr.Addr())
	if l := next(); l != "ready" {
		// "ok connect", "ok post-recv" come first.
		for l != "ready" {
			if strings.HasPrefix(l, "FAIL") {
				t.Fatalf("C side: %s\n%s", l, all.String())
			}
			l = next()
		}
	}

	copy(buf, bytes.Repeat([]byte("G"), 64))
	copy(buf[200:], "from go")
	binary.LittleEndian.PutUint64(buf[512:], 41)
	if err := qp.PostSend([]vrdma.SendWR{
		{ID: 1, Opcode: vrdma.OpRDMAWrite, Flags: vrdma.SendSignaled, SGL: []vrdma.SGE{mr.SGE(0, 64)}, RemoteAddr: cAddr + 100, RKey: cRKey},
		{ID: 2, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: []vrdma.SGE{mr.SGE(200, 7)}},
	}); err != nil {
		t.Fatal(err)
	}
	wc := make([]vrdma.WorkCompletion, 4)
	for got := 0; got < 2; {
		if err := cq.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		n, err := cq.Poll(wc)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range wc[:n] {
			if w.Status != vrdma.WCSuccess {
				t.Fatalf("Go side completion %+v", w)
			}
		}
		got += n
	}
	for l := next(); l != "done"; l = next() {
	}
	cmd.Wait()
	t.Logf("C side:\n%s%s", all.String(), stderr.String())
	if strings.Contains(all.String(), "FAIL") {
		t.Errorf("C side failed:\n%s", all.String())
	}
	if !bytes.Equal(buf[1024:1088], bytes.Repeat([]byte("C"), 64)) || buf[1023] != 0 || buf[1088] != 0 {
		t.Errorf("the C side's WRITE did not land at the Go side's guest address + 1024: %q", buf[1020:1092])
	}
	if w := binary.LittleEndian.Uint64(buf[512:]); w != 42 {
		t.Errorf("the Go word after the C side's FETCH_ADD: %d, want 42", w)
	}
}
