// SPDX-License-Identifier: Apache-2.0

package tcpwire

// XRC requests. A request of an XRC initiator QP carries FlagXRC and the
// XRC SRQ number it names at the target (24 bits), in the one header
// field its type leaves unused: the swap field (bytes 48..55) of every
// RC request type but CMP_SWAP, whose swap value takes it; CMP_SWAP's
// in the imm/length field (bytes 56..59), which it does not use. The
// target QP resolves the number in its XRC domain (docs/wire-tcp.md).

// FlagXRC marks a request of an XRC initiator QP: the header carries
// the XRC SRQ number it names (XRCSRQN). Only RC request frames carry it.
const FlagXRC Flags = 1 << 1

// maxSRQN bounds XRC SRQ numbers: 24 bits, as IBTA's XRCETH.
const maxSRQN = 1<<24 - 1

// SetXRC marks h, an RC request, as an XRC initiator's naming XRC SRQ
// srqn.
func (h *Header) SetXRC(srqn uint32) {
	h.Flags |= FlagXRC
	if h.Type == CmpSwap {
		h.ImmOrLen = srqn & maxSRQN
	} else {
		h.Swap = uint64(srqn & maxSRQN)
	}
}

// XRCSRQN returns the XRC SRQ number an XRC request names; 0 for a
// request without FlagXRC.
func (h *Header) XRCSRQN() uint32 {
	switch {
	case h.Flags&FlagXRC == 0:
		return 0
	case h.Type == CmpSwap:
		return h.ImmOrLen
	}
	return uint32(h.Swap)
}

// checkXRC checks the XRC field of a request with FlagXRC: an RC request,
// and a number of 24 bits.
func (h *Header) checkXRC() error {
	if h.Flags&FlagXRC == 0 {
		return nil
	}
	if h.Type < Write || h.Type > FetchAdd {
		return errorf("%s carries the XRC flag (2): only an RC request does", h.Type)
	}
	if h.Type == CmpSwap && h.ImmOrLen > maxSRQN || h.Type != CmpSwap && h.Swap > maxSRQN {
		return errorf("%s: XRC SRQ number wider than 24 bits", h.Type)
	}
	return nil
}
