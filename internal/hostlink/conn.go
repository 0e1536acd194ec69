// SPDX-License-Identifier: Apache-2.0

package hostlink

// A connection between two agents: its frames, written one at a time
// under its write lock, and its read buffer, read by one goroutine at a
// time (the handshake's, then the connection's reader).

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/cm"
	"github.com/vrdma/vrdma/internal/tcpwire"
)

// Conn is one connection between two agents: TCP, or a Unix socket or a
// pipe on the test link. Its write side (WriteFrame, WriteFrames,
// WriteEncoded, StartWrite…EndWrite) may be used by any goroutine; its
// read side (Unread…ReadRaw) only by the goroutine that reads it — for a
// connection the peer opened, its Responder.
type Conn struct {
	l        *Peer
	nc       net.Conn // a TCP connection; a Unix socket on the test link
	outgoing bool     // opened by this host: requests out, responses in
	ver      uint8
	peerBoot string // the peer agent's boot ID at the handshake

	// Lanes (lanes.go). A main connection's group names its lanes, nlanes
	// is how many connections its requests may be striped over (itself
	// included; 1 without lanes), lanes[i] is lane i (1..). A lane's main
	// is its main connection; on the requester's side its writer takes
	// batches from jobs and closes wdone when it stops; on the
	// responder's side its reader takes its responder's jobs from ljobs.
	group  string
	nlanes atomic.Int32
	lanes  [tcpwire.MaxLanes]atomic.Pointer[Conn]
	main   *Conn
	jobs   chan *LaneBatch
	wdone  chan struct{}
	ljobs  chan LaneJob
	// detached says a lane left its group (replaced, attachLane): its
	// close no longer closes its main connection.
	detached atomic.Bool

	wmu sync.Mutex // one frame at a time
	// monotonic ns of the write deadline set
	wdeadline int64                   // +checklocks:wmu
	whdr      [tcpwire.HeaderLen]byte // +checklocks:wmu
	wiov      net.Buffers             // +checklocks:wmu
	// what WriteTo is consuming; a field, so that it does not escape per call
	wbufs net.Buffers // +checklocks:wmu

	pmu sync.Mutex
	// requests waiting for a response
	pending map[uint64]*Call // +checklocks:pmu
	nextTag uint64           // +checklocks:pmu
	dead    bool             // +checklocks:pmu

	// rq handles the RC requests of a connection the peer opened; owned
	// by serveRequests.
	rq Responder

	cmMu sync.Mutex
	// CM requests from the peer waiting for an answer, by tag
	cms     map[uint64]*cm.Remote // +checklocks:cmMu
	cmCount atomic.Int32          // CM requests being served
	// notes holds a token for each CM_DISC or CM_RTU being served, at
	// most cmMaxNotes (noteCM).
	notes chan struct{}
	// notesIgnored counts the CM_DISC and CM_RTU frames ignored (their
	// sender not on the peer host); lastLogged is when a line about them
	// was last logged (logNow).
	notesIgnored atomic.Uint64
	lastLogged   atomic.Int64

	// The reader's side, owned by whichever goroutine reads.
	rc          syscall.RawConn // nc's descriptor: TCP_INFO, ReadRaw, WriteRaw
	rbuf        [rbufSize]byte
	rr, rw      int          // rbuf[rr:rw] is read but not consumed
	dgram       []byte       // a datagram frame's payload (ud.go), made at the first
	rdeadline   int64        // monotonic ns of the read deadline set, 0 for none
	handshaking bool         // the handshake's own deadline applies
	lastRead    atomic.Int64 // monotonic ns of the last read progress
	closed      chan struct{}
	once        sync.Once
	err         error // why it closed; set before closed is closed
}

func newConn(l *Peer, nc net.Conn, outgoing bool, ver uint8) *Conn {
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
		tc.SetKeepAlive(true)
		tc.SetKeepAlivePeriod(keepAlive)
	}
	c := &Conn{l: l, nc: nc, outgoing: outgoing, ver: ver, pending: map[uint64]*Call{}, closed: make(chan struct{}),
		handshaking: true, // until the handshake ends, its own deadline bounds every read and write
		cms:         map[uint64]*cm.Remote{},
		notes:       make(chan struct{}, cmMaxNotes),
		wiov:        make(net.Buffers, 0, abi.MaxSGE+1)}
	c.lastRead.Store(nanotime())
	c.nlanes.Store(1)
	if sc, ok := nc.(syscall.Conn); ok {
		c.rc, _ = sc.SyscallConn()
	}
	return c
}

var monoStart = time.Now()

func nanotime() int64 { return int64(time.Since(monoStart)) }

// PeerID is the ID of the peer host.
func (c *Conn) PeerID() string { return c.l.peerID }

// Version is the protocol version the handshake agreed on.
func (c *Conn) Version() uint8 { return c.ver }

// Close closes the connection and fails every waiting call (with
// ErrConnLost); why is logged and shown in status. A main connection's
// lanes and a lane's main connection close with it. Any goroutine; the
// first call wins.
func (c *Conn) Close(why error) {
	first := false
	c.once.Do(func() {
		first = true
		c.err = why
		close(c.closed)
		// Abortive close (RST): the kernel must not deliver requests
		// still queued on a connection given up for dead once the link
		// is back — the requester has already failed or resent them.
		if tc, ok := c.nc.(*net.TCPConn); ok {
			tc.SetLinger(0)
		}
		c.nc.Close()
		c.pmu.Lock()
		c.dead = true
		for tag, k := range c.pending {
			delete(c.pending, tag)
			k.Err = ErrConnLost
			k.signal()
		}
		c.pmu.Unlock()
		l := c.l
		l.out.CompareAndSwap(c, nil)
		l.mu.Lock()
		delete(l.in, c)
		l.mu.Unlock()
		if why != nil && !errors.Is(why, io.EOF) && !errors.Is(why, net.ErrClosed) {
			l.setErr(why)
			l.u.log.Info("tcp path connection closed", "peer", l.peerID, "outgoing", c.outgoing, "why", why)
		}
	})
	if !first {
		return
	}
	// The group closes once c's own close is done: a lane closing its
	// main connection, which closes its lanes, finds its own close done.
	for i := range c.lanes {
		if ln := c.lanes[i].Load(); ln != nil {
			ln.Close(why)
		}
	}
	if c.main != nil && !c.detached.Load() {
		c.main.Close(why)
	}
}

// ErrConnLost is the error of a call whose connection closed before its
// response came.
var ErrConnLost = errors.New("tcp path connection lost")

// ReadSince reports whether the connection read anything since t (the
// real clock): a connection whose responses flow is alive, even when one
// response is late.
func (c *Conn) ReadSince(t time.Time) bool {
	return c.lastRead.Load() >= t.Sub(monoStart).Nanoseconds()
}

// PeerAcking reports whether the peer's kernel acknowledges what this
// host sends (TCP_INFO): nothing is unacknowledged, or the last ACK came
// within d, or within d plus the kernel's retransmission timeout while
// that timeout has not yet expired once for what is unacknowledged.
//
// A link or host that is down acknowledges nothing; a peer agent that is
// only slow (a loaded host, a deep queue on the connection) is not taken
// for dead — by its caller, for a bounded time, since a host that died
// after acknowledging everything looks the same. A lossy network gets one
// retransmission: a segment lost once goes out again after the
// retransmission timeout (200 ms at least), longer than short local ACK
// timeouts, and closing the connection before that would trade one lost
// segment for a new handshake, which may lose segments too (each failed
// dial spends a transport retry of the QP). A segment lost twice, or a
// link cut for longer than that timeout, is a peer not acknowledging.
// A main connection's peer acknowledges when it does so on every lane
// too: a request's stripes travel there.
func (c *Conn) PeerAcking(d time.Duration) bool {
	for i := range c.lanes {
		if ln := c.lanes[i].Load(); ln != nil && !ln.PeerAcking(d) {
			return false
		}
	}
	if c.rc == nil {
		return false
	}
	alive := false
	c.rc.Control(func(fd uintptr) {
		info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
		age := time.Duration(info.Last_ack_recv) * time.Millisecond
		rto := time.Duration(info.Rto) * time.Microsecond
		alive = err == nil && (info.Unacked == 0 || age < d || info.Backoff == 0 && age < d+rto)
	})
	return alive
}

// armWrite makes sure a write deadline covers writing n more bytes. The
// deadline bounds a write that makes no progress. Setting it costs a
// timer update, so small frames reuse one with at least half of
// writeStall left; a big frame gets its own, with a floor of 100 MB/s on
// top: a big frame to a slow but working peer is not a stall. During the
// handshake its own deadline applies.
//
// +checklocks:c.wmu
func (c *Conn) armWrite(n uint64) {
	if now := nanotime(); !c.handshaking && (n > 1<<20 || now > c.wdeadline-int64(writeStall/2)) {
		d := writeStall + time.Duration(n*10)
		c.nc.SetWriteDeadline(time.Now().Add(d))
		c.wdeadline = now + int64(d)
	}
}

// WriteFrame writes header h (its Version set to the connection's) and
// the payload segments as one frame. A write error closes the
// connection.
func (c *Conn) WriteFrame(h *tcpwire.Header, payload [][]byte) error {
	h.Version = c.ver
	c.wmu.Lock()
	defer c.wmu.Unlock()
	h.Put(c.whdr[:])
	c.wiov = append(c.wiov[:0], c.whdr[:])
	n := uint64(tcpwire.HeaderLen)
	for _, p := range payload {
		if len(p) > 0 {
			c.wiov = append(c.wiov, p)
			n += uint64(len(p))
		}
	}
	c.armWrite(n)
	c.wbufs = c.wiov // WriteTo consumes its receiver; a field does not escape per call
	_, err := c.wbufs.WriteTo(c.nc)
	clear(c.wiov) // do not keep guest memory reachable
	if err != nil {
		err = fmt.Errorf("write %s frame: %w", h.Type, err)
		c.Close(err)
		return err
	}
	c.l.bytesOut.Add(n)
	c.l.framesOut.Add(1)
	return nil
}

// WriteFrames writes frames already encoded in *iov (headers and
// payloads, n bytes in all), in one writev; the caller clears *iov. A
// write error closes the connection.
func (c *Conn) WriteFrames(iov *net.Buffers, n uint64, frames int) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.armWrite(n)
	c.wbufs = *iov
	if _, err := c.wbufs.WriteTo(c.nc); err != nil {
		err = fmt.Errorf("write %d request frames: %w", frames, err)
		c.Close(err)
		return err
	}
	c.l.bytesOut.Add(n)
	c.l.framesOut.Add(uint64(frames))
	return nil
}

// WriteEncoded writes frames already encoded in b, headers without
// payloads (a responder's ACKs held back), in one write. A write error
// closes the connection.
func (c *Conn) WriteEncoded(b []byte, frames int) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.armWrite(uint64(len(b)))
	if _, err := c.nc.Write(b); err != nil {
		err = fmt.Errorf("write %d frames: %w", frames, err)
		c.Close(err)
		return err
	}
	c.l.bytesOut.Add(uint64(len(b)))
	c.l.framesOut.Add(uint64(frames))
	return nil
}

// StartWrite takes the connection's write side for one frame of n bytes
// that the caller writes itself, header and guest memory, with WriteRaw
// (a READ response), under a write deadline for n bytes; EndWrite ends
// it. No other frame is written in between.
//
// +checklocksacquire:c.wmu
func (c *Conn) StartWrite(n uint64) {
	c.wmu.Lock()
	c.armWrite(n)
}

// WriteRaw runs f with the connection's descriptor when it is writable
// (syscall.RawConn.Write): f makes one non-blocking write and returns
// false to wait until the socket is writable again. The caller holds the
// write side (StartWrite), and closes the connection when a frame it
// began cannot be finished.
//
// +checklocks:c.wmu
func (c *Conn) WriteRaw(f func(fd uintptr) bool) error { return c.rc.Write(f) }

// EndWrite ends StartWrite, counting the bytes and frames written.
//
// +checklocksrelease:c.wmu
func (c *Conn) EndWrite(written uint64, frames int) {
	c.l.bytesOut.Add(written)
	c.l.framesOut.Add(uint64(frames))
	c.wmu.Unlock()
}

// Raw reports whether the connection has a descriptor for ReadRaw and
// WriteRaw (a TCP connection, or the test link's Unix socket).
func (c *Conn) Raw() bool { return c.rc != nil }

// writeControl writes a control frame with a JSON payload.
func (c *Conn) writeControl(t tcpwire.Type, tag uint64, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	h := tcpwire.Header{Type: t, Tag: tag, PayloadLen: uint32(len(b))}
	return c.WriteFrame(&h, [][]byte{b})
}

// rbufSize is the size of a connection's read buffer. It lets one recv
// bring in every frame the socket holds, up to its size: a burst of
// ACKs, or of requests with their payloads, which are then copied out of
// it; one recv and one ACK write for a burst of 4 KiB writes cost less
// than two recvs and a write for each (system calls cost microseconds on
// a virtual machine, a 4 KiB copy a fraction of one). A payload's part
// that did not come in with its header, if DirectRead bytes or more, goes
// straight from the socket into its destination.
const rbufSize = 64 << 10

// DirectRead is the least payload remainder worth reading from the
// socket straight into its destination (ReadRaw) rather than through the
// read buffer.
const DirectRead = 16 << 10

// ReadFull reads exactly len(b) bytes of a frame already begun, recording
// progress. A read that makes no progress for writeStall (plus 10 ns a
// byte) fails: a stalled peer must not hold the connection forever.
func (c *Conn) ReadFull(b []byte) error {
	n := copy(b, c.rbuf[c.rr:c.rw])
	c.rr += n
	b = b[n:]
	for len(b) > 0 {
		if len(b) < DirectRead {
			if err := c.fill(len(b), false); err != nil {
				return err
			}
			n := copy(b, c.rbuf[c.rr:c.rw])
			c.rr += n
			return nil
		}
		chunk := b
		if len(chunk) > 1<<20 {
			chunk = chunk[:1<<20]
		}
		c.armRead(len(chunk))
		n, err := io.ReadFull(c.nc, chunk)
		c.Received(uint64(n))
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// Buffered reports whether a whole frame header is in the read buffer:
// the next frame is already here.
func (c *Conn) Buffered() bool { return c.rw-c.rr >= tcpwire.HeaderLen }

// BufferedLen is how many bytes are read from the socket but not
// consumed.
func (c *Conn) BufferedLen() int { return c.rw - c.rr }

// Unread returns the bytes read from the socket but not consumed, at
// least one of them when the frame goes on: if there are none it reads
// some, under the frame's deadline. The slice is valid until the next
// read; Consume takes bytes out of it.
func (c *Conn) Unread() ([]byte, error) {
	if c.rr == c.rw {
		if err := c.fill(1, false); err != nil {
			return nil, err
		}
	}
	return c.rbuf[c.rr:c.rw], nil
}

// Consume takes the first n bytes of Unread.
func (c *Conn) Consume(n int) { c.rr += n }

// ReadRaw runs f with the connection's descriptor when it is readable
// (syscall.RawConn.Read), under a read deadline for n bytes: f makes one
// non-blocking read straight into its destination and returns false to
// wait until the socket is readable again. Only when nothing is buffered
// (Unread would read); the caller counts what f read with Received.
func (c *Conn) ReadRaw(n int, f func(fd uintptr) bool) error {
	c.armRead(n)
	return c.rc.Read(f)
}

// Received records n bytes read from the socket: the connection makes
// progress.
func (c *Conn) Received(n uint64) {
	if n > 0 {
		c.lastRead.Store(nanotime())
		c.l.bytesIn.Add(n)
	}
}

// fill reads until the buffer holds need bytes. Waiting for a header
// (header) on an idle connection has no time limit: a payload's deadline
// that expires before its first byte is cleared. Once a frame has begun,
// a read that makes no progress for the deadline fails.
func (c *Conn) fill(need int, header bool) error {
	if c.rw-c.rr >= need {
		return nil
	}
	if c.rr > 0 {
		c.rw = copy(c.rbuf[:], c.rbuf[c.rr:c.rw])
		c.rr = 0
	}
	for c.rw < need {
		if !header || c.rw > 0 {
			c.armRead(need - c.rw)
		}
		// No polling before the read sleeps: programs that busy-wait
		// without yielding (perftest) hold a CPU until the next tick
		// once a poller yields it to them (docs/PERF-LOG.md).
		n, err := c.nc.Read(c.rbuf[c.rw:])
		if n > 0 {
			c.rw += n
			c.Received(uint64(n))
			continue
		}
		if err == nil {
			continue
		}
		var ne net.Error
		if header && c.rw == 0 && !c.handshaking && c.rdeadline != 0 && errors.As(err, &ne) && ne.Timeout() {
			c.nc.SetReadDeadline(time.Time{})
			c.rdeadline = 0
			continue
		}
		if errors.Is(err, io.EOF) && (!header || c.rw > 0) {
			err = io.ErrUnexpectedEOF
		}
		return err
	}
	return nil
}

// armRead makes sure a read deadline covers reading n more bytes. Setting
// one costs a timer update, so one with half of writeStall left is kept.
// During the handshake its own deadline applies.
func (c *Conn) armRead(n int) {
	if c.handshaking {
		return
	}
	if now := nanotime(); now > c.rdeadline-int64(writeStall/2) {
		d := writeStall + time.Duration(n*10)
		c.nc.SetReadDeadline(time.Now().Add(d))
		c.rdeadline = now + int64(d)
	}
}

// Discard reads and drops n bytes of payload.
func (c *Conn) Discard(n uint64) error {
	for n > 0 {
		b, err := c.Unread()
		if err != nil {
			return err
		}
		k := min(n, uint64(len(b)))
		c.rr += int(k)
		n -= k
	}
	return nil
}

// readHeader reads and validates the next frame header into h.
func (c *Conn) readHeader(h *tcpwire.Header) error { return c.readHeaderIdle(h, true) }

// readHeaderIdle is readHeader; idle false puts the wait for it under
// the stall deadline of a frame already begun (fill).
func (c *Conn) readHeaderIdle(h *tcpwire.Header, idle bool) error {
	if err := c.fill(tcpwire.HeaderLen, idle); err != nil {
		return err
	}
	b := c.rbuf[c.rr : c.rr+tcpwire.HeaderLen]
	c.rr += tcpwire.HeaderLen
	c.l.framesIn.Add(1)
	return tcpwire.Decode(b, c.ver, h)
}

// readControl reads a control frame's JSON payload into v.
func (c *Conn) readControl(h *tcpwire.Header, v any) error {
	if !h.Type.IsControl() {
		return fmt.Errorf("%s frame where a control frame was expected", h.Type)
	}
	b := make([]byte, h.PayloadLen)
	if err := c.ReadFull(b); err != nil {
		return err
	}
	return tcpwire.DecodeJSON(b, v)
}
