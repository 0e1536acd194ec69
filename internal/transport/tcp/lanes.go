// SPDX-License-Identifier: Apache-2.0

package tcp

// Striped requests at the responder (docs/wire-tcp.md, "Lanes"). A striped
// request's first stripe comes on the main connection with its frame;
// stripe i (1..) comes on lane i. Each lane has a reader goroutine of its
// own, made at the connection's first striped request, which reads a lane
// only when the main connection's reader tells it to: while it executes
// that request, in the order of the requests. The lanes' stripes then land
// in parallel with the first, each reader under the target's memory one
// step at a time as the main reader's (landing.go), on its own copy of the
// request's resolved target; the main reader answers the request once
// every stripe landed. A request that does not land (a duplicate, a NAK,
// its target gone) has its stripes read and dropped, so that every lane
// stays in step with the main connection.

import (
	"errors"
	"fmt"

	"github.com/vrdma/vrdma/internal/device"
	"github.com/vrdma/vrdma/internal/hostlink"
	"github.com/vrdma/vrdma/internal/tcpwire"
)

// laneReader reads one lane of a connection for its responder.
type laneReader struct {
	lander // the lane's
	i      int
	main   *hostlink.Conn
	// The job, set by the main reader before it sends on start: the
	// striped request, and the target its stripe lands in (p nil: read
	// and drop it). done gets the outcome.
	req    *tcpwire.Header
	p      device.Target
	m      device.Message
	start  chan struct{}
	done   chan error
	landed bool
	hdr    tcpwire.Header
}

// checkLanes checks that striped request h fits the connection's lanes:
// as many as the handshake agreed on, each there.
func (rp *responder) checkLanes(h *tcpwire.Header) error {
	n := h.StripeCount()
	if n > rp.c.Lanes() {
		return fmt.Errorf("host %s striped a %s over %d connections; the handshake agreed on %d", rp.c.PeerID(), h.Type, n, rp.c.Lanes())
	}
	for i := 1; i < n; i++ {
		if rp.c.Lane(i) == nil {
			return fmt.Errorf("host %s striped a %s over lane %d, which it did not open", rp.c.PeerID(), h.Type, i)
		}
		if rp.lanes[i] == nil {
			rp.lanes[i] = newLaneReader(rp.c, i)
		}
	}
	return nil
}

// newLaneReader makes the reader of lane i of main connection c and
// starts its goroutine, which ends when c closes.
func newLaneReader(c *hostlink.Conn, i int) *laneReader {
	r := &laneReader{lander: lander{c: c.Lane(i)}, i: i, main: c, start: make(chan struct{}), done: make(chan error, 1)}
	r.readFn = r.tryRead
	go r.run()
	return r
}

// run serves the main reader's jobs until the connection closes.
func (r *laneReader) run() {
	for {
		select {
		case <-r.start:
			err := r.serve()
			if err != nil {
				r.main.Close(err) // the main reader may wait for its own payload meanwhile
			}
			r.done <- err
		case <-r.main.Closed():
			return
		}
	}
}

// serve reads the lane's next stripe, which must be stripe i of r.req,
// into r.m at r.p, or drops it. A panic is the connection's error: the
// main reader closes it.
func (r *laneReader) serve() (err error) {
	defer func() {
		if x := recover(); x != nil {
			if r.held != nil {
				r.release(r.held)
			}
			r.clearStep()
			err = fmt.Errorf("internal error: the reader of lane %d panicked: %v", r.i, x)
		}
	}()
	r.landed = false
	h := &r.hdr
	if err := r.c.ReadStripe(h); err != nil {
		return fmt.Errorf("lane %d: %w", r.i, err)
	}
	if err := tcpwire.CheckStripe(r.req, h, r.i); err != nil {
		return err
	}
	remaining := uint64(h.PayloadLen)
	if r.p != nil {
		r.landed, err = r.land(r.p, &r.m, h.RemoteAddr, &remaining)
		if err != nil {
			return fmt.Errorf("lane %d: %w", r.i, err)
		}
	}
	if remaining > 0 {
		return r.c.Discard(remaining)
	}
	return nil
}

// startStripes starts the lanes' readers on sp's stripes, landing them
// in message m at p; waitStripes waits for them.
func (rp *responder) startStripes(p device.Target, m *device.Message, sp *sockPayload) {
	for i := 1; i <= sp.stripes; i++ {
		r := rp.lanes[i]
		r.req, r.p, r.m = sp.req, p, *m
		r.start <- struct{}{}
	}
}

// waitStripes waits for the lanes' readers startStripes started: landed
// when every stripe landed; err when a lane broke.
func (rp *responder) waitStripes() (landed bool, err error) {
	landed = true
	sp := &rp.sp
	for i := 1; i <= sp.stripes; i++ {
		r := rp.lanes[i]
		err = errors.Join(err, <-r.done)
		landed = landed && r.landed
		r.req, r.p, r.m = nil, nil, device.Message{} // no reference to guest memory stays
	}
	sp.stripes = 0
	return landed, err
}

// dropStripes reads and drops the stripes of a request that did not
// land.
func (rp *responder) dropStripes(sp *sockPayload) error {
	var none device.Message
	rp.startStripes(nil, &none, sp)
	_, err := rp.waitStripes()
	return err
}
