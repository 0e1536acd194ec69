// SPDX-License-Identifier: Apache-2.0

package tcp

// Striped requests at the responder (docs/wire-tcp.md, "Lanes"). A striped
// request's first stripe comes on the main connection with its frame;
// stripe i (1..) comes on lane i. Each lane has a reader goroutine of its
// own, owned by package hostlink (Conn.StartLane): the goroutine that
// accepted the lane, which lives as long as the lane. It reads the lane
// only when the main connection's reader hands it a job: while that
// reader executes the request whose stripe comes next on the lane, in the
// order of the requests. The lanes' stripes then land in parallel with
// the first, each reader under the target's memory one step at a time as
// the main reader's (landing.go), on its own copy of the request's
// resolved target; the main reader answers the request once every stripe
// landed. A request that does not land (a duplicate, a NAK, its target
// gone) has its stripes read and dropped, so that every lane stays in
// step with the main connection. A lane that closed before it took its
// job closes the connection (its close closes the main connection too):
// the main reader then waits only for the jobs the lanes took.

import (
	"errors"
	"fmt"

	"github.com/vrdma/vrdma/internal/device"
	"github.com/vrdma/vrdma/internal/hostlink"
	"github.com/vrdma/vrdma/internal/tcpwire"
)

// laneReader is the state of one lane of a connection for its
// responder: the job the main reader hands the lane's reader goroutine.
type laneReader struct {
	lander // the lane's
	i      int
	main   *hostlink.Conn
	// The job, set by the main reader before StartLane: the striped
	// request, and the target its stripe lands in (p nil: read and drop
	// it). done gets the outcome; started says the lane took the job.
	req     *tcpwire.Header
	p       device.Target
	m       device.Message
	done    chan error
	started bool
	landed  bool
	hdr     tcpwire.Header
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

// newLaneReader makes the state of lane i of main connection c.
func newLaneReader(c *hostlink.Conn, i int) *laneReader {
	r := &laneReader{lander: lander{c: c.Lane(i)}, i: i, main: c, done: make(chan error, 1)}
	r.readFn = r.tryRead
	return r
}

// RunLane runs the job, in the lane's reader goroutine: it reads the
// lane's next stripe and reports on done. An error closes the connection
// at once: the main reader may be waiting for its own payload meanwhile.
func (r *laneReader) RunLane() {
	err := r.serve()
	if err != nil {
		r.main.Close(err)
	}
	r.done <- err
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
// in message m at p; waitStripes waits for them. A lane that closed
// before it took its job closes the connection (the main connection's
// reads then fail); its job is not waited for.
func (rp *responder) startStripes(p device.Target, m *device.Message, sp *sockPayload) {
	for i := 1; i <= sp.stripes; i++ {
		r := rp.lanes[i]
		r.req, r.p, r.m = sp.req, p, *m
		r.started = r.c.StartLane(r)
		if !r.started {
			rp.c.Close(fmt.Errorf("lane %d of the connection closed: %w", i, hostlink.ErrConnLost))
		}
	}
}

// waitStripes waits for the lanes' readers startStripes started: landed
// when every stripe landed; err when a lane broke.
func (rp *responder) waitStripes() (landed bool, err error) {
	landed = true
	sp := &rp.sp
	for i := 1; i <= sp.stripes; i++ {
		r := rp.lanes[i]
		if r.started {
			err = errors.Join(err, <-r.done)
			landed = landed && r.landed
		} else {
			err = errors.Join(err, fmt.Errorf("lane %d of the connection closed: %w", i, hostlink.ErrConnLost))
			landed = false
		}
		r.req, r.p, r.m, r.started = nil, nil, device.Message{}, false // no reference to guest memory stays
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
