// SPDX-License-Identifier: Apache-2.0

package tcp

// Moving a request's bytes between the connection and guest memory at the
// responder, holding the target's memory one step at a time (execute's
// comment says why). A step is a copy out of the read buffer, or one
// non-blocking system call between the socket and guest memory run from
// the runtime's poller callback (syscall.RawConn): when the socket is not
// ready the callback lets go of the memory and the poller waits holding
// nothing. Each step takes the memory anew (Hold) and resolves the
// message's target again (Revalidate) before it touches it.

import (
	"errors"
	"fmt"
	"io"
	"syscall"
	"unsafe"

	"github.com/vrdma/vrdma/internal/device"
	"github.com/vrdma/vrdma/internal/hostlink"
	"github.com/vrdma/vrdma/internal/tcpwire"
	"golang.org/x/sys/unix"
)

// maxStep bounds the bytes one system call moves under a target's
// memory: what a deregistration or destroy may have to wait for.
const maxStep = 1 << 20

// step is the state of one system call between the socket and a
// message's target, for the poller's callbacks (tryRead, tryWrite); owned
// by the connection's reader (serveRequests), or a lane's reader
// (lanes.go). The callbacks are bound once per connection, so that a step
// allocates nothing.
type step struct {
	p    device.Target
	m    *device.Message
	off  uint64 // the offset in the message
	n    uint64 // at most this many bytes of it
	fd   int
	hdr  []byte // what is left of the response header to write first (tryWrite)
	iov  [2]unix.Iovec
	done uint64 // bytes of the message moved
	gone bool   // the target went: nothing moved
	err  error
}

// Fill makes s a device.Filler: one non-blocking read into dst.
func (s *step) Fill(dst []byte) (int, error) {
	for {
		n, err := unix.Read(s.fd, dst)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return 0, err
		case n == 0:
			return 0, io.ErrUnexpectedEOF
		}
		return n, nil
	}
}

// lander moves payload bytes from one connection into guest memory: the
// responder's (its main connection), or a lane reader's (lanes.go). held
// is the target whose memory it holds (hold), nil between steps; a
// panic while it is held lets go of it on its way out (responder.unwind),
// so that the VM's teardown does not wait forever for a handler that is
// gone.
type lander struct {
	c *hostlink.Conn
	// step is a system call between the socket and a target's memory;
	// readFn and writeFn are its callbacks, bound once.
	step    step
	readFn  func(uintptr) bool
	writeFn func(uintptr) bool
	held    device.Target
}

// hold is p.Hold(), noting p as held.
func (l *lander) hold(p device.Target) bool {
	if !p.Hold() {
		return false
	}
	l.held = p
	return true
}

// release is p.Release(), noting that nothing is held.
func (l *lander) release(p device.Target) {
	l.held = nil
	p.Release()
}

// landPayload reads the request's payload into message m at p: the
// payload on the connection, sp.remaining bytes, and a striped request's
// stripes on the lanes, read meanwhile by the lanes' readers (lanes.go).
// When the target goes meanwhile (its region deregistered, its receive
// flushed, the QP destroyed, the VM gone) it stops, and landed is false:
// Request reads the rest and drops it. err is the connection's: it broke.
func (rp *responder) landPayload(p device.Target, m *device.Message, sp *sockPayload) (landed bool, err error) {
	if sp.stripes == 0 {
		return rp.land(p, m, 0, &sp.remaining)
	}
	rp.startStripes(p, m, sp)
	landed, err = rp.land(p, m, 0, &sp.remaining)
	if err != nil {
		rp.c.Close(err) // and its lanes: their readers stop at once
	}
	lanesLanded, lerr := rp.waitStripes()
	return landed && lanesLanded, errors.Join(err, lerr)
}

// land reads *remaining bytes of payload from the connection into
// message m at p, from offset off on (see landPayload).
func (l *lander) land(p device.Target, m *device.Message, off uint64, remaining *uint64) (landed bool, err error) {
	c := l.c
	for *remaining > 0 {
		if c.BufferedLen() == 0 && c.Raw() && *remaining >= hostlink.DirectRead {
			n, ok, err := l.readDirect(p, m, off, min(*remaining, maxStep))
			if err != nil || !ok {
				return false, err
			}
			off += n
			*remaining -= n
			continue
		}
		b, err := c.Unread()
		if err != nil {
			return false, err
		}
		k := min(uint64(len(b)), *remaining)
		if !l.hold(p) {
			return false, nil
		}
		ok := p.Revalidate(m) && p.Write(m, off, b[:k])
		l.release(p)
		if !ok {
			return false, nil
		}
		c.Consume(int(k))
		off += k
		*remaining -= k
	}
	return true, nil
}

// readDirect reads at most n bytes of the payload from the socket
// straight into m's bytes at off: one read, under p's memory. ok false:
// the target went.
func (l *lander) readDirect(p device.Target, m *device.Message, off, n uint64) (got uint64, ok bool, err error) {
	s := &l.step
	*s = step{p: p, m: m, off: off, n: n}
	err = l.c.ReadRaw(int(n), l.readFn)
	got, ok = s.done, !s.gone
	if err == nil {
		err = s.err
	}
	l.clearStep()
	l.c.Received(got)
	if err != nil {
		if errors.Is(err, unix.ECONNRESET) || errors.Is(err, io.ErrUnexpectedEOF) {
			err = fmt.Errorf("read a request's payload: %w", err)
		}
		return got, ok, err
	}
	return got, ok, nil
}

// tryRead is readDirect's step, called by the poller with the socket's
// descriptor: false asks it to wait until the socket is readable.
func (l *lander) tryRead(fd uintptr) bool {
	s := &l.step
	if !l.hold(s.p) {
		s.gone = true
		return true
	}
	if !s.p.Revalidate(s.m) {
		l.release(s.p)
		s.gone = true
		return true
	}
	s.fd = int(fd)
	n, ok, err := s.p.Fill(s.m, s.off, s.n, s)
	l.release(s.p)
	switch {
	case !ok:
		s.gone = true
	case err == unix.EAGAIN:
		return false
	default:
		s.done, s.err = uint64(n), err
	}
	return true
}

// sendRead writes a READ's response: the header (sp.resp, OK) and total
// bytes of m's target, straight from guest memory, one non-blocking write
// at a time under p's memory. If the target goes before the first byte
// of it left, nothing is written and sp.responded stays false (execute
// answers REM_ACCESS_ERR); once the response has begun it cannot be
// taken back, and the connection is closed instead: the requester
// retries the READ, which then fails.
func (rp *responder) sendRead(p device.Target, m *device.Message, total uint64, sp *sockPayload) error {
	if err := rp.flushAcks(); err != nil { // responses go out in order
		return err
	}
	resp := sp.resp
	resp.Status, resp.PayloadLen, resp.Version = tcpwire.OK, uint32(total), rp.c.Version()
	c := rp.c
	if !c.Raw() {
		return fmt.Errorf("READ response on a connection without a descriptor") // every connection has one (TCP, or the test link's Unix socket)
	}
	n := uint64(tcpwire.HeaderLen) + total
	c.StartWrite(n)
	rp.writing = true
	err := rp.writeRead(p, m, total, sp)
	if err != nil || !sp.responded {
		n = 0
	}
	rp.writing = false
	c.EndWrite(n, min(int(n), 1))
	return err
}

// writeRead is sendRead's frame, written while it holds the connection's
// write side.
//
// +checklocksignore: the caller holds rp.c's write side (StartWrite), which WriteRaw needs
func (rp *responder) writeRead(p device.Target, m *device.Message, total uint64, sp *sockPayload) error {
	sp.resp.Put(rp.whdr[:])
	s := &rp.step
	defer rp.clearStep()
	*s = step{p: p, m: m, hdr: rp.whdr[:]}
	for len(s.hdr) > 0 || s.off < total {
		s.n = min(total-s.off, maxStep)
		if err := rp.c.WriteRaw(rp.writeFn); err != nil || s.err != nil {
			err = errors.Join(err, s.err)
			err = fmt.Errorf("write READ response: %w", err)
			rp.c.Close(err)
			return err
		}
		if s.gone {
			if len(s.hdr) == tcpwire.HeaderLen {
				return nil // nothing sent: execute answers with an error
			}
			err := fmt.Errorf("the target of a READ response in progress (QP 0x%x) was deregistered: connection closed, the requester retries", p.QPN())
			rp.c.Close(err)
			return err
		}
		sp.responded = true
	}
	return nil
}

// clearStep forgets the last step: no reference to guest memory stays.
func (l *lander) clearStep() { l.step = step{} }

// tryWrite is sendRead's step: one non-blocking writev of what is left
// of the header and of the target's next bytes, under p's memory.
func (rp *responder) tryWrite(fd uintptr) bool {
	s := &rp.step
	if !rp.hold(s.p) {
		s.gone = true
		return true
	}
	var data []byte
	if s.n > 0 {
		if !s.p.Revalidate(s.m) {
			rp.release(s.p)
			s.gone = true
			return true
		}
		data = s.m.Place(s.off, s.n)
	}
	iov := s.iov[:0]
	if len(s.hdr) > 0 {
		iov = append(iov, unix.Iovec{Base: &s.hdr[0]})
		iov[len(iov)-1].SetLen(len(s.hdr))
	}
	if len(data) > 0 {
		iov = append(iov, unix.Iovec{Base: &data[0]})
		iov[len(iov)-1].SetLen(len(data))
	}
	var r uintptr
	var errno syscall.Errno
	for {
		r, _, errno = unix.Syscall(unix.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
		if errno != unix.EINTR {
			break
		}
	}
	rp.release(s.p)
	switch {
	case errno == unix.EAGAIN:
		return false
	case errno != 0:
		s.err = errno
		return true
	}
	w := uint64(r)
	h := min(w, uint64(len(s.hdr)))
	s.hdr = s.hdr[h:]
	s.off += w - h
	return true
}
