// SPDX-License-Identifier: Apache-2.0

package requester

// The upcalls: what a wire's responses say, recorded under Engine.mu for
// the QP's goroutine, which each pokes. The wire calls them from the
// goroutine that reads its responses (rdma: the engine's reader; tcp: the
// QP goroutine itself, in Collect), one at a time, in the order the
// responses came.

import (
	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/rc"
)

// Ack records an acknowledgement of every PSN up to psn (coalesced: a
// SEND or WRITE that ends there or before is settled; a READ or atomic
// still waiting before it lost its response, an implicit NAK).
func (r *Engine) Ack(psn uint32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	defer r.heardLocked()
	r.ackThrough(psn & rc.PSNMask)
}

// Nak records a NAK at psn: RNR (rnrTimer is the delay's code) and PSN
// sequence error (psn is the PSN the responder expects) go back to psn;
// any other settles the WQE at psn with the NAK's status. Each
// acknowledges what comes before psn.
func (r *Engine) Nak(psn uint32, nak rc.NAK, rnrTimer uint8) {
	psn &= rc.PSNMask
	r.mu.Lock()
	defer r.mu.Unlock()
	defer r.heardLocked()
	r.ackThrough((psn - 1) & rc.PSNMask)
	switch nak {
	case rc.NAKNone:
	case rc.NAKRNR:
		r.goBack(psn) // from the refused packet on
		r.rnr, r.rnrT = true, rnrTimer
	case rc.NAKSeqErr:
		if r.retrying || rc.PSNDiff(psn, r.sendPSN) >= 0 {
			// A go-back-N is under way, or psn was not sent again since
			// the last one (or the RNR wait), which covers it: the NAK
			// asks for nothing new.
			return
		}
		// Back to psn, or to an earlier PSN a go-back-N not taken yet
		// asks for (a READ or atomic whose response the NAK's implicit
		// ACK shows lost).
		r.goBack(psn)
		r.rewind = true
	default:
		if e := r.entryAt(psn); e != nil && !e.done {
			e.done, e.st = true, nak.Status()
		}
	}
}

// AtomicAck records an atomic's response at psn: its original value.
func (r *Engine) AtomicAck(psn uint32, orig uint64) {
	psn &= rc.PSNMask
	r.mu.Lock()
	defer r.mu.Unlock()
	defer r.heardLocked()
	e := r.entryAt(psn)
	if e == nil || e.done || !e.WQE.Opcode.IsAtomic() {
		return // a duplicate, or a response to what is no longer in flight
	}
	r.ackThrough((psn - 1) & rc.PSNMask)
	e.done, e.st, e.old = true, abi.WCSuccess, orig
	r.advanceAck((psn + 1) & rc.PSNMask)
}

// AtomicWriteAck records the answer to an atomic write at psn (IBTA's
// zero-length RDMA READ response): it acknowledges every PSN up to it,
// and reports whether the WQE at psn is an atomic write still in flight
// (else the answer is another's: a zero-length READ's).
func (r *Engine) AtomicWriteAck(psn uint32) bool {
	psn &= rc.PSNMask
	r.mu.Lock()
	e := r.entryAt(psn)
	ok := e != nil && !e.done && e.WQE.Opcode == abi.OpAtomicWrite
	r.mu.Unlock()
	if ok {
		r.Ack(psn)
	}
	return ok
}

// ReadResponse lands a READ response packet at psn (first and last: its
// place in the response) in the READ's local buffers. A packet out of
// order is dropped. One past the next packet expected tells that one
// lost: the READ is asked for again at once from the packet lost (a
// go-back-N, as rxe's completer retries on a READ response out of
// sequence), not after the local ACK timeout, while the responder may
// still be sending the rest: it then goes on from the packet asked for,
// and what it sent meanwhile is all a loss costs. Once per retry, as an
// implicit NAK: the packets of the response already under way when the
// request left are past the packet expected too.
//
// credited says the responder paces the response by the Config's
// ReadCredit. Then, once half of the credit the READ's requests gave has
// landed, ReadResponse returns a continuation (ask): the READ request
// again, from the end of that credit, which the wire sends at once from
// the goroutine that reads its responses, so that the response flows on
// without waiting for the QP's goroutine to wake. It asks for none from a
// responder that does not say it paces: that one would take it for a
// request to send the rest of the response again.
func (r *Engine) ReadResponse(psn uint32, first, last, credited bool, payload []byte) (more ReadMore, ask bool) {
	psn &= rc.PSNMask
	r.mu.Lock()
	defer r.mu.Unlock()
	defer r.heardLocked()
	e := r.entryAt(psn)
	if e == nil || e.done || e.WQE.Opcode != abi.OpRDMARead {
		return
	}
	if d := rc.PSNDiff(psn, e.PSN); d != int32(e.got) {
		if d > int32(e.got) && e.sent > 0 && !r.retrying {
			r.goBack(e.PSN)
			r.rewind = true
		}
		return
	}
	if e.got == 0 {
		r.ackThrough((psn - 1) & rc.PSNMask)
	}
	lastPkt := e.got == e.NPSN-1
	if (e.got == 0) != first || lastPkt != last {
		return
	}
	off := uint64(e.got) * uint64(e.MTU)
	if off+uint64(len(payload)) > e.Total || !lastPkt && len(payload) == 0 {
		return
	}
	if len(payload) > 0 {
		if !r.q.HoldMemory() {
			return
		}
		rest := payload
		for _, s := range e.Segs[:e.NSeg] {
			if off >= uint64(len(s)) {
				off -= uint64(len(s))
				continue
			}
			k := copy(s[off:], rest)
			rest, off = rest[k:], 0
			if len(rest) == 0 {
				break
			}
		}
		r.q.Release()
	}
	e.got++
	r.advanceAck((psn + 1) & rc.PSNMask)
	if lastPkt {
		if uint64(e.got-1)*uint64(e.MTU)+uint64(len(payload)) != e.Total {
			e.done, e.st = true, abi.WCBadRespErr
			return
		}
		e.done, e.st = true, abi.WCSuccess
		return
	}
	if credit := r.cfg.ReadCredit; credited && credit > 0 && e.sent > 0 && e.lim < e.NPSN && e.got+credit/2 >= e.lim {
		k := e.lim
		e.lim = min(k+credit, e.NPSN)
		skip := uint64(k) * uint64(e.MTU)
		return ReadMore{PSN: (e.PSN + k) & rc.PSNMask, RemoteAddr: e.WQE.RemoteAddr + skip, RKey: e.WQE.RKey, Len: uint32(e.Total - skip), SRQN: e.WQE.XRCSRQN}, true
	}
	return ReadMore{}, false
}

// ReadMore is a continuation of a READ (ReadResponse): the READ request
// again, with the fields of its headers, from a response packet on.
type ReadMore struct {
	PSN        uint32 // the READ's first PSN plus the response packet asked from
	RemoteAddr uint64 // that packet's bytes at the responder
	RKey       uint32
	Len        uint32 // the bytes from there to the READ's end
	SRQN       uint32 // an XRC initiator's READ: the XRC SRQ it names
}

// ReadLanded records that a READ's whole response, asked for at psn, was
// landed in its local buffers by the wire itself (tcp's reader).
func (r *Engine) ReadLanded(psn uint32) {
	psn &= rc.PSNMask
	r.mu.Lock()
	defer r.mu.Unlock()
	defer r.heardLocked()
	e := r.entryAt(psn)
	if e == nil || e.done || e.WQE.Opcode != abi.OpRDMARead || psn != e.PSN {
		return
	}
	r.ackThrough((psn - 1) & rc.PSNMask)
	e.got, e.done, e.st = e.NPSN, true, abi.WCSuccess
	r.advanceAck((psn + e.NPSN) & rc.PSNMask)
}

// Lost records that the wire lost what was in flight (its connection
// closed, or the responder has no such QP): a transport retry, going back
// to the oldest WQE not settled after the local ACK timeout.
func (r *Engine) Lost() {
	r.mu.Lock()
	defer r.mu.Unlock()
	defer r.heardLocked()
	r.lost, r.waited = true, false
}

// heardLocked notes a response and pokes the QP's goroutine.
//
// +checklocks:r.mu
func (r *Engine) heardLocked() {
	r.heard = true
	select {
	case r.q.WakeCh() <- struct{}{}:
	default:
	}
}

// ackThrough records an acknowledgement of every PSN up to psn: SENDs and
// WRITEs that end there are settled; a READ or atomic still waiting before
// it lost its response (an implicit NAK: go back to it).
//
// +checklocks:r.mu
func (r *Engine) ackThrough(psn uint32) {
	if next := (psn + 1) & rc.PSNMask; rc.PSNDiff(next, r.seenPSN) > 0 && rc.PSNDiff(next, r.maxPSN) <= 0 {
		r.seenPSN, r.progress, r.retrying = next, true, false
	}
	for i := 0; i < r.n; i++ {
		e := r.at(i)
		if e.local != abi.WCSuccess {
			return
		}
		last := (e.PSN + e.NPSN - 1) & rc.PSNMask
		if rc.PSNDiff(psn, last) < 0 {
			break
		}
		if e.done {
			continue
		}
		if e.WQE.Opcode.IsRdAtomic() {
			// Not while a go-back-N is under way, nor when psn was not
			// sent again since the last one: a response to what went
			// before it, which asks for nothing new.
			if !r.retrying && rc.PSNDiff(psn, r.sendPSN) < 0 {
				r.goBack(e.PSN)
				r.rewind = true
			}
			return
		}
		if e.sent < e.Packets() {
			return // acknowledged beyond what was sent: a stale ACK from before a rewind
		}
		e.done, e.st = true, abi.WCSuccess
	}
	r.advanceAck((psn + 1) & rc.PSNMask)
}

// goBack asks the goroutine for a go-back-N to psn, or keeps the earlier
// PSN one it has not taken yet asks for.
//
// +checklocks:r.mu
func (r *Engine) goBack(psn uint32) {
	if !r.rewind && !r.rnr || rc.PSNDiff(psn, r.rewPSN) < 0 {
		r.rewPSN = psn
	}
}

// advanceAck moves ackPSN to psn if that is further.
//
// +checklocks:r.mu
func (r *Engine) advanceAck(psn uint32) {
	if rc.PSNDiff(psn, r.ackPSN) > 0 && rc.PSNDiff(psn, r.maxPSN) <= 0 {
		r.ackPSN, r.progress, r.retrying, r.moved = psn, true, false, true
		if rc.PSNDiff(psn, r.seenPSN) > 0 {
			r.seenPSN = psn
		}
	}
}

// entryAt returns the entry whose PSNs include psn.
//
// +checklocks:r.mu
func (r *Engine) entryAt(psn uint32) *Entry {
	for i := 0; i < r.n; i++ {
		e := r.at(i)
		if e.local != abi.WCSuccess {
			return nil
		}
		if d := rc.PSNDiff(psn, e.PSN); d >= 0 && d < int32(e.NPSN) {
			return e
		}
	}
	return nil
}
