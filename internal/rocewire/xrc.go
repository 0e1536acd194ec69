// SPDX-License-Identifier: Apache-2.0

package rocewire

import "encoding/binary"

// XRC is the transport bits (101) of the extended reliable connected
// opcodes: XRC|op is XRC's form of the RC opcode op (XRC|SendOnly is
// XRC's SEND_ONLY, 0xa4), with RC's headers and payload rules, and, in a
// request, the XRCETH right after the BTH: the XRC SRQ the message is for
// at the target (IBTA 9.2, ib_pack.h IB_OPCODE_XRC_*). Responses carry no
// XRCETH.
const XRC Opcode = 0xa0

// XRCETHLen is the length of the XRC Extended Transport Header.
const XRCETHLen = 4

// XRCETH is an XRC Extended Transport Header view (4 bytes): 8 reserved
// bits, then the 24-bit XRC SRQ number.
type XRCETH []byte

// SRQN returns the XRC SRQ number.
func (x XRCETH) SRQN() uint32 { return binary.BigEndian.Uint32(x) & QPNMask }

// Encode writes the SRQ number; the reserved bits are zero.
func (x XRCETH) Encode(srqn uint32) { binary.BigEndian.PutUint32(x, srqn&QPNMask) }

// StripXRC turns a parsed XRC packet into its RC form, for a receiver that
// serves XRC with its RC code: it rewrites the BTH's opcode in place (p's
// bytes; its ICRC, which covers the opcode, must have been checked
// before) and p.Info, and returns the XRCETH's SRQ number (0 for a
// response, which has none). false: p is not an XRC packet, and is left
// as it is.
func (p *Packet) StripXRC() (srqn uint32, ok bool) {
	op := p.BTH.Opcode()
	if op.Transport() != XRC {
		return 0, false
	}
	rc := op.Operation()
	p.BTH[0] = byte(rc)
	p.Info = ops[rc]
	if p.XRCETH != nil {
		srqn = p.XRCETH.SRQN()
	}
	return srqn, true
}

func init() {
	for op := SendFirst; op <= SendOnlyWithInvalidate; op++ {
		i, ok := ops[op]
		if !ok {
			continue // 0x15 is reserved
		}
		i.Name = "XRC_" + i.Name
		if i.Request {
			i.Headers |= HasXRCETH
		}
		ops[XRC|op] = i
	}
}
