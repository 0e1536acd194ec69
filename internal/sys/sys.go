// Package sys wraps the few Linux system calls vrdma needs: memfd-backed shared
// memory, mappings with overflow-safe bounds checks, eventfd doorbells, and
// SOCK_SEQPACKET Unix sockets that carry file descriptors (SCM_RIGHTS).
//
// It re-exports only what the rest of vrdma uses, so that every raw file
// descriptor in the project is created and closed here.
package sys

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// PageSize is the size of a memory page on this machine.
var PageSize = os.Getpagesize()

// Memfd creates an anonymous shared-memory file of size bytes. The caller
// owns the returned descriptor and must close it.
//
// The file's size is sealed (F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_SEAL): a
// process it is shared with cannot truncate it, which would turn every
// access to the pages beyond the new end into a SIGBUS that kills the
// process mapping them (the agent).
func Memfd(name string, size int64) (int, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, fmt.Errorf("memfd_create %q: %w", name, err)
	}
	if err := unix.Ftruncate(fd, size); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("size memfd %q to %d bytes: %w", name, size, err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("seal the size of memfd %q: %w", name, err)
	}
	return fd, nil
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
// wake-up is pending). Wait sleeps in poll(2) on the end and on a private
// eventfd that only Wake writes, so a side can always interrupt its own
// Wait, whatever the peer does. It is safe for concurrent use.
type Bell struct {
	mu     sync.RWMutex // guards the fds against Close while in use
	end    int          // this side's end of the socketpair
	peer   int          // the other end, until handed over (agent side), or -1
	wake   int          // private eventfd for Wake
	closed bool
}

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
	b.peer = fds[1]
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
	// Non-blocking, so that Wait can drain: this side's end is its own
	// file description, which the peer's end does not share.
	if err := unix.SetNonblock(end, true); err != nil {
		return nil, fmt.Errorf("doorbell: %w", err)
	}
	w, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	return &Bell{end: end, peer: -1, wake: w}, nil
}

// PeerFD returns the other end, for passing to the peer; it stays owned by
// b until Close.
func (b *Bell) PeerFD() int { return b.peer }

var one = []byte{1, 0, 0, 0, 0, 0, 0, 0}

// Ring wakes the peer's Wait. It never blocks.
func (b *Bell) Ring() error {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return os.ErrClosed
	}
	for {
		err := unix.Send(b.end, one[:1], unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
		switch err {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return nil // the peer has wake-ups pending already
		}
		return err
	}
}

// Wake wakes this side's own Wait.
func (b *Bell) Wake() {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if !b.closed {
		unix.Write(b.wake, one)
	}
}

// Wait blocks until the peer rings, Wake is called, or the peer's end is
// closed (then it returns io.EOF), and consumes the pending wake-ups.
func (b *Bell) Wait() error {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return os.ErrClosed
	}
	fds := [2]unix.PollFd{{Fd: int32(b.end), Events: unix.POLLIN}, {Fd: int32(b.wake), Events: unix.POLLIN}}
	for {
		_, err := unix.Poll(fds[:], -1)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("poll doorbell: %w", err)
		}
		break
	}
	var buf [64]byte
	if fds[1].Revents != 0 {
		unix.Read(b.wake, buf[:8])
	}
	if fds[0].Revents&(unix.POLLHUP|unix.POLLERR) != 0 && fds[0].Revents&unix.POLLIN == 0 {
		return io.EOF
	}
	for fds[0].Revents&unix.POLLIN != 0 {
		n, err := unix.Read(b.end, buf[:])
		if err != nil || n == 0 {
			break
		}
	}
	return nil
}

// Close closes this side's fds. A goroutine blocked in Wait must be woken
// (Wake) and have returned first; callers arrange that.
func (b *Bell) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	CloseFD(b.peer)
	unix.Close(b.wake)
	return unix.Close(b.end)
}

// CloseFD closes a raw descriptor, ignoring -1.
func CloseFD(fd int) {
	if fd >= 0 {
		unix.Close(fd)
	}
}
