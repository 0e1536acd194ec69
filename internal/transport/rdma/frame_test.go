// SPDX-License-Identifier: Apache-2.0

package rdma_test

import (
	"bytes"
	"errors"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/rocewire"
	"github.com/vrdma/vrdma/internal/testenv"
	"github.com/vrdma/vrdma/internal/transport/rdma"
)

// TestFrameConn sends RoCE v1 batches through the AF_PACKET socket on
// one end of a veth pair (in a namespace of the test's own) and reads
// them on the other: every frame arrives whole, its tag stripped by the
// kernel (the receiving socket sees none), its ICRC right; a frame to
// another MAC arrives too (the engine checks the MAC); a frame longer than the reader's buffer is reported so; sending
// allocates nothing; loopback is refused.
func TestFrameConn(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("AF_PACKET sockets need root (CI runs as root)")
	}
	if _, err := rdma.ListenFrames("lo"); err == nil {
		t.Error("ListenFrames(lo): RoCE v1 on loopback (no MAC) accepted")
	}
	ns := testenv.NewNetns(t)
	for _, args := range [][]string{{"link", "add", "va", "mtu", "9000", "type", "veth", "peer", "name", "vb", "mtu", "9000"}, {"link", "set", "va", "up"}, {"link", "set", "vb", "up"}} {
		if out, err := ns.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	var a, b rdma.FrameConn
	if err := ns.Run(func() (err error) {
		if a, err = rdma.ListenFrames("va"); err != nil {
			return err
		}
		b, err = rdma.ListenFrames("vb")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	defer b.Close()
	gidA, gidB := netip.MustParseAddr("::ffff:10.0.0.1"), netip.MustParseAddr("::ffff:10.0.0.2")
	m := rdma.Marks{TOS: 26 << 2, Priority: 3, VLAN: 0}
	batch := rdma.NewFrameBatch(a, gidA, b.Link().MAC, gidB, m)
	other := rdma.NewFrameBatch(a, gidA, [6]byte{0x02, 0, 0, 0, 0, 0x42}, gidB, m)

	payload := make([]byte, 4096)
	for i := range payload {
		payload[i] = byte(i * 13)
	}
	pieces := [][]byte{payload[:1000], payload[1000:4096]}
	send := func(bt *rdma.FrameBatch, k int) {
		var h [rocewire.BTHLen]byte
		op, n := rocewire.SendMiddle, 4096
		if k == 3 {
			op, n = rocewire.SendLast, 1001 // another size, with pad
		}
		rocewire.BTH(h[:]).Encode(&rocewire.BTHFields{Opcode: op, PKey: rocewire.DefaultPKey, PadCount: rocewire.PadCount(n), DestQP: 0x11, PSN: uint32(k)})
		p := pieces
		if n != 4096 {
			p = [][]byte{payload[:n]}
		}
		if err := bt.Add(h[:], p, n); err != nil {
			t.Fatal(err)
		}
	}
	for k := range 4 {
		send(batch, k)
	}
	if err := batch.Flush(); err != nil {
		t.Fatal(err)
	}
	send(other, 0)
	if err := other.Flush(); err != nil {
		t.Fatal(err)
	}

	bufs := make([][]byte, 8)
	for i := range bufs {
		bufs[i] = make([]byte, 9217)
	}
	lens := make([]int, 8)
	var got [][]byte
	deadline := time.Now().Add(5 * time.Second)
	for len(got) < 5 && time.Now().Before(deadline) {
		n, err := b.ReadFrames(bufs, lens)
		if err != nil {
			t.Fatal(err)
		}
		for k := range n {
			if lens[k] > len(bufs[k]) {
				t.Fatalf("frame %d: %d bytes, longer than the buffer", len(got), lens[k])
			}
			got = append(got, bytes.Clone(bufs[k][:lens[k]]))
		}
	}
	if len(got) != 5 {
		t.Fatalf("%d frames arrived, want 5", len(got))
	}
	var c rocewire.Checksummer
	for i, fr := range got {
		var f rocewire.Frame
		if err := rocewire.ParseFrame(fr, &f); err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if f.Tagged {
			t.Errorf("frame %d: the receiving socket sees the 802.1Q tag (the brief measured it stripped)", i)
		}
		if f.Src != a.Link().MAC || f.GRH.SGID() != gidA.As16() || f.GRH.DGID() != gidB.As16() || f.GRH.TClass() != 26<<2 || f.GRH.HopLimit() != 64 {
			t.Errorf("frame %d: source %s, GIDs %x %x, traffic class %d, hop limit %d", i, net.HardwareAddr(f.Src[:]), f.GRH.SGID(), f.GRH.DGID(), f.GRH.TClass(), f.GRH.HopLimit())
		}
		if !c.VerifyGRH(f.GRH, f.Transport) {
			t.Errorf("frame %d: bad ICRC", i)
		}
		var p rocewire.Packet
		if err := rocewire.Parse(f.Transport, 4096, &p); err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		want := payload
		if p.BTH.Opcode() == rocewire.SendLast {
			want = payload[:1001]
		}
		if !bytes.Equal(p.Payload, want) {
			t.Errorf("frame %d: payload differs", i)
		}
		if toB := f.Dst == b.Link().MAC; toB != (i < 4) {
			t.Errorf("frame %d to %s", i, net.HardwareAddr(f.Dst[:]))
		}
	}

	// A frame longer than the reader's buffer is told as such.
	send(batch, 0)
	if err := batch.Flush(); err != nil {
		t.Fatal(err)
	}
	small := [][]byte{make([]byte, 100)}
	if n, err := b.ReadFrames(small, lens[:1]); err != nil || n != 1 || lens[0] <= 100 {
		t.Errorf("a frame of 4 KiB read into 100 bytes: %d frames, length %d, %v; want a length beyond the buffer", n, lens[0], err)
	}

	// Closed while it polls (frames came a moment ago), the socket says
	// net.ErrClosed, as the engine's receive loop expects to stop: not
	// the file's own error, on which the loop would spin.
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.ReadFrames(bufs, lens); !errors.Is(err, net.ErrClosed) {
		t.Errorf("ReadFrames on a closed socket: %v, want net.ErrClosed", err)
	}

	// Sending allocates nothing.
	if n := testing.AllocsPerRun(50, func() {
		for k := range 4 {
			send(batch, k)
		}
		if err := batch.Flush(); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("%v allocations per batch of 4 frames", n)
	}
}
