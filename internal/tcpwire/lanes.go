// SPDX-License-Identifier: Apache-2.0

package tcpwire

// Lanes. Two hosts whose handshake agreed on more than one lane open, beside
// the connection that carries a host's requests (the main connection), up
// to MaxLanes-1 more connections to the same peer (lanes 1..), each with a
// handshake of its own that names the main connection's group and its
// index. A large message of a payload request (WRITE, WRITE_IMM, SEND,
// SEND_IMM, SEND_INV) is then striped: its frame on the main connection
// carries FlagStriped, the message's total length in the compare field and
// its first stripe as its payload; stripe i (1..) follows on lane i as a
// STRIPE frame. Every lane carries stripes in the order of the frames on the
// main connection that announce them, and a responder reads a lane only
// while it executes such a frame: data lands in the order of the requests,
// as without lanes.

import "fmt"

// Stripe is a lane's frame: stripe i of the striped request whose tag,
// QPNs and PSN it repeats; RemoteAddr is the stripe's offset in the
// message, PayloadLen its length. No response.
const Stripe Type = 28

// FlagStriped marks a payload request whose message is striped over lanes:
// Compare holds the message's length, PayloadLen the first stripe's, and
// stripe i of StripeCount follows on lane i.
const FlagStriped Flags = 1 << 2

// MaxLanes bounds the connections of one host's requests to one peer, the
// main connection included.
const MaxLanes = 8

// MinStripe is the least stripe a striped frame carries, and the unit
// stripes are rounded to.
const MinStripe = 512

// striped reports whether t is a payload request that may be striped.
func (t Type) striped() bool {
	return t == Write || t == WriteImm || t == Send || t == SendImm || t == SendInv
}

// Striped reports whether h is a striped request (FlagStriped).
func (h *Header) Striped() bool { return h.Flags&FlagStriped != 0 }

// MessageLen is the length of h's message: its payload's, or for a
// striped request the total over its stripes.
func (h *Header) MessageLen() uint64 {
	if h.Striped() {
		return h.Compare
	}
	return uint64(h.PayloadLen)
}

// StripeCount is how many stripes a striped request's message has, the
// first (on the main connection) included: its length over the first
// stripe's, rounded up. 1 for a request that is not striped.
func (h *Header) StripeCount() int {
	if !h.Striped() || h.PayloadLen == 0 {
		return 1
	}
	s := uint64(h.PayloadLen)
	return int((h.Compare + s - 1) / s)
}

// StripeAt is where stripe i of a striped request's message lies: its
// offset and length. Every stripe but the last is as long as the first.
func (h *Header) StripeAt(i int) (off, n uint64) {
	s := uint64(h.PayloadLen)
	off = uint64(i) * s
	return off, min(s, h.Compare-off)
}

// checkStriped checks the stripe rules of a request with FlagStriped: a
// payload request, a first stripe of at least MinStripe bytes, a message
// longer than it and at most MaxData, over at most MaxLanes stripes.
func (h *Header) checkStriped() error {
	if !h.Striped() {
		return nil
	}
	switch {
	case !h.Type.striped():
		return errorf("%s carries the striped flag (4): only WRITE, WRITE_IMM, SEND, SEND_IMM and SEND_INV are striped", h.Type)
	case h.PayloadLen < MinStripe:
		return errorf("%s: striped with a %d-byte first stripe, under the %d-byte least", h.Type, h.PayloadLen, MinStripe)
	case h.Compare <= uint64(h.PayloadLen) || h.Compare > MaxData:
		return errorf("%s: striped message of %d bytes: want more than its %d-byte first stripe and at most 2 GiB", h.Type, h.Compare, h.PayloadLen)
	case h.StripeCount() > MaxLanes:
		return errorf("%s: a %d-byte message in %d-byte stripes takes %d lanes, over the %d a peer may have", h.Type, h.Compare, h.PayloadLen, h.StripeCount(), MaxLanes)
	}
	return nil
}

// CheckStripe checks that s, read from lane i, is stripe i of striped
// request r.
func CheckStripe(r, s *Header, i int) error {
	off, n := r.StripeAt(i)
	if s.Type != Stripe || s.Tag != r.Tag || s.DstQPN != r.DstQPN || s.SrcQPN != r.SrcQPN || s.PSN != r.PSN ||
		s.RemoteAddr != off || uint64(s.PayloadLen) != n {
		return fmt.Errorf("lane %d: %s frame (tag %d, QP 0x%x, PSN 0x%x, offset %d, %d bytes) where stripe %d of %s tag %d (QP 0x%x, PSN 0x%x, offset %d, %d bytes) was due: the lanes lost their order",
			i, s.Type, s.Tag, s.DstQPN, s.PSN, s.RemoteAddr, s.PayloadLen, i, r.Type, r.Tag, r.DstQPN, r.PSN, off, n)
	}
	return nil
}

// StripeSize is the first stripe of a message of total bytes striped over
// at most lanes lanes, each stripe at least least bytes (MinStripe or
// more): the message split evenly, rounded up to MinStripe. total itself when
// the message is not worth striping (it would take a single stripe).
func StripeSize(total uint64, lanes int, least uint64) uint64 {
	least = max(least, MinStripe)
	n := min(uint64(max(lanes, 1)), total/least)
	if n < 2 {
		return total
	}
	s := (total + n - 1) / n
	s = (s + MinStripe - 1) &^ (MinStripe - 1)
	if s >= total {
		return total
	}
	return s
}
