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

// EventFD is an eventfd used as a doorbell between a workload and the agent.
// Wait blocks the calling OS thread in read(2), which wakes faster than the
// Go netpoller; Ring never blocks. It is safe for concurrent use.
type EventFD struct {
	mu     sync.RWMutex // guards fd against Close while in use
	fd     int
	closed bool
}

// NewEventFD creates a blocking eventfd with a zero counter.
func NewEventFD() (*EventFD, error) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	return &EventFD{fd: fd}, nil
}

// EventFDFrom adopts fd (received from a peer) as an EventFD. The fd is made
// blocking so that Wait sleeps in the kernel.
func EventFDFrom(fd int) (*EventFD, error) {
	if err := unix.SetNonblock(fd, false); err != nil {
		return nil, fmt.Errorf("eventfd %d: set blocking: %w", fd, err)
	}
	return &EventFD{fd: fd}, nil
}

// FD returns the descriptor, for passing to a peer. It stays owned by e.
func (e *EventFD) FD() int { return e.fd }

var one = []byte{1, 0, 0, 0, 0, 0, 0, 0}

// Ring adds one to the counter, waking a waiter.
func (e *EventFD) Ring() error {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.closed {
		return os.ErrClosed
	}
	for {
		_, err := unix.Write(e.fd, one)
		if err == unix.EINTR {
			continue
		}
		return err
	}
}

// Wait blocks until the counter is non-zero, then resets it.
func (e *EventFD) Wait() error {
	e.mu.RLock()
	fd, closed := e.fd, e.closed
	e.mu.RUnlock()
	if closed {
		return os.ErrClosed
	}
	var buf [8]byte
	for {
		_, err := unix.Read(fd, buf[:])
		if err == unix.EINTR {
			continue
		}
		return err
	}
}

// Close closes the eventfd. A goroutine blocked in Wait must be woken by
// Ring before Close; callers arrange that.
func (e *EventFD) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil
	}
	e.closed = true
	return unix.Close(e.fd)
}

// CloseFD closes a raw descriptor, ignoring -1.
func CloseFD(fd int) {
	if fd >= 0 {
		unix.Close(fd)
	}
}
