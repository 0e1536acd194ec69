// SPDX-License-Identifier: Apache-2.0

package abi

// Asynchronous events (op 48, docs/wire-local.md §4.13): what
// ibv_get_async_event returns. A session opens an event socket per
// adapter (async-open); the agent writes one AsyncEvent per message, as
// JSON, for the session's QPs on that adapter. This is the shape of a
// context's async_fd, which programs poll.

// Asynchronous event types, numbered as libibverbs' enum ibv_event_type.
const (
	// EventCQErr is IBV_EVENT_CQ_ERR: the CQ overran — its consumer
	// index is not one the agent can write behind — and its QPs moved to
	// ERR (CapQPEvents).
	EventCQErr      = 0
	EventQPFatal    = 1  // IBV_EVENT_QP_FATAL: the agent moved the QP to ERR for an error it detected
	EventCommEst    = 4  // IBV_EVENT_COMM_EST: a QP in RTR received its first message (CapQPEvents)
	EventSQDrained  = 5  // IBV_EVENT_SQ_DRAINED: a QP in SQD has no send work in flight (CapQPEvents)
	EventPortActive = 9  // IBV_EVENT_PORT_ACTIVE
	EventPortErr    = 10 // IBV_EVENT_PORT_ERR
	// EventSRQLimit is IBV_EVENT_SRQ_LIMIT_REACHED: the SRQ's posted
	// receives fell below its armed limit (which the event disarms).
	EventSRQLimit = 15
	// EventQPLastWQE is IBV_EVENT_QP_LAST_WQE_REACHED: a QP on an SRQ
	// entered ERR and will take no more receives from it.
	EventQPLastWQE = 16
)

// AsyncEvent is one message of an event socket.
type AsyncEvent struct {
	Event int    `json:"event"`            // Event*
	QP    uint32 `json:"qp,omitempty"`     // QP events: the QP's handle
	QPN   uint32 `json:"qpn,omitempty"`    // and number
	SRQ   uint32 `json:"srq,omitempty"`    // SRQ events: the SRQ's handle
	CQ    uint32 `json:"cq,omitempty"`     // CQ events: the CQ's handle
	Port  int    `json:"port,omitempty"`   // port events: the port (1)
	Why   string `json:"reason,omitempty"` // for people: what the agent saw
}
