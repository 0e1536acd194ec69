// SPDX-License-Identifier: Apache-2.0

package sys

import (
	"encoding/binary"
	"fmt"
	"net"
	"time"
	"unsafe"

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
// larger than buf, with more than MaxFDsPerMessage descriptors, or whose
// control data does not parse is an error; the descriptors it brought
// are closed, never leaked (takeRights).
func (p *PacketConn) Recv(buf []byte) (int, []int, error) {
	n, oobn, flags, _, err := p.c.ReadMsgUnix(buf, p.oob)
	if err != nil {
		return 0, nil, err
	}
	var fds []int
	if oobn > 0 {
		var perr error
		if fds, perr = takeRights(p.oob[:oobn]); perr != nil {
			return 0, nil, perr
		}
	}
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		closeFDs(fds)
		return 0, nil, fmt.Errorf("message truncated: larger than %d bytes or more than %d descriptors", len(buf), MaxFDsPerMessage)
	}
	if n == 0 && oobn == 0 {
		return 0, nil, net.ErrClosed
	}
	return n, fds, nil
}

// takeRights returns the descriptors the SCM_RIGHTS messages of control
// data oob carry; the kernel has installed them in this process already.
// Control data that does not parse is an error, and then every
// descriptor of it is closed: those of the well-formed messages before
// the bad one, and, when the bad one is an SCM_RIGHTS message whose
// length runs past the data (cut short), those of its descriptors that
// the data holds. A header too short for itself says nothing of what
// follows it: nothing after it is taken for a descriptor (closing a
// number that is not one would close one of the agent's own).
func takeRights(oob []byte) ([]int, error) {
	var fds []int
	hdr := unix.CmsgLen(0)
	for off := 0; off+hdr <= len(oob); {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[off]))
		l, left := uint64(h.Len), uint64(len(oob)-off)
		short, long := l < uint64(hdr), l > left
		if !short && h.Level == unix.SOL_SOCKET && h.Type == unix.SCM_RIGHTS {
			for d := oob[off+hdr : off+int(min(l, left))]; len(d) >= 4; d = d[4:] {
				fds = append(fds, int(int32(binary.NativeEndian.Uint32(d))))
			}
		}
		if short || long {
			closeFDs(fds)
			return nil, fmt.Errorf("malformed control message at byte %d of %d: header length %d (the descriptors it carried are closed)", off, len(oob), l)
		}
		off += unix.CmsgSpace(int(l) - hdr)
	}
	return fds, nil
}

// closeFDs closes descriptors received from a peer that are not kept.
func closeFDs(fds []int) {
	for _, fd := range fds {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
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
