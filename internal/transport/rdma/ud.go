// SPDX-License-Identifier: Apache-2.0

package rdma

// Datagrams on the rdma path: a UD SEND is one RoCE UD packet, opcode
// UD_SEND_ONLY (0x64) or UD_SEND_ONLY_WITH_IMMEDIATE (0x65), BTH + DETH
// (the Q_Key and the source QP) [+ ImmDt], with its ICRC, to the
// destination host's uplink (RoCE v2: UDP 4791; RoCE v1: an Ethernet
// frame with a GRH). The IP header (v1: the GRH) names the uplinks, not
// the adapters, so the payload starts with the sending adapter's GID
// (SourceGIDLen bytes), then the message (docs/wire-rdma.md, "UD"). No
// packet answers it; a packet the destination cannot deliver is dropped
// there and counted (device.DeliverDatagram).

import (
	"net/netip"
	"sync"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/device"
	"github.com/vrdma/vrdma/internal/rocewire"
)

// SourceGIDLen is the length of the sending adapter's GID in front of a
// UD packet's message.
const SourceGIDLen = 16

// dgramPath carries an address handle's datagrams to one peer uplink.
type dgramPath struct {
	e *Engine

	mu     sync.Mutex                                                   // several QPs may send through one address handle at once
	b      *batch                                                       // +checklocks:mu
	psn    uint32                                                       // +checklocks:mu
	hdr    [rocewire.BTHLen + rocewire.DETHLen + rocewire.ImmDtLen]byte // +checklocks:mu
	prefix [SourceGIDLen]byte                                           // +checklocks:mu
	iov    [1 + abi.MaxSGE][]byte                                       // +checklocks:mu
}

// Datagrams returns the rdma path of datagrams to the uplink at peer
// (port 0 means 4791) of a RoCE v2 engine, its packets carrying marks m,
// for an address handle (device.UDRouter's RouteAH).
func (e *Engine) Datagrams(peer netip.AddrPort, m Marks) device.DatagramPath {
	if peer.Port() == 0 {
		peer = netip.AddrPortFrom(peer.Addr(), rocewire.UDPPort)
	}
	return &dgramPath{e: e, b: newBatch(e, peer, [6]byte{}, m)}
}

// DatagramFrames is Datagrams for a RoCE v1 engine: the peer is the
// uplink of GID gid on interface MAC mac (BindFrames).
func (e *Engine) DatagramFrames(mac [6]byte, gid netip.Addr, m Marks) device.DatagramPath {
	peer := netip.AddrPortFrom(netip.AddrFrom16(gid.As16()), 0)
	return &dgramPath{e: e, b: newBatch(e, peer, mac, m)}
}

// Kind is rdma.
func (p *dgramPath) Kind() abi.PathKind { return abi.PathRDMA }

// SendDatagram sends d as one packet; one the socket cannot take now is
// lost, as UD may lose it.
func (p *dgramPath) SendDatagram(d *device.Datagram) {
	p.mu.Lock()
	defer p.mu.Unlock()
	op := rocewire.UDSendOnly
	n := rocewire.BTHLen + rocewire.DETHLen
	if d.WithImm {
		op = rocewire.UDSendOnlyWithImmediate
		rocewire.ImmDt(p.hdr[n:]).Encode(d.Imm)
		n += rocewire.ImmDtLen
	}
	size := SourceGIDLen + int(d.Len)
	rocewire.BTH(p.hdr[:]).Encode(&rocewire.BTHFields{Opcode: op, Solicited: d.Solicited, PadCount: rocewire.PadCount(size), PKey: rocewire.DefaultPKey,
		DestQP: d.DstQPN, PSN: p.psn})
	p.psn = (p.psn + 1) & rocewire.PSNMask
	rocewire.DETH(p.hdr[rocewire.BTHLen:]).Encode(d.QKey, d.SrcQPN)
	p.prefix = d.SGID
	p.iov[0] = p.prefix[:]
	k := copy(p.iov[1:], d.Payload)
	if p.b.add(p.hdr[:n], p.iov[:1+k], size) == nil {
		_ = p.b.flush() // lost, as UD may lose it
	}
	clear(p.iov[1 : 1+k])
}

// udPacket hands UD packet pkt from src (the peer uplink's address; RoCE
// v1: its GID) to the device, which delivers or drops it.
func (e *Engine) udPacket(pkt *rocewire.Packet, src netip.Addr) { e.udPacketTo(pkt, src, nil) }

// udPacketTo is udPacket for a packet to multicast group *group, or, when
// group is nil, to the adapter of its DestQP.
func (e *Engine) udPacketTo(pkt *rocewire.Packet, src netip.Addr, group *abi.GID) {
	sink, ok := e.dev.(device.DatagramSink)
	if !ok || len(pkt.Payload) < SourceGIDLen || pkt.DETH == nil {
		e.ctr.Malformed.Add(1)
		return
	}
	msg := pkt.Payload[SourceGIDLen:]
	d := device.Datagram{SrcQPN: pkt.DETH.SrcQP(), DstQPN: pkt.BTH.DestQP(), SGID: abi.GID(pkt.Payload[:SourceGIDLen]),
		QKey: pkt.DETH.QKey(), Solicited: pkt.BTH.Solicited(), Payload: [][]byte{msg}, Len: uint32(len(msg))}
	if pkt.ImmDt != nil {
		d.Imm, d.WithImm = pkt.ImmDt.Imm(), true
	}
	if group != nil {
		d.DGID = *group
	} else if q := e.dev.Target(d.DstQPN); q != nil {
		d.DGID = q.GID() // the packet names the destination's uplink, not its adapter: the QPN names the adapter
	}
	sink.DeliverDatagram(&d, device.Via{Path: abi.PathRDMA, Addr: src.Unmap()})
}
