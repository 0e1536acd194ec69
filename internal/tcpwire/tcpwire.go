// SPDX-License-Identifier: Apache-2.0

// Package tcpwire is the frame format of vrdma's tcp path: the protocol two
// host agents speak over the TCP connections that carry the traffic of
// every QP between their hosts. It is documented in docs/wire-tcp.md.
//
// Every frame is a 64-byte header, big-endian, followed by a payload whose
// length the header gives. Data frames carry guest memory as their payload;
// control frames (handshake, connection management) carry JSON. The
// package only encodes, decodes and validates; it does no I/O, so that the
// decoder can be fuzzed on its own.
package tcpwire

import (
	"encoding/binary"
	"fmt"

	"github.com/vrdma/vrdma/internal/rc"
)

// Magic opens every frame: "VT".
const Magic = 0x5654

// Version is the protocol version this build speaks. A handshake agrees on
// one version; every later frame carries it. Version 2 is version 1's
// frames with a handshake in which each side also signs with its host key
// (CHALLENGE's and AUTH's sig); this build speaks version 2 only, so that
// no peer can fall back to a handshake without host keys.
const Version = 2

// HeaderLen is the length of a frame header.
const HeaderLen = 64

// Payload limits. MaxData is the largest message (max_msg_sz, 2 GiB);
// MaxControl bounds the JSON of control frames.
const (
	MaxData    = 1 << 31
	MaxControl = 64 << 10
)

// Type is a frame's type.
type Type uint8

// Frame types. Requests flow on a connection from the host that opened it;
// responses flow back on the same connection and carry the request's tag.
const (
	// Handshake (JSON payloads), in this order.
	Hello     Type = 1 // initiator → acceptor: versions, host ID, nonce
	Challenge Type = 2 // acceptor → initiator: version, host ID, nonce, proof
	Auth      Type = 3 // initiator → acceptor: proof
	Ready     Type = 4 // acceptor → initiator: the connection carries traffic
	Refuse    Type = 5 // either side: why the handshake failed; then close

	// Requests (RC operations) addressed to QP DstQPN.
	Write    Type = 16 // payload: the data
	WriteImm Type = 17 // payload: the data; Imm
	Send     Type = 18 // payload: the message
	SendImm  Type = 19 // payload: the message; Imm
	Read     Type = 20 // Len bytes at RemoteAddr; no payload
	CmpSwap  Type = 21 // Compare, Swap at RemoteAddr; no payload
	FetchAdd Type = 22 // Compare (the addend) at RemoteAddr; no payload
	SendInv  Type = 23 // payload: the message; RKey: the rkey it invalidates at the responder (capability mw)

	// Datagrams (UD SENDs, ud.go): unanswered, addressed to QP DstQPN.
	UDSend    Type = 24 // payload: SGID, DGID, the message
	UDSendImm Type = 25 // payload: SGID, DGID, the message; Imm

	// Responses.
	Ack      Type = 32 // Status (+ RNRTimer), Value for atomics; no payload
	ReadResp Type = 33 // Status; payload: the data read (empty unless OK)

	// AtomicWrite is a request: Swap's 8 bytes stored at RemoteAddr at
	// once (RDMA atomic write); no payload; answered by an Ack.
	AtomicWrite Type = 34

	// Connection management (JSON payloads).
	CMReq    Type = 48 // connect to a listener: ConnReq
	CMResp   Type = 49 // answer to a CMReq (same tag): ConnResp
	CMCancel Type = 50 // the dialer gave up on the CMReq with this tag
	CMDisc   Type = 51 // one side of an rdma_cm connection disconnected: ConnDisc
	CMRTU    Type = 52 // a dialer that moves its QP itself established the connection: ConnDisc's shape
	CMWho    Type = 53 // which VM holds a port of the receiver's addresses: HostPort; answered by a CMResp
)

var typeNames = map[Type]string{Hello: "HELLO", Challenge: "CHALLENGE", Auth: "AUTH", Ready: "READY", Refuse: "REFUSE",
	Write: "WRITE", WriteImm: "WRITE_IMM", Send: "SEND", SendImm: "SEND_IMM", Read: "READ", CmpSwap: "CMP_SWAP",
	FetchAdd: "FETCH_ADD", SendInv: "SEND_INV", AtomicWrite: "ATOMIC_WRITE", UDSend: "UD_SEND", UDSendImm: "UD_SEND_IMM", Ack: "ACK", ReadResp: "READ_RESP", CMReq: "CM_REQ", CMResp: "CM_RESP", CMCancel: "CM_CANCEL",
	CMDisc: "CM_DISC", CMRTU: "CM_RTU", CMWho: "CM_WHO", Stripe: "STRIPE"}

func (t Type) String() string {
	if s, ok := typeNames[t]; ok {
		return s
	}
	return fmt.Sprintf("Type(%d)", uint8(t))
}

// Known reports whether t is a frame type of this version.
func (t Type) Known() bool { _, ok := typeNames[t]; return ok }

// IsRequest reports whether t is an RC or UC operation request.
func (t Type) IsRequest() bool { return t >= Write && t <= SendInv || t == AtomicWrite || t.IsUC() }

// IsControl reports whether t carries a JSON payload.
func (t Type) IsControl() bool { return t <= Refuse || t >= CMReq && t <= CMWho }

// Status is a response's outcome, as the responder saw it.
type Status uint8

// Response statuses. NoQP is the silent drop of RC: the responder has no
// QP bound to the requester under that number (or not in RTR..SQD), and
// the requester retries as if nothing had answered.
const (
	OK           Status = 0
	RNR          Status = 1 // no receive posted (or the receive CQ is full); RNRTimer says how long to wait
	RemAccessErr Status = 2 // bad rkey, bounds or access flags
	RemOpErr     Status = 3 // the responder could not complete the operation (bad receive WQE)
	RemInvReqErr Status = 4 // invalid request (message too long for the receive buffer, misaligned atomic)
	NoQP         Status = 5 // no such QP bound to the requester: retry
	SeqErr       Status = 6 // PSN out of sequence: retry
	statusMax    Status = 7
)

var statusNames = [...]string{"OK", "RNR", "REM_ACCESS_ERR", "REM_OP_ERR", "REM_INV_REQ_ERR", "NO_QP", "SEQ_ERR"}

func (s Status) String() string {
	if s < statusMax {
		return statusNames[s]
	}
	return fmt.Sprintf("Status(%d)", uint8(s))
}

// Header is a decoded frame header. Fields a type does not use are zero.
//
//	off size field
//	0   2    magic 0x5654 "VT"
//	2   1    version
//	3   1    type
//	4   4    payload length
//	8   8    tag: a request's number on its connection; a response repeats it
//	16  4    dst QPN (requests: the responder's QP)
//	20  4    src QPN (requests: the requester's QP; responses: the responder's)
//	24  4    PSN (24 bits)
//	28  4    rkey (SEND_INV: the rkey it invalidates)
//	32  8    remote address
//	40  8    compare / add (requests); the original value (atomic ACK)
//	48  8    swap
//	56  4    imm (WRITE_IMM, SEND_IMM) or length (READ)
//	60  1    status (responses)
//	61  1    RNR timer (RNR responses)
//	62  1    flags: FlagSolicited (SEND, SEND_IMM, SEND_INV, WRITE_IMM, their UC frames, datagrams), FlagXRC (RC requests, xrc.go), FlagStriped (payload requests, lanes.go: compare holds the message's length); other bits zero
//	63  1    reserved, zero
type Header struct {
	Version    uint8
	Type       Type
	PayloadLen uint32
	Tag        uint64
	DstQPN     uint32
	SrcQPN     uint32
	PSN        uint32
	RKey       uint32
	RemoteAddr uint64
	Compare    uint64 // compare or add; the original value in an atomic ACK
	Swap       uint64
	ImmOrLen   uint32
	Status     Status
	RNRTimer   uint8
	Flags      Flags
}

// Flags are a request frame's flag bits (byte 62).
type Flags uint8

// FlagSolicited is the solicited-event bit of IBTA's BTH (SE): the
// message's receive completion wakes a CQ armed for solicited completions
// only. Only the frames whose message consumes a receive carry it.
const FlagSolicited Flags = 1 << 0

// SolicitedOf is the flags of a frame whose message consumes a receive
// (event) and was posted with the solicited bit (se): FlagSolicited when
// both hold.
func SolicitedOf(event, se bool) Flags {
	if event && se {
		return FlagSolicited
	}
	return 0
}

// carriesEvent reports whether a frame of type t may carry FlagSolicited:
// one whose message consumes a receive.
func (t Type) carriesEvent() bool {
	switch t {
	case Send, SendImm, SendInv, WriteImm, UCSend, UCSendImm, UCWriteImm, UDSend, UDSendImm:
		return true
	}
	return false
}

// Put encodes h into b[:HeaderLen], with the magic.
func (h *Header) Put(b []byte) {
	_ = b[HeaderLen-1]
	be := binary.BigEndian
	be.PutUint16(b[0:], Magic)
	b[2] = h.Version
	b[3] = byte(h.Type)
	be.PutUint32(b[4:], h.PayloadLen)
	be.PutUint64(b[8:], h.Tag)
	be.PutUint32(b[16:], h.DstQPN)
	be.PutUint32(b[20:], h.SrcQPN)
	be.PutUint32(b[24:], h.PSN)
	be.PutUint32(b[28:], h.RKey)
	be.PutUint64(b[32:], h.RemoteAddr)
	be.PutUint64(b[40:], h.Compare)
	be.PutUint64(b[48:], h.Swap)
	be.PutUint32(b[56:], h.ImmOrLen)
	b[60] = byte(h.Status)
	b[61] = h.RNRTimer
	b[62], b[63] = byte(h.Flags), 0
}

// Error is a frame the decoder refuses: the connection that carried it
// cannot be trusted and is closed with Reason logged.
type Error struct{ Reason string }

func (e *Error) Error() string { return "tcp path frame: " + e.Reason }

func errorf(format string, args ...any) error { return &Error{Reason: fmt.Sprintf(format, args...)} }

// Decode decodes and validates the header in b, which holds at least
// HeaderLen bytes, for a connection that agreed on version ver. It checks
// the magic, version, type, the payload length against the type, the PSN's
// width, the status and the reserved bytes. It does not allocate.
func Decode(b []byte, ver uint8, h *Header) error {
	if len(b) < HeaderLen {
		return errorf("truncated header: %d of %d bytes", len(b), HeaderLen)
	}
	be := binary.BigEndian
	if m := be.Uint16(b[0:]); m != Magic {
		return errorf("bad magic 0x%04x (want 0x%04x): not a vrdma peer, or the stream lost its framing", m, Magic)
	}
	*h = Header{
		Version:    b[2],
		Type:       Type(b[3]),
		PayloadLen: be.Uint32(b[4:]),
		Tag:        be.Uint64(b[8:]),
		DstQPN:     be.Uint32(b[16:]),
		SrcQPN:     be.Uint32(b[20:]),
		PSN:        be.Uint32(b[24:]),
		RKey:       be.Uint32(b[28:]),
		RemoteAddr: be.Uint64(b[32:]),
		Compare:    be.Uint64(b[40:]),
		Swap:       be.Uint64(b[48:]),
		ImmOrLen:   be.Uint32(b[56:]),
		Status:     Status(b[60]),
		RNRTimer:   b[61],
		Flags:      Flags(b[62]),
	}
	if h.Version != ver {
		return errorf("version %d on a connection that agreed on version %d", h.Version, ver)
	}
	if b[63] != 0 {
		return errorf("reserved byte 0x%02x is not zero", b[63])
	}
	if !h.Type.Known() {
		return errorf("unknown frame type %d", uint8(h.Type))
	}
	if sol := h.Flags & FlagSolicited; h.Flags&^(FlagSolicited|FlagXRC|FlagStriped) != 0 || sol != 0 && !h.Type.carriesEvent() {
		return errorf("%s: flags 0x%02x: only a SEND's, a WRITE with immediate's or a datagram's frame carries the solicited bit (1), an RC request the XRC bit (2), a payload request the striped bit (4); no other bit is defined", h.Type, uint8(h.Flags))
	}
	if err := h.checkXRC(); err != nil {
		return err
	}
	if err := h.checkStriped(); err != nil {
		return err
	}
	if h.PSN > 0xffffff {
		return errorf("%s: PSN 0x%x wider than 24 bits", h.Type, h.PSN)
	}
	if h.Status >= statusMax {
		return errorf("%s: unknown status %d", h.Type, uint8(h.Status))
	}
	if h.RNRTimer > 31 {
		return errorf("%s: RNR timer %d out of range 0..31", h.Type, h.RNRTimer)
	}
	n := h.PayloadLen
	switch {
	case h.Type.IsControl():
		if n > MaxControl {
			return errorf("%s: %d-byte payload exceeds the %d-byte limit of control frames", h.Type, n, MaxControl)
		}
	case h.Type == Write || h.Type == WriteImm || h.Type == Send || h.Type == SendImm || h.Type == SendInv || h.Type.IsUC() || h.Type == Stripe:
		if n > MaxData {
			return errorf("%s: %d-byte payload exceeds the 2 GiB message limit", h.Type, n)
		}
	case h.Type.IsDatagram():
		if n < DatagramPrefix || n > DatagramPrefix+MaxDatagram {
			return errorf("%s: %d-byte payload is not the %d-byte GIDs and a message of at most %d bytes", h.Type, n, DatagramPrefix, MaxDatagram)
		}
	case h.Type == Read:
		if n != 0 {
			return errorf("READ carries a %d-byte payload; it must carry none", n)
		}
		if h.ImmOrLen > MaxData {
			return errorf("READ of %d bytes exceeds the 2 GiB message limit", h.ImmOrLen)
		}
	case h.Type == ReadResp:
		if n > MaxData {
			return errorf("READ_RESP: %d-byte payload exceeds the 2 GiB message limit", n)
		}
		if n != 0 && h.Status != OK {
			return errorf("READ_RESP with status %s carries %d bytes; only OK carries data", h.Status, n)
		}
	default: // atomics, ACK
		if n != 0 {
			return errorf("%s carries a %d-byte payload; it must carry none", h.Type, n)
		}
	}
	if (h.Type.IsRequest() || h.Type.IsDatagram() || h.Type == Stripe) && h.Status != OK {
		return errorf("request %s carries status %s", h.Type, h.Status)
	}
	return nil
}

// PSNMask keeps the 24 bits of a PSN field (rc.PSNMask: PSN arithmetic
// is package rc's).
const PSNMask = rc.PSNMask
