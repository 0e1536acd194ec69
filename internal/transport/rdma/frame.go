// SPDX-License-Identifier: Apache-2.0

package rdma

// RoCE v1 (docs/wire-rdma.md, "RoCE v1"): the same
// transport in Ethernet frames of Ethertype 0x8915, a GRH where RoCE v2
// has IP and UDP, through an AF_PACKET socket (SOCK_RAW, protocol
// ETH_P_IBOE; root, CAP_NET_RAW) bound to the uplink's interface. The
// engine writes every frame whole — Ethernet header, the 802.1Q tag that
// carries the port group's PFC priority as PCP and its VLAN, GRH, the
// transport packet — and the kernel sends it as is. There is no
// segmentation offload for such frames: a batch is one sendmmsg(2) of one
// message per frame, and the reader takes up to rxFrames frames per
// recvmmsg(2). The receiving socket sees frames with their tag stripped
// (the kernel takes it off before a protocol socket sees the frame, and
// an ETH_P_IBOE socket gets no VLAN information), so the receiver cannot
// check the sender's VLAN or PCP: the tag is for the switches between.
// Each frame also has the PFC priority as its socket priority (an
// SO_PRIORITY control message), which picks the queue of a NIC that
// maps priorities to traffic classes.
//
// Addressing: a frame's SGID and DGID are the two uplinks' GIDs — those
// of their IP addresses, IPv4-mapped (::ffff:a.b.c.d) for IPv4, the
// GIDs the host records already hold, as ConnectX "method 2" stacks use
// for RoCE v1 too — and its Ethernet addresses the two uplink
// interfaces' MACs, the peer's from its host record (records.Uplink.MAC).
// A frame is served only if its destination MAC and DGID are this
// uplink's, its ICRC is right, and its source MAC and SGID are those of
// the peer the QP it names is connected to.

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/internal/device"
	"github.com/vrdma/vrdma/internal/rocewire"
)

// FrameConn carries the engine's RoCE v1 frames.
type FrameConn interface {
	// WriteFrames sends frames: frame k is the concatenation of
	// bufs[ends[k-1]:ends[k]] (ends[-1] being 0); each with socket
	// priority prio (0–7), which picks a NIC's queue for the PFC
	// priority, as the tag's PCP tells the switches.
	WriteFrames(bufs [][]byte, ends []int, prio uint8) error
	// ReadFrames reads up to len(bufs) frames, waiting for the first:
	// frame k into bufs[k], lens[k] its length (more than len(bufs[k])
	// when it did not fit). Only the engine's reader calls it.
	ReadFrames(bufs [][]byte, lens []int) (int, error)
	// Link is the interface the frames travel on.
	Link() Link
	Close() error
}

// Link is the Ethernet interface of a RoCE v1 uplink.
type Link struct {
	Name  string
	Index int
	MAC   [6]byte
	MTU   int // the interface's: the GRH and the transport packet must fit
}

// rxFrames is the most frames the reader takes per system call;
// maxFrame the largest frame it takes whole (a 9000-byte MTU's and a
// tag, rounded up), and one byte to tell a longer one.
const (
	rxFrames = 32
	maxFrame = 9216 + 1
)

// InterfaceOf returns the name of the interface that holds address a.
func InterfaceOf(a netip.Addr) (string, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return "", err
	}
	for _, ifc := range ifs {
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, x := range addrs {
			if n, ok := x.(*net.IPNet); ok {
				if b, ok := netip.AddrFromSlice(n.IP); ok && b.Unmap() == a.Unmap() {
					return ifc.Name, nil
				}
			}
		}
	}
	return "", fmt.Errorf("no interface holds address %s", a)
}

// packetConn is a FrameConn on an AF_PACKET socket.
type packetConn struct {
	f      *os.File
	raw    syscall.RawConn
	link   Link
	rcvbuf int // the receive buffer the kernel gave (setBuffers)

	sends spares[frameSend] // the senders' sendmmsg state, for reuse

	prio7Denied atomic.Bool // priority 7 needs CAP_NET_ADMIN: once refused, left off
	closed      atomic.Bool // Close was called

	// The reader's: recvmmsg's arguments and result.
	rmsgs  [rxFrames]unix.Mmsghdr
	riov   [rxFrames]unix.Iovec
	rname  [rxFrames]unix.RawSockaddrLinklayer
	rn     int // frames read, 0 for none yet, -1 for an error
	rerr   error
	polled time.Time
	pollFn func(fd uintptr)
	readFn func(fd uintptr) bool
}

// htons is x in network byte order, as AF_PACKET takes protocols.
func htons(x uint16) uint16 { return x<<8 | x>>8 }

// ListenFrames opens the RoCE v1 socket on interface ifname: an
// Ethernet interface with a MAC (not loopback). It needs CAP_NET_RAW.
func ListenFrames(ifname string) (FrameConn, error) {
	ifc, err := net.InterfaceByName(ifname)
	if err != nil {
		return nil, fmt.Errorf("rdma uplink RoCE v1: %w", err)
	}
	var mac [6]byte
	if len(ifc.HardwareAddr) != 6 || ifc.Flags&net.FlagLoopback != 0 || [6]byte(ifc.HardwareAddr) == mac {
		return nil, fmt.Errorf("rdma uplink RoCE v1 on %s: not an Ethernet interface with a MAC (RoCE v1 frames are addressed by MAC)", ifname)
	}
	mac = [6]byte(ifc.HardwareAddr)
	// Protocol 0 until the bind: opened for ETH_P_IBOE, the socket would
	// take the RoCE v1 frames of every interface until it is bound to
	// this one.
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("rdma uplink RoCE v1 on %s: AF_PACKET socket: %w (needs root: CAP_NET_RAW)", ifname, err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IBOE), Ifindex: ifc.Index}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("rdma uplink RoCE v1 on %s: bind: %w", ifname, err)
	}
	// Frames this socket sends are not read back (Linux 4.20).
	unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_IGNORE_OUTGOING, 1)
	rcvbuf := setBuffers(fd)
	f := os.NewFile(uintptr(fd), "rocev1:"+ifname) // non-blocking: in the runtime's poller
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	c := &packetConn{f: f, link: Link{Name: ifname, Index: ifc.Index, MAC: mac, MTU: ifc.MTU}, rcvbuf: rcvbuf, sends: newSpares(newFrameSend)}
	c.raw = rc
	c.pollFn, c.readFn = c.pollOnce, c.readOnce
	return c, nil
}

func (c *packetConn) Link() Link { return c.link }

// ReceiveBuffer is the socket's receive buffer in bytes.
func (c *packetConn) ReceiveBuffer() int { return c.rcvbuf }

// Close closes the socket: a ReadFrames after it returns net.ErrClosed.
func (c *packetConn) Close() error {
	c.closed.Store(true)
	return c.f.Close()
}

// WriteFrames sends the frames with sendmmsg(2), straight from the
// caller's pieces (guest memory among them), the priority as an
// SO_PRIORITY control message on each. A frame the device's queue drops
// (ENOBUFS) is lost, as on a wire; the RC rules recover it. A priority
// the kernel refuses (7 without CAP_NET_ADMIN) is left off from then on.
func (c *packetConn) WriteFrames(bufs [][]byte, ends []int, prio uint8) error {
	if len(ends) > maxSegments || len(bufs) > maxIOV || len(ends) > 0 && ends[len(ends)-1] > len(bufs) {
		return fmt.Errorf("rdma uplink RoCE v1: %d frames in %d pieces: at most %d frames in %d pieces", len(ends), len(bufs), maxSegments, maxIOV)
	}
	for k, prev := 0, 0; k < len(ends); prev, k = ends[k], k+1 {
		if ends[k] < prev {
			return fmt.Errorf("rdma uplink RoCE v1: frame ends %v out of order", ends)
		}
	}
	w := c.sends.get()
	w.n, w.sent, w.err = 0, 0, nil
	var ctl []byte
	if prio != 0 && prio < 8 && !(prio == 7 && c.prio7Denied.Load()) {
		ctl = prioCmsgs[prio] // read only: shared by every send
	}
	nv, start := 0, 0
	for k, end := range ends {
		first := nv
		for _, b := range bufs[start:end] {
			if len(b) > 0 {
				w.iov[nv].Base, w.iov[nv].Len = &b[0], uint64(len(b))
				nv++
			}
		}
		start = end
		h := &w.hdrs[k].Hdr
		*h = unix.Msghdr{}
		h.Iov, h.Iovlen = &w.iov[first], uint64(nv-first)
		if ctl != nil {
			h.Control, h.Controllen = &ctl[0], uint64(len(ctl))
		}
		w.n++
	}
	werr := c.raw.Write(w.fn)
	err := w.err
	if errors.Is(err, unix.EPERM) && ctl != nil {
		c.prio7Denied.Store(true)
		for k := w.sent; k < w.n; k++ {
			w.hdrs[k].Hdr.Control, w.hdrs[k].Hdr.Controllen = nil, 0
		}
		w.err = nil
		werr, err = c.raw.Write(w.fn), w.err
	}
	clear(w.iov[:nv]) // no reference to guest memory outlives the send
	for k := range w.n {
		w.hdrs[k].Hdr.Iov, w.hdrs[k].Hdr.Control = nil, nil
	}
	c.sends.put(w)
	if werr != nil {
		return werr
	}
	if err != nil {
		return os.NewSyscallError("sendmmsg", err)
	}
	return nil
}

// frameSend is one sendmmsg's arguments and progress, kept for reuse with its
// bound method.
type frameSend struct {
	hdrs    [maxSegments]unix.Mmsghdr
	iov     [maxIOV]unix.Iovec
	n, sent int
	err     error
	fn      func(fd uintptr) bool
}

func newFrameSend() *frameSend {
	w := &frameSend{}
	w.fn = w.send
	return w
}

// send is the sendmmsg of the frames not sent yet (sendmmsgFrom): a
// frame the device's queue drops is lost.
func (w *frameSend) send(fd uintptr) bool {
	var done bool
	done, w.err = sendmmsgFrom(fd, w.hdrs[:w.n], &w.sent, true)
	return done
}

// ReadFrames reads with recvmmsg(2): polling first for readPoll after
// the last frames came, then waiting in the runtime's poller.
func (c *packetConn) ReadFrames(bufs [][]byte, lens []int) (int, error) {
	n := min(len(bufs), len(lens), rxFrames)
	if n == 0 {
		return 0, nil
	}
	for k := range n {
		c.riov[k].Base, c.riov[k].Len = &bufs[k][0], uint64(len(bufs[k]))
	}
	c.rn, c.rerr = 0, nil
	if !c.polled.IsZero() {
		deadline := c.polled.Add(readPoll)
		for {
			c.rn = n
			if err := c.raw.Control(c.pollFn); err != nil {
				return 0, c.closedErr(err)
			}
			if c.rn != 0 {
				break
			}
			device.YieldCPU()
			if time.Now().After(deadline) {
				break
			}
		}
	}
	if c.rn == 0 {
		c.rn = n
		if err := c.raw.Read(c.readFn); err != nil {
			return 0, c.closedErr(err)
		}
	}
	if c.rn < 0 {
		return 0, os.NewSyscallError("recvmmsg", c.rerr)
	}
	got := c.rn
	for k := range got {
		lens[k] = int(c.rmsgs[k].Len)
		if c.rmsgs[k].Hdr.Flags&unix.MSG_TRUNC != 0 {
			lens[k] = len(bufs[k]) + 1
		}
	}
	c.polled = time.Now()
	return got, nil
}

// closedErr returns net.ErrClosed for an error of the socket after Close
// (the file's raw Read says os.ErrClosed, its Control the poller's own
// "use of closed file"), err otherwise: the engine's receive loop stops
// on net.ErrClosed.
func (c *packetConn) closedErr(err error) error {
	if c.closed.Load() || errors.Is(err, os.ErrClosed) {
		return net.ErrClosed
	}
	return err
}

// pollOnce is one non-blocking recvmmsg of up to c.rn frames; it leaves
// in c.rn how many came, 0 for none, -1 for an error.
func (c *packetConn) pollOnce(fd uintptr) {
	n := c.rn
	for k := range n {
		h := &c.rmsgs[k].Hdr
		*h = unix.Msghdr{Name: (*byte)(unsafe.Pointer(&c.rname[k])), Namelen: unix.SizeofSockaddrLinklayer, Iov: &c.riov[k], Iovlen: 1}
		c.rmsgs[k].Len = 0
	}
	for {
		r, _, errno := unix.RawSyscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&c.rmsgs[0])), uintptr(n), unix.MSG_DONTWAIT, 0, 0)
		switch errno {
		case 0:
			c.rn = int(r)
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			c.rn = 0
		default:
			c.rn, c.rerr = -1, errno
		}
		return
	}
}

// readOnce is pollOnce for the runtime's poller: false (wait) when
// nothing came.
func (c *packetConn) readOnce(fd uintptr) bool {
	n := c.rn
	c.pollOnce(fd)
	if c.rn == 0 {
		c.rn = n
		return false
	}
	return true
}

// maxFrameHeader is the Ethernet header, tag and GRH before every frame's
// transport packet.
const maxFrameHeader = rocewire.EthHeaderLen + rocewire.VLANTagLen + rocewire.GRHLen

// frames is what a batch of RoCE v1 frames adds to a batch: each frame's
// Ethernet header and GRH, made from the path's template, and where each
// frame's pieces end.
type frames struct {
	tmpl [maxFrameHeader]byte
	tlen int
	hdr  [maxSegments][maxFrameHeader]byte
	ends [maxSegments]int
}

// newFrames makes the header template of the frames from engine e to
// the uplink of MAC mac and GID gid, marked m: tagged when the port
// group has a VLAN or a priority (VID 0 is a priority-only tag).
func newFrames(e *Engine, mac [6]byte, gid netip.Addr, m Marks) *frames {
	f := &frames{}
	eth := rocewire.EthHeader(f.tmpl[:], mac, e.link.MAC, m.VLAN != 0 || m.Priority != 0, rocewire.TCI(m.Priority, m.VLAN))
	rocewire.GRH(f.tmpl[len(eth):]).Encode(&rocewire.GRHFields{TClass: m.TOS, HopLimit: rocewire.DefaultHopLimit, SGID: e.local.Addr().As16(), DGID: gid.As16()})
	f.tlen = len(eth) + rocewire.GRHLen
	return f
}

// addFrame is batch.add for RoCE v1: any sizes may share a batch.
func (b *batch) addFrame(h []byte, payload [][]byte, n int) error {
	var err error
	f := b.f
	padN := int(rocewire.PadCount(n))
	size := len(h) + n + padN + rocewire.ICRCLen
	if b.n > 0 && (b.n == maxSegments || len(b.iov)+len(payload)+3 > maxIOV) {
		err = b.flush()
	}
	k := b.n
	eg := f.hdr[k][:f.tlen]
	copy(eg, f.tmpl[:f.tlen])
	grh := rocewire.GRH(eg[f.tlen-rocewire.GRHLen:])
	grh.SetPayLen(uint16(size))
	hdr := b.hdr[k][:copy(b.hdr[k][:], h)]
	trail := b.trail[k][:padN+rocewire.ICRCLen]
	clear(trail[:padN])
	start := len(b.iov)
	b.iov = append(b.iov, eg, hdr)
	b.iov = append(b.iov, payload...)
	b.iov = append(b.iov, trail[:padN])
	crc, cerr := b.sum.SumGRH(grh, b.iov[start+1:])
	if cerr != nil {
		b.iov = b.iov[:start]
		return cerr
	}
	b.seal(trail, padN, crc)
	f.ends[k] = len(b.iov)
	b.n++
	b.bytes += f.tlen + size
	return err
}

// readFrames is the RoCE v1 engine's receive loop: the frames of one
// read are served one by one, and what the responders answered goes out
// once they all are.
func (e *Engine) readFrames() {
	defer e.wg.Done()
	bufs := make([][]byte, rxFrames)
	for k := range bufs {
		bufs[k] = make([]byte, maxFrame)
	}
	var lens [rxFrames]int
	var fr rocewire.Frame
	var pkt rocewire.Packet
	var sum rocewire.Checksummer
	var answered answering
	for {
		n, err := e.fc.ReadFrames(bufs, lens[:])
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			e.log.Warn("rdma uplink: read frames", "err", err)
			time.Sleep(time.Millisecond)
			continue
		}
		if n > 1 {
			e.ctr.RxBatches.Add(1)
		}
		for k := range n {
			answered.add(e.safeFrame(bufs[k], lens[k], &fr, &pkt, &sum))
		}
		answered.flush()
	}
}

// safeFrame is frame, except that a panic in it — a bug reached by a
// frame — drops that frame only, logged and counted as the engine's
// packet does.
func (e *Engine) safeFrame(buf []byte, l int, fr *rocewire.Frame, pkt *rocewire.Packet, sum *rocewire.Checksummer) (p *path) {
	defer func() {
		if r := recover(); r != nil {
			p = nil
			e.panicked("a RoCE v1 frame", r)
		}
	}()
	return e.frame(buf, l, fr, pkt, sum)
}

// frame checks one received frame, the first l bytes of buf, and hands
// its packet to its QP; it returns the path whose responder served it.
// A frame too long for buf, or shorter than an Ethernet header, is
// dropped and counted as malformed; one whose destination MAC is not
// this interface's (a bridge floods what it has not learnt; multicast,
// broadcast) as for no QP — the engine checks the MAC itself: the kernel
// classes a frame tagged with a VID no VLAN interface has as for another
// host even when it is addressed to this one; then one that does not
// parse as malformed, one whose DGID is not this uplink's as for no QP,
// one whose ICRC is wrong as such: nothing of a dropped frame reaches a
// QP.
func (e *Engine) frame(buf []byte, l int, fr *rocewire.Frame, pkt *rocewire.Packet, sum *rocewire.Checksummer) *path {
	e.ctr.RxPackets.Add(1)
	if l < rocewire.EthHeaderLen || l > len(buf)-1 {
		e.ctr.Malformed.Add(1)
		return nil
	}
	e.ctr.RxBytes.Add(uint64(l))
	mcast := [6]byte(buf[:6])[0]&1 != 0
	if [6]byte(buf[:6]) != e.link.MAC && !mcast {
		e.ctr.NoQP.Add(1)
		return nil
	}
	if err := rocewire.ParseFrame(buf[:l], fr); err != nil || len(fr.Transport) > maxDatagram {
		e.ctr.Malformed.Add(1)
		return nil
	}
	if mcast {
		return e.groupFrame(fr, pkt, sum) // mcast.go
	}
	if fr.GRH.DGID() != e.gid {
		e.ctr.NoQP.Add(1)
		return nil
	}
	if !sum.VerifyGRH(fr.GRH, fr.Transport) {
		e.ctr.BadICRC.Add(1)
		return nil
	}
	return e.dispatch(fr.Transport, netip.AddrPortFrom(netip.AddrFrom16(fr.GRH.SGID()), 0), &fr.Src, pkt)
}
