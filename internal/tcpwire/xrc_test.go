// SPDX-License-Identifier: Apache-2.0

package tcpwire_test

import (
	"strings"
	"testing"

	"github.com/vrdma/vrdma/internal/tcpwire"
)

// TestXRC checks the XRC field of every RC request type: SetXRC and
// XRCSRQN round-trip through Put and Decode, the field the type uses stays
// its own (CMP_SWAP's swap value), and a request without the flag names
// no SRQ.
func TestXRC(t *testing.T) {
	for _, ty := range []tcpwire.Type{tcpwire.Write, tcpwire.WriteImm, tcpwire.Send, tcpwire.SendImm, tcpwire.Read, tcpwire.CmpSwap, tcpwire.FetchAdd} {
		h := validHeader(ty)
		if n := h.XRCSRQN(); n != 0 {
			t.Errorf("%s without FlagXRC names SRQ 0x%x", ty, n)
		}
		h.SetXRC(0xabcdef)
		var got tcpwire.Header
		if err := tcpwire.Decode(encode(&h), tcpwire.Version, &got); err != nil {
			t.Fatalf("%s with XRC: %v", ty, err)
		}
		if got != h || got.XRCSRQN() != 0xabcdef {
			t.Errorf("%s with XRC decodes to %+v (SRQ 0x%x), want %+v", ty, got, got.XRCSRQN(), h)
		}
		if ty == tcpwire.CmpSwap && got.Swap != 0xfedcba9876543210 {
			t.Errorf("CMP_SWAP's swap value became 0x%x", got.Swap)
		}
	}
}

// TestXRCRefused checks that the decoder refuses the XRC flag where it
// has no meaning, and a number wider than 24 bits.
func TestXRCRefused(t *testing.T) {
	for _, c := range []struct {
		name string
		ty   tcpwire.Type
		f    func(b []byte)
		want string
	}{
		{"on an ACK", tcpwire.Ack, func(b []byte) { b[62] = 2 }, "ACK carries the XRC flag"},
		{"on a UC SEND", tcpwire.UCSend, func(b []byte) { b[62] = 2 }, "UC_SEND carries the XRC flag"},
		{"on a datagram", tcpwire.UDSend, func(b []byte) { b[62] = 2 }, "UD_SEND carries the XRC flag"},
		{"25-bit number on a SEND", tcpwire.Send, func(b []byte) { b[62], b[52] = 2, 1 }, "SEND: XRC SRQ number wider than 24 bits"},
		{"25-bit number on a CMP_SWAP", tcpwire.CmpSwap, func(b []byte) { b[62], b[56] = 2, 1 }, "CMP_SWAP: XRC SRQ number wider than 24 bits"},
	} {
		h := validHeader(c.ty)
		b := encode(&h)
		c.f(b)
		var got tcpwire.Header
		err := tcpwire.Decode(b, tcpwire.Version, &got)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Decode = %v, want an error with %q", c.name, err, c.want)
		}
	}
}
