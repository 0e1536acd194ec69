// SPDX-License-Identifier: Apache-2.0

package agent

// The event sockets of ibv_get_async_event (op 48, docs/wire-local.md
// §4.13). A session opens one per adapter it has a context on; the agent
// writes an abi.AsyncEvent to each of the adapter's sockets when it moves
// one of the session's QPs on that adapter to ERR for an error it
// detected (device.QP.MoveToErr: a failed work request, a peer that went
// away, a request the responder refused): IBV_EVENT_QP_FATAL, whose fd
// programs poll; and, to every socket of an adapter, IBV_EVENT_PORT_ERR
// when the adapter is disconnected and IBV_EVENT_PORT_ACTIVE when it is
// connected again (device.Device.SetConnected). Each socket is a
// cm.Channel, whose writer goroutine the channel owns; the session's end
// closes them (closeAsync).

import (
	"slices"
	"sync"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/cm"
	"github.com/vrdma/vrdma/internal/device"
)

// maxAsyncSockets bounds one session's event sockets (a context per
// adapter, and a few more for programs that open contexts again).
const maxAsyncSockets = 64

// asyncEvents is a session's event sockets, by adapter.
type asyncEvents struct {
	mu        sync.Mutex
	n         int                      // +checklocks:mu
	byAdapter map[string][]*cm.Channel // +checklocks:mu
}

// asyncOpen is async-open: a new event socket for adapter r of v.
func (s *session) asyncOpen(v *device.Context, r *abi.AdapterRef) (any, []int, error) {
	if _, err := v.Adapter(r.Adapter); err != nil {
		return nil, nil, err
	}
	e := &s.async
	e.mu.Lock()
	defer e.mu.Unlock()
	e.pruneLocked()
	if e.n >= maxAsyncSockets {
		return nil, nil, abi.Errorf(abi.CodeLimit, "", "this session has %d event sockets, the limit: close contexts it no longer uses", e.n)
	}
	c, peer, err := cm.NewChannel("async-events")
	if err != nil {
		return nil, nil, err
	}
	if e.byAdapter == nil {
		e.byAdapter = map[string][]*cm.Channel{}
	}
	e.n++
	e.byAdapter[r.Adapter] = append(e.byAdapter[r.Adapter], c)
	c.Start(s.log)
	return givenAway{abi.Empty{}, []int{peer}}, nil, nil
}

// pruneLocked forgets the sockets whose workload end was closed (its
// context closed: the writer saw the socket fail and stopped).
// +checklocks:e.mu
func (e *asyncEvents) pruneLocked() {
	e.n = 0
	for ad, cs := range e.byAdapter {
		live := cs[:0]
		for _, c := range cs {
			if c.PeerClosed() {
				c.Close()
				continue
			}
			live = append(live, c)
		}
		e.byAdapter[ad] = live
		e.n += len(live)
	}
}

// watchFatal reports q's agent-detected errors on its adapter's sockets.
func (s *session) watchFatal(q *device.QP) {
	adapter, handle, qpn := q.Adapter().Name(), q.Handle(), q.QPN()
	q.SetOnFatal(func(why string) {
		e := &s.async
		e.mu.Lock()
		chans := slices.Clone(e.byAdapter[adapter]) // pruneLocked reuses the array
		e.mu.Unlock()
		for _, c := range chans {
			c.Post(abi.AsyncEvent{Event: abi.EventQPFatal, QP: handle, QPN: qpn, Why: why})
		}
	})
	if s.clientCaps.Has(abi.CapQPEvents) {
		q.SetOnEvent(func(event int, why string) {
			s.postAsync(adapter, abi.AsyncEvent{Event: event, QP: handle, QPN: qpn, Why: why})
		})
	}
	if q.SRQ() != nil {
		q.SetOnLastWQE(func() {
			s.postAsync(adapter, abi.AsyncEvent{Event: abi.EventQPLastWQE, QP: handle, QPN: qpn, Why: "the QP entered ERR: it takes no more receives from its SRQ"})
		})
	}
}

// watchOpen reports the async events of an XRC target QP the session
// opened (ibv_open_qp) on its adapter's sockets, with the open's handle:
// every process that holds the QP hears them, as the kernel tells every
// opener of a shared target QP.
func (s *session) watchOpen(o *device.QPOpen) {
	adapter, handle, qpn := o.QP().Adapter().Name(), o.Handle(), o.QP().QPN()
	qpEvents := s.clientCaps.Has(abi.CapQPEvents)
	o.SetOnEvent(func(event int, why string) {
		if event == abi.EventQPFatal || qpEvents {
			s.postAsync(adapter, abi.AsyncEvent{Event: event, QP: handle, QPN: qpn, Why: why})
		}
	})
}

// watchCQ reports CQ c's overrun (IBV_EVENT_CQ_ERR) on its adapter's
// sockets, to a client that knows the QP events.
func (s *session) watchCQ(c *device.CQ) {
	if !s.clientCaps.Has(abi.CapQPEvents) {
		return
	}
	adapter, handle := c.Adapter().Name(), c.Handle()
	c.SetOnError(func(why string) {
		s.postAsync(adapter, abi.AsyncEvent{Event: abi.EventCQErr, CQ: handle, Why: why})
	})
}

// watchSRQ reports SRQ q's limit event (IBV_EVENT_SRQ_LIMIT_REACHED)
// on its adapter's sockets.
func (s *session) watchSRQ(q *device.SRQ) {
	adapter, handle := q.Adapter().Name(), q.Handle()
	q.SetOnLimit(func() {
		s.postAsync(adapter, abi.AsyncEvent{Event: abi.EventSRQLimit, SRQ: handle, Why: "the SRQ's posted receives fell below its limit"})
	})
}

// postAsync posts ev to the session's sockets for adapter.
func (s *session) postAsync(adapter string, ev abi.AsyncEvent) {
	e := &s.async
	e.mu.Lock()
	chans := slices.Clone(e.byAdapter[adapter]) // pruneLocked reuses the array
	e.mu.Unlock()
	for _, c := range chans {
		c.Post(ev)
	}
}

// PortChanged posts a port event to the session's sockets for adapter ad
// (device.Owner).
func (s *session) PortChanged(ad *device.Adapter, active bool) {
	ev := abi.AsyncEvent{Event: abi.EventPortErr, Port: 1, Why: "the adapter was disconnected"}
	if active {
		ev = abi.AsyncEvent{Event: abi.EventPortActive, Port: 1, Why: "the adapter was connected"}
	}
	e := &s.async
	e.mu.Lock()
	chans := slices.Clone(e.byAdapter[ad.Name()]) // pruneLocked reuses the array
	e.mu.Unlock()
	for _, c := range chans {
		c.Post(ev)
	}
}

// closeAsync closes the session's event sockets.
func (s *session) closeAsync() {
	e := &s.async
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, cs := range e.byAdapter {
		for _, c := range cs {
			c.Close()
		}
	}
	e.byAdapter = nil
}
