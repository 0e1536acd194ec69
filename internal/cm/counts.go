// SPDX-License-Identifier: Apache-2.0

package cm

// Connect counters (mgmt.ConnectCount): the connects this host's
// workloads dial, by outcome as rdma_cm reports it (failure), and the
// requests to this host's listeners, by how they ended.

import (
	"sync/atomic"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/abi/mgmt"
)

// The results of a dial, as the workload sees them.
const (
	dialEstablished = iota // connected (rdma_cm: ESTABLISHED, or CONNECT_RESPONSE for an external QP)
	dialRejected           // the listener's side rejected it, or nothing listens (REJECTED)
	dialUnreachable        // no path to the remote end, or it is nowhere (UNREACHABLE, -EHOSTUNREACH)
	dialTimeout            // no answer in time, or what it needs is out of reach (UNREACHABLE, -ETIMEDOUT)
	dialError              // a bad request (UNREACHABLE, -EINVAL)
	numDial
)

// The ends of a request to a listener of this host.
const (
	reqAccepted   = iota // the listener's workload accepted it
	reqRejected          // the workload rejected it, or the listener closed before it answered
	reqNoListener        // nothing listens on its port
	reqDialerGone        // its dialer gave up first (timeout, canceled, connection lost)
	reqFailed            // accepted, but the connection could not be set up (a QP would not move)
	numReq
)

var (
	dialResults = [numDial]string{"established", "rejected", "unreachable", "timeout", "error"}
	reqResults  = [numReq]string{"accepted", "rejected", "no_listener", "abandoned", "failed"}
)

// counts are a Manager's connect counters.
type counts struct {
	dial [numDial]atomic.Uint64
	req  [numReq]atomic.Uint64
}

// dialResult classifies a dial's outcome err (nil: established) as the
// event rdma_cm gives for it (failure).
func dialResult(err error) int {
	if err == nil {
		return dialEstablished
	}
	switch ev := failure(err); {
	case ev.Event == abi.CMEventRejected:
		return dialRejected
	case ev.Status == statusTimedOut:
		return dialTimeout
	case ev.Status == statusInvalid:
		return dialError
	}
	return dialUnreachable
}

// CountDial counts a connect a workload of this host dialed, whose
// outcome is err (nil: established). The event channels' connects count
// themselves; the agent counts those of the connect operation.
func (m *Manager) CountDial(err error) { m.counts.dial[dialResult(err)].Add(1) }

// acceptResult is the end of a request its listener's workload accepted,
// with err the setup's outcome.
func acceptResult(err error) int {
	if err != nil {
		return reqFailed
	}
	return reqAccepted
}

// countReq counts a request to a listener of this host that ended so.
func (m *Manager) countReq(result int) { m.counts.req[result].Add(1) }

// Connects are the connect counters, every side and result (zeros
// included).
func (m *Manager) Connects() []mgmt.ConnectCount {
	out := make([]mgmt.ConnectCount, 0, numDial+numReq)
	for i, r := range dialResults {
		out = append(out, mgmt.ConnectCount{Side: "dial", Result: r, Count: m.counts.dial[i].Load()})
	}
	for i, r := range reqResults {
		out = append(out, mgmt.ConnectCount{Side: "accept", Result: r, Count: m.counts.req[i].Load()})
	}
	return out
}
