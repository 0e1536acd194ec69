package rdma

// Packets leave in batches: a batch is the packets one goroutine sends to
// one peer back to back, gathered into one sendmsg with UDP GSO, which
// the kernel cuts into one datagram per packet. A batch's packets are all
// of its first packet's size but the last, which may be shorter (the
// kernel's rule), so a message's middle packets travel together, its
// first (with a RETH) and last (shorter, or with an ImmDt) mostly apart.
// Each packet's ICRC covers the IP header its segment will carry: on
// IPv4, ID k for the k-th (conn.go). The requester flushes its batch when it has
// sent what the window allows, the responder when the datagram that asked
// has been served; both before the guest memory the batch points into is
// released.

import (
	"encoding/binary"
	"net/netip"

	"github.com/vrdma/vrdma/internal/rocewire"
)

// maxHeader is the longest header a packet of the engine's has: a BTH and
// an AtomicETH.
const maxHeader = rocewire.BTHLen + rocewire.AtomicETHLen

// batch is packets on their way to one peer; owned by one goroutine.
type batch struct {
	e    *Engine
	peer netip.AddrPort
	m    Marks

	n      int  // packets
	size   int  // the first packet's size: the segment size
	bytes  int  // all packets'
	closed bool // the last packet is shorter than size: no more may join
	iov    [][]byte
	hdr    [maxSegments][maxHeader]byte
	trail  [maxSegments][8]byte // pad (up to 3 bytes) and ICRC

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
	if b.n > 0 && (b.closed || size > b.size || b.n == maxSegments || b.bytes+size > maxBatch || len(b.iov)+len(payload)+2 > maxIOV) {
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
	ip, udp := ipUDP(b.ipu[:], b.e.local, b.peer, size, uint16(k))
	crc, cerr := b.sum.Sum(ip, udp, b.iov[start:])
	if cerr != nil {
		b.iov = b.iov[:start]
		return cerr
	}
	b.seal(trail, padN, crc)
	if k == 0 {
		b.size = size
	} else if size < b.size {
		b.closed = true
	}
	b.n++
	b.bytes += size
	return err
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
	seg := 0
	if b.n > 1 {
		seg = b.size
	}
	b.e.ctr.TxPackets.Add(uint64(b.n))
	b.e.ctr.TxBytes.Add(uint64(b.bytes))
	if b.n > 1 {
		b.e.ctr.TxBatches.Add(1)
	}
	var err error
	if b.f != nil {
		err = b.e.fc.WriteFrames(b.iov, b.f.ends[:b.n], b.m.Priority)
	} else {
		err = b.e.conn.WriteTo(b.iov, b.peer, b.m, seg)
	}
	clear(b.iov) // no reference to guest memory outlives the send
	b.iov, b.n, b.bytes, b.closed = b.iov[:0], 0, 0, false
	return err
}
