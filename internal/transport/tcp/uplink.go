// Package tcp is the tcp path (DESIGN.md §3): the agent's links to the
// other hosts of its switch, over TCP on the host's PVRDMA address, with
// the RC protocol of package tcpwire: a requester per QP (requester.go)
// and a responder per connection (responder.go) on package device's
// shared responder, and connection management across hosts (cm.go).
package tcp

// Connections. Between two hosts A and B there are two TCP connections:
// the one A opened carries A's requests and B's responses, the one B
// opened carries B's requests and A's responses. A responder thus never
// waits on its own requests to write a response, and two agents flooding
// each other cannot deadlock on full socket buffers. A connection is opened
// on first use, after a handshake that agrees on a version and proves both
// hosts hold the switch's secret (docs/wire-tcp.md).
//
// Goroutines and who owns them:
//
//	uplink.serve        accept loop on the PVRDMA address; one per
//	                    listener, owned by the uplink, stopped when the
//	                    listener closes (the address changed, or close).
//	uplink.watchConfig  follows this host's record in the control plane
//	                    (config.go): a new PVRDMA address moves the
//	                    listener, the pvrdma firewall rule turned off drops
//	                    every connection; stopped by close.
//	tconn.serveRequests one per accepted connection (responder side): reads
//	                    requests in order (sleeping in the network poller
//	                    between them), executes each against the
//	                    target VM's memory (reading a WRITE's or SEND's
//	                    payload straight into guest memory), writes the
//	                    response. CM requests go to their own goroutine,
//	                    which may wait for a listener's accept.
//	tconn.readResponses one per opened connection (requester side): reads
//	                    responses, hands each to the call waiting for its
//	                    tag (a READ's data goes straight into the caller's
//	                    local segments), fails every waiting call when the
//	                    connection ends.
//
// Requesters are QP goroutines (device's runSQ, requester.go): each writes its
// request frames under the connection's write lock and keeps up to
// txWindow requests in flight, completed in order. Flow control is TCP's:
// a slow responder stops reading, the requester's write blocks, the QP
// waits. No buffer grows with traffic: frames go from guest memory to the
// socket (writev) and from the socket to guest memory.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/abi/mgmt"
	"github.com/vrdma/vrdma/internal/cm"
	"github.com/vrdma/vrdma/internal/control/member"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
	"github.com/vrdma/vrdma/internal/device"
	"github.com/vrdma/vrdma/internal/tcpwire"
)

// Handshake and connection timing.
const (
	handshakeTimeout = 5 * time.Second
	// maxHandshakes bounds the accepted connections in their handshake at
	// once; more are dropped at accept.
	maxHandshakes = 64
	keepAlive     = 15 * time.Second
	// writeStall bounds a frame write that makes no progress (the peer
	// stopped reading): the connection is then closed.
	writeStall = 10 * time.Second
)

// Config configures an Uplink.
type Config struct {
	Device device.Targets
	CM     *cm.Manager // where remote dialers' requests go
	HostID string      // this host's ID
	Host   string      // this host's name, for messages
	Log    *slog.Logger

	// The control plane: this host's record and its peers' (Cache), the
	// switch's secret (Store).
	Store         *store.Store
	Cache         *member.Cache
	Switch        string        // the distributed switch this host is on
	LookupTimeout time.Duration // bounds a lookup that goes to etcd
	// PVRDMAAddress is where to listen at start (the host record may
	// give another later); Firewall the pvrdma firewall rule at start.
	PVRDMAAddress netip.AddrPort
	Firewall      bool
	// OnDisconnect, if set, is told of a CM_DISC from a peer host: its QP
	// fromQPN (GID fromGID), an adapter of that host, disconnected the
	// rdma_cm connection of this host's QP qpn.
	OnDisconnect func(qpn, fromQPN uint32, fromGID abi.GID)
	// OnEstablish, if set, is told of a CM_RTU from a peer host: its QP
	// fromQPN (GID fromGID), which its workload moves itself, established
	// the rdma_cm connection to this host's QP qpn.
	OnEstablish func(qpn, fromQPN uint32, fromGID abi.GID)
}

// Uplink is the agent's tcp path: its links to the other hosts.
type Uplink struct {
	cfg  Config
	log  *slog.Logger
	boot string // this process's boot ID

	// firewall is whether this host's pvrdma firewall rule is on, as its
	// host record last said (vrdmad --firewall-pvrdma at start).
	firewall atomic.Bool
	// handshakes is how many accepted connections are in their handshake
	// (at most maxHandshakes); floodLogged when the last one over the
	// limit was logged.
	handshakes  atomic.Int32
	floodLogged atomic.Int64
	// gen counts dropAll calls: a connection whose setup began before one
	// is dropped once set up (see stale).
	gen atomic.Uint64

	secretMu sync.Mutex
	secret   []byte // the switch secret, once read

	mu sync.Mutex
	// nil: no PVRDMA address, or it could not be bound
	ln *net.TCPListener // +checklocks:mu
	// the PVRDMA address, as the host record says
	addr netip.AddrPort // +checklocks:mu
	// why ln is nil although addr is set
	listenErr string // +checklocks:mu
	// by peer host ID
	links  map[string]*link // +checklocks:mu
	closed bool             // +checklocks:mu

	stop chan struct{} // closed by close: watchConfig returns
	wg   sync.WaitGroup
}

// link is this host's relation with one peer host: the connection it
// opened (requests out), the connections the peer opened (requests in),
// and counters.
type link struct {
	u      *Uplink
	peerID string

	dialMu sync.Mutex // one dial at a time
	out    atomic.Pointer[tconn]

	// The test link (testlink.go): pipe makes connection n (a pipe's two
	// ends); lossy says frames may be lost without the connection.
	pipe  func(n uint64) (req, resp *tconn, err error)
	lossy bool

	mu       sync.Mutex
	in       map[*tconn]struct{} // +checklocks:mu
	peerName string              // +checklocks:mu
	addr     netip.AddrPort      // +checklocks:mu
	peerBoot string              // +checklocks:mu
	lastErr  string              // +checklocks:mu
	down     bool                // +checklocks:mu

	bytesOut, bytesIn, framesOut, framesIn, dials, refused atomic.Uint64
}

// Start starts the tcp path of an agent with a control plane: it listens
// on the host's PVRDMA address when it has one, and follows the host
// record for changes (a PVRDMA address given later with vrdmactl host
// configure starts it then). A PVRDMA address given at start that cannot
// be bound fails the start.
func Start(cfg Config) (*Uplink, error) {
	var b [16]byte
	rand.Read(b[:])
	u := &Uplink{cfg: cfg, log: cfg.Log.With("component", "uplink"), boot: hex.EncodeToString(b[:]),
		links: map[string]*link{}, stop: make(chan struct{})}
	u.firewall.Store(cfg.Firewall)
	if addr := cfg.PVRDMAAddress; addr.IsValid() {
		u.mu.Lock()
		err := u.listenLocked(addr)
		u.mu.Unlock()
		if err != nil {
			return nil, err
		}
	}
	u.wg.Add(1)
	go u.watchConfig()
	return u, nil
}

// Bind returns the maker of the tcp path of a QP whose remote end is on
// host id, for a device.Route.
func (u *Uplink) Bind(id string) func(q device.Source) device.Path {
	l := u.linkTo(id)
	return func(q device.Source) device.Path { return newTCPPath(q, id, l) }
}

// listenLocked listens on addr, the host's PVRDMA address, and starts its
// accept loop.
//
// +checklocks:u.mu
func (u *Uplink) listenLocked(addr netip.AddrPort) error {
	u.addr, u.listenErr = addr, ""
	ln, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(addr))
	if err != nil {
		err = fmt.Errorf("tcp path: listen on the PVRDMA address %s: %w (is the address on this host, the port free?)", addr, err)
		u.listenErr = err.Error()
		return err
	}
	u.ln = ln
	u.wg.Add(1)
	go u.serve(ln)
	u.log.Info("tcp path listening", "address", ln.Addr().String(), "boot", u.boot)
	return nil
}

// localAddr returns the host's PVRDMA address, the source of the
// connections it opens; false when it has none it listens on.
func (u *Uplink) localAddr() (netip.AddrPort, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.addr, u.ln != nil
}

// Close stops accepting and closes every connection; waiting requesters
// fail over to their retry rules.
func (u *Uplink) Close() {
	u.mu.Lock()
	u.closed = true
	if u.ln != nil {
		u.ln.Close()
		u.ln = nil
	}
	u.mu.Unlock()
	close(u.stop)
	u.dropAll(errors.New("agent stopping"))
	u.wg.Wait()
}

// dropAll closes every connection with every peer, and those being set
// up when it is called.
func (u *Uplink) dropAll(why error) {
	u.gen.Add(1)
	u.mu.Lock()
	links := make([]*link, 0, len(u.links))
	for _, l := range u.links {
		links = append(links, l)
	}
	u.mu.Unlock()
	for _, l := range links {
		l.closeAll(why)
	}
}

// stale says why a connection whose setup began at generation gen must
// not be used, now that it is registered with its link: the agent stops,
// or dropAll ran meanwhile (the PVRDMA address changed, the firewall rule
// went off). nil when it may.
func (u *Uplink) stale(gen uint64) error {
	u.mu.Lock()
	closed := u.closed
	u.mu.Unlock()
	switch {
	case closed:
		return errors.New("agent stopping")
	case u.gen.Load() != gen || !u.firewall.Load():
		return errors.New("this host's PVRDMA configuration changed while the connection was set up")
	}
	return nil
}

// linkTo returns the link to host id, creating it.
func (u *Uplink) linkTo(id string) *link {
	u.mu.Lock()
	defer u.mu.Unlock()
	l := u.links[id]
	if l == nil {
		l = &link{u: u, peerID: id, in: map[*tconn]struct{}{}}
		u.links[id] = l
	}
	return l
}

func (l *link) setErr(err error) {
	l.mu.Lock()
	l.lastErr = err.Error()
	l.mu.Unlock()
}

// closeAll closes every connection with the peer.
func (l *link) closeAll(why error) {
	if c := l.out.Load(); c != nil {
		c.close(why)
	}
	l.mu.Lock()
	in := make([]*tconn, 0, len(l.in))
	for c := range l.in {
		in = append(in, c)
	}
	l.mu.Unlock()
	for _, c := range in {
		c.close(why)
	}
}

// switchSecret returns the switch's secret, creating it in the control
// plane if this is the first host to need it.
func (u *Uplink) switchSecret(ctx context.Context) ([]byte, error) {
	u.secretMu.Lock()
	defer u.secretMu.Unlock()
	if u.secret != nil {
		return u.secret, nil
	}
	c := &u.cfg
	sw := c.Switch
	if sw == "" {
		return nil, errors.New("this host is on no distributed switch (--switch): it has no tcp path")
	}
	key := records.SwitchSecretKey(sw)
	s, _, err := store.Get[records.SwitchSecret](ctx, c.Store, key)
	if errors.Is(err, store.ErrNotFound) {
		ns := records.SwitchSecret{Switch: sw, Key: make([]byte, records.SwitchSecretLen)}
		rand.Read(ns.Key)
		if _, err = c.Store.Create(ctx, key, ns); err == nil {
			s = ns
		} else if errors.Is(err, store.ErrExists) {
			s, _, err = store.Get[records.SwitchSecret](ctx, c.Store, key)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("switch %s's secret (%s): %w", sw, key, err)
	}
	u.secret = s.Key
	return u.secret, nil
}

// serve accepts connections from other hosts on ln.
func (u *Uplink) serve(ln *net.TCPListener) {
	defer u.wg.Done()
	for {
		nc, err := ln.AcceptTCP()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			u.log.Warn("tcp path: accept", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if u.handshakes.Add(1) > maxHandshakes {
			// A flood of connections that do not finish their handshakes:
			// each holds a goroutine and buffers until its deadline.
			u.handshakes.Add(-1)
			nc.SetLinger(0)
			nc.Close()
			if now := nanotime(); now-u.floodLogged.Load() > int64(time.Second) {
				u.floodLogged.Store(now)
				u.log.Warn("tcp path: too many handshakes under way; connection dropped", "from", nc.RemoteAddr().String(), "limit", maxHandshakes)
			}
			continue
		}
		u.wg.Add(1)
		go func() {
			defer u.wg.Done()
			c, err := u.acceptHandshake(nc)
			u.handshakes.Add(-1)
			if err != nil {
				nc.Close()
				return
			}
			c.serveRequests()
		}()
	}
}

// tconn is one TCP connection of the tcp path.
type tconn struct {
	l        *link
	nc       net.Conn // a TCP connection; a Unix socket on the test link
	outgoing bool     // opened by this host: requests out, responses in
	ver      uint8
	peerBoot string // the peer agent's boot ID at the handshake

	wmu  sync.Mutex // one frame at a time
	whdr [tcpwire.HeaderLen]byte
	// monotonic ns of the write deadline set
	wdeadline int64       // +checklocks:wmu
	wiov      net.Buffers // +checklocks:wmu
	// what WriteTo is consuming; a field, so that it does not escape per call
	wbufs net.Buffers // +checklocks:wmu

	pmu sync.Mutex
	// requests waiting for a response
	pending map[uint64]*call // +checklocks:pmu
	nextTag uint64           // +checklocks:pmu
	dead    bool             // +checklocks:pmu

	// The responder's scratch, owned by serveRequests. ACKs wait in acks
	// while the next request is already in the read buffer, and go out
	// together (at most maxAcks).
	acks  [maxAcks * tcpwire.HeaderLen]byte
	nacks int
	resp  tcpwire.Header
	sp    sockPayload
	req   device.Request
	rx    device.Message
	bind  tcpBinding // the requester of the request being served
	// step is a system call between the socket and a target's memory
	// (landing.go); readFn and writeFn are its callbacks, bound once.
	step    step
	readFn  func(uintptr) bool
	writeFn func(uintptr) bool

	cmMu sync.Mutex
	// CM requests from the peer waiting for an answer, by tag
	cms     map[uint64]*cm.Remote // +checklocks:cmMu
	cmCount atomic.Int32          // CM requests being served

	// The reader's side, owned by whichever goroutine reads.
	rc          syscall.RawConn // nc's descriptor, for TCP_INFO
	rbuf        [rbufSize]byte
	rr, rw      int          // rbuf[rr:rw] is read but not consumed
	rdeadline   int64        // monotonic ns of the read deadline set, 0 for none
	handshaking bool         // the handshake's own deadline applies
	lastRead    atomic.Int64 // monotonic ns of the last read progress
	closed      chan struct{}
	once        sync.Once
	err         error // why it closed; set before closed is closed
}

func newTconn(l *link, nc net.Conn, outgoing bool, ver uint8) *tconn {
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
		tc.SetKeepAlive(true)
		tc.SetKeepAlivePeriod(keepAlive)
	}
	c := &tconn{l: l, nc: nc, outgoing: outgoing, ver: ver, pending: map[uint64]*call{}, closed: make(chan struct{}),
		handshaking: true, // until the handshake ends, its own deadline bounds every read and write
		cms:         map[uint64]*cm.Remote{},
		wiov:        make(net.Buffers, 0, abi.MaxSGE+1)}
	c.lastRead.Store(nanotime())
	if sc, ok := nc.(syscall.Conn); ok {
		c.rc, _ = sc.SyscallConn()
	}
	c.readFn, c.writeFn = c.tryRead, c.tryWrite
	return c
}

var monoStart = time.Now()

func nanotime() int64 { return int64(time.Since(monoStart)) }

// close closes the connection and fails every waiting call.
func (c *tconn) close(why error) {
	c.once.Do(func() {
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
			k.err = errConnLost
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
}

var errConnLost = errors.New("tcp path connection lost")

// peerAcking reports whether the peer's kernel acknowledges what this
// host sends (TCP_INFO): nothing is unacknowledged, or the last ACK came
// within d. A link or host that is down acknowledges nothing; a peer
// agent that is only slow (a loaded host, a deep queue on the connection)
// is not taken for dead — for at most slowPeerLimit, since a host that
// died after acknowledging everything looks the same.
func (c *tconn) peerAcking(d time.Duration) bool {
	if c.rc == nil {
		return false
	}
	alive := false
	c.rc.Control(func(fd uintptr) {
		info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
		alive = err == nil && (info.Unacked == 0 || time.Duration(info.Last_ack_recv)*time.Millisecond < d)
	})
	return alive
}

// writeFrame writes header h and the payload segments as one frame.
func (c *tconn) writeFrame(h *tcpwire.Header, payload [][]byte) error {
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
	// The deadline bounds a write that makes no progress. Setting it costs
	// a timer update, so small frames reuse one with at least half of
	// writeStall left; a big frame gets its own, with a floor of 100 MB/s
	// on top: a big frame to a slow but working peer is not a stall.
	// During the handshake its own deadline applies.
	if now := nanotime(); !c.handshaking && (n > 1<<20 || now > c.wdeadline-int64(writeStall/2)) {
		d := writeStall + time.Duration(n*10)
		c.nc.SetWriteDeadline(time.Now().Add(d))
		c.wdeadline = now + int64(d)
	}
	c.wbufs = c.wiov // WriteTo consumes its receiver; a field does not escape per call
	_, err := c.wbufs.WriteTo(c.nc)
	clear(c.wiov) // do not keep guest memory reachable
	if err != nil {
		err = fmt.Errorf("write %s frame: %w", h.Type, err)
		c.close(err)
		return err
	}
	c.l.bytesOut.Add(n)
	c.l.framesOut.Add(1)
	return nil
}

// writeFrames writes frames already encoded in *iov (headers and payloads,
// n bytes in all), in one writev.
func (c *tconn) writeFrames(iov *net.Buffers, n uint64, frames int) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if now := nanotime(); n > 1<<20 || now > c.wdeadline-int64(writeStall/2) {
		d := writeStall + time.Duration(n*10)
		c.nc.SetWriteDeadline(time.Now().Add(d))
		c.wdeadline = now + int64(d)
	}
	c.wbufs = *iov
	if _, err := c.wbufs.WriteTo(c.nc); err != nil {
		err = fmt.Errorf("write %d request frames: %w", frames, err)
		c.close(err)
		return err
	}
	c.l.bytesOut.Add(n)
	c.l.framesOut.Add(uint64(frames))
	return nil
}

// flushAcks writes the ACKs serveRC held back, in one write.
func (c *tconn) flushAcks() error {
	n := c.nacks
	if n == 0 {
		return nil
	}
	c.nacks = 0
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if now := nanotime(); now > c.wdeadline-int64(writeStall/2) {
		c.nc.SetWriteDeadline(time.Now().Add(writeStall))
		c.wdeadline = now + int64(writeStall)
	}
	if _, err := c.nc.Write(c.acks[:n*tcpwire.HeaderLen]); err != nil {
		err = fmt.Errorf("write %d ACK frames: %w", n, err)
		c.close(err)
		return err
	}
	c.l.bytesOut.Add(uint64(n * tcpwire.HeaderLen))
	c.l.framesOut.Add(uint64(n))
	return nil
}

// writeControl writes a control frame with a JSON payload.
func (c *tconn) writeControl(t tcpwire.Type, tag uint64, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	h := tcpwire.Header{Type: t, Tag: tag, PayloadLen: uint32(len(b))}
	return c.writeFrame(&h, [][]byte{b})
}

// rbufSize is the size of a connection's read buffer. It lets one recv
// bring in every frame the socket holds, up to its size: a burst of
// ACKs, or of requests with their payloads, which are then copied out of
// it; one recv and one ACK write for a burst of 4 KiB writes cost less
// than two recvs and a write for each (system calls cost microseconds on
// a virtual machine, a 4 KiB copy a fraction of one). A payload's part
// that did not come in with its header, if directRead bytes or more, goes
// straight from the socket into its destination.
const rbufSize = 64 << 10

// directRead is the least payload remainder read from the socket
// straight into its destination rather than through the read buffer.
const directRead = 16 << 10

// maxAcks is how many ACKs the responder holds back at most.
const maxAcks = 16

// readFull reads exactly len(b) bytes of a frame already begun, recording
// progress. A read that makes no progress for writeStall (plus 10 ns a
// byte) fails: a stalled peer must not hold the connection forever.
func (c *tconn) readFull(b []byte) error {
	n := copy(b, c.rbuf[c.rr:c.rw])
	c.rr += n
	b = b[n:]
	for len(b) > 0 {
		if len(b) < directRead {
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
		c.lastRead.Store(nanotime())
		c.l.bytesIn.Add(uint64(n))
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// buffered reports whether a whole frame header is in the read buffer.
func (c *tconn) buffered() bool { return c.rw-c.rr >= tcpwire.HeaderLen }

// fill reads until the buffer holds need bytes. Waiting for a header
// (header) on an idle connection has no time limit: a payload's deadline
// that expires before its first byte is cleared. Once a frame has begun,
// a read that makes no progress for the deadline fails.
func (c *tconn) fill(need int, header bool) error {
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
		// once a poller yields it to them (docs/PERF-LOG.md, issue 11).
		n, err := c.nc.Read(c.rbuf[c.rw:])
		if n > 0 {
			c.rw += n
			c.lastRead.Store(nanotime())
			c.l.bytesIn.Add(uint64(n))
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
func (c *tconn) armRead(n int) {
	if c.handshaking {
		return
	}
	if now := nanotime(); now > c.rdeadline-int64(writeStall/2) {
		d := writeStall + time.Duration(n*10)
		c.nc.SetReadDeadline(time.Now().Add(d))
		c.rdeadline = now + int64(d)
	}
}

// discard reads and drops n bytes of payload.
func (c *tconn) discard(n uint64) error {
	for n > 0 {
		if c.rr == c.rw {
			if err := c.fill(1, false); err != nil {
				return err
			}
		}
		k := min(n, uint64(c.rw-c.rr))
		c.rr += int(k)
		n -= k
	}
	return nil
}

// readHeader reads and validates the next frame header into h.
func (c *tconn) readHeader(h *tcpwire.Header) error {
	if err := c.fill(tcpwire.HeaderLen, true); err != nil {
		return err
	}
	b := c.rbuf[c.rr : c.rr+tcpwire.HeaderLen]
	c.rr += tcpwire.HeaderLen
	c.l.framesIn.Add(1)
	return tcpwire.Decode(b, c.ver, h)
}

// readControl reads a control frame's JSON payload into v.
func (c *tconn) readControl(h *tcpwire.Header, v any) error {
	if !h.Type.IsControl() {
		return fmt.Errorf("%s frame where a control frame was expected", h.Type)
	}
	b := make([]byte, h.PayloadLen)
	if err := c.readFull(b); err != nil {
		return err
	}
	return tcpwire.DecodeJSON(b, v)
}

// call is one request waiting for its response. A QP owns one and reuses
// it for every request; the connection's reader fills in the response.
type call struct {
	tag  uint64
	done chan struct{} // buffered 1; signalled once per registered call
	resp tcpwire.Header
	err  error
	// readSegs receive a READ response's data; ctl a control response's
	// payload.
	readSegs [][]byte
	ctl      []byte
	// wake, if set, is poked after done is signalled (the QP's wakeCh).
	wake chan struct{}
}

// signal hands the call's outcome to its owner.
func (k *call) signal() {
	k.done <- struct{}{}
	if k.wake != nil {
		select {
		case k.wake <- struct{}{}:
		default:
		}
	}
}

func newCall() *call { return &call{done: make(chan struct{}, 1)} }

// register assigns k a tag and records it as waiting; false if the
// connection is dead.
func (c *tconn) register(k *call) bool {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	if c.dead {
		return false
	}
	c.nextTag++
	k.tag, k.err = c.nextTag, nil
	c.pending[k.tag] = k
	return true
}

// withdraw removes k from the waiting calls; false if the reader already
// took it (it will signal done).
func (c *tconn) withdraw(k *call) bool {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	if c.pending[k.tag] == k {
		delete(c.pending, k.tag)
		return true
	}
	return false
}

// readResponses is the requester side's reader.
func (c *tconn) readResponses() {
	var h tcpwire.Header
	for {
		if err := c.readHeader(&h); err != nil {
			c.close(err)
			return
		}
		if h.Type != tcpwire.Ack && h.Type != tcpwire.ReadResp && h.Type != tcpwire.CMResp {
			c.close(fmt.Errorf("host %s sent a %s frame on a connection that carries responses only", c.l.peerID, h.Type))
			return
		}
		c.pmu.Lock()
		k := c.pending[h.Tag]
		delete(c.pending, h.Tag)
		c.pmu.Unlock()
		if k == nil { // a response for a request that gave up
			if err := c.discard(uint64(h.PayloadLen)); err != nil {
				c.close(err)
				return
			}
			continue
		}
		k.resp = h
		var err error
		switch h.Type {
		case tcpwire.ReadResp:
			err = c.readInto(k.readSegs, uint64(h.PayloadLen))
		case tcpwire.CMResp:
			k.ctl = make([]byte, h.PayloadLen)
			err = c.readFull(k.ctl)
		}
		if err != nil {
			k.err = errConnLost
			k.signal()
			c.close(err)
			return
		}
		k.signal()
	}
}

// readInto reads n bytes of payload across segs; what segs cannot hold is
// a protocol error (the responder sent more than was asked).
func (c *tconn) readInto(segs [][]byte, n uint64) error {
	for _, s := range segs {
		if n == 0 {
			break
		}
		k := min(uint64(len(s)), n)
		if err := c.readFull(s[:k]); err != nil {
			return err
		}
		n -= k
	}
	if n > 0 {
		return fmt.Errorf("host %s sent %d bytes more than the READ asked for", c.l.peerID, n)
	}
	return nil
}

// status reports the uplink's links.
// Status reports each link.
func (u *Uplink) Status() []mgmt.UplinkStatus {
	u.mu.Lock()
	links := make([]*link, 0, len(u.links))
	for _, l := range u.links {
		links = append(links, l)
	}
	u.mu.Unlock()
	var out []mgmt.UplinkStatus
	for _, l := range links {
		l.mu.Lock()
		s := mgmt.UplinkStatus{PeerHostID: l.peerID, PeerHost: l.peerName, LastError: l.lastErr, Conns: len(l.in)}
		if l.addr.IsValid() {
			s.Address = l.addr.String()
		}
		down := l.down
		l.mu.Unlock()
		if l.out.Load() != nil {
			s.Conns++
		}
		switch {
		case s.Conns > 0:
			s.State = "up"
		case down:
			s.State = "down"
		default:
			s.State = "idle"
		}
		s.BytesOut, s.BytesIn = l.bytesOut.Load(), l.bytesIn.Load()
		s.FramesOut, s.FramesIn = l.framesOut.Load(), l.framesIn.Load()
		s.Dials, s.Refused = l.dials.Load(), l.refused.Load()
		out = append(out, s)
	}
	return out
}
