// SPDX-License-Identifier: Apache-2.0

package rdma

// The engine's datagrams. On IPv4 the ICRC covers the IP header's
// Identification and Flags, which a UDP socket neither shows nor lets one
// set: the socket is unconnected, bound to the uplink's address and port
// 4791, with path MTU discovery on (IP_PMTUDISC_DO), so that the kernel
// sends every datagram with DF set and ID 0 (docs/wire-rdma.md,
// checked by TestEngineWire against tshark's capture). A batch of
// datagrams sent with UDP GSO is one such datagram that the kernel cuts
// into segments (in the sender's stack, in the receiver's, or never, when
// the receiving socket takes the batch whole with UDP GRO), and it numbers
// their IDs from 0: segment k has ID k, and its ICRC is computed with
// that ID. A receiver rebuilds the header it cannot see the same way: ID
// k for the k-th segment of a coalesced batch, 0 for a lone datagram —
// and, since a lone datagram may be any segment of a batch the kernel
// cut, any ID below maxSegments (icrcid.go). A peer whose IDs differ (a
// hardware NIC or kernel rxe with other IDs) fails the ICRC check and is
// counted, not served.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/internal/device"
	"github.com/vrdma/vrdma/internal/rocewire"
)

// Conn carries the engine's UDP datagrams.
type Conn interface {
	// WriteTo sends datagrams to dst, marked m: datagram k the
	// concatenation of bufs[dgrams[k-1].End:dgrams[k].End] (from 0 for
	// the first), cut into segments of dgrams[k].Seg bytes but the last,
	// which may be shorter, when that is not 0 (UDP GSO: segmented by
	// the kernel, each segment with its own IP header, whose ID is its
	// index). One system call for all (sendmmsg).
	WriteTo(bufs [][]byte, dgrams []Datagram, dst netip.AddrPort, m Marks) error
	// Read reads up to len(bufs) datagrams (len(reads) at most),
	// waiting for the first: datagram k into bufs[k], reads[k] what it
	// was. Only the engine's reader calls it.
	Read(bufs [][]byte, reads []Read) (int, error)
	// LocalAddr is the address and port the datagrams leave from.
	LocalAddr() netip.AddrPort
	Close() error
}

// Read is one datagram of a Conn.Read: its length; the segment size of
// the datagrams from Src the kernel coalesced into it (UDP GRO: all but
// the last Seg bytes), or 0; its source.
type Read struct {
	N, Seg int
	Src    netip.AddrPort
}

// maxReads is the most datagrams one Read returns: one recvmmsg(2).
const maxReads = 8

// Datagram is one datagram of a Conn.WriteTo: where its pieces end, and
// its segment size (0: one packet).
type Datagram struct{ End, Seg int }

// Marks are what the engine's packets carry for the network's quality of
// service, from the port group: the IP TOS byte (IPv6: traffic class),
// DSCP << 2, which routers read; and the socket priority, the PFC
// priority, which a VLAN interface's egress map turns into the 802.1Q PCP
// (netcheck.SocketOptionsOf).
//
// RoCE v1 frames have no IP header: TOS is their GRH's traffic class, and
// the engine writes the 802.1Q tag itself, PCP Priority and VID VLAN,
// when either is not 0 (frame.go).
type Marks struct {
	TOS      uint8
	Priority uint8  // 0–7; 7 needs CAP_NET_ADMIN, else it is left off (udpConn.WriteTo)
	VLAN     uint16 // RoCE v1 only: the VID its frames are tagged with
}

// Batches (UDP GSO and GRO): maxSegments is the most datagrams one
// sendmsg carries (the kernel's UDP_MAX_SEGMENTS), maxBatch the most
// bytes (an IPv4 datagram's 65,535 less its IP and UDP headers), maxIOV
// the most pieces (the kernel's UIO_MAXIOV).
const (
	maxSegments = 64
	maxBatch    = 65535 - rocewire.IPv4HeaderLen - rocewire.UDPHeaderLen
	maxIOV      = 1024
)

// socketBuffer is the send and receive buffer the engine asks for: a
// burst of a 1 MiB message is a thousand packets, which the default
// (208 KiB) would drop on loopback.
const socketBuffer = 8 << 20

// setBuffers asks for socketBuffer bytes of send and receive buffer on
// socket fd — beyond net.core.[rw]mem_max with CAP_NET_ADMIN, capped
// there without — and returns the receive buffer the kernel gave
// (SO_RCVBUF: twice what it counts as data, for its bookkeeping).
func setBuffers(fd int) int {
	for _, o := range [][2]int{{unix.SO_SNDBUFFORCE, unix.SO_SNDBUF}, {unix.SO_RCVBUFFORCE, unix.SO_RCVBUF}} {
		if unix.SetsockoptInt(fd, unix.SOL_SOCKET, o[0], socketBuffer) != nil {
			unix.SetsockoptInt(fd, unix.SOL_SOCKET, o[1], socketBuffer)
		}
	}
	n, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF)
	if err != nil {
		return 0
	}
	return n
}

// ReceiveBuffer is the socket's receive buffer in bytes.
func (u *udpConn) ReceiveBuffer() int { return u.rcvbuf }

// udpConn is a Conn on a UDP socket.
type udpConn struct {
	c      *net.UDPConn
	raw    syscall.RawConn
	local  netip.AddrPort
	v6     bool
	rcvbuf int // the receive buffer the kernel gave (setBuffers)

	prio7Denied atomic.Bool
	// PriorityDenied counts the sends whose priority the kernel refused.
	PriorityDenied atomic.Uint64

	// The reader's: the non-blocking recvmmsg's arguments (pollOnce,
	// bound once as pollFn and, for raw.Read, readFn) and result.
	rmsgs  [maxReads]unix.Mmsghdr
	riov   [maxReads]unix.Iovec
	rname  [maxReads]unix.RawSockaddrInet6 // room for either family's
	roob   [maxReads][64]byte              // control messages
	want   int                             // datagrams to read at most
	rn     int                             // datagrams read, 0 for nothing yet, -1 for an error
	errno  unix.Errno                      // the error, when rn is -1
	polled time.Time                       // when the last read that asks for polling came
	pollFn func(fd uintptr)
	readFn func(fd uintptr) bool
	// gosched: the poll yields the Go scheduler too (YieldGoroutines).
	gosched bool

	ops spares[sendOp]
}

// YieldGoroutines makes the reader of c, a conn of ListenUDP, yield the
// Go scheduler to this process's other goroutines at every turn of its
// poll, not only the CPU: for an engine whose process also runs workloads
// that busy-wait (a native peer's in-process agent), whose QP goroutines
// would otherwise find no P until the poll ends (readPoll); a native
// peer's write_lat took 216 µs instead of 48. Call it before the engine
// starts.
func YieldGoroutines(c Conn) {
	if u, ok := c.(*udpConn); ok {
		u.gosched = true
	}
}

// ListenUDP binds the engine's socket on addr (an IPv4 or IPv6 address,
// not a wildcard: the ICRC covers it; port 0 means 4791).
func ListenUDP(addr netip.AddrPort) (Conn, error) {
	addr = netip.AddrPortFrom(addr.Addr().Unmap(), addr.Port())
	if !addr.Addr().IsValid() || addr.Addr().IsUnspecified() || addr.Addr().Zone() != "" {
		return nil, fmt.Errorf("rdma uplink %s: want the uplink's own IPv4 or IPv6 address (the ICRC covers it), not a wildcard or a zoned one", addr)
	}
	if addr.Port() == 0 {
		addr = netip.AddrPortFrom(addr.Addr(), rocewire.UDPPort)
	}
	network, level, pmtu := "udp4", unix.IPPROTO_IP, [2]int{unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO}
	if addr.Addr().Is6() {
		network, level, pmtu = "udp6", unix.IPPROTO_IPV6, [2]int{unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_DO}
	}
	c, err := net.ListenUDP(network, net.UDPAddrFromAddrPort(addr))
	if err != nil {
		return nil, fmt.Errorf("rdma uplink: bind UDP %s: %w (is another engine, or kernel rdma_rxe, on the port?)", addr, err)
	}
	rc, err := c.SyscallConn()
	if err != nil {
		c.Close()
		return nil, err
	}
	var serr error
	var rcvbuf int
	rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), level, pmtu[0], pmtu[1])
		if serr != nil {
			return
		}
		if serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_UDP, unix.UDP_GRO, 1); serr != nil {
			serr = fmt.Errorf("UDP_GRO (Linux 5.0 or later): %w", serr)
			return
		}
		rcvbuf = setBuffers(int(fd))
		serr = setMulticastIf(int(fd), addr.Addr())
	})
	if serr != nil {
		c.Close()
		return nil, fmt.Errorf("rdma uplink %s: socket options: %w", addr, serr)
	}
	local := c.LocalAddr().(*net.UDPAddr).AddrPort()
	return newUDPConn(c, rc, netip.AddrPortFrom(local.Addr().Unmap(), local.Port()), addr.Addr().Is6(), rcvbuf), nil
}

// withReuse runs fn, which binds a multicast group's socket (mcast.go),
// with SO_REUSEADDR set on u's socket: Linux lets a socket bind a group's
// address on port 4791 only beside sockets of the port that have it. It
// is cleared again at once, so that no other socket can bind u's address
// and port beside it (and take its packets) afterwards.
func (u *udpConn) withReuse(fn func() error) error {
	set := func(v int) (err error) {
		if cerr := u.raw.Control(func(fd uintptr) { err = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, v) }); cerr != nil {
			return cerr
		}
		return err
	}
	if err := set(1); err != nil {
		return err
	}
	defer set(0)
	return fn()
}

// newUDPConn wraps socket c, bound to local.
func newUDPConn(c *net.UDPConn, rc syscall.RawConn, local netip.AddrPort, v6 bool, rcvbuf int) *udpConn {
	u := &udpConn{c: c, raw: rc, local: local, v6: v6, rcvbuf: rcvbuf, ops: newSpares(newSendOp)}
	u.pollFn, u.readFn = u.pollOnce, u.readOnce
	return u
}

// setMulticastIf has the packets socket fd sends to a multicast group
// leave from the interface of the uplink's address a (mcast.go), with the
// kernel's defaults otherwise: TTL (hop limit) 1, looped back to this
// host's members.
func setMulticastIf(fd int, a netip.Addr) error {
	if a.Is4() {
		return unix.SetsockoptInet4Addr(fd, unix.IPPROTO_IP, unix.IP_MULTICAST_IF, a.As4())
	}
	if i := ifindexOf(a); i != 0 {
		return unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_MULTICAST_IF, i)
	}
	return nil // no interface holds it (yet): the routing table picks one
}

// WriteTo, Read, LocalAddr and Close make u a Conn.

// WriteTo sends the datagrams with one sendmmsg(2), straight from the
// caller's pieces (guest memory among them): no copy in user space. The
// marks travel as control messages — IP_TOS (IPv6: IPV6_TCLASS) and
// SO_PRIORITY — so that QPs of port groups with different DSCPs and
// priorities share the socket; a segment size as a UDP_SEGMENT one. A
// priority the kernel refuses (7 without CAP_NET_ADMIN) is left off from
// then on, and counted in PriorityDenied.
func (u *udpConn) WriteTo(bufs [][]byte, dgrams []Datagram, dst netip.AddrPort, m Marks) error {
	if err := checkDatagrams(bufs, dgrams); err != nil {
		return err
	}
	w := u.ops.get()
	w.setAddr(dst, u.v6)
	prio := m.Priority != 0 && m.Priority < 8 && !(m.Priority == 7 && u.prio7Denied.Load())
	nv, start := 0, 0
	for k, d := range dgrams {
		first := nv
		for _, b := range bufs[start:d.End] {
			if len(b) > 0 {
				w.iov[nv].Base = &b[0]
				w.iov[nv].SetLen(len(b))
				nv++
			}
		}
		start = d.End
		oob := w.cmsgs[k][:0]
		if m.TOS != 0 {
			oob = append(oob, tosCmsgs[u.family()][m.TOS]...)
		}
		if d.Seg > 0 {
			oob = appendSegment(oob, d.Seg)
		}
		w.noPrio[k] = len(oob) // the priority last: an IP_TOS control message sets a priority of its own (rt_tos2priority)
		if prio {
			oob = append(oob, prioCmsgs[m.Priority]...)
		}
		h := &w.hdrs[k].Hdr
		*h = unix.Msghdr{}
		h.Name, h.Namelen = w.name()
		if nv > first {
			h.Iov = &w.iov[first]
			h.SetIovlen(nv - first)
		}
		if len(oob) > 0 {
			h.Control = &oob[0]
			h.SetControllen(len(oob))
		}
	}
	w.n, w.sent, w.err = len(dgrams), 0, nil
	werr := u.raw.Write(w.fn)
	err := w.err
	if errors.Is(err, unix.EPERM) && prio {
		u.prio7Denied.Store(true)
		u.PriorityDenied.Add(1)
		for k := w.sent; k < w.n; k++ {
			h := &w.hdrs[k].Hdr
			h.SetControllen(w.noPrio[k])
			if w.noPrio[k] == 0 {
				h.Control = nil
			}
		}
		w.err = nil
		werr, err = u.raw.Write(w.fn), w.err
	}
	clear(w.iov[:nv]) // no reference to guest memory outlives the send
	for k := range w.n {
		w.hdrs[k].Hdr.Iov = nil
	}
	u.ops.put(w)
	if werr != nil {
		return werr
	}
	if err != nil {
		return os.NewSyscallError("sendmmsg", err)
	}
	return nil
}

// checkDatagrams checks a WriteTo's datagrams against its pieces.
func checkDatagrams(bufs [][]byte, dgrams []Datagram) error {
	if len(dgrams) == 0 || len(dgrams) > MaxDatagrams || len(bufs) > maxIOV || dgrams[len(dgrams)-1].End != len(bufs) {
		return fmt.Errorf("rdma uplink: a send of %d datagrams in %d pieces: want 1 to %d datagrams of at most %d pieces in all, the last ending at the last piece", len(dgrams), len(bufs), MaxDatagrams, maxIOV)
	}
	prev := 0
	for _, d := range dgrams {
		if d.End <= prev || d.Seg < 0 || d.Seg > maxBatch {
			return fmt.Errorf("rdma uplink: datagrams %v: each must end after the one before and have a segment size from 0 to %d", dgrams, maxBatch)
		}
		prev = d.End
	}
	return nil
}

// sendOp is one sendmmsg's arguments and progress, kept for reuse with
// its bound method (spares), so that a packet's send allocates nothing:
// the message headers, their iovecs and the address are built here,
// where unix.SendmsgBuffers would allocate the iovecs (and a closure, a
// sockaddr and the error would escape per call).
type sendOp struct {
	hdrs    [MaxDatagrams]unix.Mmsghdr
	cmsgs   [MaxDatagrams][3 * 24]byte // each datagram's control messages: three of up to 4 bytes (CmsgSpace(4) = 24)
	noPrio  [MaxDatagrams]int          // their length without the priority
	iov     [maxIOV]unix.Iovec
	name4   unix.RawSockaddrInet4
	name6   unix.RawSockaddrInet6
	v6      bool
	n, sent int
	err     error
	fn      func(fd uintptr) bool // send, bound once
}

// name is the destination, as a message header takes it.
func (w *sendOp) name() (*byte, uint32) {
	if w.v6 {
		return (*byte)(unsafe.Pointer(&w.name6)), unix.SizeofSockaddrInet6
	}
	return (*byte)(unsafe.Pointer(&w.name4)), unix.SizeofSockaddrInet4
}

// setAddr makes dst the destination.
func (w *sendOp) setAddr(dst netip.AddrPort, v6 bool) {
	w.v6 = v6
	port := dst.Port()
	if v6 {
		w.name6 = unix.RawSockaddrInet6{Family: unix.AF_INET6, Addr: dst.Addr().As16()}
		p := (*[2]byte)(unsafe.Pointer(&w.name6.Port))
		p[0], p[1] = byte(port>>8), byte(port)
		return
	}
	w.name4 = unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: dst.Addr().As4()}
	p := (*[2]byte)(unsafe.Pointer(&w.name4.Port))
	p[0], p[1] = byte(port>>8), byte(port)
}

// spares keeps objects of a sending goroutine's state for reuse, at most
// maxSpares: one for each goroutine that sends at once (QPs' requesters,
// responders, the reader). A channel, not a sync.Pool: a pool is emptied
// at every garbage collection, and an agent whose process collects often
// (an embedded etcd's allocations) would then allocate one per send.
type spares[T any] struct {
	ch    chan *T
	fresh func() *T
}

const maxSpares = 64

func newSpares[T any](fresh func() *T) spares[T] {
	return spares[T]{ch: make(chan *T, maxSpares), fresh: fresh}
}

// get returns a spare, or a fresh one.
func (s *spares[T]) get() *T {
	select {
	case x := <-s.ch:
		return x
	default:
		return s.fresh()
	}
}

// put keeps x for reuse, if there is room.
func (s *spares[T]) put(x *T) {
	select {
	case s.ch <- x:
	default:
	}
}

func newSendOp() *sendOp {
	w := &sendOp{}
	w.fn = w.send
	return w
}

// send is the sendmmsg of the datagrams not sent yet (sendmmsgFrom).
func (w *sendOp) send(fd uintptr) bool {
	var done bool
	done, w.err = sendmmsgFrom(fd, w.hdrs[:w.n], &w.sent, false)
	return done
}

// sendmmsgFrom sends hdrs[*sent:] with sendmmsg(2), resumed where it
// stopped, and advances *sent past what went: a raw system call that does
// not block (MSG_DONTWAIT; see pollOnce for why raw). It reports false
// when the socket can take no more (the runtime waits until it can, then
// calls again), true when all went or on an error. The kernel reports an
// error with the first message it could not send (the ones before went),
// which the next call meets; with dropNoBufs, ENOBUFS (a device queue
// that dropped the message: lost, as on a wire) skips that message.
func sendmmsgFrom(fd uintptr, hdrs []unix.Mmsghdr, sent *int, dropNoBufs bool) (bool, error) {
	for *sent < len(hdrs) {
		r, _, errno := unix.RawSyscall6(unix.SYS_SENDMMSG, fd, uintptr(unsafe.Pointer(&hdrs[*sent])), uintptr(len(hdrs)-*sent), unix.MSG_DONTWAIT, 0, 0)
		switch {
		case errno == 0:
			*sent += int(r)
		case errno == unix.EINTR:
		case errno == unix.EAGAIN:
			return false, nil
		case errno == unix.ENOBUFS && dropNoBufs:
			*sent++
		default:
			return true, errno
		}
	}
	return true, nil
}

// readPoll is how long the reader polls the socket for the next datagram
// after one came, before it sleeps in the network poller: a packet that
// follows within it (the response to a request, the next of a stream)
// costs no sleep and wake-up of a thread, most of a round trip's cost on
// a small or virtual machine. (The tcp path no longer polls: see its
// requester's note on programs that busy-wait without yielding.)
const readPoll = 200 * time.Microsecond

// Read reads with one recvmmsg(2), polling first for readPoll after the
// last read that asks for it (setPolled), then blocking.
func (u *udpConn) Read(bufs [][]byte, reads []Read) (int, error) {
	u.want = min(len(bufs), len(reads), maxReads)
	if u.want == 0 {
		return 0, nil
	}
	for k := range u.want {
		u.riov[k].Base, u.riov[k].Len = &bufs[k][0], uint64(len(bufs[k]))
	}
	if u.polled.IsZero() || !u.poll() {
		if err := u.raw.Read(u.readFn); err != nil {
			return 0, err
		}
	}
	if u.rn < 0 {
		return 0, os.NewSyscallError("recvmmsg", u.errno)
	}
	total := 0
	for k := range u.rn {
		h := &u.rmsgs[k]
		reads[k] = Read{N: int(h.Len), Seg: groSegment(u.roob[k][:h.Hdr.Controllen]), Src: addrPort(&u.rname[k])}
		total += int(h.Len)
	}
	u.setPolled(total)
	return u.rn, nil
}

// poll tries the socket until readPoll after the last read, yielding the
// CPU between tries; it reports whether the last try read or failed
// (u.rn).
func (u *udpConn) poll() bool {
	deadline := u.polled.Add(readPoll)
	for {
		if u.raw.Control(u.pollFn) != nil {
			return false
		}
		if u.rn != 0 {
			return true
		}
		device.YieldCPU() // at every turn
		if u.gosched {
			runtime.Gosched()
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// readOnce is pollOnce for raw.Read: false (nothing yet) has the runtime
// wait until the socket is readable.
func (u *udpConn) readOnce(fd uintptr) bool {
	u.pollOnce(fd)
	return u.rn != 0
}

// pollAfter is the largest read after which the reader polls for the
// next: a packet or two is a request or its answer, whose next is due
// soon; a coalesced batch bigger than that is a stream, whose next batch
// one wake-up takes whole, and whose polling would take the CPU that the
// agents moving its bytes need.
const pollAfter = 2 * maxDatagram

// setPolled notes a read of n bytes: the reader polls before the next
// read if n is small.
func (u *udpConn) setPolled(n int) {
	if n <= pollAfter {
		u.polled = time.Now()
	} else {
		u.polled = time.Time{}
	}
}

// pollOnce is Read's non-blocking recvmmsg(2), into the buffers the
// iovecs point to; u.rn is how many datagrams it read, 0 for nothing
// yet, -1 for an error (u.errno). Like sendOp.send it is a raw system
// call: it does not block, and the runtime's bookkeeping of one that
// might (entersyscall) wakes its monitor thread, which then keeps
// retaking the processor of every system call — half the context
// switches of a stream on a two-core machine (docs/PERF-LOG.md).
func (u *udpConn) pollOnce(fd uintptr) {
	for k := range u.want {
		u.rmsgs[k] = unix.Mmsghdr{Hdr: unix.Msghdr{Name: (*byte)(unsafe.Pointer(&u.rname[k])), Namelen: unix.SizeofSockaddrInet6,
			Iov: &u.riov[k], Iovlen: 1, Control: &u.roob[k][0], Controllen: uint64(len(u.roob[k]))}}
	}
	for {
		n, _, errno := unix.RawSyscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&u.rmsgs[0])), uintptr(u.want), unix.MSG_DONTWAIT, 0, 0)
		switch {
		case errno == unix.EINTR:
			continue
		case errno == unix.EAGAIN:
			u.rn = 0
		case errno != 0:
			u.rn, u.errno = -1, errno
		default:
			u.rn = int(n)
		}
		return
	}
}

// groSegment is the segment size a UDP_GRO control message in oob gives,
// or 0.
func groSegment(oob []byte) int {
	for len(oob) >= unix.CmsgLen(0) {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
		l := int(h.Len)
		if l < unix.CmsgLen(0) || l > len(oob) {
			return 0
		}
		if h.Level == unix.IPPROTO_UDP && h.Type == unix.UDP_GRO && l >= unix.CmsgLen(4) {
			return int(binary.NativeEndian.Uint32(oob[unix.CmsgLen(0):]))
		}
		oob = oob[min(unix.CmsgSpace(l-unix.CmsgLen(0)), len(oob)):]
	}
	return 0
}

// appendSegment appends to oob a UDP_SEGMENT control message for
// segments of seg bytes.
func appendSegment(oob []byte, seg int) []byte {
	n := len(oob)
	oob = append(oob, make([]byte, unix.CmsgSpace(2))...) // within cap: no allocation
	h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[n]))
	h.Level, h.Type = unix.IPPROTO_UDP, unix.UDP_SEGMENT
	h.SetLen(unix.CmsgLen(2))
	binary.NativeEndian.PutUint16(oob[n+unix.CmsgLen(0):], uint16(seg))
	return oob
}

func (u *udpConn) LocalAddr() netip.AddrPort { return u.local }
func (u *udpConn) Close() error              { return u.c.Close() }

// family is the index of u's address family in tosCmsgs: 0 IPv4, 1 IPv6.
func (u *udpConn) family() int {
	if u.v6 {
		return 1
	}
	return 0
}

// tosCmsgs holds the IP_TOS (IPv4) and IPV6_TCLASS (IPv6) control
// messages of every TOS byte, built once: a packet's sendmsg passes one,
// read only, and allocates nothing.
var tosCmsgs = func() (m [2][256][]byte) {
	n := unix.CmsgSpace(4)
	for f, lt := range [2][2]int32{{unix.IPPROTO_IP, unix.IP_TOS}, {unix.IPPROTO_IPV6, unix.IPV6_TCLASS}} {
		for tos := range m[f] {
			b := make([]byte, n)
			h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
			h.Level, h.Type = lt[0], lt[1]
			h.SetLen(unix.CmsgLen(4))
			binary.NativeEndian.PutUint32(b[unix.CmsgLen(0):], uint32(tos))
			m[f][tos] = b
		}
	}
	return m
}()

// prioCmsgs holds the SO_PRIORITY control message of priorities 0–7.
var prioCmsgs = func() (m [8][]byte) {
	for p := range m {
		b := make([]byte, unix.CmsgSpace(4))
		h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
		h.Level, h.Type = unix.SOL_SOCKET, unix.SO_PRIORITY
		h.SetLen(unix.CmsgLen(4))
		binary.NativeEndian.PutUint32(b[unix.CmsgLen(0):], uint32(p))
		m[p] = b
	}
	return m
}()

// addrPort is the address and port of the sockaddr_in or sockaddr_in6
// in sa.
func addrPort(sa *unix.RawSockaddrInet6) netip.AddrPort {
	port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:])
	if sa.Family == unix.AF_INET {
		sa4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		return netip.AddrPortFrom(netip.AddrFrom4(sa4.Addr), port)
	}
	return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), port)
}

// maxIPUDP is the room ipUDP needs: an IPv6 and a UDP header.
const maxIPUDP = rocewire.IPv6HeaderLen + rocewire.UDPHeaderLen

// ipUDP writes into h (maxIPUDP bytes) the IP and UDP headers the kernel
// sends a datagram of n payload bytes from src to dst with, and returns
// them: IPv4 with DF and ID id, or IPv6 (no ID); the masked fields (TOS
// or traffic class and flow label, TTL or hop limit, checksums) zero.
func ipUDP(h []byte, src, dst netip.AddrPort, n int, id uint16) (ip, udp []byte) {
	if src.Addr().Is4() {
		ip = h[:rocewire.IPv4HeaderLen]
		ip[0], ip[1] = 0x45, 0
		binary.BigEndian.PutUint16(ip[2:], uint16(rocewire.IPv4HeaderLen+rocewire.UDPHeaderLen+n))
		binary.BigEndian.PutUint16(ip[4:], id)
		binary.BigEndian.PutUint16(ip[6:], 0x4000) // DF
		ip[8], ip[9] = 0, unix.IPPROTO_UDP
		ip[10], ip[11] = 0, 0
		s, d := src.Addr().As4(), dst.Addr().As4()
		copy(ip[12:16], s[:])
		copy(ip[16:20], d[:])
	} else {
		ip = h[:rocewire.IPv6HeaderLen]
		ip[0], ip[1], ip[2], ip[3] = 0x60, 0, 0, 0
		binary.BigEndian.PutUint16(ip[4:], uint16(rocewire.UDPHeaderLen+n))
		ip[6], ip[7] = unix.IPPROTO_UDP, 0
		s, d := src.Addr().As16(), dst.Addr().As16()
		copy(ip[8:24], s[:])
		copy(ip[24:40], d[:])
	}
	udp = h[len(ip) : len(ip)+rocewire.UDPHeaderLen]
	binary.BigEndian.PutUint16(udp[0:], src.Port())
	binary.BigEndian.PutUint16(udp[2:], dst.Port())
	binary.BigEndian.PutUint16(udp[4:], uint16(rocewire.UDPHeaderLen+n))
	udp[6], udp[7] = 0, 0
	return ip, udp
}
