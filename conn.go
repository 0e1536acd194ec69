// SPDX-License-Identifier: Apache-2.0

package vrdma

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/sys"
)

// ErrAgentGone is returned by every call once the host agent's connection
// is lost: the agent (vrdmad) exited or was killed. Objects of the VM are
// unusable; open the VM again once an agent runs.
var ErrAgentGone = errors.New("vrdma: the host agent (vrdmad) connection is gone: the agent exited or was killed; reopen the VM once it runs again")

// Error is an error of a class (see ErrInvalid and the others): one the
// agent returned for a command, or one of the library's own checks. It
// carries a stable Code, the Field at fault if any, and a message that
// says what to change; errors.Is(err, ErrLimit) tests its class, and
// errors.As(err, &e) with e an *Error reads its fields.
type Error = abi.Error

type reply struct {
	h    abi.Header
	body []byte
	fds  []int
}

// conn is the session with the agent. Calls may run concurrently; a
// reader goroutine (owned by conn, ended by Close or the agent's death)
// routes replies by sequence number.
type conn struct {
	pc *sys.PacketConn

	mu      sync.Mutex
	seq     uint32                // +checklocks:mu
	pending map[uint32]chan reply // +checklocks:mu
	onDead  []func()              // +checklocks:mu
	sendBuf []byte                // +checklocks:mu

	dead atomic.Bool
	done chan struct{}
}

// closeWait bounds how long close waits for the agent to end its side.
const closeWait = 10 * time.Second

func dial(path string) (*conn, error) {
	pc, err := sys.DialPacket(path)
	if err != nil {
		return nil, fmt.Errorf("vrdma: connect to the host agent at %s: %w (is vrdmad running? set VRDMA_SOCKET or WithSocket to its socket)", path, err)
	}
	c := &conn{pc: pc, pending: map[uint32]chan reply{}, done: make(chan struct{})}
	go c.readLoop()
	return c, nil
}

func (c *conn) readLoop() {
	defer close(c.done)
	buf := make([]byte, abi.MaxMessage)
	for {
		n, fds, err := c.pc.Recv(buf)
		if err != nil {
			break
		}
		h, body, err := abi.ParseMessage(buf[:n])
		if err != nil || h.Flags&abi.FlagResponse == 0 {
			for _, fd := range fds {
				sys.CloseFD(fd)
			}
			continue
		}
		c.mu.Lock()
		ch := c.pending[h.Seq]
		delete(c.pending, h.Seq)
		c.mu.Unlock()
		if ch == nil {
			for _, fd := range fds {
				sys.CloseFD(fd)
			}
			continue
		}
		ch <- reply{h: h, body: append([]byte(nil), body...), fds: fds}
	}
	c.dead.Store(true)
	c.pc.Close()
	c.mu.Lock()
	for seq, ch := range c.pending {
		close(ch)
		delete(c.pending, seq)
	}
	hooks := c.onDead
	c.onDead = nil
	c.mu.Unlock()
	for _, f := range hooks {
		f()
	}
}

// whenDead registers f to run once the agent connection is lost (at once
// if it already is).
func (c *conn) whenDead(f func()) {
	c.mu.Lock()
	if !c.dead.Load() {
		c.onDead = append(c.onDead, f)
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	f()
}

// start sends a request and returns the channel its reply arrives on
// (closed if the agent goes away).
func (c *conn) start(op abi.Op, req any, fds ...int) (uint32, chan reply, error) {
	if c.dead.Load() {
		return 0, nil, ErrAgentGone
	}
	ch := make(chan reply, 1)
	c.mu.Lock()
	c.seq++
	seq := c.seq
	var err error
	c.sendBuf, err = abi.AppendMessage(c.sendBuf[:0], abi.Header{Version: abi.Version, Op: op, Seq: seq}, req)
	if err != nil {
		c.mu.Unlock()
		return 0, nil, err
	}
	c.pending[seq] = ch
	err = c.pc.Send(c.sendBuf, fds...)
	if err != nil {
		delete(c.pending, seq)
	}
	c.mu.Unlock()
	if err != nil {
		// EPIPE or ECONNRESET: the agent's end is closed — it died — and
		// the reader has not seen it yet (it will, and mark the
		// connection dead).
		if c.dead.Load() || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) {
			return 0, nil, ErrAgentGone
		}
		return 0, nil, fmt.Errorf("vrdma: send %s to the agent: %w", op, err)
	}
	return seq, ch, nil
}

func (c *conn) cancel(seq uint32) {
	c.mu.Lock()
	delete(c.pending, seq)
	c.mu.Unlock()
}

// decode turns a reply into resp (and its descriptors), or an error.
func decode(op abi.Op, r reply, ok bool, resp any) ([]int, error) {
	if !ok {
		return nil, ErrAgentGone
	}
	if r.h.Flags&abi.FlagError != 0 {
		closeFDs(r.fds)
		e := new(Error)
		if err := json.Unmarshal(r.body, e); err != nil {
			return nil, fmt.Errorf("vrdma: %s: undecodable error from the agent: %w", op, err)
		}
		return nil, e
	}
	if resp != nil {
		if err := json.Unmarshal(r.body, resp); err != nil {
			closeFDs(r.fds)
			return nil, fmt.Errorf("vrdma: %s: undecodable reply from the agent: %w", op, err)
		}
	}
	return r.fds, nil
}

// call runs one command. If ctx ends first the call returns ctx.Err(); the
// agent may still carry the command out.
func (c *conn) call(ctx context.Context, op abi.Op, req, resp any, fds ...int) ([]int, error) {
	seq, ch, err := c.start(op, req, fds...)
	if err != nil {
		return nil, err
	}
	select {
	case r, ok := <-ch:
		return decode(op, r, ok, resp)
	case <-ctx.Done():
		c.cancel(seq)
		// A reply may have raced in; its descriptors must not leak.
		select {
		case r, ok := <-ch:
			if ok {
				closeFDs(r.fds)
			}
		default:
		}
		return nil, ctx.Err()
	}
}

// close ends the session and waits until the agent has ended its side:
// the agent closes the connection only after it has detached the
// session's VM, so that a command sent right after Close (a define, an
// attach from another process) finds the VM detached. Once the agent is
// gone there is nothing left to close, and that is no error.
func (c *conn) close() error {
	if c.pc.CloseWrite() == nil {
		select {
		case <-c.done:
		case <-time.After(closeWait):
		}
	}
	err := c.pc.Close()
	<-c.done
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		sys.CloseFD(fd)
	}
}
