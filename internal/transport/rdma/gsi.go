// SPDX-License-Identifier: Apache-2.0

package rdma

// QP1, the General Services Interface: RDMA CM's MADs travel as UD
// SEND_ONLY packets from QP1 to QP1 with the GSI Q_Key, the MAD (256
// bytes) their whole payload, as a kernel RoCE device sends them. Unlike
// vrdma's own datagrams (ud.go) they carry no source GID in front: they
// are for peers that are not vrdma hosts. The engine hands every packet
// to QP1 to Config.GSI, whoever sent it; the receiver checks the MAD.

import (
	"net/netip"

	"github.com/vrdma/vrdma/internal/rocewire"
)

// gsiPacket hands UD packet pkt to QP1 from src to Config.GSI, or drops
// it and counts it: no receiver (NoQP; NotVRDMA from a peer that is no
// vrdma host), a Q_Key other than the GSI's, or a payload that is not one
// MAD (Malformed).
func (e *Engine) gsiPacket(pkt *rocewire.Packet, src netip.Addr) {
	switch {
	case e.cfg.GSI == nil && !e.member(src):
		e.ctr.NotVRDMA.Add(1)
	case e.cfg.GSI == nil:
		e.ctr.NoQP.Add(1)
	case pkt.DETH.QKey() != rocewire.QP1QKey || len(pkt.Payload) != rocewire.MADLen || pkt.ImmDt != nil:
		e.ctr.Malformed.Add(1)
	default:
		e.cfg.GSI(src.Unmap(), pkt.DETH.SrcQP(), pkt.Payload)
	}
}

// SendGSI sends mad (one MAD, rocewire.MADLen bytes) from QP1 to QP1 of
// the RoCE endpoint at peer (UDP 4791), with the GSI Q_Key. A packet the
// socket cannot take now is lost, as a MAD may be: CM resends.
func (e *Engine) SendGSI(peer netip.Addr, mad []byte) {
	b := newBatch(e, netip.AddrPortFrom(peer, rocewire.UDPPort), [6]byte{}, Marks{})
	var hdr [rocewire.BTHLen + rocewire.DETHLen]byte
	rocewire.BTH(hdr[:]).Encode(&rocewire.BTHFields{Opcode: rocewire.UDSendOnly, PadCount: rocewire.PadCount(len(mad)),
		PKey: rocewire.DefaultPKey, DestQP: rocewire.GSIQPN})
	rocewire.DETH(hdr[rocewire.BTHLen:]).Encode(rocewire.QP1QKey, rocewire.GSIQPN)
	if b.add(hdr[:], [][]byte{mad}, len(mad)) == nil {
		_ = b.flush() // lost, as a MAD may be
	}
}
