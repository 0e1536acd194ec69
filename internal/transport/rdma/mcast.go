// SPDX-License-Identifier: Apache-2.0

package rdma

// Multicast on the rdma path, as a kernel RoCE device sends it. A UD
// SEND to a group is one UD packet to DestQP 0xFFFFFF: RoCE v2 sends it
// to the group's IP address (an IPv4 group's from its IPv4-mapped GID),
// UDP port 4791, so that the kernel addresses the frame to the group's
// multicast MAC (01:00:5e:… for IPv4, 33:33:… for IPv6) out of the
// uplink's interface (IP_MULTICAST_IF); RoCE v1 sends a frame with the
// group's GID as its DGID to the MAC 33:33 and the GID's last four bytes
// (rdma_get_mcast_mac). The ICRC covers the group's address as any
// other destination's.
//
// An engine receives a group's packets while the agent has it joined
// (JoinGroup): RoCE v2 with a socket of the group's, bound to the group's
// address and port 4791 and a member of it on the uplink's interface
// (IP_ADD_MEMBERSHIP: the network learns it by IGMP or MLD), its own
// reader; RoCE v1 by accepting frames to the group's MAC and GID. A
// group's packet is served only as a UD packet to QPN 0xFFFFFF, and one
// this uplink sent itself (looped back) is dropped: the agent delivered
// its copies on this host already.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/device"
	"github.com/vrdma/vrdma/internal/rocewire"
)

// groups are the multicast groups an engine receives.
type groups struct {
	mu sync.Mutex
	m  map[netip.Addr]*group // +checklocks:mu
	// v1 are the groups' MACs (RoCE v1).
	// +checklocks:mu
	v1 map[[6]byte]bool
}

// group is one joined group: how many joins hold it, and (RoCE v2) its
// socket.
type group struct {
	refs int
	conn *udpConn
}

// GroupAddr is the IP address of multicast group gid on an uplink of
// family v6 (RoCE v2): an IPv4 group's on an IPv4 uplink, an IPv6 one's
// on an IPv6 uplink; ok false when the group cannot travel on it.
func GroupAddr(gid abi.GID, v6 bool) (netip.Addr, bool) {
	a := netip.AddrFrom16(gid).Unmap()
	if !a.IsMulticast() || a.Is6() != v6 {
		return netip.Addr{}, false
	}
	return a, true
}

// McastMAC is the multicast MAC of group gid on RoCE v1: 33:33 and the
// GID's last four bytes.
func McastMAC(gid abi.GID) [6]byte {
	return [6]byte{0x33, 0x33, gid[12], gid[13], gid[14], gid[15]}
}

// GroupDatagrams returns the path of datagrams to multicast group gid
// through this engine, its packets marked m; ok is false when the group
// cannot travel on the uplink (an IPv6 group on an IPv4 uplink, or the
// other way round).
func (e *Engine) GroupDatagrams(gid abi.GID, m Marks) (device.DatagramPath, bool) {
	if e.fc != nil {
		return &dgramPath{e: e, b: newBatch(e, netip.AddrPortFrom(netip.AddrFrom16(gid), 0), McastMAC(gid), m)}, true
	}
	a, ok := GroupAddr(gid, e.local.Addr().Is6())
	if !ok {
		return nil, false
	}
	return &dgramPath{e: e, b: newBatch(e, netip.AddrPortFrom(a, rocewire.UDPPort), [6]byte{}, m)}, true
}

// JoinGroup has the engine receive multicast group gid's packets until
// as many LeaveGroup; it fails when the group cannot travel on the
// uplink, or its socket cannot be made.
func (e *Engine) JoinGroup(gid abi.GID) error {
	e.mc.mu.Lock()
	defer e.mc.mu.Unlock()
	key := netip.AddrFrom16(gid)
	if g := e.mc.m[key]; g != nil {
		g.refs++
		return nil
	}
	g := &group{refs: 1}
	if e.fc == nil {
		a, ok := GroupAddr(gid, e.local.Addr().Is6())
		if !ok {
			return fmt.Errorf("rdma uplink %s: multicast group %s is not of the uplink's address family", e.local.Addr(), gid)
		}
		c, err := listenGroupBeside(e.conn, a, e.local.Addr())
		if err != nil {
			return err
		}
		g.conn = c
		e.wg.Add(1)
		go e.readGroup(c, a)
	}
	if e.mc.m == nil {
		e.mc.m, e.mc.v1 = map[netip.Addr]*group{}, map[[6]byte]bool{}
	}
	e.mc.m[key] = g
	e.mc.v1[McastMAC(gid)] = true
	return nil
}

// listenGroupBeside opens group a's socket on the uplink's interface
// (local), beside the uplink's own socket conn: a UDP socket of the
// engine's lets the group's bind share its port for that moment.
func listenGroupBeside(conn Conn, a, local netip.Addr) (*udpConn, error) {
	var c *udpConn
	bind := func() (err error) { c, err = listenGroup(a, local); return err }
	var err error
	if u, ok := conn.(*udpConn); ok {
		err = u.withReuse(bind)
	} else {
		err = bind()
	}
	return c, err
}

// LeaveGroup undoes a JoinGroup of gid.
func (e *Engine) LeaveGroup(gid abi.GID) {
	e.mc.mu.Lock()
	defer e.mc.mu.Unlock()
	key := netip.AddrFrom16(gid)
	g := e.mc.m[key]
	if g == nil {
		return
	}
	if g.refs--; g.refs > 0 {
		return
	}
	delete(e.mc.m, key)
	delete(e.mc.v1, McastMAC(gid))
	for k := range e.mc.m {
		e.mc.v1[McastMAC(abi.GID(k.As16()))] = true // another group of the same MAC
	}
	if g.conn != nil {
		g.conn.Close() // its reader ends
	}
}

// closeGroups closes the groups' sockets (Close).
func (e *Engine) closeGroups() {
	e.mc.mu.Lock()
	defer e.mc.mu.Unlock()
	for k, g := range e.mc.m {
		if g.conn != nil {
			g.conn.Close()
		}
		delete(e.mc.m, k)
	}
}

// joinedFrame reports whether a RoCE v1 frame to MAC dst and GID dgid is
// to a group the engine joined.
func (e *Engine) joinedFrame(dst [6]byte, dgid [16]byte) bool {
	if dst[0]&1 == 0 {
		return false
	}
	e.mc.mu.Lock()
	defer e.mc.mu.Unlock()
	return e.mc.v1[dst] && e.mc.m[netip.AddrFrom16(dgid)] != nil && McastMAC(abi.GID(dgid)) == dst
}

// readGroup is the reader of group a's socket c: each packet, checked as
// any (its ICRC with the group's address as the destination), goes to the
// device if it is a UD packet to QPN 0xFFFFFF from another uplink.
func (e *Engine) readGroup(c *udpConn, a netip.Addr) {
	defer e.wg.Done()
	bufs := make([][]byte, maxReads)
	for k := range bufs {
		bufs[k] = make([]byte, readBuffer)
	}
	var reads [maxReads]Read
	var ids idDeltas
	var pkt rocewire.Packet
	dst := netip.AddrPortFrom(a, rocewire.UDPPort)
	gid := abi.GID(a.As16()) // an IPv4 group's IPv4-mapped GID
	for {
		n, err := c.Read(bufs, reads[:])
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			e.log.Warn("rdma uplink: read multicast group", "group", a, "err", err)
			continue
		}
		for k := range n {
			e.groupPacket(bufs[k][:min(reads[k].N, len(bufs[k]))], reads[k].Src, dst, gid, &ids, &pkt)
		}
	}
}

// groupPacket serves one packet b of a group's socket from src.
func (e *Engine) groupPacket(b []byte, src, dst netip.AddrPort, gid abi.GID, ids *idDeltas, pkt *rocewire.Packet) {
	defer func() {
		if r := recover(); r != nil {
			e.panicked(src.String(), r)
		}
	}()
	e.ctr.RxPackets.Add(1)
	e.ctr.RxBytes.Add(uint64(len(b)))
	switch {
	case src.Addr() == e.local.Addr():
		return // looped back: this host's members had their copies
	case len(b) > maxDatagram || len(b) == readBuffer || src.Addr().Is4() != e.local.Addr().Is4():
		e.ctr.Malformed.Add(1)
		return
	case !ids.verify(src, dst, b, 0):
		e.ctr.BadICRC.Add(1)
		return
	}
	if err := rocewire.Parse(b, 0, pkt); err != nil {
		e.ctr.Malformed.Add(1)
		return
	}
	if pkt.DETH == nil || pkt.BTH.DestQP() != abi.MulticastQPN {
		e.ctr.NoQP.Add(1) // a group carries UD datagrams to QPN 0xFFFFFF only
		return
	}
	e.udPacketTo(pkt, src.Addr(), &gid)
}

// listenGroup makes the socket of group a on the uplink at local: bound
// to the group's address and port 4791 (SO_REUSEADDR: the engines of
// several hosts of one network namespace, in tests, share it), a member
// of the group on local's interface.
func listenGroup(a, local netip.Addr) (*udpConn, error) {
	network := "udp4"
	if a.Is6() {
		network = "udp6"
	}
	var serr error
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1) })
	}}
	pc, err := lc.ListenPacket(context.Background(), network, netip.AddrPortFrom(a, rocewire.UDPPort).String())
	if err == nil && serr != nil {
		pc.Close()
		err = serr
	}
	if err != nil {
		return nil, fmt.Errorf("rdma uplink %s: bind the socket of multicast group %s: %w (Linux refuses it while another socket of the network namespace holds UDP port 4791 without SO_REUSEADDR: another RoCE engine, kernel rdma_rxe)", local, a, err)
	}
	c := pc.(*net.UDPConn)
	rc, err := c.SyscallConn()
	if err != nil {
		c.Close()
		return nil, err
	}
	var rcvbuf int
	rc.Control(func(fd uintptr) {
		if a.Is4() {
			serr = unix.SetsockoptIPMreq(int(fd), unix.IPPROTO_IP, unix.IP_ADD_MEMBERSHIP, &unix.IPMreq{Multiaddr: a.As4(), Interface: local.As4()})
		} else {
			serr = unix.SetsockoptIPv6Mreq(int(fd), unix.IPPROTO_IPV6, unix.IPV6_JOIN_GROUP, &unix.IPv6Mreq{Multiaddr: a.As16(), Interface: uint32(ifindexOf(local))})
		}
		rcvbuf = setBuffers(int(fd))
	})
	if serr != nil {
		c.Close()
		return nil, fmt.Errorf("rdma uplink %s: join multicast group %s: %w", local, a, serr)
	}
	return newUDPConn(c, rc, netip.AddrPortFrom(a, rocewire.UDPPort), a.Is6(), rcvbuf), nil
}

// ifindexOf is the index of the interface that holds address a, 0 if
// none does.
func ifindexOf(a netip.Addr) int {
	ifs, err := net.Interfaces()
	if err != nil {
		return 0
	}
	for _, i := range ifs {
		addrs, err := i.Addrs()
		if err != nil {
			continue
		}
		for _, x := range addrs {
			if n, ok := x.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap() == a.Unmap() {
					return i.Index
				}
			}
		}
	}
	return 0
}

// groupFrame serves a RoCE v1 frame to a multicast MAC: a UD packet to
// QPN 0xFFFFFF of a group the engine joined, from another uplink, with
// its ICRC right; others are dropped and counted.
func (e *Engine) groupFrame(fr *rocewire.Frame, pkt *rocewire.Packet, sum *rocewire.Checksummer) *path {
	dgid, sgid := fr.GRH.DGID(), fr.GRH.SGID()
	switch {
	case !e.joinedFrame(fr.Dst, dgid) || sgid == e.gid:
		e.ctr.NoQP.Add(1) // another group's, a broadcast, or looped back from this uplink
		return nil
	case !sum.VerifyGRH(fr.GRH, fr.Transport):
		e.ctr.BadICRC.Add(1)
		return nil
	}
	if err := rocewire.Parse(fr.Transport, 0, pkt); err != nil {
		e.ctr.Malformed.Add(1)
		return nil
	}
	if pkt.DETH == nil || pkt.BTH.DestQP() != abi.MulticastQPN {
		e.ctr.NoQP.Add(1)
		return nil
	}
	g := abi.GID(dgid)
	e.udPacketTo(pkt, netip.AddrFrom16(sgid), &g)
	return nil
}
