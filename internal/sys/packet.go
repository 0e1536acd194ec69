package sys

import (
	"fmt"
	"net"
	"time"

	"golang.org/x/sys/unix"
)

// MaxFDsPerMessage bounds how many descriptors one message may carry.
const MaxFDsPerMessage = 4

// PacketConn is a SOCK_SEQPACKET Unix connection: message boundaries are
// kept and each message may carry file descriptors. Reads and writes may
// run concurrently with each other, but not with themselves.
type PacketConn struct {
	c   *net.UnixConn
	oob []byte
}

// sendBuffer is the send buffer a PacketConn asks for. A SOCK_SEQPACKET
// message must fit the sender's buffer, whose default (net.core.wmem_default,
// often 208 KiB) is smaller than the largest command message (1 MiB).
const sendBuffer = 2 << 20

// NewPacketConn wraps c, which must be a "unixpacket" connection. It raises
// the socket's send buffer so that messages up to 1 MiB fit: beyond
// net.core.wmem_max with CAP_NET_ADMIN, up to it otherwise.
func NewPacketConn(c *net.UnixConn) *PacketConn {
	if raw, err := c.SyscallConn(); err == nil {
		raw.Control(func(fd uintptr) {
			if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, sendBuffer) != nil {
				unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF, sendBuffer)
			}
		})
	}
	return &PacketConn{c: c, oob: make([]byte, unix.CmsgSpace(4*MaxFDsPerMessage))}
}

// DialPacket connects to the SOCK_SEQPACKET socket at path.
func DialPacket(path string) (*PacketConn, error) {
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, err
	}
	return NewPacketConn(c), nil
}

// Conn returns the underlying connection.
func (p *PacketConn) Conn() *net.UnixConn { return p.c }

// Send writes one message carrying b and, if any, the descriptors fds. The
// descriptors stay owned by the caller.
func (p *PacketConn) Send(b []byte, fds ...int) error {
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	n, oobn, err := p.c.WriteMsgUnix(b, oob, nil)
	if err != nil {
		return err
	}
	if n != len(b) || oobn != len(oob) {
		return fmt.Errorf("short write on unix socket: %d of %d bytes", n, len(b))
	}
	return nil
}

// Recv reads one message into buf and returns its length and the
// descriptors that came with it, which the caller then owns. A message
// larger than buf is an error (its descriptors are closed).
func (p *PacketConn) Recv(buf []byte) (int, []int, error) {
	n, oobn, flags, _, err := p.c.ReadMsgUnix(buf, p.oob)
	if err != nil {
		return 0, nil, err
	}
	var fds []int
	if oobn > 0 {
		msgs, perr := unix.ParseSocketControlMessage(p.oob[:oobn])
		if perr != nil {
			return 0, nil, fmt.Errorf("parse control message: %w", perr)
		}
		for _, m := range msgs {
			got, rerr := unix.ParseUnixRights(&m)
			if rerr == nil {
				fds = append(fds, got...)
			}
		}
	}
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return 0, nil, fmt.Errorf("message truncated: larger than %d bytes or more than %d descriptors", len(buf), MaxFDsPerMessage)
	}
	if n == 0 && oobn == 0 {
		return 0, nil, net.ErrClosed
	}
	return n, fds, nil
}

// Close closes the connection.
func (p *PacketConn) Close() error { return p.c.Close() }

// CloseWrite shuts down the sending side: the peer reads end of file,
// and this end can still read what the peer sends until it closes.
func (p *PacketConn) CloseWrite() error { return p.c.CloseWrite() }

// SetWriteDeadline bounds the time a Send may block; a zero t removes
// the bound.
func (p *PacketConn) SetWriteDeadline(t time.Time) error { return p.c.SetWriteDeadline(t) }

// PeerCred returns the credentials of the process at the other end.
func (p *PacketConn) PeerCred() (*unix.Ucred, error) {
	raw, err := p.c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	return cred, cerr
}
