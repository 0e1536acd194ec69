// SPDX-License-Identifier: Apache-2.0

// Package libdiag holds diagnostics of the client library's (package
// vrdma's) private state that are not part of its API: the system tests
// (tests/) print them when a workload stalls. Package vrdma fills the
// hooks when it is initialised, as gRPC's internal package does; nothing
// here imports the library, which imports this package.
package libdiag

import "sync/atomic"

// RingWords describes the shared words of q's queues and of cq, its
// completion queue (a *vrdma.QP and a *vrdma.CQ), for a test's report of
// a stall: they tell a doorbell the agent never heard (a send queue tail
// past the agent's head, with the doorbell flag set) from an event the
// workload never got (a completion queue tail past the workload's head,
// not armed). Package vrdma sets it.
var RingWords func(q, cq any) string

// IgnoreRevocations, set, makes the library's memcpy-direct revocation
// reader read the agent's notices and do nothing: no unmap, no
// acknowledgement, as a hung or hostile peer would. Only the system
// tests' workload processes set it, to see the agent fence such a peer.
var IgnoreRevocations atomic.Bool

// RelayAfter, nonzero, replaces the relay_ns of every send channel the
// library maps from then on (wire-local.md §4.22): how long a message may
// wait untaken before its sender retracts and relays it. The system tests
// that count what the agent relayed set it long, so that a receiver the
// machine's load keeps from polling for a millisecond does not make them
// fail; the tests of the retraction itself leave it 0.
var RelayAfter atomic.Int64
