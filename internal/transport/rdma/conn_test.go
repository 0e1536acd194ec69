// SPDX-License-Identifier: Apache-2.0

package rdma

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/vrdma/vrdma/internal/rocewire"
)

// TestWriteToAllocs checks that sending a datagram or a batch, with or
// without a TOS byte, allocates nothing: it runs for every packet.
func TestWriteToAllocs(t *testing.T) {
	for _, addr := range []string{"127.0.33.12:4791", "[::1]:4794"} {
		c, err := ListenUDP(netip.MustParseAddrPort(addr))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		writeToAllocs(t, c)
	}
}

func writeToAllocs(t *testing.T, c Conn) {
	dst := c.LocalAddr()
	payload := make([]byte, 64)
	// As many pieces as a batch of packets has (header, payload pieces,
	// trail, for each): a few iovecs would fit a small stack allocation
	// where more would not.
	bufs := [][]byte{payload[:12], payload[12:20], payload[20:24], payload[24:36], payload[36:44], payload[44:48], payload[48:60], payload[60:]}
	for _, m := range []Marks{{}, {TOS: 26 << 2, Priority: 3}} {
		for _, dgrams := range [][]Datagram{{{End: 8}}, {{End: 8, Seg: 16}}, {{End: 2}, {End: 5, Seg: 12}, {End: 8, Seg: 16}}} {
			if n := testing.AllocsPerRun(200, func() {
				if err := c.WriteTo(bufs, dgrams, dst, m); err != nil {
					t.Fatal(err)
				}
			}); n != 0 {
				t.Errorf("WriteTo %v marked %+v, datagrams %v: %v allocations per call, want 0", dst, m, dgrams, n)
			}
		}
	}
}

// TestBatchGRO sends a batch of packets (UDP GSO) to the engine's own
// socket and checks what the kernel hands the reader (UDP GRO): the
// batch whole, with its segment size; each segment the packet sent, its
// ICRC the one of an IP header with ID k for the k-th (what the kernel
// writes when it cuts the batch: TestEngineWireGSO checks that on a
// veth), accepted by the reader's check at its place in the batch and as
// a lone datagram; a corrupt one refused.
func TestBatchGRO(t *testing.T) {
	for _, addr := range []string{"127.0.33.13:4791", "[::1]:4793"} {
		t.Run(addr, func(t *testing.T) { testBatchGRO(t, netip.MustParseAddrPort(addr)) })
	}
}

// loopBatch is an engine on a socket at addr, closed when t ends, and a
// batch to that socket itself.
func loopBatch(t *testing.T, addr netip.AddrPort) (Conn, *Engine, *batch) {
	c, err := ListenUDP(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	e := &Engine{conn: c, local: c.LocalAddr()}
	return c, e, newBatch(e, c.LocalAddr(), [6]byte{}, Marks{})
}

func testBatchGRO(t *testing.T, addr netip.AddrPort) {
	c, e, b := loopBatch(t, addr)
	const mtu, n = 1024, 9
	data := make([]byte, n*mtu)
	for i := range data {
		data[i] = byte(i * 7)
	}
	var sent [][]byte
	for i := range n {
		var h [rocewire.BTHLen]byte
		op := rocewire.RDMAWriteMiddle
		pay := data[i*mtu : (i+1)*mtu]
		if i == n-1 {
			op, pay = rocewire.RDMAWriteLast, pay[:mtu-3] // shorter, padded: closes the batch
		}
		rocewire.BTH(h[:]).Encode(&rocewire.BTHFields{Opcode: op, PKey: rocewire.DefaultPKey, DestQP: 17, PSN: uint32(i), PadCount: rocewire.PadCount(len(pay))})
		if err := b.add(h[:], [][]byte{pay}, len(pay)); err != nil {
			t.Fatal(err)
		}
		sent = append(sent, append(h[:], pay...))
	}
	if b.n != n {
		t.Fatalf("batch holds %d packets, want %d", b.n, n)
	}
	if err := b.flush(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, readBuffer)
	var r [1]Read
	if _, err := c.Read([][]byte{buf}, r[:]); err != nil {
		t.Fatal(err)
	}
	got, seg, src := r[0].N, r[0].Seg, r[0].Src
	want := rocewire.BTHLen + mtu + rocewire.ICRCLen
	if seg != want || src != c.LocalAddr() {
		t.Fatalf("read %d bytes in segments of %d from %v; want segments of %d from %v (is UDP GRO on?)", got, seg, src, want, c.LocalAddr())
	}
	var ids idDeltas
	k := 0
	for off := 0; off < got; off, k = off+seg, k+1 {
		p := buf[off:min(off+seg, got)]
		if !bytes.HasPrefix(p, sent[k]) {
			t.Fatalf("segment %d is not packet %d", k, k)
		}
		var h [maxIPUDP]byte
		ip, udp := ipUDP(h[:], src, e.local, len(p), uint16(k))
		if ok, err := rocewire.VerifyICRC(ip, udp, p); err != nil || !ok {
			t.Errorf("segment %d: ICRC is not the one of its IP header (IPv4: ID %d) (%v)", k, k, err)
		}
		if !ids.verify(src, e.local, p, uint16(k)) {
			t.Errorf("segment %d: the reader's check refuses it", k)
		}
		if !ids.verify(src, e.local, p, 0) {
			t.Errorf("segment %d: the reader's check refuses it as a lone datagram", k)
		}
		if k == 3 {
			bad := append([]byte(nil), p...)
			binary.LittleEndian.PutUint32(bad[len(bad)-4:], binary.LittleEndian.Uint32(bad[len(bad)-4:])^0x100)
			if ids.verify(src, e.local, bad, uint16(k)) {
				t.Errorf("a corrupt ICRC is accepted")
			}
		}
	}
	if k != n {
		t.Fatalf("%d segments, want %d", k, n)
	}
}

// TestBatchDatagrams sends more packets than one UDP GSO datagram
// carries with one flush and checks that they leave as several
// datagrams of one sendmmsg, read back with one recvmmsg: every packet
// once, in order, each segment's ICRC the one of an IP header with its
// index in its own datagram as the ID.
func TestBatchDatagrams(t *testing.T) {
	c, e, b := loopBatch(t, netip.MustParseAddrPort("127.0.33.14:4791"))
	const mtu, n = 1024, 150
	perDatagram := maxBatch / (rocewire.BTHLen + mtu + rocewire.ICRCLen)
	var sent [][]byte
	for i := range n {
		var h [rocewire.BTHLen]byte
		pay := bytes.Repeat([]byte{byte(i)}, mtu)
		rocewire.BTH(h[:]).Encode(&rocewire.BTHFields{Opcode: rocewire.RDMAWriteMiddle, PKey: rocewire.DefaultPKey, DestQP: 17, PSN: uint32(i)})
		if err := b.add(h[:], [][]byte{pay}, len(pay)); err != nil {
			t.Fatal(err)
		}
		sent = append(sent, append(h[:], pay...))
	}
	wantDgrams := (n + perDatagram - 1) / perDatagram
	if b.n != n || b.nd+1 != wantDgrams {
		t.Fatalf("batch holds %d packets in %d datagrams, want %d in %d", b.n, b.nd+1, n, wantDgrams)
	}
	if err := b.flush(); err != nil {
		t.Fatal(err)
	}
	if got := e.ctr.TxBatches.Load(); got != uint64(wantDgrams) {
		t.Errorf("%d datagrams of several packets counted, want %d", got, wantDgrams)
	}
	bufs := make([][]byte, maxReads)
	for k := range bufs {
		bufs[k] = make([]byte, readBuffer)
	}
	var reads [maxReads]Read
	var ids idDeltas
	pk, dgrams := 0, 0
	for pk < n {
		m, err := c.Read(bufs, reads[:])
		if err != nil {
			t.Fatal(err)
		}
		if dgrams == 0 && m != wantDgrams {
			t.Errorf("the first read took %d datagrams, want all %d (loopback delivers them before sendmmsg returns)", m, wantDgrams)
		}
		for d := range m {
			r := reads[d]
			dgrams++
			for off, k := 0, 0; off < r.N; off, k = off+r.Seg, k+1 {
				p := bufs[d][off:min(off+r.Seg, r.N)]
				if pk >= n || !bytes.HasPrefix(p, sent[pk]) {
					t.Fatalf("datagram %d, segment %d is not packet %d", dgrams, k, pk)
				}
				if !ids.verify(r.Src, e.local, p, uint16(k)) {
					t.Errorf("packet %d, segment %d of its datagram: ICRC refused", pk, k)
				}
				pk++
			}
		}
	}
	if dgrams != wantDgrams {
		t.Errorf("read %d datagrams, want %d", dgrams, wantDgrams)
	}
}
