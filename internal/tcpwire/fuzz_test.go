// SPDX-License-Identifier: Apache-2.0

package tcpwire_test

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/vrdma/vrdma/internal/tcpwire"
)

// FuzzDecode feeds the frame decoder arbitrary bytes, as a hostile or
// broken peer would send them. Decode must never panic; whatever it
// accepts must re-encode to the same 64 bytes (no field is lost or
// reinterpreted), and satisfy the rules the agent relies on before it
// reads a payload into guest memory: a known type, a 24-bit PSN, a known
// status, an RNR timer within 0..31, a payload length within its type's
// limit, no status on a request.
//
// Seeds: the test vectors, one valid header of every type (and of every
// RC request type with the XRC field), and the corpus in
// testdata/fuzz/FuzzDecode.
func FuzzDecode(f *testing.F) {
	for _, v := range vectors {
		f.Add(encode(&v.h))
	}
	for _, c := range allTypes {
		h := validHeader(c.t)
		f.Add(encode(&h))
		if c.t >= tcpwire.Write && c.t <= tcpwire.FetchAdd {
			h.SetXRC(0x123456) // an XRC initiator's request
			f.Add(encode(&h))
		}
	}
	for _, h := range []tcpwire.Header{
		{Version: tcpwire.Version, Type: tcpwire.Write, Flags: tcpwire.FlagStriped, Tag: 9, DstQPN: 1, SrcQPN: 2, Compare: 1 << 20, PayloadLen: 512 << 10},
		{Version: tcpwire.Version, Type: tcpwire.Stripe, Tag: 9, DstQPN: 1, SrcQPN: 2, RemoteAddr: 512 << 10, PayloadLen: 512 << 10},
	} {
		f.Add(encode(&h))
	}
	f.Add([]byte{})
	f.Add([]byte("VT"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var h tcpwire.Header
		// On a version 1 connection, and on a connection of whatever
		// version the bytes claim (so that the fuzzer gets past the
		// version check from any input).
		vers := []uint8{tcpwire.Version}
		if len(b) > 2 && b[2] != tcpwire.Version {
			vers = append(vers, b[2])
		}
		for _, ver := range vers {
			err := tcpwire.Decode(b, ver, &h)
			if err != nil {
				if _, ok := err.(*tcpwire.Error); !ok {
					t.Fatalf("Decode error %v is a %T, want a *tcpwire.Error", err, err)
				}
				_ = err.Error()
				continue
			}
			if len(b) < tcpwire.HeaderLen {
				t.Fatalf("Decode accepted %d bytes", len(b))
			}
			if again := encode(&h); !bytes.Equal(again, b[:tcpwire.HeaderLen]) {
				t.Fatalf("%+v re-encodes to\n% x\nnot\n% x", h, again, b[:tcpwire.HeaderLen])
			}
			checkInvariants(t, &h, ver)
		}
	})
}

// checkInvariants checks what every header Decode accepts satisfies.
func checkInvariants(t *testing.T, h *tcpwire.Header, ver uint8) {
	t.Helper()
	_ = h.Type.String() + h.Status.String()
	n := h.PayloadLen
	switch {
	case h.Version != ver:
		t.Fatalf("version %d accepted on a version %d connection", h.Version, ver)
	case !h.Type.Known():
		t.Fatalf("unknown type %d accepted", h.Type)
	case h.PSN > tcpwire.PSNMask:
		t.Fatalf("PSN 0x%x accepted", h.PSN)
	case h.Status > tcpwire.SeqErr:
		t.Fatalf("status %d accepted", h.Status)
	case h.RNRTimer > 31:
		t.Fatalf("RNR timer %d accepted", h.RNRTimer)
	case h.Type.IsRequest() && h.Status != tcpwire.OK:
		t.Fatalf("request %s with status %s accepted", h.Type, h.Status)
	case h.Type.IsControl() && n > tcpwire.MaxControl:
		t.Fatalf("%s with a %d-byte payload accepted", h.Type, n)
	case n > tcpwire.MaxData:
		t.Fatalf("%s with a %d-byte payload accepted", h.Type, n)
	}
	switch h.Type {
	case tcpwire.Read:
		if n != 0 || h.ImmOrLen > tcpwire.MaxData {
			t.Fatalf("READ with a %d-byte payload for %d bytes accepted", n, h.ImmOrLen)
		}
	case tcpwire.CmpSwap, tcpwire.FetchAdd, tcpwire.Ack:
		if n != 0 {
			t.Fatalf("%s with a %d-byte payload accepted", h.Type, n)
		}
	case tcpwire.ReadResp:
		if n != 0 && h.Status != tcpwire.OK {
			t.Fatalf("READ_RESP %s with %d bytes accepted", h.Status, n)
		}
	case tcpwire.UDSend, tcpwire.UDSendImm:
		if n < tcpwire.DatagramPrefix || n > tcpwire.DatagramPrefix+tcpwire.MaxDatagram || h.Status != tcpwire.OK {
			t.Fatalf("%s %s with a %d-byte payload accepted", h.Type, h.Status, n)
		}
	}
	if h.Striped() {
		if n < tcpwire.MinStripe || h.MessageLen() <= uint64(n) || h.MessageLen() > tcpwire.MaxData || h.StripeCount() > tcpwire.MaxLanes {
			t.Fatalf("%s striped: %d-byte message in %d-byte stripes accepted", h.Type, h.MessageLen(), n)
		}
		if off, last := h.StripeAt(h.StripeCount() - 1); last == 0 || off+last != h.MessageLen() {
			t.Fatalf("%s striped: stripes end at %d, not at the message's %d bytes", h.Type, off+last, h.MessageLen())
		}
	}
	if h.Type == tcpwire.Stripe && (h.Flags != 0 || h.Status != tcpwire.OK) {
		t.Fatalf("STRIPE with flags 0x%x, status %s accepted", h.Flags, h.Status)
	}
	if h.Type.IsRequest() == h.Type.IsControl() && h.Type != tcpwire.Ack && h.Type != tcpwire.ReadResp && !h.Type.IsDatagram() && h.Type != tcpwire.Stripe {
		t.Fatalf("%s is neither request, response nor control", h.Type)
	}
}

// controlKinds are the control messages FuzzControl decodes into, by the
// fuzzer's kind byte.
var controlKinds = []func() any{
	func() any { return new(tcpwire.HelloMsg) },
	func() any { return new(tcpwire.ChallengeMsg) },
	func() any { return new(tcpwire.AuthMsg) },
	func() any { return new(tcpwire.RefuseMsg) },
	func() any { return new(tcpwire.ConnReqMsg) },
	func() any { return new(tcpwire.ConnRespMsg) },
	func() any { return new(tcpwire.HostPortMsg) },
	func() any { return new(whoAnswer) },
}

// whoAnswer is a CM_RESP that answers a CM_WHO, as AskWho checks it.
type whoAnswer struct{ tcpwire.ConnRespMsg }

func (w *whoAnswer) Validate() error { return w.ValidateWho() }

// FuzzControl feeds control payloads (the JSON of handshake and CM frames)
// to DecodeJSON and Validate, as the agent does with a peer's frames:
// neither may panic, and a message that validates must survive a round
// trip through JSON and still validate, so that what one agent accepts
// and forwards another accepts too.
func FuzzControl(f *testing.F) {
	for i, v := range []any{ptr(validHello()), ptr(validChallenge()), &tcpwire.AuthMsg{Proof: nonceA},
		&tcpwire.RefuseMsg{Reason: "rule version: ..."}, ptr(validConnReq()), ptr(validConnResp()),
		&tcpwire.HostPortMsg{Port: 7471, UD: true}, &tcpwire.ConnRespMsg{VM: "vm1", Adapters: []string{"vrdma0", "vrdma1"}}} {
		b, err := json.Marshal(v)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(uint8(i), b)
	}
	f.Add(uint8(5), []byte(`{"code":"refused","message":"nothing listens on vm2/vrdma0 port 7000"}`))
	f.Add(uint8(0), []byte(`{"versions":[1,2,3],"host_id":"`+idA+`"}`))
	f.Add(uint8(4), []byte(`{"from_gid":"::ffff:10.0.0.1"}`))
	f.Add(uint8(4), []byte(`{"target":"vm2/vrdma0","port":7000,"from_vm":"vm1","from_adapter":"vrdma0","from_gid":"fe80::1","from_qpn":18,"timeout_ms":1,"ud":true,"to_ip":"127.0.0.2","from_ip":"127.0.0.3"}`))
	f.Add(uint8(7), []byte(`{"vm":"vm1","adapters":["vrdma0","eth0"]}`))
	f.Fuzz(func(t *testing.T, kind uint8, payload []byte) {
		v := controlKinds[int(kind)%len(controlKinds)]()
		if err := tcpwire.DecodeJSON(payload, v); err != nil {
			return
		}
		val, ok := v.(validator)
		if !ok {
			return // AUTH and REFUSE have no rules of their own
		}
		if val.Validate() != nil {
			return
		}
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatalf("%T %+v validates but does not encode: %v", v, v, err)
		}
		w := controlKinds[int(kind)%len(controlKinds)]()
		if err := tcpwire.DecodeJSON(b, w); err != nil {
			t.Fatalf("%T re-encoded as %s does not decode: %v", v, b, err)
		}
		if err := w.(validator).Validate(); err != nil {
			t.Fatalf("%T re-encoded as %s does not validate: %v", v, b, err)
		}
		if !reflect.DeepEqual(normalize(v), normalize(w)) {
			t.Fatalf("%T %+v re-decodes as %+v", v, v, w)
		}
	})
}

// normalize makes a decoded message comparable: an empty version list
// and a missing one are the same on the wire.
func normalize(v any) any {
	if h, ok := v.(*tcpwire.HelloMsg); ok && len(h.Versions) == 0 {
		c := *h
		c.Versions = nil
		return &c
	}
	return v
}
