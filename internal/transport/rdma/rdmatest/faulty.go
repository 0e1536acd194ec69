// Package rdmatest is test support for the rdma path (package rdma): a
// fault injector between the engine and its socket. The datagrams the
// engine sends are dropped, duplicated, reordered or delayed by seeded
// fates (package testlink's), so that the RC rules meet lost, repeated
// and late packets on a real UDP socket.
package rdmatest

import (
	"net/netip"
	"sync"
	"time"

	"github.com/vrdma/vrdma/internal/testlink"
	"github.com/vrdma/vrdma/internal/transport/rdma"
)

// faulty is an rdma.Conn whose sends meet faults.
type faulty struct {
	rdma.Conn
	delayBy time.Duration
	st      *testlink.Stats

	mu     sync.Mutex
	fates  *testlink.Fates // +checklocks:mu
	held   []byte          // a datagram held back to follow the next one; +checklocks:mu
	heldTo netip.AddrPort  // +checklocks:mu
	heldM  rdma.Marks      // +checklocks:mu
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
