// SPDX-License-Identifier: Apache-2.0

package cm

// An event channel's socket: a SOCK_SEQPACKET socketpair whose far end the
// workload polls and reads, one JSON message per event, and the writer
// goroutine that feeds it. rdma_cm's event channels (events.go) are made
// of it, and so are the agent's ibv_get_async_event sockets
// (internal/agent/events.go).

import (
	"encoding/json"
	"log/slog"
	"os"
	"slices"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/internal/abi"
)

// ChannelQueueLen is how many events may wait for a channel's writer.
// Beyond, an event that can come without end (a CONNECT_REQUEST, which
// peers make) is lost and Post says so; one that settles the state of
// one of the workload's own objects (settles) waits in the channel's
// overflow instead.
const ChannelQueueLen = 1024

// maxOverflow bounds a channel's overflow. Its events are at most one per
// kind and object (settles: a later one replaces an earlier one of the
// same key), and the objects are the workload's, bounded by its limits;
// a channel whose overflow grows past this anyway is closed (the workload
// reads end of file) rather than losing an event silently.
const maxOverflow = 1 << 16

// Channel is the agent's end of one event socket. It is made by
// NewChannel, started once by Start, fed by Post from any goroutine, and
// ended by Close (its owner: the session that opened it) or by a failed
// write. It is safe for concurrent use.
type Channel struct {
	id   uint32 // the session's handle of it (0 for an async-event socket): for the log
	f    *os.File
	q    chan any
	quit chan struct{}
	once sync.Once

	mu sync.Mutex
	// overflow holds, in order, the settling events that found q full,
	// and every one posted after them until the writer takes them all:
	// nothing enters q while it holds any, so order is kept.
	overflow []any // +checklocks:mu
	// more is poked (buffered 1) when overflow grows.
	more chan struct{}
}

// eventKey names what an event settles: its kind and its object.
type eventKey struct {
	event int
	qp    uint32
	other uint64  // a CM event's cookie; an async event's port
	group abi.GID // a MULTICAST_JOIN's: an ID's joins of two groups are two events
}

// settles reports whether e settles the state of one of the workload's own
// objects — a QP's connection established, disconnected or out of
// TIMEWAIT, an operation it asked for answered, a QP fatal, a port's state
// — and is therefore never dropped, and its key: a later event of the
// same key replaces an earlier one still waiting. A CONNECT_REQUEST, which
// peers make without end, does not.
func settles(e any) (eventKey, bool) {
	switch e := e.(type) {
	case abi.CMEvent:
		k := eventKey{event: e.Event, qp: e.QP, other: e.Cookie}
		if e.Event == abi.CMEventMulticastJoin {
			k.group = e.RemoteGID
		}
		return k, e.Event != abi.CMEventConnectRequest
	case abi.AsyncEvent:
		if e.Event == abi.EventPortActive || e.Event == abi.EventPortErr {
			return eventKey{event: abi.EventPortErr, other: uint64(e.Port)}, true // the port's last state wins
		}
		return eventKey{event: e.Event, qp: e.QP}, true
	}
	return eventKey{}, false
}

// NewChannel makes an event socket named name (for the descriptor's
// name): the agent's end, its writer not started, and the workload's end,
// a descriptor the caller hands to the workload and then closes.
func NewChannel(name string) (*Channel, int, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, -1, abi.Errorf(abi.CodeLimit, "", "socketpair for an event channel: %v", err)
	}
	// Events are small; the default buffer holds hundreds. The workload
	// may not write on its end: the agent never reads it.
	unix.Shutdown(fds[0], unix.SHUT_RD)
	if err := unix.SetNonblock(fds[0], true); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return nil, -1, abi.Errorf(abi.CodeInternal, "", "event channel: %v", err)
	}
	return &Channel{f: os.NewFile(uintptr(fds[0]), name), q: make(chan any, ChannelQueueLen), quit: make(chan struct{}),
		more: make(chan struct{}, 1)}, fds[1], nil
}

// Start starts c's writer, which logs on log the write failure that ends
// it.
//
// The writer goroutine (one per channel) is owned by the channel: it
// drains the queue, then the overflow, into the socket, one JSON message
// per event, until Close or a write fails (the workload closed its end),
// and then closes the agent's end. Whoever opened the channel stops it
// with Close; nobody waits for it.
func (c *Channel) Start(log *slog.Logger) {
	go func() {
		defer c.f.Close()
		for {
			e, ok := c.next()
			if !ok {
				return
			}
			b, err := json.Marshal(e)
			if err == nil {
				_, err = c.f.Write(b)
			}
			if err != nil {
				log.Info("CM event channel: write failed, closing it", "channel", c.id, "err", err)
				c.Close()
				return
			}
		}
	}()
}

// next returns the next event to write, waiting for one: the queue's
// first, then the overflow's; false once c is closed.
func (c *Channel) next() (any, bool) {
	for {
		select {
		case <-c.quit:
			return nil, false
		case e := <-c.q:
			return e, true
		default:
		}
		c.mu.Lock()
		if len(c.overflow) > 0 {
			e := c.overflow[0]
			c.overflow[0] = nil
			c.overflow = c.overflow[1:]
			if len(c.overflow) == 0 {
				c.overflow = nil
			}
			c.mu.Unlock()
			return e, true
		}
		c.mu.Unlock()
		select {
		case <-c.quit:
			return nil, false
		case e := <-c.q:
			return e, true
		case <-c.more:
		}
	}
}

// Close stops c's writer, which closes the agent's end; events still
// queued are dropped. Safe to call more than once.
func (c *Channel) Close() { c.once.Do(func() { close(c.quit) }) }

// Post queues e (an abi.CMEvent, or an abi.AsyncEvent on an async-event
// socket) for the workload, and never blocks. It returns false when c is
// closed, or when e is an event that does not settle an object of the
// workload's (a CONNECT_REQUEST: settles) and its reader fell
// ChannelQueueLen events behind: e is lost. A settling event is never
// lost while c is open: when the queue is full it waits in the overflow,
// replacing one of its key still waiting there.
func (c *Channel) Post(e any) bool {
	select {
	case <-c.quit:
		return false
	default:
	}
	key, keep := settles(e)
	c.mu.Lock()
	if len(c.overflow) == 0 {
		select {
		case c.q <- e:
			c.mu.Unlock()
			return true
		default:
		}
	}
	if !keep {
		c.mu.Unlock()
		return false
	}
	c.overflow = slices.DeleteFunc(c.overflow, func(o any) bool { k, _ := settles(o); return k == key })
	c.overflow = append(c.overflow, e)
	full := len(c.overflow) > maxOverflow
	c.mu.Unlock()
	if full {
		c.Close() // the workload reads end of file: it knows it missed events
		return false
	}
	select {
	case c.more <- struct{}{}:
	default:
	}
	return true
}

// PeerClosed reports whether c's writer stopped or the workload closed
// its end of the socket (POLLHUP: for an async-event socket, a context
// closed).
func (c *Channel) PeerClosed() bool {
	select {
	case <-c.quit:
		return true
	default:
	}
	rc, err := c.f.SyscallConn()
	if err != nil {
		return true
	}
	hup := false
	rc.Control(func(fd uintptr) {
		p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
		if n, err := unix.Poll(p, 0); err == nil && n == 1 && p[0].Revents&(unix.POLLHUP|unix.POLLERR) != 0 {
			hup = true
		}
	})
	return hup
}
