// SPDX-License-Identifier: Apache-2.0

package rdma

import (
	"net/netip"

	"github.com/vrdma/vrdma/internal/rocewire"
)

// FrameBatch is a RoCE v1 batch of an engine on fc whose uplink has GID
// gid, to the uplink of peerMAC and peerGID, for tests outside the
// package: Add and Flush are batch.add and batch.flush.
type FrameBatch struct{ b *batch }

// NewFrameBatch makes a FrameBatch.
func NewFrameBatch(fc FrameConn, gid netip.Addr, peerMAC [6]byte, peerGID netip.Addr, m Marks) *FrameBatch {
	e := &Engine{fc: fc, link: fc.Link(), gid: gid.As16(), local: netip.AddrPortFrom(netip.AddrFrom16(gid.As16()), 0)}
	return &FrameBatch{newBatch(e, netip.AddrPortFrom(netip.AddrFrom16(peerGID.As16()), 0), peerMAC, m)}
}

// Add is batch.add.
func (f *FrameBatch) Add(h []byte, payload [][]byte, n int) error { return f.b.add(h, payload, n) }

// Flush is batch.flush.
func (f *FrameBatch) Flush() error { return f.b.flush() }

// SetPacketHook makes every engine's reader call f with each packet's
// parsed headers before it finds the packet's QP, until restore is
// called; f may panic.
func SetPacketHook(f func(pkt *rocewire.Packet)) (restore func()) {
	testHookPacket = f
	return func() { testHookPacket = nil }
}
