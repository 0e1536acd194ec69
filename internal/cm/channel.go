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
	"sync"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/internal/abi"
)

// ChannelQueueLen is how many events may wait for a channel's writer;
// beyond, the channel is dead (its reader fell that far behind).
const ChannelQueueLen = 1024

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
	return &Channel{f: os.NewFile(uintptr(fds[0]), name), q: make(chan any, ChannelQueueLen), quit: make(chan struct{})}, fds[1], nil
}

// Start starts c's writer, which logs on log the write failure that ends
// it.
//
// The writer goroutine (one per channel) is owned by the channel: it
// drains the queue into the socket, one JSON message per event, until
// Close or a write fails (the workload closed its end), and then closes
// the agent's end. Whoever opened
// the channel stops it with Close; nobody waits for it.
func (c *Channel) Start(log *slog.Logger) {
	go func() {
		defer c.f.Close()
		for {
			select {
			case e := <-c.q:
				b, err := json.Marshal(e)
				if err == nil {
					_, err = c.f.Write(b)
				}
				if err != nil {
					log.Info("CM event channel: write failed, closing it", "channel", c.id, "err", err)
					c.Close()
					return
				}
			case <-c.quit:
				return
			}
		}
	}()
}

// Close stops c's writer, which closes the agent's end; events still
// queued are dropped. Safe to call more than once.
func (c *Channel) Close() { c.once.Do(func() { close(c.quit) }) }

// Post queues e (an abi.CMEvent, or an abi.AsyncEvent on an async-event
// socket) for the workload; false when c is closed or its reader fell
// ChannelQueueLen events behind (the event is lost). It never blocks.
func (c *Channel) Post(e any) bool {
	select {
	case <-c.quit:
		return false
	default:
	}
	select {
	case c.q <- e:
		return true
	default:
		return false
	}
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
