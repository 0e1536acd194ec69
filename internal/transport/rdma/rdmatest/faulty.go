// SPDX-License-Identifier: Apache-2.0

// Package rdmatest is test support for the rdma path (package rdma): a
// fault injector between the engine and its socket. The datagrams the
// engine sends are dropped, duplicated, reordered or delayed by seeded
// fates (package testlink's), so that the RC rules meet lost, repeated
// and late packets on a real UDP socket; and a trap that drops exactly
// the packets a test names (Trapped).
package rdmatest

import (
	"net/netip"
	"sync"
	"time"

	"github.com/vrdma/vrdma/internal/rocewire"
	"github.com/vrdma/vrdma/internal/testlink"
	"github.com/vrdma/vrdma/internal/transport/rdma"
)

// faulty is an rdma.Conn whose sends meet faults.
type faulty struct {
	rdma.Conn
	delayBy time.Duration
	st      *testlink.Stats

	mu    sync.Mutex
	fates *testlink.Fates // +checklocks:mu
	// a datagram held back to follow the next one
	held   []byte         // +checklocks:mu
	heldTo netip.AddrPort // +checklocks:mu
	heldM  rdma.Marks     // +checklocks:mu
}

// Faulty returns c with faults f on what is sent through it, counted in
// st (if not nil).
func Faulty(c rdma.Conn, f testlink.Faults, st *testlink.Stats) rdma.Conn {
	return &faulty{Conn: c, delayBy: f.DelayBy, st: st, fates: testlink.NewFates(f, f.Seed)}
}

// WriteTo sends each datagram to dst as the next fate says: not at all,
// twice, after the next datagram, later, or now; a datagram of segments
// (Seg > 0) segment by segment, as the kernel would cut it.
func (f *faulty) WriteTo(bufs [][]byte, dgrams []rdma.Datagram, dst netip.AddrPort, m rdma.Marks) error {
	var err error
	start := 0
	for _, d := range dgrams {
		if e := f.writeDatagram(bufs[start:d.End], d.Seg, dst, m); err == nil {
			err = e
		}
		start = d.End
	}
	return err
}

// writeDatagram sends one datagram, or its segments of seg bytes.
func (f *faulty) writeDatagram(bufs [][]byte, seg int, dst netip.AddrPort, m rdma.Marks) error {
	if seg == 0 {
		return f.writeOne(bufs, dst, m)
	}
	all := flatten(bufs)
	var err error
	for len(all) > 0 {
		d := all[:min(seg, len(all))]
		all = all[len(d):]
		if e := f.writeOne([][]byte{d}, dst, m); err == nil {
			err = e
		}
	}
	return err
}

// writeOne sends one datagram as the next fate says.
func (f *faulty) writeOne(bufs [][]byte, dst netip.AddrPort, m rdma.Marks) error {
	f.mu.Lock()
	fate := f.fates.Next()
	if f.st != nil {
		f.st.Note(fate)
	}
	held, heldTo, heldM := f.held, f.heldTo, f.heldM
	f.held = nil
	switch fate {
	case testlink.Drop:
		f.mu.Unlock()
		return nil
	case testlink.Reorder:
		f.held, f.heldTo, f.heldM = flatten(bufs), dst, m
		f.mu.Unlock()
		if held != nil {
			return f.Conn.WriteTo([][]byte{held}, one, heldTo, heldM)
		}
		return nil
	case testlink.Delay:
		b := flatten(bufs)
		time.AfterFunc(f.delayBy, func() { f.Conn.WriteTo([][]byte{b}, one, dst, m) })
		f.mu.Unlock()
		return nil
	}
	f.mu.Unlock()
	err := f.Conn.WriteTo(bufs, []rdma.Datagram{{End: len(bufs)}}, dst, m)
	if fate == testlink.Dup {
		f.Conn.WriteTo(bufs, []rdma.Datagram{{End: len(bufs)}}, dst, m)
	}
	if held != nil {
		f.Conn.WriteTo([][]byte{held}, one, heldTo, heldM)
	}
	return err
}

// one is a WriteTo's datagrams when it sends one piece.
var one = []rdma.Datagram{{End: 1}}

// flatten copies a datagram's pieces into one buffer.
func flatten(bufs [][]byte) []byte {
	n := 0
	for _, b := range bufs {
		n += len(b)
	}
	out := make([]byte, 0, n)
	for _, b := range bufs {
		out = append(out, b...)
	}
	return out
}

// Trap drops packets a test names: once armed, the next n packets of one
// opcode to one QP that a Conn made by Trapped sends, a loss placed
// exactly where Faulty's are drawn at random (the first ATOMIC_ACKNOWLEDGE
// of a QP, every one). Safe for concurrent use; the zero Trap is unarmed.
type Trap struct {
	mu  sync.Mutex
	op  rocewire.Opcode // +checklocks:mu
	qpn uint32          // +checklocks:mu
	// packets still to drop
	left int // +checklocks:mu
	// since the last Arm
	dropped int // +checklocks:mu
}

// Arm makes the trap drop the next n packets of opcode op whose BTH names
// destination QP qpn, and forgets what it dropped before.
func (t *Trap) Arm(op rocewire.Opcode, qpn uint32, n int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.op, t.qpn, t.left, t.dropped = op, qpn&rocewire.QPNMask, n, 0
}

// Dropped returns how many packets the trap dropped since it was armed.
func (t *Trap) Dropped() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.dropped
}

// armed reports whether the trap may still drop a packet.
func (t *Trap) armed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.left > 0
}

// take reports whether the trap drops packet p (a BTH first), counting it.
func (t *Trap) take(p []byte) bool {
	if len(p) < rocewire.BTHLen {
		return false
	}
	b := rocewire.BTH(p)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.left == 0 || b.Opcode() != t.op || b.DestQP() != t.qpn {
		return false
	}
	t.left--
	t.dropped++
	return true
}

// trapped is an rdma.Conn whose sends pass a Trap.
type trapped struct {
	rdma.Conn
	t *Trap
}

// Trapped returns c with trap t on what is sent through it.
func Trapped(c rdma.Conn, t *Trap) rdma.Conn { return &trapped{Conn: c, t: t} }

// WriteTo sends the datagrams as they are while the trap is not armed;
// armed, it cuts them into their packets, one datagram each, and sends
// all but those the trap takes (Faulty's way of cutting: the receiver
// finds the IPv4 IDs the segments would have had).
func (c *trapped) WriteTo(bufs [][]byte, dgrams []rdma.Datagram, dst netip.AddrPort, m rdma.Marks) error {
	if !c.t.armed() {
		return c.Conn.WriteTo(bufs, dgrams, dst, m)
	}
	var pkts [][]byte
	start := 0
	for _, d := range dgrams {
		all := flatten(bufs[start:d.End])
		start = d.End
		seg := d.Seg
		if seg == 0 {
			seg = len(all)
		}
		for len(all) > 0 {
			p := all[:min(seg, len(all))]
			all = all[len(p):]
			if !c.t.take(p) {
				pkts = append(pkts, p)
			}
		}
	}
	var err error
	for len(pkts) > 0 { // rdma.MaxDatagrams a send at most
		n := min(len(pkts), rdma.MaxDatagrams)
		ds := make([]rdma.Datagram, n)
		for i := range ds {
			ds[i] = rdma.Datagram{End: i + 1}
		}
		if e := c.Conn.WriteTo(pkts[:n], ds, dst, m); err == nil {
			err = e
		}
		pkts = pkts[n:]
	}
	return err
}
