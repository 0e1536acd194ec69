package rdma

// The engine's datagrams. On IPv4 the ICRC covers the IP header's
// Identification and Flags, which a UDP socket neither shows nor lets one
// set: the socket is unconnected, bound to the uplink's address and port
// 4791, with path MTU discovery on (IP_PMTUDISC_DO), so that the kernel
// sends every datagram with DF set and ID 0 (../shared/specs/rocev2.md
// §3.3, checked by TestEngineWire against tshark's capture). A receiver
// rebuilds the header it cannot see the same way; a peer whose IP header
// differs (a hardware NIC or kernel rxe with non-zero IDs) fails the ICRC
// check and is counted, not served.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/internal/rocewire"
)

// Conn carries the engine's UDP datagrams.
type Conn interface {
	// WriteTo sends one datagram, the concatenation of bufs, to dst, with
	// IP TOS byte tos (the port group's DSCP << 2).
	WriteTo(bufs [][]byte, dst netip.AddrPort, tos uint8) error
	// ReadFrom reads one datagram into b.
	ReadFrom(b []byte) (n int, src netip.AddrPort, err error)
	// LocalAddr is the address and port the datagrams leave from.
	LocalAddr() netip.AddrPort
	Close() error
}

// socketBuffer is the send and receive buffer the engine asks for: a
// burst of a 1 MiB message is a thousand packets, which the default
// (208 KiB) would drop on loopback.
const socketBuffer = 8 << 20

// udpConn is a Conn on a UDP socket.
type udpConn struct {
	c   *net.UDPConn
	raw interface {
		Write(func(fd uintptr) bool) error
	}
	local netip.AddrPort
}

// ListenUDP binds the engine's socket on addr (an IPv4 address; port 0
// means 4791).
func ListenUDP(addr netip.AddrPort) (Conn, error) {
	if !addr.Addr().Is4() {
		return nil, fmt.Errorf("rdma uplink %s: only IPv4 addresses are served yet", addr)
	}
	if addr.Port() == 0 {
		addr = netip.AddrPortFrom(addr.Addr(), rocewire.UDPPort)
	}
	c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(addr))
	if err != nil {
		return nil, fmt.Errorf("rdma uplink: bind UDP %s: %w (is another engine, or kernel rdma_rxe, on the port?)", addr, err)
	}
	rc, err := c.SyscallConn()
	if err != nil {
		c.Close()
		return nil, err
	}
	var serr error
	rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO)
		if serr != nil {
			return
		}
		for _, o := range [][2]int{{unix.SO_SNDBUFFORCE, unix.SO_SNDBUF}, {unix.SO_RCVBUFFORCE, unix.SO_RCVBUF}} {
			if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, o[0], socketBuffer) != nil {
				unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, o[1], socketBuffer) // capped by net.core.[rw]mem_max
			}
		}
	})
	if serr != nil {
		c.Close()
		return nil, fmt.Errorf("rdma uplink %s: IP_MTU_DISCOVER: %w", addr, serr)
	}
	local := c.LocalAddr().(*net.UDPAddr).AddrPort()
	return &udpConn{c: c, raw: rc, local: netip.AddrPortFrom(local.Addr().Unmap(), local.Port())}, nil
}

// WriteTo, ReadFrom, LocalAddr and Close make u a Conn.

// WriteTo sends bufs as one datagram with sendmsg(2), straight from the
// caller's pieces (guest memory among them): no copy in user space. The
// TOS byte travels as an IP_TOS control message, so that QPs of port
// groups with different DSCPs share the socket.
func (u *udpConn) WriteTo(bufs [][]byte, dst netip.AddrPort, tos uint8) error {
	w := sends.Get().(*sendOp)
	w.bufs, w.sa.Addr, w.sa.Port, w.oob = bufs, dst.Addr().As4(), int(dst.Port()), nil
	if tos != 0 {
		w.oob = tosCmsgs[tos]
	}
	werr := u.raw.Write(w.fn)
	err := w.err
	w.bufs, w.err = nil, nil
	sends.Put(w)
	if werr != nil {
		return werr
	}
	if err != nil {
		return os.NewSyscallError("sendmsg", err)
	}
	return nil
}

// sendOp is one sendmsg's arguments and result, pooled with its bound
// method, so that a packet's send allocates nothing (a closure, a
// sockaddr and the error would escape per call otherwise).
type sendOp struct {
	bufs [][]byte
	oob  []byte
	sa   unix.SockaddrInet4
	err  error
	fn   func(fd uintptr) bool // send, bound once
}

var sends = sync.Pool{New: func() any {
	w := &sendOp{}
	w.fn = w.send
	return w
}}

// send is the sendmsg; false asks the runtime to wait until the socket
// can take it.
func (w *sendOp) send(fd uintptr) bool {
	_, w.err = unix.SendmsgBuffers(int(fd), w.bufs, w.oob, &w.sa, unix.MSG_DONTWAIT)
	return !errors.Is(w.err, unix.EAGAIN)
}

// ReadFrom reads one datagram.
func (u *udpConn) ReadFrom(b []byte) (int, netip.AddrPort, error) {
	n, src, err := u.c.ReadFromUDPAddrPort(b)
	return n, netip.AddrPortFrom(src.Addr().Unmap(), src.Port()), err
}

func (u *udpConn) LocalAddr() netip.AddrPort { return u.local }
func (u *udpConn) Close() error              { return u.c.Close() }

// tosCmsgs holds the IP_TOS control message of every TOS byte, built
// once: a packet's sendmsg passes one, read only, and allocates nothing.
var tosCmsgs = func() (m [256][]byte) {
	n := unix.CmsgSpace(4)
	for tos := range m {
		b := make([]byte, n)
		h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
		h.Level, h.Type = unix.IPPROTO_IP, unix.IP_TOS
		h.SetLen(unix.CmsgLen(4))
		binary.NativeEndian.PutUint32(b[unix.CmsgLen(0):], uint32(tos))
		m[tos] = b
	}
	return m
}()

// ipUDP writes into h (28 bytes) the IPv4 and UDP headers the kernel
// sends a datagram of n payload bytes from src to dst with: DF, ID 0; the
// masked fields (TOS, TTL, checksums) are left zero.
func ipUDP(h []byte, src, dst netip.AddrPort, n int) {
	h[0], h[1] = 0x45, 0
	binary.BigEndian.PutUint16(h[2:], uint16(rocewire.IPv4HeaderLen+rocewire.UDPHeaderLen+n))
	binary.BigEndian.PutUint16(h[4:], 0)      // ID
	binary.BigEndian.PutUint16(h[6:], 0x4000) // DF
	h[8], h[9] = 0, unix.IPPROTO_UDP
	h[10], h[11] = 0, 0
	s, d := src.Addr().As4(), dst.Addr().As4()
	copy(h[12:16], s[:])
	copy(h[16:20], d[:])
	u := h[rocewire.IPv4HeaderLen:]
	binary.BigEndian.PutUint16(u[0:], src.Port())
	binary.BigEndian.PutUint16(u[2:], dst.Port())
	binary.BigEndian.PutUint16(u[4:], uint16(rocewire.UDPHeaderLen+n))
	u[6], u[7] = 0, 0
}
