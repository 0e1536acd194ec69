// SPDX-License-Identifier: Apache-2.0

package rocewire

import (
	"encoding/binary"
	"fmt"
)

// Error is a packet that breaks the wire rules: a receiver drops it (and
// counts it), it never panics on it.
type Error struct{ Reason string }

func (e *Error) Error() string { return "rocev2 packet: " + e.Reason }

func errorf(format string, args ...any) error { return &Error{Reason: fmt.Sprintf(format, args...)} }

// Packet is a parsed transport packet: views of its headers, nil when
// absent, and of its payload, all into the bytes Parse was given.
type Packet struct {
	Info         OpInfo
	BTH          BTH
	DETH         DETH
	XRCETH       XRCETH
	RETH         RETH
	AtomicETH    AtomicETH
	ImmDt        ImmDt
	IETH         IETH
	AETH         AETH
	AtomicAckETH AtomicAckETH
	Payload      []byte // without the pad bytes
	Pad          []byte
	ICRC         uint32 // as on the wire (least significant byte first)
}

// Parse checks b, a UDP payload from the BTH through the ICRC, and fills
// p. mtu is the QP's path MTU for the payload rules of FIRST, MIDDLE, LAST
// and ONLY packets; 0 checks no MTU (a packet not yet matched to a QP).
// The ICRC is not checked here: it covers the IP and UDP headers too
// (VerifyICRC).
func Parse(b []byte, mtu int, p *Packet) error {
	if len(b) < BTHLen+ICRCLen {
		return errorf("%d bytes, shorter than a BTH and an ICRC (%d)", len(b), BTHLen+ICRCLen)
	}
	if mtu != 0 && !ValidMTU(mtu) {
		return errorf("path MTU %d is not 256, 512, 1024, 2048 or 4096", mtu)
	}
	bth := BTH(b[:BTHLen])
	if v := bth.TVer(); v != 0 {
		return errorf("transport header version %d, want 0", v)
	}
	op := bth.Opcode()
	info, ok := op.Info()
	if !ok {
		return errorf("%s is not an opcode vrdma knows", op)
	}
	hl := HeaderLen(op)
	if len(b) < hl+ICRCLen {
		return errorf("%s: %d bytes, shorter than its headers and an ICRC (%d)", op, len(b), hl+ICRCLen)
	}
	*p = Packet{Info: info, BTH: bth}
	off := BTHLen
	take := func(n int) []byte {
		v := b[off : off+n : off+n]
		off += n
		return v
	}
	h := info.Headers
	if h&HasDETH != 0 {
		p.DETH = DETH(take(DETHLen))
	}
	if h&HasXRCETH != 0 {
		p.XRCETH = XRCETH(take(XRCETHLen))
	}
	if h&HasRETH != 0 {
		p.RETH = RETH(take(RETHLen))
	}
	if h&HasAtomicETH != 0 {
		p.AtomicETH = AtomicETH(take(AtomicETHLen))
	}
	if h&HasImmDt != 0 {
		p.ImmDt = ImmDt(take(ImmDtLen))
	}
	if h&HasIETH != 0 {
		p.IETH = IETH(take(IETHLen))
	}
	if h&HasAETH != 0 {
		p.AETH = AETH(take(AETHLen))
		s := p.AETH.Syndrome()
		if !s.Valid() {
			return errorf("%s: AETH syndrome 0x%02x is reserved", op, uint8(s))
		}
		if op.Operation() != Acknowledge && s.Kind() != KindACK {
			// A NAK travels only in an ACKNOWLEDGE packet (RC's or XRC's).
			return errorf("%s carries an ACK syndrome, not 0x%02x (a NAK travels in an ACKNOWLEDGE)", op, uint8(s))
		}
	}
	if h&HasAtomicAckETH != 0 {
		p.AtomicAckETH = AtomicAckETH(take(AtomicAckETHLen))
	}
	end := len(b) - ICRCLen
	pad := int(bth.PadCount())
	body := end - off
	if pad > body {
		return errorf("%s: pad count %d but %d bytes after the headers", op, pad, body)
	}
	n := body - pad
	if PadCount(n) != uint8(pad) {
		return errorf("%s: a %d-byte payload needs %d pad bytes, the BTH says %d", op, n, PadCount(n), pad)
	}
	switch rule := info.Payload; {
	case rule == PayloadNone && n != 0:
		return errorf("%s carries no payload, this one has %d bytes", op, n)
	case rule == PayloadFixed16 && n != 16:
		return errorf("%s carries 16 reserved bytes, this one %d", op, n)
	case mtu == 0:
	case rule == PayloadFull && n != mtu:
		return errorf("%s carries exactly the path MTU (%d bytes), this one %d", op, mtu, n)
	case rule == PayloadLast && (n < 1 || n > mtu):
		return errorf("%s carries 1 to %d bytes (the path MTU), this one %d", op, mtu, n)
	case rule == PayloadOnly && n > mtu:
		return errorf("%s carries at most the path MTU (%d bytes), this one %d", op, mtu, n)
	}
	if p.RETH != nil && info.Position == PosOnly && info.Payload != PayloadNone && uint32(n) != p.RETH.DMALen() {
		return errorf("%s: %d payload bytes, but the RETH says the message is %d", op, n, p.RETH.DMALen())
	}
	p.Payload = b[off : off+n : off+n]
	p.Pad = b[off+n : end : end]
	p.ICRC = binary.LittleEndian.Uint32(b[end:])
	return nil
}
