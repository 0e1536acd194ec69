// SPDX-License-Identifier: Apache-2.0

package rdma

import (
	"log/slog"
	"net/netip"
	"testing"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/device"
	"github.com/vrdma/vrdma/internal/rocewire"
)

// FuzzGroupPacket feeds hostile packets to the reader of a multicast
// group's socket, from another uplink, sealed with a right ICRC or not:
// any opcode, DestQP, header and payload. It must not panic (a panic is
// recovered and counted: that fails the target too), and it must count
// every packet once, as received; a packet with a right ICRC that is not
// a UD packet to QPN 0xFFFFFF is counted as for no QP; exactly the
// datagrams to the group with a right ICRC reach the device (which drops
// them: the group has no member), nothing else.
func FuzzGroupPacket(f *testing.F) {
	e := &Engine{dev: device.New(device.Config{}), local: netip.MustParseAddrPort("192.0.2.1:4791"), log: slog.New(slog.DiscardHandler)}
	src := netip.MustParseAddrPort("192.0.2.2:4791")
	dst := netip.MustParseAddrPort("239.1.2.3:4791")
	gid := abi.GID(dst.Addr().As16())
	ud := func(op rocewire.Opcode, qpn uint32, rest ...byte) []byte {
		b := make([]byte, rocewire.BTHLen+rocewire.DETHLen, 128)
		rocewire.BTH(b).Encode(&rocewire.BTHFields{Opcode: op, PKey: rocewire.DefaultPKey, DestQP: qpn})
		rocewire.DETH(b[rocewire.BTHLen:]).Encode(abi.UDPQKey, 7)
		return append(b, rest...)
	}
	f.Add(ud(rocewire.UDSendOnly, abi.MulticastQPN, make([]byte, SourceGIDLen+64)...), true)
	f.Add(ud(rocewire.UDSendOnlyWithImmediate, abi.MulticastQPN, make([]byte, 4+SourceGIDLen+1)...), true)
	f.Add(ud(rocewire.UDSendOnly, 7, make([]byte, SourceGIDLen+8)...), true)
	f.Add(ud(rocewire.UDSendOnly, abi.MulticastQPN, 1, 2, 3), true)
	f.Add(ud(rocewire.SendOnly, abi.MulticastQPN, make([]byte, 32)...), true)
	f.Add(ud(rocewire.UDSendOnly, abi.MulticastQPN, make([]byte, SourceGIDLen+64)...), false)
	var ids idDeltas
	var pkt rocewire.Packet
	f.Fuzz(func(t *testing.T, tp []byte, seal bool) {
		if len(tp) < rocewire.BTHLen || len(tp) > 4200 {
			return
		}
		b := append(append([]byte(nil), tp...), 0, 0, 0, 0)
		if seal {
			var h [maxIPUDP]byte
			ip, udp := ipUDP(h[:], src, dst, len(b), 0)
			if err := rocewire.PutICRC(ip, udp, b); err != nil {
				t.Fatal(err)
			}
		}
		rx, noQP, dropped := e.ctr.RxPackets.Load(), e.ctr.NoQP.Load(), e.dev.(*device.Device).UDDropped()
		e.groupPacket(b, src, dst, gid, &ids, &pkt)
		if e.ctr.Panics.Load() != 0 {
			t.Fatalf("serving packet %x panicked", b)
		}
		if e.ctr.RxPackets.Load() != rx+1 {
			t.Fatalf("packet %x counted %d times", b, e.ctr.RxPackets.Load()-rx)
		}
		err := rocewire.Parse(b, 0, &pkt)
		if seal && len(b) <= maxDatagram && err == nil && (pkt.DETH == nil || pkt.BTH.DestQP() != abi.MulticastQPN) && e.ctr.NoQP.Load() != noQP+1 {
			t.Fatalf("packet %x, no UD packet to the group's QPN, not counted as for no QP", b)
		}
		reached := e.dev.(*device.Device).UDDropped() - dropped
		if seal && len(b) <= maxDatagram && err == nil && pkt.DETH != nil && pkt.BTH.DestQP() == abi.MulticastQPN && len(pkt.Payload) >= SourceGIDLen {
			if reached != 1 {
				t.Fatalf("packet %x, a datagram to the group, did not reach the device (which drops it: no member)", b)
			}
		} else if reached != 0 {
			t.Fatalf("packet %x reached the device", b)
		}
	})
}
