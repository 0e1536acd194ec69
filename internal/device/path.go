// SPDX-License-Identifier: Apache-2.0

package device

// Paths. A connected QP moves its work requests over exactly one path,
// chosen by the device's Router when it enters RTR (Modify) and dropped
// when it moves to RESET: memcpy between two VMs of this host, tcp to another host, and
// later rdma (the software RoCEv2 engine), memcpy-direct and native
// endpoints. The device — the QP state machine, the send-queue goroutine
// (exec.go), the receive queue, the CQs and the responder (respond.go) —
// knows the path only by this interface; everything a path needs per QP
// (a window of requests in flight, a link, a responder's PSN state) lives
// in the path's own value, made at RTR, so a QP that never connects pays
// for none of it.
//
// How to add a path: write a package under internal/transport with a type
// that implements Path (Pump, Busy, Drop, Flush, PollBudget, Kind), made
// by a func(Source) Path from the QP as a Source (sq.go: its SendQueue,
// which a windowed path hands to the RC requester engine, and QPN, GID,
// Remote, PortUp, ExecPending) and, for its responder side, a Targets
// (target.go) in which it finds each request's Target by QPN: Admit with
// the path's Binding, then Respond, or Begin, Write or Fill (under Hold,
// with Revalidate), End, then Release. A path uses nothing else of the
// device (internal/agent's TestLayersPaths). Make the agent's Router
// (internal/agent/route.go) return its maker when the control plane's
// decision names it; add a pathEnv to the conformance suite
// (conformance_test.go). docs/architecture.md has the whole journey of a
// work request.

import (
	"time"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/abi/mgmt"
)

// Path moves a connected QP's send queue to its remote end. Its methods
// are called only by the QP's send-queue goroutine (runSQ), which is thus
// the owner of the Path's requester state.
type Path interface {
	// Kind names the path (the vocabulary of abi.PathKind).
	Kind() abi.PathKind
	// Pump executes the send queue from the QP's SQ head while the QP is
	// in RTS or SQD: in RTS it takes new WQEs, in SQD it only finishes
	// what it already has in flight. It returns when it has nothing left
	// to do, the QP leaves RTS and SQD, or the QP stops.
	Pump()
	// Busy reports whether work requests are in flight (taken from the SQ
	// but not completed).
	Busy() bool
	// Drop forgets what is in flight, without completions (RESET, and
	// the QP's end).
	Drop()
	// Flush completes what is in flight with WR_FLUSH_ERR, oldest first
	// (ERR), before the device flushes the rest of the send queue.
	Flush()
	// PollBudget is how long the send-queue goroutine polls for new work
	// in doorbell mode before it sleeps; 0: it sleeps at once.
	PollBudget() time.Duration
}

// PathStatuser is what a path that keeps work requests in flight adds to
// its QP's status report; any goroutine may call it.
type PathStatuser interface {
	Status(st *mgmt.QPStatus)
}

// pathRef boxes a path for an atomic pointer.
type pathRef struct{ p Path }

// BoundPath returns the path the QP is bound to, nil before RTR and after
// RESET. Any goroutine may call it.
func (q *QP) BoundPath() Path {
	if r := q.bound.Load(); r != nil {
		return r.p
	}
	return nil
}

// bindPathLocked binds the QP to p (at RTR), with the decision to report.
//
// +checklocks:q.mu
func (q *QP) bindPathLocked(p Path, info abi.PathInfo) {
	q.pathInfo = info
	q.bound.Store(&pathRef{p})
}

// SyncExecutor executes one work request to its end before it returns: a
// path with nothing in flight between two calls (memcpy).
type SyncExecutor interface {
	Execute(w *abi.SendWQE, slot []byte) (abi.WCStatus, uint32)
}
