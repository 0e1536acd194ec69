// SPDX-License-Identifier: Apache-2.0

package tcp

// Datagrams on the tcp path: a UD SEND is one datagram frame (UD_SEND,
// UD_SEND_IMM; docs/wire-tcp.md, "Datagrams") on the link's connection
// for requests to the destination's host, written from the sending QP's
// goroutine; nothing answers it. The receiving host's connection reader
// hands it to the device (DeliverDatagram), which drops what it cannot
// deliver.

import (
	"sync"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/device"
	"github.com/vrdma/vrdma/internal/hostlink"
	"github.com/vrdma/vrdma/internal/tcpwire"
)

// dgramPath carries an address handle's datagrams to one peer host.
type dgramPath struct {
	peer *hostlink.Peer

	mu     sync.Mutex                   // several QPs may send through one address handle at once
	h      tcpwire.Header               // +checklocks:mu
	prefix [tcpwire.DatagramPrefix]byte // +checklocks:mu
	iov    [1 + abi.MaxSGE][]byte       // +checklocks:mu
}

// Datagrams returns the path of datagrams to host peer over the tcp
// path, for an address handle (device.UDRouter's RouteAH).
func Datagrams(peer *hostlink.Peer) device.DatagramPath { return &dgramPath{peer: peer} }

// Kind is the tcp path's.
func (p *dgramPath) Kind() abi.PathKind { return abi.PathTCP }

// SendDatagram writes d as one frame; a datagram the link cannot carry
// now (no connection within the lookup timeout, a write error) is lost.
func (p *dgramPath) SendDatagram(d *device.Datagram) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t := tcpwire.UDSend
	if d.WithImm {
		t = tcpwire.UDSendImm
	}
	p.h = tcpwire.Header{Type: t, PayloadLen: tcpwire.DatagramPrefix + d.Len, DstQPN: d.DstQPN, SrcQPN: d.SrcQPN,
		RKey: d.QKey, ImmOrLen: d.Imm, RemoteAddr: tcpwire.DatagramRoute(d.TrafficClass, d.HopLimit, d.FlowLabel), Flags: tcpwire.SolicitedOf(true, d.Solicited)}
	tcpwire.PutDatagramPrefix(p.prefix[:], d.SGID, d.DGID)
	p.iov[0] = p.prefix[:]
	n := copy(p.iov[1:], d.Payload)
	_ = p.peer.SendDatagram(&p.h, p.iov[:1+n]) // lost, as UD may lose it
	clear(p.iov[1 : 1+n])
}

// DatagramReceiver returns the handler of datagram frames from peer
// hosts (hostlink.Config.OnDatagram): each goes to sink with its source
// host.
func DatagramReceiver(sink device.DatagramSink) func(fromHost string, h *tcpwire.Header, payload []byte) {
	return func(fromHost string, h *tcpwire.Header, payload []byte) {
		sgid, dgid := tcpwire.DatagramGIDs(payload)
		tc, hop, fl := tcpwire.SplitDatagramRoute(h.RemoteAddr)
		msg := payload[tcpwire.DatagramPrefix:]
		d := device.Datagram{SrcQPN: h.SrcQPN & 0xffffff, DstQPN: h.DstQPN & 0xffffff, SGID: sgid, DGID: dgid, QKey: h.RKey,
			Imm: h.ImmOrLen, WithImm: h.Type == tcpwire.UDSendImm, Solicited: h.Flags&tcpwire.FlagSolicited != 0, TrafficClass: tc, HopLimit: hop, FlowLabel: fl,
			Payload: [][]byte{msg}, Len: uint32(len(msg))}
		sink.DeliverDatagram(&d, device.Via{Path: abi.PathTCP, Host: fromHost})
	}
}
