// SPDX-License-Identifier: Apache-2.0

package rocewire

import "fmt"

// Opcode is a BTH opcode: bits 7–5 the transport (000 RC, 001 UC, 011 UD,
// 100 CNP, 101 XRC), bits 4–0 the operation.
type Opcode uint8

// RC opcodes (ib_pack.h), UD's SEND_ONLY pair (for QP1, the CM) and the
// congestion notification packet; UC's are UC|op (uc.go).
const (
	SendFirst                  Opcode = 0x00
	SendMiddle                 Opcode = 0x01
	SendLast                   Opcode = 0x02
	SendLastWithImmediate      Opcode = 0x03
	SendOnly                   Opcode = 0x04
	SendOnlyWithImmediate      Opcode = 0x05
	RDMAWriteFirst             Opcode = 0x06
	RDMAWriteMiddle            Opcode = 0x07
	RDMAWriteLast              Opcode = 0x08
	RDMAWriteLastWithImmediate Opcode = 0x09
	RDMAWriteOnly              Opcode = 0x0a
	RDMAWriteOnlyWithImmediate Opcode = 0x0b
	RDMAReadRequest            Opcode = 0x0c
	RDMAReadResponseFirst      Opcode = 0x0d
	RDMAReadResponseMiddle     Opcode = 0x0e
	RDMAReadResponseLast       Opcode = 0x0f
	RDMAReadResponseOnly       Opcode = 0x10
	Acknowledge                Opcode = 0x11
	AtomicAcknowledge          Opcode = 0x12
	CompareSwap                Opcode = 0x13
	FetchAdd                   Opcode = 0x14
	SendLastWithInvalidate     Opcode = 0x16
	SendOnlyWithInvalidate     Opcode = 0x17
	// AtomicWrite (IBTA 1.5): RETH, then the 8 bytes to store at its VA
	// at once; answered by an RDMA READ RESPONSE ONLY of no payload.
	AtomicWrite             Opcode = 0x1d
	UDSendOnly              Opcode = 0x64
	UDSendOnlyWithImmediate Opcode = 0x65
	CNP                     Opcode = 0x81
)

// Headers is a set of extended transport headers.
type Headers uint8

// The extended transport headers, in their order on the wire:
// BTH [DETH] [XRCETH] [RETH | AtomicETH] [ImmDt | IETH] for requests,
// BTH [AETH [AtomicAckETH]] for responses.
const (
	HasDETH Headers = 1 << iota
	HasRETH
	HasAtomicETH
	HasImmDt
	HasIETH
	HasAETH
	HasAtomicAckETH
	HasXRCETH // XRC requests (xrc.go)
)

// Payload is the rule an opcode's payload length follows, for a path MTU
// (rxe check_length).
type Payload uint8

// The payload rules.
const (
	PayloadNone    Payload = iota // no payload
	PayloadFull                   // exactly the path MTU (FIRST, MIDDLE)
	PayloadLast                   // 1 to the path MTU (LAST)
	PayloadOnly                   // 0 to the path MTU (ONLY)
	PayloadFixed16                // CNP: 16 reserved bytes
)

// Position is where a packet lies in its message.
type Position uint8

// The positions.
const (
	PosOnly Position = iota
	PosFirst
	PosMiddle
	PosLast
)

// OpInfo describes an opcode.
type OpInfo struct {
	Name     string
	Headers  Headers
	Payload  Payload
	Position Position
	Request  bool // sent by a requester (else a response)
	// RecvWQE: the message consumes a receive WQE (its first packet says
	// so); Completes: its last packet completes it at the responder.
	RecvWQE   bool
	Completes bool
}

// ops is the opcode table (the InfiniBand Architecture Specification's,
// as Linux rxe's rxe_opcode.c lists it).
var ops = map[Opcode]OpInfo{
	SendFirst:                  {"SEND_FIRST", 0, PayloadFull, PosFirst, true, true, false},
	SendMiddle:                 {"SEND_MIDDLE", 0, PayloadFull, PosMiddle, true, false, false},
	SendLast:                   {"SEND_LAST", 0, PayloadLast, PosLast, true, false, true},
	SendLastWithImmediate:      {"SEND_LAST_WITH_IMMEDIATE", HasImmDt, PayloadLast, PosLast, true, false, true},
	SendOnly:                   {"SEND_ONLY", 0, PayloadOnly, PosOnly, true, true, true},
	SendOnlyWithImmediate:      {"SEND_ONLY_WITH_IMMEDIATE", HasImmDt, PayloadOnly, PosOnly, true, true, true},
	RDMAWriteFirst:             {"RDMA_WRITE_FIRST", HasRETH, PayloadFull, PosFirst, true, false, false},
	RDMAWriteMiddle:            {"RDMA_WRITE_MIDDLE", 0, PayloadFull, PosMiddle, true, false, false},
	RDMAWriteLast:              {"RDMA_WRITE_LAST", 0, PayloadLast, PosLast, true, false, false},
	RDMAWriteLastWithImmediate: {"RDMA_WRITE_LAST_WITH_IMMEDIATE", HasImmDt, PayloadLast, PosLast, true, true, true},
	RDMAWriteOnly:              {"RDMA_WRITE_ONLY", HasRETH, PayloadOnly, PosOnly, true, false, false},
	RDMAWriteOnlyWithImmediate: {"RDMA_WRITE_ONLY_WITH_IMMEDIATE", HasRETH | HasImmDt, PayloadOnly, PosOnly, true, true, true},
	RDMAReadRequest:            {"RDMA_READ_REQUEST", HasRETH, PayloadNone, PosOnly, true, false, false},
	RDMAReadResponseFirst:      {"RDMA_READ_RESPONSE_FIRST", HasAETH, PayloadFull, PosFirst, false, false, false},
	RDMAReadResponseMiddle:     {"RDMA_READ_RESPONSE_MIDDLE", 0, PayloadFull, PosMiddle, false, false, false},
	RDMAReadResponseLast:       {"RDMA_READ_RESPONSE_LAST", HasAETH, PayloadLast, PosLast, false, false, false},
	RDMAReadResponseOnly:       {"RDMA_READ_RESPONSE_ONLY", HasAETH, PayloadOnly, PosOnly, false, false, false},
	Acknowledge:                {"ACKNOWLEDGE", HasAETH, PayloadNone, PosOnly, false, false, false},
	AtomicAcknowledge:          {"ATOMIC_ACKNOWLEDGE", HasAETH | HasAtomicAckETH, PayloadNone, PosOnly, false, false, false},
	CompareSwap:                {"COMPARE_SWAP", HasAtomicETH, PayloadNone, PosOnly, true, false, false},
	FetchAdd:                   {"FETCH_ADD", HasAtomicETH, PayloadNone, PosOnly, true, false, false},
	SendLastWithInvalidate:     {"SEND_LAST_WITH_INVALIDATE", HasIETH, PayloadLast, PosLast, true, false, true},
	SendOnlyWithInvalidate:     {"SEND_ONLY_WITH_INVALIDATE", HasIETH, PayloadOnly, PosOnly, true, true, true},
	AtomicWrite:                {"ATOMIC_WRITE", HasRETH, PayloadOnly, PosOnly, true, false, false},
	UDSendOnly:                 {"UD_SEND_ONLY", HasDETH, PayloadOnly, PosOnly, true, true, true},
	UDSendOnlyWithImmediate:    {"UD_SEND_ONLY_WITH_IMMEDIATE", HasDETH | HasImmDt, PayloadOnly, PosOnly, true, true, true},
	CNP:                        {"CNP", 0, PayloadFixed16, PosOnly, false, false, false},
}

// Info returns what the table says of op; false for an opcode vrdma does
// not know (RD, the reserved ones, FLUSH and ATOMIC_WRITE; XRC's are RC's
// with the XRC bits, xrc.go).
func (op Opcode) Info() (OpInfo, bool) {
	i, ok := ops[op]
	return i, ok
}

func (op Opcode) String() string {
	if i, ok := ops[op]; ok {
		return i.Name
	}
	return fmt.Sprintf("opcode(0x%02x)", uint8(op))
}

// headerOrder lists the extended headers in wire order with their sizes.
var headerOrder = [...]struct {
	h Headers
	n int
}{{HasDETH, DETHLen}, {HasXRCETH, XRCETHLen}, {HasRETH, RETHLen}, {HasAtomicETH, AtomicETHLen}, {HasImmDt, ImmDtLen}, {HasIETH, IETHLen},
	{HasAETH, AETHLen}, {HasAtomicAckETH, AtomicAckETHLen}}

// HeaderLen returns the length of the transport headers of op, BTH
// included; 0 for an unknown opcode.
func HeaderLen(op Opcode) int {
	i, ok := ops[op]
	if !ok {
		return 0
	}
	n := BTHLen
	for _, h := range headerOrder {
		if i.Headers&h.h != 0 {
			n += h.n
		}
	}
	return n
}

// MTUs are the path MTUs RoCE allows, by IB enum (1 = 256 … 5 = 4096).
var MTUs = [...]int{1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096}

// ValidMTU reports whether mtu is a RoCE path MTU.
func ValidMTU(mtu int) bool {
	return mtu == 256 || mtu == 512 || mtu == 1024 || mtu == 2048 || mtu == 4096
}
