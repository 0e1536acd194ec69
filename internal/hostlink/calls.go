// SPDX-License-Identifier: Apache-2.0

package hostlink

// The two readers of a connection: on a connection this host opened,
// readResponses hands each response to the Call that waits for its tag;
// on one the peer opened, serveRequests hands each request to its
// handler.

import (
	"errors"
	"fmt"
	"time"

	"github.com/vrdma/vrdma/internal/tcpwire"
)

// Responder handles the RC requests of one connection a peer host
// opened: the tcp path's responder (Config.Responder makes one per
// connection). Its methods are called by the connection's reader
// (serveRequests) only, one at a time: a Responder is that goroutine's
// scratch, and it reads the connection's read side. It lives as long as
// the connection.
type Responder interface {
	// Request executes RC request h and answers it. The request's
	// payload, h.PayloadLen bytes, follows on the connection: Request
	// reads or discards all of it before it returns. An error closes the
	// connection.
	Request(h *tcpwire.Header) error
	// Idle is called when no whole frame header is buffered, before the
	// reader waits for the next frame: answers held back go out.
	Idle() error
}

// Call is one request waiting for its response. Its owner (a QP's
// requester, a dialer) makes it once and reuses it for every request:
// Register gives it a tag, the connection's reader fills in the response
// and signals Done. Between Register and that signal the reader owns
// Resp, Err and the memory of ReadSegs; after it, the owner.
type Call struct {
	tag uint64
	// Done is signalled once per registered call (buffered 1).
	Done chan struct{}
	// Resp is the response's header; Err, if set, why none came (the
	// connection closed: ErrConnLost).
	Resp tcpwire.Header
	Err  error
	// ReadSegs receive a READ response's data (set by the owner before
	// Register; what they cannot hold closes the connection); Ctl is a
	// control response's payload.
	ReadSegs [][]byte
	Ctl      []byte
	// wake, if set, is poked after Done is signalled (the QP's wakeCh).
	wake chan struct{}
}

// NewCall makes a call; wake, if not nil, is poked (without blocking)
// after each signal.
func NewCall(wake chan struct{}) *Call { return &Call{Done: make(chan struct{}, 1), wake: wake} }

// Tag is the call's tag on the connection it was last registered with,
// for its request's header.
func (k *Call) Tag() uint64 { return k.tag }

// signal hands the call's outcome to its owner.
func (k *Call) signal() {
	k.Done <- struct{}{}
	if k.wake != nil {
		select {
		case k.wake <- struct{}{}:
		default:
		}
	}
}

// Register assigns k a tag and records it as waiting; false if the
// connection is dead.
func (c *Conn) Register(k *Call) bool {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	if c.dead {
		return false
	}
	c.nextTag++
	k.tag, k.Err = c.nextTag, nil
	c.pending[k.tag] = k
	return true
}

// Withdraw removes k from the waiting calls; false if the reader already
// took it (it signals Done).
func (c *Conn) Withdraw(k *Call) bool {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	if c.pending[k.tag] == k {
		delete(c.pending, k.tag)
		return true
	}
	return false
}

// Waiting reports whether k still waits for its response on c: false
// once the reader took it (its response is arriving, or has arrived) or
// it was withdrawn.
func (c *Conn) Waiting(k *Call) bool {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	return c.pending[k.tag] == k
}

// Recall takes call k back from c. If the connection already took it (a
// response arrived, or the connection closed and failed it), it waits
// for that signal and consumes it, so that no stale signal is left to
// complete the call's next use: it lets a reader that is storing a
// READ's data finish, and cuts a stalled connection.
func (c *Conn) Recall(k *Call) {
	if c.Withdraw(k) {
		return
	}
	select {
	case <-k.Done:
	case <-time.After(writeStall):
		c.Close(fmt.Errorf("response from host %s stalled", c.l.peerID))
		<-k.Done
	}
}

// readResponses is the reader of a connection this host opened. A panic
// closes the connection (guard), and fails the call whose response was
// being read, which the connection's close cannot find any more.
func (c *Conn) readResponses() {
	defer c.guard("response reader")
	var k *Call // the call whose response is being read: taken from pending, not signalled
	defer func() {
		if k != nil {
			k.Err = ErrConnLost
			k.signal()
		}
	}()
	var h tcpwire.Header
	for {
		if err := c.readHeader(&h); err != nil {
			c.Close(err)
			return
		}
		if h.Type != tcpwire.Ack && h.Type != tcpwire.ReadResp && h.Type != tcpwire.CMResp {
			c.Close(fmt.Errorf("host %s sent a %s frame on a connection that carries responses only", c.l.peerID, h.Type))
			return
		}
		c.pmu.Lock()
		k = c.pending[h.Tag]
		delete(c.pending, h.Tag)
		c.pmu.Unlock()
		if k == nil { // a response for a request that gave up
			if err := c.Discard(uint64(h.PayloadLen)); err != nil {
				c.Close(err)
				return
			}
			continue
		}
		k.Resp = h
		if testHookFrame != nil {
			testHookFrame(c, &h)
		}
		var err error
		switch h.Type {
		case tcpwire.ReadResp:
			err = c.readInto(k.ReadSegs, uint64(h.PayloadLen))
		case tcpwire.CMResp:
			k.Ctl = make([]byte, h.PayloadLen)
			err = c.ReadFull(k.Ctl)
		}
		if err != nil {
			c.Close(err)
			return // the deferred call fails k
		}
		k.signal()
		k = nil
	}
}

// readInto reads n bytes of payload across segs; what segs cannot hold is
// a protocol error (the responder sent more than was asked).
func (c *Conn) readInto(segs [][]byte, n uint64) error {
	for _, s := range segs {
		if n == 0 {
			break
		}
		k := min(uint64(len(s)), n)
		if err := c.ReadFull(s[:k]); err != nil {
			return err
		}
		n -= k
	}
	if n > 0 {
		return fmt.Errorf("host %s sent %d bytes more than the READ asked for", c.l.peerID, n)
	}
	return nil
}

// serveRequests is the reader of a connection the peer opened: RC
// requests go to the connection's Responder, CM frames to connection
// management (cm.go). A panic in a handler closes the connection
// (guard).
func (c *Conn) serveRequests() {
	defer c.guard("request reader")
	c.rq = c.l.u.cfg.Responder(c)
	var h tcpwire.Header
	for {
		var err error
		if !c.Buffered() {
			err = c.rq.Idle() // before waiting for more
		}
		if err == nil {
			err = c.readHeader(&h)
		}
		if err == nil && testHookFrame != nil {
			testHookFrame(c, &h)
		}
		if err == nil {
			switch {
			case h.Type.IsRequest():
				err = c.rq.Request(&h)
			case h.Type.IsDatagram():
				err = c.datagram(&h) // ud.go
			case h.Type == tcpwire.CMReq:
				err = c.startCM(&h)
			case h.Type == tcpwire.CMCancel:
				err = c.cancelCM(&h)
			case h.Type == tcpwire.CMWho:
				err = c.answerWho(&h)
			case h.Type == tcpwire.CMDisc, h.Type == tcpwire.CMRTU:
				err = c.noteCM(&h)
			default:
				err = fmt.Errorf("%s frame on a connection that carries requests", h.Type)
			}
		}
		if err != nil {
			var fe *tcpwire.Error
			if errors.As(err, &fe) {
				c.l.u.log.Warn("tcp path: bad frame from a peer; connection closed", "peer", c.l.peerID, "err", err)
			}
			c.Close(err)
			return
		}
	}
}
