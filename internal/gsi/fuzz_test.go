// SPDX-License-Identifier: Apache-2.0

package gsi

import (
	"context"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/rocewire"
)

// FuzzReceive: any run of MADs from a peer — whole or cut short, of any
// attribute, naming the connection in progress or not — is dropped,
// answered or taken, never a panic, and the Manager follows at most
// MaxConns connections. data is cut into MADs of rocewire.MADLen bytes;
// the first two bytes of each say whether to aim it at the connection
// the listener holds (its comm IDs written in).
func FuzzReceive(f *testing.F) {
	var m [rocewire.MADLen]byte
	mad := rocewire.MAD(m[:])
	seed := func(attr rocewire.CMAttr, put func(rocewire.MAD)) []byte {
		mad.EncodeCM(7, attr)
		put(mad)
		return append([]byte(nil), m[:]...)
	}
	req := seed(rocewire.AttrREQ, func(d rocewire.MAD) {
		r := rocewire.REQ{LocalCommID: 9, ServiceID: rocewire.ServiceID(rocewire.PortSpaceTCP, 7471), LocalQPN: 0x11, PathMTU: 3, MaxCMRetries: 2}
		(&rocewire.CMAHeader{Src: addrA, Dst: addrB}).Put(r.PrivateData[:])
		r.Put(d)
	})
	f.Add(req)
	for _, a := range []rocewire.CMAttr{rocewire.AttrRTU, rocewire.AttrREJ, rocewire.AttrMRA, rocewire.AttrDREQ, rocewire.AttrDREP, rocewire.AttrREP} {
		f.Add(append(append([]byte(nil), req...), seed(a, func(d rocewire.MAD) { d.Data()[0] = 1 })...))
	}
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, data []byte) {
		b := New(Config{Send: func(netip.Addr, []byte) {}, Local: addrB, ResponseTimeout: 8, MaxRetries: 1,
			Serve:       func(*Request) (Accepted, error) { return Accepted{QPN: 0x22, PSN: 1}, nil },
			Established: func(uint32, uint32, abi.GID) {}, Gone: func(uint32, uint32, abi.GID) {}, Failed: func(uint32, uint32, abi.GID, uint16) {}})
		a := New(Config{Send: func(to netip.Addr, mad []byte) { b.Receive(addrA, rocewire.GSIQPN, mad) }, Local: addrA, ResponseTimeout: 8, MaxRetries: 0})
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		a.Dial(ctx, DialParams{Peer: addrB, Port: 7471, QPN: 0x11, MTU: 1024}) // one connection in progress at b
		for len(data) > 0 {
			n := min(len(data), rocewire.MADLen)
			piece := append([]byte(nil), data[:n]...)
			data = data[n:]
			if n == rocewire.MADLen && piece[rocewire.MADHeaderLen] == 1 {
				b.mu.Lock()
				for _, c := range b.byID {
					d := rocewire.MAD(piece).Data()
					binary.BigEndian.PutUint32(d[0:], c.remoteID)
					binary.BigEndian.PutUint32(d[4:], c.localID)
				}
				b.mu.Unlock()
			}
			b.Receive(addrA, rocewire.GSIQPN, piece)
		}
		b.mu.Lock()
		defer b.mu.Unlock()
		if len(b.byID) > MaxConns {
			t.Fatalf("%d connections", len(b.byID))
		}
	})
}
