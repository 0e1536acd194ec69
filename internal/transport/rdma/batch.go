// SPDX-License-Identifier: Apache-2.0

package rdma

// Packets leave in batches: a batch is the packets one goroutine sends to
// one peer back to back, gathered into datagrams of UDP GSO, which the
// kernel cuts into one datagram per packet, and all of its datagrams go
// with one sendmmsg (a system call costs more than a microsecond on a
// virtual machine: docs/PERF-LOG.md). A datagram's packets are all of
// its first packet's size but the last, which may be shorter (the
// kernel's rule), so a message's middle packets travel together, its
// first (with a RETH) and last (shorter, or with an ImmDt) mostly apart.
// Each packet's ICRC covers the IP header its segment will carry: on
// IPv4, ID k for the k-th of its datagram (conn.go). The requester
// flushes its batch when it has sent what the window allows, the
// responder when the datagram that asked has been served; both before
// the guest memory the batch points into is released.

import (
	"encoding/binary"
	"net/netip"

	"github.com/vrdma/vrdma/internal/rocewire"
)

// maxHeader is the longest header a packet of the engine's has: a BTH, an
// XRCETH and an AtomicETH.
const maxHeader = rocewire.BTHLen + rocewire.XRCETHLen + rocewire.AtomicETHLen

// A batch holds at most maxPackets packets in at most MaxDatagrams
// datagrams (and maxIOV pieces): a MiB of 4 KiB packets.
const maxPackets = 256

// MaxDatagrams is the most datagrams one Conn.WriteTo sends: a batch's.
const MaxDatagrams = 16

// batch is packets on their way to one peer; owned by one goroutine.
type batch struct {
	e    *Engine
	peer netip.AddrPort
	m    Marks

	n      int // packets
	bytes  int // all packets'
	iov    [][]byte
	hdr    [maxPackets][maxHeader]byte
	trail  [maxPackets][8]byte // pad (up to 3 bytes) and ICRC
	dgrams [MaxDatagrams]Datagram
	nd     int // datagrams before the open one

	// The open datagram: its packets, bytes and first packet's size (the
	// segment size); closed when its last packet is shorter than that: no
	// more may join.
	dn, dbytes, size int
	closed           bool

	sum rocewire.Checksummer
	ipu [maxIPUDP]byte // the headers a packet's ICRC covers

	f *frames // RoCE v1's frame headers (frame.go); nil for v2
}

// newBatch makes a batch to peer (RoCE v1: its GID and mac).
func newBatch(e *Engine, peer netip.AddrPort, mac [6]byte, m Marks) *batch {
	b := &batch{e: e, peer: peer, m: m, iov: make([][]byte, 0, maxIOV)}
	if e.fc != nil {
		b.f = newFrames(e, mac, peer.Addr(), m)
	}
	return b
}

// add appends a packet: header h (copied) and then payload, n bytes in
// pieces that stay valid until the batch is flushed (guest memory). It
// sends the batch first if the packet cannot join it.
func (b *batch) add(h []byte, payload [][]byte, n int) error {
	if b.f != nil {
		return b.addFrame(h, payload, n)
	}
	var err error
	padN := int(rocewire.PadCount(n))
	size := len(h) + n + padN + rocewire.ICRCLen
	if b.dn > 0 && (b.closed || size > b.size || b.dn == maxSegments || b.dbytes+size > maxBatch) {
		b.endDatagram()
	}
	if b.n == maxPackets || len(b.iov)+len(payload)+2 > maxIOV || b.dn == 0 && b.nd == MaxDatagrams {
		err = b.flush()
	}
	k := b.n
	hdr := b.hdr[k][:copy(b.hdr[k][:], h)]
	trail := b.trail[k][:padN+rocewire.ICRCLen]
	clear(trail[:padN])
	start := len(b.iov)
	b.iov = append(b.iov, hdr)
	b.iov = append(b.iov, payload...)
	b.iov = append(b.iov, trail[:padN])
	ip, udp := ipUDP(b.ipu[:], b.e.local, b.peer, size, uint16(b.dn))
	crc, cerr := b.sum.Sum(ip, udp, b.iov[start:])
	if cerr != nil {
		b.iov = b.iov[:start]
		return cerr
	}
	b.seal(trail, padN, crc)
	if b.dn == 0 {
		b.size = size
	} else if size < b.size {
		b.closed = true
	}
	b.n++
	b.dn++
	b.bytes += size
	b.dbytes += size
	return err
}

// endDatagram closes the open datagram.
func (b *batch) endDatagram() {
	seg := 0
	if b.dn > 1 {
		seg = b.size
		b.e.ctr.TxBatches.Add(1)
	}
	b.dgrams[b.nd] = Datagram{End: len(b.iov), Seg: seg}
	b.nd++
	b.dn, b.dbytes, b.size, b.closed = 0, 0, 0, false
}

// seal writes crc after the pad in trail, and makes trail, pad and ICRC,
// the last piece of the packet add is appending (which ended with the pad
// alone, the piece the ICRC covers).
func (b *batch) seal(trail []byte, padN int, crc uint32) {
	binary.LittleEndian.PutUint32(trail[padN:], crc)
	b.iov[len(b.iov)-1] = trail
}

// flush sends the batch.
func (b *batch) flush() error {
	if b.n == 0 {
		return nil
	}
	b.e.ctr.TxPackets.Add(uint64(b.n))
	b.e.ctr.TxBytes.Add(uint64(b.bytes))
	var err error
	if b.f != nil {
		if b.n > 1 {
			b.e.ctr.TxBatches.Add(1)
		}
		err = b.e.fc.WriteFrames(b.iov, b.f.ends[:b.n], b.m.Priority)
	} else {
		if b.dn > 0 {
			b.endDatagram()
		}
		err = b.e.conn.WriteTo(b.iov, b.dgrams[:b.nd], b.peer, b.m)
	}
	clear(b.iov) // no reference to guest memory outlives the send
	b.iov, b.n, b.bytes, b.nd = b.iov[:0], 0, 0, 0
	return err
}
