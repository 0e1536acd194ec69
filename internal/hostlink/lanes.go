// SPDX-License-Identifier: Apache-2.0

package hostlink

// Lanes (docs/wire-tcp.md, "Lanes"): beside the connection that carries
// this host's requests to a peer (the main connection), up to
// tcpwire.MaxLanes-1 more connections, each with a handshake of its own
// that names the main connection's group and its index, carry the stripes
// of large messages. A lane is part of its main connection: either one
// closing closes both, and the requests in flight are retried on a new
// main connection with new lanes, as when a connection without lanes
// closes.
//
// Goroutines, each living exactly as long as its lane, so that a host's
// goroutines grow and shrink with its connections and nothing else:
//
//   - The requester's side (the host that dialed) writes a batch's
//     stripes through each lane's writer goroutine (writeLane, started
//     when the lane is opened, owned by the Links' wait group) while it
//     writes the main connection's frames itself (WriteStriped), and
//     returns once every lane wrote its part: guest memory is read only
//     while the QP's send-queue goroutine waits.
//   - The responder's side (the host that accepted) keeps the goroutine
//     that ran an accepted lane's handshake as the lane's reader
//     (serveLane, owned by the Links' wait group). It reads the lane only
//     when the main connection's responder hands it a job (StartLane):
//     while the responder executes the request whose stripe comes next on
//     the lane (package tcp). It ends when the lane closes, which the
//     main connection's close does.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"runtime"
	"time"

	"github.com/vrdma/vrdma/internal/tcpwire"
)

// DefaultStripeMin is the least stripe of a striped message, so that
// messages under twice that stay on one connection.
const DefaultStripeMin = 128 << 10

// defaultLanes is one lane per two cores, at most 4 (none on two cores):
// a lane's bytes are copied by a thread of its own at each end, and one
// connection already keeps a core busy at each end; more threads than
// cores only queue, and pay a context switch and a wake-up per stripe.
// On two vCPUs with both agents on them, 1 MiB write_bw over 2 lanes was
// 0.5–0.75× one connection's (BenchmarkTCPLanesWriteBW,
// docs/BENCHMARKS.md).
func defaultLanes() int { return min(runtime.NumCPU()/2, 4) }

// lanes is how many connections this host carries its requests to one
// peer on, the main one included (Config.Lanes, 1..MaxLanes).
func (u *Links) lanes() int {
	n := u.cfg.Lanes
	if n == 0 {
		n = defaultLanes()
	}
	return min(max(n, 1), tcpwire.MaxLanes)
}

// stripeMin is the least stripe (Config.StripeMin, or DefaultStripeMin).
func (u *Links) stripeMin() uint64 {
	if u.cfg.StripeMin > 0 {
		return u.cfg.StripeMin
	}
	return DefaultStripeMin
}

// LaneBatch is what a batch of requests puts on one lane: its STRIPE
// frames, headers and payloads, n bytes in all. Its owner (a QP's
// requester) makes it once, fills Iov for each batch and hands it to
// WriteStriped; the lane's writer owns it until WriteStriped returns.
type LaneBatch struct {
	Iov    net.Buffers
	N      uint64
	Frames int
	done   chan error
	bufs   net.Buffers // what WriteTo consumes
}

// NewLaneBatch makes a lane batch.
func NewLaneBatch() *LaneBatch { return &LaneBatch{done: make(chan error, 1)} }

// Lanes is how many connections c's requests may be striped over, c
// included: 1 when the handshake agreed on none, or for a lane.
func (c *Conn) Lanes() int { return int(c.nlanes.Load()) }

// StripeMin is the least stripe this host cuts a message into.
func (c *Conn) StripeMin() uint64 { return c.l.u.stripeMin() }

// Lane returns lane i (1..Lanes()-1) of main connection c, nil when it is
// not (yet) there.
func (c *Conn) Lane(i int) *Conn {
	if i <= 0 || i >= len(c.lanes) {
		return nil
	}
	return c.lanes[i].Load()
}

// WriteStriped writes a batch: the main connection's frames (*iov, n
// bytes, frames of them, as WriteFrames) and each lane's (lanes[i-1] for
// lane i; one with N 0 has nothing). The lanes' batches are queued under
// the main connection's write lock, so every lane carries its stripes in
// the order of the frames that announce them; WriteStriped returns once
// every lane wrote its batch or failed. An error closes the connection
// and its lanes.
func (c *Conn) WriteStriped(iov *net.Buffers, n uint64, frames int, lanes []*LaneBatch) error {
	c.wmu.Lock()
	queued := 0
	var err error
	for i, b := range lanes {
		if b.N == 0 {
			continue
		}
		ln := c.Lane(i + 1)
		if ln == nil {
			err = fmt.Errorf("lane %d of the connection to host %s is gone", i+1, c.l.peerID)
			break
		}
		select {
		case ln.jobs <- b:
			queued |= 1 << i
		case <-ln.closed:
			err = fmt.Errorf("lane %d of the connection to host %s closed: %w", i+1, c.l.peerID, ErrConnLost)
		}
		if err != nil {
			break
		}
	}
	if err == nil {
		c.armWrite(n)
		c.wbufs = *iov
		if _, werr := c.wbufs.WriteTo(c.nc); werr != nil {
			err = fmt.Errorf("write %d request frames: %w", frames, werr)
		} else {
			c.l.bytesOut.Add(n)
			c.l.framesOut.Add(uint64(frames))
			c.l.striped.Add(1)
		}
	}
	c.wmu.Unlock()
	if err != nil {
		c.Close(err) // its lanes too: their writers stop at once
	}
	for i, b := range lanes {
		if queued&(1<<i) == 0 {
			continue
		}
		if lerr := c.lanes[i+1].Load().waitLane(b); lerr != nil && err == nil {
			err = lerr
			c.Close(err)
		}
	}
	return err
}

// waitLane waits until lane ln wrote batch b, or failed, or closed and
// its writer stopped (then b no longer reads guest memory).
func (ln *Conn) waitLane(b *LaneBatch) error {
	select {
	case err := <-b.done:
		return err
	case <-ln.closed:
	}
	<-ln.wdone
	select {
	case err := <-b.done:
		return err
	default:
		return fmt.Errorf("lane to host %s closed: %w", ln.l.peerID, ErrConnLost)
	}
}

// writeLane is a lane's writer on the requester's side: it writes the
// batches queued on it, one at a time, until the lane closes.
func (ln *Conn) writeLane() {
	defer close(ln.wdone)
	for {
		select {
		case b := <-ln.jobs:
			b.done <- ln.writeBatch(b)
		case <-ln.closed:
			return
		}
	}
}

// writeBatch writes one lane batch in one writev.
func (ln *Conn) writeBatch(b *LaneBatch) error {
	ln.wmu.Lock()
	defer ln.wmu.Unlock()
	ln.armWrite(b.N)
	b.bufs = b.Iov
	_, err := b.bufs.WriteTo(ln.nc)
	b.bufs = nil
	if err != nil {
		err = fmt.Errorf("write %d stripes on a lane: %w", b.Frames, err)
		ln.Close(err)
		return err
	}
	ln.l.bytesOut.Add(b.N)
	ln.l.framesOut.Add(uint64(b.Frames))
	return nil
}

// ReadStripe reads the next frame header of lane c into h, under the
// stall deadline of a frame already begun (its main connection announced
// it): a STRIPE, else an error.
func (c *Conn) ReadStripe(h *tcpwire.Header) error {
	if err := c.readHeaderIdle(h, false); err != nil {
		return err
	}
	if h.Type != tcpwire.Stripe {
		return fmt.Errorf("%s frame on a lane, which carries stripes only", h.Type)
	}
	return nil
}

// newGroup is a fresh group name for a main connection's lanes.
func newGroup() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Lane opening. A main connection this host dials is used at once, on
// its own; its lanes are opened after it, by a goroutine of their own
// (openLanes, owned by the Links' wait group, which ends once every lane
// is open, or the connection closes, or the agent stops), and join it one
// by one: Lanes grows as they do. The QP that dialed does not wait for
// them — a handshake lost on a lossy link would cost it a transport
// retry — and a lane whose handshake fails is tried again until it
// opens: a connection does not stay for its whole life with fewer lanes
// than its handshake agreed on because one handshake met a lost segment.
// Only a lane the peer refuses (its main connection gone there) is given
// up, with the lanes after it.

// laneRetry bounds the wait between two attempts to open a lane.
const laneRetry = 2 * time.Second

// goOpenLanes starts the goroutine that opens the lanes of main
// connection c, want connections in all (c included), unless the agent
// stops. dial opens lane i of c's group within ctx.
func (u *Links) goOpenLanes(dial func(ctx context.Context, lane int) (*Conn, error), c *Conn, want int) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return errors.New("agent stopping")
	}
	u.wg.Add(1)
	go func() {
		defer u.wg.Done()
		c.l.openLanes(dial, c, want)
	}()
	return nil
}

// openLanes opens lanes 1..want-1 of main connection c, one after
// another, and starts their writers; each joins c (Lanes grows) once it
// is open. It ends when they are, or c closes, or the agent stops.
func (l *Peer) openLanes(dial func(ctx context.Context, lane int) (*Conn, error), c *Conn, want int) {
	u := l.u
	// ctx ends when c closes or the agent stops: a dial in progress
	// then returns at once. The watcher ends with openLanes.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-c.closed:
		case <-u.stop:
		case <-ctx.Done():
		}
		cancel()
	}()
	backoff := 50 * time.Millisecond
	for i := 1; i < want; {
		hctx, hcancel := context.WithTimeout(ctx, handshakeTimeout)
		ln, err := dial(hctx, i)
		hcancel()
		if ctx.Err() != nil {
			if ln != nil {
				ln.Close(errors.New("its main connection closed"))
			}
			return
		}
		if err != nil {
			if errors.As(err, new(dialRefusal)) {
				u.log.Info("tcp path: the peer refused a lane; the connection goes on with fewer", "peer", l.peerID, "lane", i, "lanes", i, "err", err)
				return
			}
			u.log.Debug("tcp path: a lane could not be opened; trying again", "peer", l.peerID, "lane", i, "err", err, "in", backoff)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, laneRetry)
			continue
		}
		ln.main = c
		c.lanes[i].Store(ln)
		select {
		case <-c.closed: // closed meanwhile: its close may have missed ln
			ln.Close(errors.New("its main connection closed"))
			return
		default:
		}
		if err := u.goLaneWriter(ln); err != nil {
			ln.Close(err)
			return
		}
		i++
		c.nlanes.Store(int32(i)) // lane i-1 joins: batches from now on may stripe over it
	}
}

// goLaneWriter starts lane ln's writer, unless the agent stops.
func (u *Links) goLaneWriter(ln *Conn) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return errors.New("agent stopping")
	}
	ln.jobs = make(chan *LaneBatch, 64)
	ln.wdone = make(chan struct{})
	u.wg.Add(1)
	go func() {
		defer u.wg.Done()
		ln.writeLane()
	}()
	return nil
}

// attachLane makes accepted connection c, whose HELLO named group and
// lane i, lane i of the main connection of that group the same agent run
// of the peer opened, in the place of an earlier lane i (closed). false:
// there is no such main connection, or it has fewer lanes.
func (l *Peer) attachLane(c *Conn, group string, i int) bool {
	l.mu.Lock()
	var m *Conn
	for o := range l.in {
		if o.group == group && o.peerBoot == c.peerBoot {
			m = o
		}
	}
	l.mu.Unlock()
	c.ljobs = make(chan LaneJob) // before m's responder can see c
	if m == nil || i >= m.Lanes() {
		return false
	}
	old := m.lanes[i].Load()
	if !m.lanes[i].CompareAndSwap(old, c) {
		return false // another lane i joined meanwhile
	}
	c.main = m
	if old != nil {
		// The peer opens lane i again only when its last attempt did
		// not end in READY there (openLanes): that attempt's lane is
		// dead to it. It leaves the group without closing it.
		old.detached.Store(true)
		old.Close(errors.New("replaced by the peer's newer lane"))
	}
	select {
	case <-m.closed: // closed meanwhile: its close may have missed c
		c.Close(errors.New("its main connection closed"))
	default:
	}
	return true
}

// LaneJob is work a main connection's responder hands to one of its
// lanes' readers (StartLane): reading the lane's next stripe.
type LaneJob interface {
	// RunLane runs in the lane's reader goroutine, which reads the lane
	// only while it runs. It must not panic.
	RunLane()
}

// StartLane hands job j to lane ln's reader, which runs it (j.RunLane);
// false when the lane closed first: j does not run, and never will. Only
// the main connection's responder calls it, for lanes of a connection
// this host accepted.
func (ln *Conn) StartLane(j LaneJob) bool {
	select {
	case ln.ljobs <- j: // unbuffered: the reader has it, and runs it
		return true
	case <-ln.closed:
		return false
	}
}

// serveLane is the reader of lane ln, which this host accepted: it runs
// the jobs its main connection's responder hands it until the lane
// closes. It is the goroutine that ran the lane's handshake.
func (ln *Conn) serveLane() {
	defer ln.guard("lane reader")
	for {
		select {
		case j := <-ln.ljobs:
			j.RunLane()
		case <-ln.closed:
			return
		}
	}
}

// Closed is closed when c closes.
func (c *Conn) Closed() <-chan struct{} { return c.closed }
