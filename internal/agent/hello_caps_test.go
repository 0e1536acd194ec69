// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/hostlink"
	"github.com/vrdma/vrdma/internal/sys"
)

// TestHelloCaps checks the capability bits of the hello exchange on a real
// socket: the reply carries the features a standalone agent serves (no tcp
// path without a control plane), whether the client sent its own bits, sent
// unknown ones, or is a client older than capability bits that sends no
// caps field at all.
func TestHelloCaps(t *testing.T) {
	a := newTestAgent(t, "capshost")
	served := make(chan error, 1)
	go func() { served <- a.Serve(context.Background()) }()
	t.Cleanup(func() {
		a.Close()
		<-served
	})

	const want = abi.CapAsyncMode | abi.CapFence | abi.CapPathMemcpy | abi.CapCM | abi.CapQPCounters | abi.CapVMManage | abi.CapMRIOVA | abi.CapAsyncEvents | abi.CapSRQ | abi.CapUD |
		abi.CapUC | abi.CapCoreVerbs | abi.CapQPEvents | abi.CapMW | abi.CapXRC | abi.CapMcast | abi.CapODP | abi.CapAtomicWrite | abi.CapCQOverrun | abi.CapOpenQP | abi.CapDirect | abi.CapDirectSend
	header := func(seq uint32, n int) []byte {
		h := make([]byte, abi.CmdHeaderSize)
		h[0], h[1], h[2] = 'V', 'R', abi.Version
		binary.LittleEndian.PutUint16(h[4:], uint16(abi.OpHello))
		binary.LittleEndian.PutUint32(h[8:], seq)
		binary.LittleEndian.PutUint32(h[12:], uint32(n))
		return h
	}
	for i, body := range []string{
		`{"client":"test","caps":127}`,
		`{"client":"future","caps":4503599627370495}`, // every bit of 0..51, most unknown
		`{"client":"old"}`,                            // a client older than capability bits
		`{}`,
	} {
		c, err := sys.DialPacket(a.Socket())
		if err != nil {
			t.Fatal(err)
		}
		seq := uint32(100 + i)
		if err := c.Send(append(header(seq, len(body)), body...)); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, abi.MaxMessage)
		n, fds, err := c.Recv(buf)
		c.Close()
		if err != nil || len(fds) != 0 {
			t.Fatalf("hello %s: reply %v, %d descriptors", body, err, len(fds))
		}
		h, rb, err := abi.ParseMessage(buf[:n])
		if err != nil || h.Flags != abi.FlagResponse || h.Op != abi.OpHello || h.Seq != seq {
			t.Fatalf("hello %s: reply header %+v, %v (body %s)", body, h, err, rb)
		}
		var r abi.HelloReply
		if err := json.Unmarshal(rb, &r); err != nil {
			t.Fatalf("hello %s: reply %s: %v", body, rb, err)
		}
		if r.Caps != want || r.Caps.Has(abi.CapPathTCP) {
			t.Errorf("hello %s: agent caps %s (%#x), want %s (%#x)", body, r.Caps, uint64(r.Caps), want, uint64(want))
		}
		if r.Caps&^abi.CapsKnown != 0 {
			t.Errorf("hello %s: agent sets bits this ABI does not define: %s", body, r.Caps)
		}
		if r.Host != "capshost" || r.AgentVersion != Version || r.HostID != a.HostID() {
			t.Errorf("hello %s: reply %+v", body, r)
		}
	}
}

// TestCapsAgentTCP checks that the tcp path's bit follows the uplink: an
// agent advertises it only when it runs the tcp path.
func TestCapsAgentTCP(t *testing.T) {
	a := &Agent{}
	if a.caps().Has(abi.CapPathTCP) {
		t.Fatalf("agent without an uplink advertises %s", a.caps())
	}
	a.up = &hostlink.Links{}
	if !a.caps().Has(abi.CapPathTCP) {
		t.Fatalf("agent with an uplink advertises %s", a.caps())
	}
	if !a.caps().Has(abi.CapsBaseline) {
		t.Fatalf("agent caps %s lack the baseline %s", a.caps(), abi.CapsBaseline)
	}
}

// newTestAgent creates an agent with fresh state in a temporary directory
// and no logs; the caller serves and closes it.
func newTestAgent(tb testing.TB, host string) *Agent {
	tb.Helper()
	dir, err := os.MkdirTemp("", "vrdma-"+host)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	a, err := New(Config{Socket: filepath.Join(dir, "s"), StateDir: filepath.Join(dir, "state"), Host: host,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		tb.Fatal(err)
	}
	return a
}
