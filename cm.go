// SPDX-License-Identifier: Apache-2.0

package vrdma

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/vrdma/vrdma/internal/abi"
)

// Connect connects q, in RESET or INIT, to whoever listens on remote
// ("vm/vrdmaN" or a GID) and port, as rdma_connect does. On success q is
// in RTS and reports its path.
func (q *QP) Connect(ctx context.Context, remote string, port uint16) error {
	var timeout uint32
	if d, ok := ctx.Deadline(); ok {
		timeout = uint32(max(time.Until(d).Milliseconds(), 1))
	}
	var r abi.ConnectReply
	if _, err := q.vm.c.call(ctx, abi.OpConnect, &abi.Connect{QP: q.handle, Remote: remote, Port: port, TimeoutMS: timeout}, &r); err != nil {
		return fmt.Errorf("vrdma: connect QP 0x%x to %s port %d: %w", q.qpn, remote, port, err)
	}
	q.setPath(r.Path)
	return nil
}

// Listener receives connection requests on an (adapter, service port), as
// rdma_listen does.
type Listener struct {
	ad     *Adapter
	handle uint32
	port   uint16

	mu sync.Mutex
	// an outstanding get-request whose answer nobody took yet
	inflight chan reply // +checklocks:mu
}

// Listen starts listening on the adapter's service port.
func (a *Adapter) Listen(ctx context.Context, port uint16) (*Listener, error) {
	var r abi.Handle
	if _, err := a.vm.c.call(ctx, abi.OpListen, &abi.Listen{Adapter: a.name, Port: port}, &r); err != nil {
		return nil, fmt.Errorf("vrdma: listen on %s port %d: %w", a.name, port, err)
	}
	return &Listener{ad: a, handle: r.Handle, port: port}, nil
}

// ConnRequest is a peer's request to connect.
type ConnRequest struct {
	l *Listener
	// RemoteVM and RemoteAdapter name the dialing side.
	RemoteVM      string
	RemoteAdapter string
	RemoteGID     GID
	RemoteQPN     uint32
	id            uint32
}

// Accept waits for the next connection request. If ctx ends first, the
// request that may still arrive is kept for the next Accept.
func (l *Listener) Accept(ctx context.Context) (*ConnRequest, error) {
	c := l.ad.vm.c
	l.mu.Lock()
	ch := l.inflight
	if ch == nil {
		var err error
		_, ch, err = c.start(abi.OpGetRequest, &abi.Handle{Handle: l.handle})
		if err != nil {
			l.mu.Unlock()
			return nil, err
		}
		l.inflight = ch
	}
	l.mu.Unlock()
	select {
	case r, ok := <-ch:
		l.mu.Lock()
		l.inflight = nil
		l.mu.Unlock()
		var cr abi.ConnRequest
		if _, err := decode(abi.OpGetRequest, r, ok, &cr); err != nil {
			return nil, fmt.Errorf("vrdma: accept on %s port %d: %w", l.ad.name, l.port, err)
		}
		return &ConnRequest{l: l, id: cr.ID, RemoteVM: cr.RemoteVM, RemoteAdapter: cr.RemoteAdapter, RemoteGID: cr.RemoteGID, RemoteQPN: cr.RemoteQPN}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Accept accepts the request with q, in RESET or INIT, as rdma_accept
// does: both QPs end in RTS, facing each other.
func (r *ConnRequest) Accept(ctx context.Context, q *QP) error {
	var rep abi.ConnectReply
	if _, err := r.l.ad.vm.c.call(ctx, abi.OpAcceptRequest, &abi.AcceptRequest{Listener: r.l.handle, ID: r.id, QP: q.handle}, &rep); err != nil {
		return fmt.Errorf("vrdma: accept connection from %s/%s: %w", r.RemoteVM, r.RemoteAdapter, err)
	}
	q.setPath(rep.Path)
	return nil
}

// Reject refuses the request; the dialer's Connect fails with reason.
func (r *ConnRequest) Reject(ctx context.Context, reason string) error {
	_, err := r.l.ad.vm.c.call(ctx, abi.OpRejectRequest, &abi.RejectRequest{Listener: r.l.handle, ID: r.id, Reason: reason}, nil)
	return err
}

// Close stops listening; pending dialers are refused.
func (l *Listener) Close(ctx context.Context) error {
	_, err := l.ad.vm.c.call(ctx, abi.OpCloseListener, &abi.Handle{Handle: l.handle}, nil)
	return err
}
