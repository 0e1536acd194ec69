// SPDX-License-Identifier: Apache-2.0

package device

// The responder's target as a path sees it: the other half of the path
// interface (path.go; sq.go is the requester's). A path's responder finds
// the QP a request names through Targets and executes the request there
// only through Target's methods; none of them knows a path.

import (
	"github.com/vrdma/vrdma/internal/abi"
)

// Targets finds a request's target by its QPN, for a path's responder;
// *Device implements it. Any goroutine may call it.
type Targets interface {
	// Target returns the QP numbered qpn, or nil (a nil interface, not a
	// nil *QP) when there is none. The caller may keep the Target across
	// requests (memcpy caches its peer): a QP destroyed since answers
	// Destroyed, and false to Admit and Hold.
	Target(qpn uint32) Target
}

var _ Targets = (*Device)(nil)

// Target returns the QP numbered qpn as a responder's target, or nil.
func (d *Device) Target(qpn uint32) Target {
	if q := d.QP(qpn); q != nil {
		return q
	}
	return nil // not a Target holding a nil *QP
}

// Target is a responder's target QP, as the path's responder that serves
// a request for it sees it; *QP implements it. The caller is the goroutine
// that serves the path's incoming requests (tcp: a connection's reader;
// rdma: the engine's reader; memcpy: the requester's send-queue
// goroutine, which plays the responder), serializing them: one message
// at a time per target. A request runs between Admit and Release, which
// hold the target (its VM's memory for reading, the QP alive and in RTR,
// RTS or SQD); a path that moves a message's bytes across I/O lets go of
// it between steps and takes it again with Hold. The caller owns the
// Request and the Message it passes, and the Message's slices of guest
// memory may be used only while it holds the target. The methods above
// Admit need no hold and any goroutine may call them.
type Target interface {
	// QPN is the target's number.
	QPN() uint32
	// GID is the GID of the target's adapter.
	GID() abi.GID
	// Type is the target's transport (RC, UC): a path's Binding admits
	// a request of the same transport only.
	Type() abi.QPType
	// Remote is the requester the target was connected to at RTR (its
	// QPN and GID), for a Binding.
	Remote() (qpn uint32, gid abi.GID)
	// BoundPath is the path the target is bound to, nil before RTR and
	// after RESET: a path's Binding, or its reader, compares it with its
	// own.
	BoundPath() Path
	// PortUp reports whether the port of the target's adapter is up
	// (Admit checks it; a reader that hands the target's requester a
	// response checks it itself).
	PortUp() bool
	// Destroyed reports whether the QP was destroyed: a responder that
	// caches its target drops it then.
	Destroyed() bool
	// Counters are the target's counters (Dropped, SeqErrs, Dups, …).
	Counters() *Counters
	// RCAttrs reads the target's RC attributes together (its remote QPN,
	// rq_psn, max_dest_rd_atomic, min_rnr_timer, path MTU).
	RCAttrs() RCAttrs
	// Resets counts the target's moves to RESET: a responder's state for
	// the target (ResponderSeq) starts anew when it changes.
	Resets() uint32
	// MoveToErr moves the target to ERR with why, for an error the
	// responder finds that the device's checks could not (a RoCE opcode
	// out of sequence, a target gone while its bytes were arriving).
	MoveToErr(why string)

	// Admit opens one request: it holds the target, checks its port and
	// that it is bound to the request's requester (b, the caller's,
	// kept no longer than the call). After true the caller holds the
	// target and calls Release; after false it holds nothing and drops
	// the request unanswered (counted).
	Admit(b Binding) bool
	// Hold takes the target again for one more step of a request
	// admitted earlier (a path that let go of it across I/O), without
	// Admit's binding and port checks; false, holding nothing, when the
	// VM or the QP went or the QP left RTR..SQD.
	Hold() bool
	// Release ends Admit or Hold. Nothing that waits for a peer runs
	// between them.
	Release()
	// Respond executes r at the target in one step (Begin, every byte
	// through io, End), for a path that moves no byte across I/O
	// (memcpy); m is the caller's scratch. The caller holds the target.
	Respond(r *Request, m *Message, io Payload) (Response, error)
	// Begin checks r at the target before any byte moves and prepares m
	// (executes an atomic); the caller holds the target and owns m until
	// End.
	Begin(r *Request, m *Message) Verdict
	// Revalidate resolves m's target memory again after the caller let
	// go of the target and took it back (Hold); false: it went (a region
	// deregistered), and the message fails.
	Revalidate(m *Message) bool
	// Grow makes a SEND's message total bytes long, for a responder
	// that learns its length packet by packet; the caller holds the
	// target.
	Grow(m *Message, total uint64) abi.WCStatus
	// Invalidate makes a SEND's message one with invalidate of rkey, for
	// a responder that learns it from the message's last packet; a
	// refusal (no type 2 window of the target's to invalidate) moves the
	// target to ERR. The caller holds the target.
	Invalidate(m *Message, rkey uint32) abi.WCStatus
	// Write copies data to m's bytes at off; false: beyond the message,
	// or its receive went. The caller holds the target.
	Write(m *Message, off uint64, data []byte) bool
	// Fill lets f write m's bytes from off on (at most n) straight into
	// guest memory; ok false: beyond the message, or its receive went.
	// The caller holds the target, and f must not block.
	Fill(m *Message, off, n uint64, f Filler) (written int, ok bool, err error)
	// End completes m at the target (a SEND or WRITE_WITH_IMM consumes
	// its receive with a completion) and forgets the guest memory Begin
	// resolved (a caller may call it after a refused Begin to forget it
	// at once); the caller holds the target.
	End(m *Message) (Outcome, abi.WCStatus)
}

var _ Target = (*QP)(nil)
