// SPDX-License-Identifier: Apache-2.0

// Package sys wraps the few Linux system calls vrdma needs: memfd-backed shared
// memory, mappings with overflow-safe bounds checks, eventfd doorbells, and
// SOCK_SEQPACKET Unix sockets that carry file descriptors (SCM_RIGHTS),
// and code run inside a named network namespace.
//
// It re-exports only what the rest of vrdma uses, so that every raw file
// descriptor in the project is created and closed here.
package sys

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// PageSize is the size of a memory page on this machine.
var PageSize = os.Getpagesize()

// FD is a file descriptor together with the duty to close it: whoever
// holds an FD owns its descriptor, and Close is the one way to give it up
// (it is idempotent). The zero FD holds no descriptor. An object keeps the
// descriptors it lives with as FDs; a descriptor only passed through
// (received and sent on, or dropped) stays a plain int, closed with
// CloseFD.
type FD struct{ n int32 } // the descriptor + 1, so that the zero FD holds none

// Own takes ownership of descriptor fd (the zero FD for a negative one).
func Own(fd int) FD {
	if fd < 0 {
		return FD{}
	}
	return FD{n: int32(fd) + 1}
}

// Int returns the descriptor's number, -1 for none. The FD keeps owning it.
func (f FD) Int() int { return int(f.n) - 1 }

// Valid reports whether f holds a descriptor.
func (f FD) Valid() bool { return f.n != 0 }

// Close closes the descriptor, once; the FD then holds none.
func (f *FD) Close() error {
	if f.n == 0 {
		return nil
	}
	fd := f.Int()
	f.n = 0
	return unix.Close(fd)
}

// Memfd creates an anonymous shared-memory file of size bytes, owned by
// the caller.
//
// The file's size is sealed (F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_SEAL): a
// process it is shared with cannot truncate it, which would turn every
// access to the pages beyond the new end into a SIGBUS that kills the
// process mapping them (the agent).
func Memfd(name string, size int64) (FD, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return FD{}, fmt.Errorf("memfd_create %q: %w", name, err)
	}
	f := Own(fd)
	if err := unix.Ftruncate(fd, size); err != nil {
		f.Close()
		return FD{}, fmt.Errorf("size memfd %q to %d bytes: %w", name, size, err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		f.Close()
		return FD{}, fmt.Errorf("seal the size of memfd %q: %w", name, err)
	}
	return f, nil
}

// FileSize returns the size of the file behind fd.
func FileSize(fd int) (int64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, fmt.Errorf("fstat fd %d: %w", fd, err)
	}
	return st.Size, nil
}

// Mapping is a shared, read-write memory mapping of a file. It is safe for
// concurrent use; Unmap must not race with users of Bytes.
type Mapping struct {
	b      []byte
	locked bool
}

// Map maps size bytes of fd, shared and read-write. With populate the pages
// are faulted in at once (MAP_POPULATE), so the first copies do not pay for
// page faults.
func Map(fd int, size int, populate bool) (*Mapping, error) {
	if size <= 0 {
		return nil, fmt.Errorf("map fd %d: size %d must be positive", fd, size)
	}
	flags := unix.MAP_SHARED
	if populate {
		flags |= unix.MAP_POPULATE
	}
	b, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, flags)
	if err != nil {
		return nil, fmt.Errorf("mmap %d bytes of fd %d: %w", size, fd, err)
	}
	return &Mapping{b: b}, nil
}

// ErrMemlock is wrapped by Lock when the memory-lock limit refuses the lock.
var ErrMemlock = errors.New("RLIMIT_MEMLOCK too small")

// Lock locks the mapping in memory (mlock). When the limit refuses it, the
// error wraps ErrMemlock and states the limit.
func (m *Mapping) Lock() error {
	if err := unix.Mlock(m.b); err != nil {
		if errors.Is(err, unix.ENOMEM) || errors.Is(err, unix.EPERM) || errors.Is(err, unix.EAGAIN) {
			var lim unix.Rlimit
			_ = unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim)
			return fmt.Errorf("%w: locking %d bytes failed (%v); RLIMIT_MEMLOCK is %d bytes (raise it with ulimit -l or LimitMEMLOCK=, or run as root)",
				ErrMemlock, len(m.b), err, lim.Cur)
		}
		return fmt.Errorf("mlock %d bytes: %w", len(m.b), err)
	}
	m.locked = true
	return nil
}

// Locked reports whether Lock succeeded.
func (m *Mapping) Locked() bool { return m.locked }

// Bytes returns the mapped memory. It must not be used after Unmap.
func (m *Mapping) Bytes() []byte { return m.b }

// Len returns the mapping's size in bytes.
func (m *Mapping) Len() int { return len(m.b) }

// Unmap releases the mapping. It is idempotent.
func (m *Mapping) Unmap() error {
	if m == nil || m.b == nil {
		return nil
	}
	b := m.b
	m.b = nil
	return unix.Munmap(b)
}

// InBounds reports whether [off, off+n) lies inside a region of size bytes,
// without overflowing.
func InBounds(off, n, size uint64) bool {
	return off <= size && n <= size-off
}

// Bell carries wake-ups across the trust boundary between the agent and
// a workload, over one end of a SOCK_SEQPACKET socketpair: each side holds
// its own end, so neither can change the other's file status flags, steal
// the other's wake-ups, or make the other block. Ring sends one byte with
// MSG_DONTWAIT and never blocks (a full socket buffer already means a
// wake-up is pending). Wake interrupts this side's own Waits, whatever the
// peer does. It is safe for concurrent use.
//
// Wait has two phases. A waiter that gets one of the process's few hot
// slots (maxHotWaiters) first sleeps in poll(2) for up to hotWait, on the
// end and on a private eventfd that Wake writes: the fastest wake-up there
// is, for a QP in a ping-pong. Then, or without a slot, it parks the
// goroutine on the runtime's network poller, which holds no OS thread: an
// agent with a thousand idle or busy QPs runs on a handful of threads.
type Bell struct {
	mu     sync.RWMutex // guards the fds against Close while in use
	f      *os.File     // this side's end, registered with the network poller
	end    int          // f's descriptor (f owns it), for Ring, poll(2) and drain
	peer   FD           // the other end (agent side), to hand over
	wake   FD           // private eventfd: Wake's signal to a waiter in poll(2)
	closed bool

	// Wake interrupts the Waits in progress: those in poll(2) through the
	// eventfd, those on the poller with a read deadline in the past, which
	// the last of them to leave clears.
	wmu sync.Mutex
	// Wakes so far
	gen uint64 // +checklocks:wmu
	// Waits in progress
	waiters int // +checklocks:wmu
	// ... of which in poll(2)
	hot int // +checklocks:wmu
	// ... of which Wake interrupted
	woken int // +checklocks:wmu
	// a Wake that no Wait has seen yet
	pending bool // +checklocks:wmu
	// Close ran: the fds are gone
	shut bool // +checklocks:wmu
}

// A waiter sleeps in poll(2), holding its OS thread, for at most hotWait,
// and at most maxHotWaiters of them at once in the process; the others
// wait on the network poller. Measured on the memcpy path's 8-byte write
// ping-pong (docs/PERF-LOG.md): on the poller alone, a typical round
// trip took 25 µs instead of 3–5 µs.
const (
	hotWait       = time.Millisecond
	maxHotWaiters = 8
)

// hotSlots counts the waiters in poll(2) in this process.
var hotSlots atomic.Int32

// NewBellPair creates a socketpair and returns this side's Bell; PeerFD is
// the other end, to pass to the peer.
func NewBellPair() (*Bell, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socketpair for a doorbell: %w", err)
	}
	b, err := newBell(fds[0])
	if err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return nil, err
	}
	b.peer = Own(fds[1])
	return b, nil
}

// BellFrom adopts fd, an end received from the peer, as a Bell.
func BellFrom(fd int) (*Bell, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return nil, fmt.Errorf("doorbell fd %d is not a socket", fd)
	}
	return newBell(fd)
}

func newBell(end int) (*Bell, error) {
	// Non-blocking, so that the runtime polls it and Wait can drain: this
	// side's end is its own file description, which the peer's end does
	// not share.
	if err := unix.SetNonblock(end, true); err != nil {
		return nil, fmt.Errorf("doorbell: %w", err)
	}
	w, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	return &Bell{f: os.NewFile(uintptr(end), "doorbell"), end: end, wake: Own(w)}, nil
}

// PeerFD returns the other end, for passing to the peer; it stays owned by
// b until Close.
func (b *Bell) PeerFD() int { return b.peer.Int() }

var one = []byte{1}

// Ring wakes the peer's Wait. It never blocks.
func (b *Bell) Ring() error {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return os.ErrClosed
	}
	for {
		err := unix.Send(b.end, one, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
		switch err {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return nil // the peer has wake-ups pending already
		}
		return err
	}
}

// Wake makes every Wait in progress return, or, when there is none, the
// next Wait return at once.
func (b *Bell) Wake() {
	b.wmu.Lock()
	defer b.wmu.Unlock()
	b.gen++
	if b.waiters == 0 {
		b.pending = true
		return
	}
	if b.shut {
		return
	}
	b.woken = b.waiters
	b.f.SetReadDeadline(past)
	if b.hot > 0 {
		unix.Write(b.wake.Int(), eventOne[:])
	}
}

var eventOne = [8]byte{1}

// past is a read deadline that has passed: it makes a parked read return.
var past = time.Unix(1, 0)

// Wait blocks until the peer rings, Wake is called, or the peer's end is
// closed (then it returns io.EOF), and consumes the pending wake-ups.
func (b *Bell) Wait() error {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return os.ErrClosed
	}
	var buf [64]byte
	b.wmu.Lock()
	if b.pending {
		b.pending = false
		b.wmu.Unlock()
		b.drain(&buf)
		return nil
	}
	g := b.gen
	b.waiters++
	hot := hotSlots.Add(1) <= maxHotWaiters
	if hot {
		b.hot++
	} else {
		hotSlots.Add(-1)
	}
	b.wmu.Unlock()
	if hot {
		fds := [2]unix.PollFd{{Fd: int32(b.end), Events: unix.POLLIN}, {Fd: int32(b.wake.Int()), Events: unix.POLLIN}}
		_, err := unix.Poll(fds[:], int(hotWait/time.Millisecond))
		b.wmu.Lock()
		b.hot--
		b.wmu.Unlock()
		hotSlots.Add(-1)
		if err != nil && err != unix.EINTR {
			b.leave(g, true)
			return fmt.Errorf("poll doorbell: %w", err)
		}
		if fds[1].Revents != 0 {
			unix.Read(b.wake.Int(), buf[:8])
		}
		switch {
		case fds[0].Revents&unix.POLLIN != 0:
			b.leave(g, true)
			return b.drain(&buf)
		case fds[0].Revents&(unix.POLLHUP|unix.POLLERR) != 0:
			b.leave(g, true)
			return io.EOF
		case b.leave(g, false):
			return nil // Wake
		}
		// hotWait passed: go on waiting without the thread.
	}
	for {
		n, err := b.f.Read(buf[:]) // parks on the poller until readable
		if errors.Is(err, os.ErrDeadlineExceeded) {
			if b.leave(g, false) {
				return nil
			}
			// The deadline of a Wake that came before this Wait: the
			// Waits it is for have yet to leave and clear it.
			runtime.Gosched()
			continue
		}
		b.leave(g, true)
		switch {
		case n > 0:
			b.drain(&buf)
			return nil
		case err == io.EOF:
			return io.EOF
		case err != nil:
			return fmt.Errorf("wait on doorbell: %w", err)
		}
	}
}

// leave ends a Wait that began at generation g, if a Wake came since or
// always is set, and reports whether it did.
func (b *Bell) leave(g uint64, always bool) bool {
	b.wmu.Lock()
	defer b.wmu.Unlock()
	if b.gen == g && !always {
		return false
	}
	b.waiters--
	if b.gen != g {
		b.woken--
		if b.woken == 0 {
			b.f.SetReadDeadline(time.Time{})
		}
	}
	return true
}

// drain consumes pending wake-ups without waiting. It reports io.EOF when
// the peer's end is closed and no wake-up was pending.
func (b *Bell) drain(buf *[64]byte) error {
	rang := false
	for {
		n, err := unix.Read(b.end, buf[:])
		switch {
		case err == unix.EINTR:
			continue
		case err == nil && n == 0 && !rang:
			return io.EOF
		case err != nil || n == 0:
			return nil
		}
		rang = true
	}
}

// Close closes this side's ends. A goroutine blocked in Wait must be woken
// (Wake) and have returned first; callers arrange that.
func (b *Bell) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	b.wmu.Lock()
	b.shut = true
	b.wmu.Unlock()
	b.peer.Close()
	b.wake.Close()
	return b.f.Close()
}

// CloseFD closes a descriptor that is only passed through (see FD),
// ignoring -1.
func CloseFD(fd int) {
	if fd >= 0 {
		unix.Close(fd)
	}
}

// SetNonblock puts descriptor fd in non-blocking mode, so that an
// *os.File made from it afterwards is polled by the runtime and its read
// deadlines work (a socket end received from the agent).
func SetNonblock(fd int) error { return unix.SetNonblock(fd, true) }

// MapAt maps size bytes of fd from offset off (a multiple of the page
// size), shared and read-write; with populate the pages are faulted in at
// once, as Map's.
func MapAt(fd int, off int64, size int, populate bool) (*Mapping, error) {
	if size <= 0 || off < 0 || off%int64(PageSize) != 0 {
		return nil, fmt.Errorf("map fd %d: offset %d and size %d must be page-aligned and positive", fd, off, size)
	}
	flags := unix.MAP_SHARED
	if populate {
		flags |= unix.MAP_POPULATE
	}
	b, err := unix.Mmap(fd, off, size, unix.PROT_READ|unix.PROT_WRITE, flags)
	if err != nil {
		return nil, fmt.Errorf("mmap %d bytes of fd %d at %d: %w", size, fd, off, err)
	}
	return &Mapping{b: b}, nil
}

// UnixConn makes a connection of the Unix socket descriptor fd, which it
// takes: fd is closed on return, whatever the outcome (the connection
// holds a duplicate). name names the socket in errors.
func UnixConn(fd int, name string) (*net.UnixConn, error) {
	f := os.NewFile(uintptr(fd), name)
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		c.Close()
		return nil, fmt.Errorf("%s: not a Unix socket (%T)", name, c)
	}
	return uc, nil
}
