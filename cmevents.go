// SPDX-License-Identifier: Apache-2.0

package vrdma

// rdma_cm's event channels: the shape of librdmacm, for Go programs and
// for the drop-in C librdmacm, which speak the same commands (ops 40..47,
// docs/wire-local.md §4.12). Operations answer at once and their outcome
// arrives as a CMEvent on the channel: a listener's CONNECT_REQUEST (with
// the dialer's private data) is accepted or rejected (with private data
// of its own); a dialer gets ESTABLISHED (with the acceptor's private
// data), REJECTED (with the reason and the reject's private data) or
// UNREACHABLE; both sides of a connection get DISCONNECTED then
// TIMEWAIT_EXIT when either disconnects or goes away.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/vrdma/vrdma/internal/abi"
)

// CMEventType is an rdma_cm event type, numbered as enum
// rdma_cm_event_type.
type CMEventType int

// The CM event types the agent sends.
const (
	CMAddrResolved   CMEventType = abi.CMEventAddrResolved
	CMAddrError      CMEventType = abi.CMEventAddrError
	CMRouteResolved  CMEventType = abi.CMEventRouteResolved
	CMRouteError     CMEventType = abi.CMEventRouteError
	CMConnectRequest CMEventType = abi.CMEventConnectRequest
	CMUnreachable    CMEventType = abi.CMEventUnreachable
	CMRejected       CMEventType = abi.CMEventRejected
	CMEstablished    CMEventType = abi.CMEventEstablished
	CMDisconnected   CMEventType = abi.CMEventDisconnected
	CMTimewaitExit   CMEventType = abi.CMEventTimewaitExit
)

var cmEventNames = map[CMEventType]string{CMAddrResolved: "ADDR_RESOLVED", CMAddrError: "ADDR_ERROR", CMRouteResolved: "ROUTE_RESOLVED",
	CMRouteError: "ROUTE_ERROR", CMConnectRequest: "CONNECT_REQUEST", CMUnreachable: "UNREACHABLE", CMRejected: "REJECTED",
	CMEstablished: "ESTABLISHED", CMDisconnected: "DISCONNECTED", CMTimewaitExit: "TIMEWAIT_EXIT",
	CMMulticastJoin: "MULTICAST_JOIN", CMMulticastError: "MULTICAST_ERROR"}

// String returns the event's rdma_cm name without its prefix:
// "ESTABLISHED".
func (t CMEventType) String() string {
	if s, ok := cmEventNames[t]; ok {
		return s
	}
	return fmt.Sprintf("CMEventType(%d)", int(t))
}

// Private data limits, as rdma_cm gives RDMA_PS_TCP: a connect's (REQ),
// an accept's (REP) and a reject's (REJ). More is refused with
// invalid-argument (EINVAL).
const (
	MaxPrivateDataConnect = abi.MaxPrivateDataREQ
	MaxPrivateDataAccept  = abi.MaxPrivateDataREP
	MaxPrivateDataReject  = abi.MaxPrivateDataREJ
)

// IBTA reject reasons a REJECTED event's Status carries.
const (
	RejectNoListener = abi.RejectInvalidServiceID // nothing listens on the port
	RejectConsumer   = abi.RejectConsumer         // the listener rejected
)

// EventChannel is an rdma_cm event channel of an attached VM. Its
// methods are safe for concurrent use; events are read by one reader at
// a time (Next).
type EventChannel struct {
	vm     *VM
	handle uint32
	f      *os.File

	readMu sync.Mutex
	buf    []byte // +checklocks:readMu

	mu sync.Mutex
	// QPs connected or accepted through the channel, by handle
	qps map[uint32]*QP // +checklocks:mu
	// cookies
	next uint64 // +checklocks:mu
}

// OpenEventChannel opens an event channel, as rdma_create_event_channel.
func (v *VM) OpenEventChannel(ctx context.Context) (*EventChannel, error) {
	var r abi.Handle
	fds, err := v.c.call(ctx, abi.OpCMOpenChannel, &abi.Empty{}, &r)
	if err != nil {
		return nil, fmt.Errorf("vrdma: open a CM event channel: %w", err)
	}
	if len(fds) != 1 {
		closeFDs(fds)
		return nil, fmt.Errorf("vrdma: open a CM event channel: the agent sent %d descriptors, want 1", len(fds))
	}
	return &EventChannel{vm: v, handle: r.Handle, f: os.NewFile(uintptr(fds[0]), "vrdma-cm-channel"), buf: make([]byte, 64<<10), qps: map[uint32]*QP{}}, nil
}

// Close closes the channel; its listens stop delivering.
func (ch *EventChannel) Close(ctx context.Context) error {
	_, err := ch.vm.c.call(ctx, abi.OpCMCloseChannel, &abi.Handle{Handle: ch.handle}, nil)
	ch.f.Close()
	return err
}

func (ch *EventChannel) cookie() uint64 {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	ch.next++
	return ch.next
}

// CMEvent is one event of a channel.
type CMEvent struct {
	Type CMEventType
	// Status is 0, a negative errno (UNREACHABLE: -ETIMEDOUT, -EHOSTUNREACH;
	// ADDR_ERROR: -EHOSTUNREACH) or, for REJECTED, the IBTA reject reason
	// (RejectNoListener, RejectConsumer).
	Status int
	// Cookie is the cookie of the operation the event answers (Listen,
	// Resolve, Connect).
	Cookie uint64
	// QP is the connection's QP: ESTABLISHED, DISCONNECTED, TIMEWAIT_EXIT.
	QP *QP
	// The peer, this side's adapter and the service port.
	RemoteVM, RemoteAdapter string
	RemoteGID               GID
	RemoteQPN               uint32
	Adapter                 string
	Port                    uint16
	// PrivateData is the dialer's (CONNECT_REQUEST), the acceptor's
	// (ESTABLISHED of the dialer) or the reject's (REJECTED).
	PrivateData []byte
	// Message says why, for people (errors).
	Message string
	// QKey is the Q_Key of a UD connect's listener (ESTABLISHED) or of a
	// multicast group (MULTICAST_JOIN).
	QKey uint32

	ch           *EventChannel
	listener, id uint32
}

// Next waits for the channel's next event, as rdma_get_cm_event.
func (ch *EventChannel) Next(ctx context.Context) (*CMEvent, error) {
	ch.readMu.Lock()
	defer ch.readMu.Unlock()
	n, err := readCtx(ctx, ch.f, ch.buf)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, context.DeadlineExceeded
		}
		return nil, fmt.Errorf("vrdma: read the CM event channel: %w", err)
	}
	if n == 0 {
		return nil, fmt.Errorf("vrdma: the CM event channel was closed by the agent: %w", ErrAgentGone)
	}
	var e abi.CMEvent
	if err := json.Unmarshal(ch.buf[:n], &e); err != nil {
		return nil, fmt.Errorf("vrdma: bad CM event from the agent: %v", err)
	}
	ev := &CMEvent{Type: CMEventType(e.Event), Status: e.Status, Cookie: e.Cookie, RemoteVM: e.RemoteVM, RemoteAdapter: e.RemoteAdapter,
		RemoteGID: e.RemoteGID, RemoteQPN: e.RemoteQPN, Adapter: e.Adapter, Port: e.Port, PrivateData: e.PrivateData, Message: e.Message,
		QKey: e.QKey, ch: ch, listener: e.Listener, id: e.ID}
	if e.QP != 0 {
		ch.mu.Lock()
		ev.QP = ch.qps[e.QP]
		if ev.Type == CMTimewaitExit {
			delete(ch.qps, e.QP)
		}
		ch.mu.Unlock()
		if ev.QP != nil && ev.Type == CMEstablished && e.Path != nil {
			ev.QP.setPath(*e.Path)
		}
	}
	return ev, nil
}

// CMListener is a listen of an event channel.
type CMListener struct {
	ch     *EventChannel
	handle uint32
	Cookie uint64 // the cookie of its CONNECT_REQUEST events
}

// ListenOption changes a Listen.
type ListenOption func(*abi.CMListen)

// HostPort makes a listen also hold its port of this host's own addresses,
// as rdma_listen on the any address or a host address does on Linux's
// software RoCE: a Connect to 127.0.0.1, or to this host's PVRDMA address
// from any host, and the port reaches it (docs/network.md, "The host's
// own addresses"). Another VM holding the port is an error (EADDRINUSE).
// Only a process in the host's own network namespace holds host ports:
// from another (a VM's namespace), required makes the listen fail, and
// without it the listen holds none.
func HostPort(required bool) ListenOption {
	return func(l *abi.CMListen) {
		l.HostPort = abi.HostPortAny
		if required {
			l.HostPort = abi.HostPortAddr
		}
	}
}

// Listen listens on port of adapter ("" for every adapter of the VM, as
// rdma_listen on 0.0.0.0); requests arrive as CONNECT_REQUEST events.
func (ch *EventChannel) Listen(ctx context.Context, adapter string, port uint16, opts ...ListenOption) (*CMListener, error) {
	l := &CMListener{ch: ch, Cookie: ch.cookie()}
	var r abi.Handle
	req := &abi.CMListen{Channel: ch.handle, Adapter: adapter, Port: port, Cookie: l.Cookie}
	for _, o := range opts {
		o(req)
	}
	if _, err := ch.vm.c.call(ctx, abi.OpCMListen, req, &r); err != nil {
		what := adapter
		if what == "" {
			what = "every adapter"
		}
		return nil, fmt.Errorf("vrdma: listen on %s port %d: %w", what, port, err)
	}
	l.handle = r.Handle
	return l, nil
}

// Close stops listening; requests not yet taken are refused.
func (l *CMListener) Close(ctx context.Context) error {
	_, err := l.ch.vm.c.call(ctx, abi.OpCMCloseListen, &abi.Handle{Handle: l.handle}, nil)
	return err
}

// Resolve resolves remote (an adapter's IP address, a GID or
// "vm/vrdmaN"; or a host's address, whose listener Connect finds by its
// port; or a name, looked up here as rdma_getaddrinfo would, the first
// IPv4 address first) from adapter ("" to let the agent pick), as rdma_resolve_addr:
// ADDR_RESOLVED (Adapter is the local adapter) or ADDR_ERROR arrives with
// the returned cookie.
func (ch *EventChannel) Resolve(ctx context.Context, remote, adapter string) (uint64, error) {
	remote, err := lookupName(ctx, remote)
	if err != nil {
		return 0, err
	}
	c := ch.cookie()
	if _, err := ch.vm.c.call(ctx, abi.OpCMResolve, &abi.CMResolve{Channel: ch.handle, Cookie: c, Remote: remote, Adapter: adapter}, nil); err != nil {
		return 0, fmt.Errorf("vrdma: resolve %s: %w", remote, err)
	}
	return c, nil
}

// Connect dials remote and port with q (in RESET or INIT) — remote as
// Resolve's; for a host's address (127.0.0.1, a host's PVRDMA address)
// the VM holding that port there (HostPort) — sending priv
// (at most MaxPrivateDataConnect bytes), as rdma_connect: ESTABLISHED (q
// is in RTS), REJECTED or UNREACHABLE arrives with the returned cookie.
// timeout 0 is 10 s.
func (ch *EventChannel) Connect(ctx context.Context, q *QP, remote string, port uint16, priv []byte, timeout time.Duration) (uint64, error) {
	remote, err := lookupName(ctx, remote)
	if err != nil {
		return 0, err
	}
	c := ch.cookie()
	ch.mu.Lock()
	ch.qps[q.handle] = q
	ch.mu.Unlock()
	req := &abi.CMConnect{Channel: ch.handle, Cookie: c, QP: q.handle, Remote: remote, Port: port, PrivateData: priv,
		TimeoutMS: uint32(timeout / time.Millisecond)}
	if _, err := ch.vm.c.call(ctx, abi.OpCMConnect, req, nil); err != nil {
		ch.mu.Lock()
		delete(ch.qps, q.handle)
		ch.mu.Unlock()
		return 0, fmt.Errorf("vrdma: connect QP 0x%x to %s port %d: %w", q.qpn, remote, port, err)
	}
	return c, nil
}

// Accept accepts a CONNECT_REQUEST with q (in RESET or INIT), sending
// priv (at most MaxPrivateDataAccept bytes), as rdma_accept: both QPs
// end in RTS, and the channel gets ESTABLISHED for q.
func (e *CMEvent) Accept(ctx context.Context, q *QP, priv []byte) error {
	if e.Type != CMConnectRequest {
		return errorf(abi.CodeInvalid, "vrdma: accept a %s event: only a CONNECT_REQUEST can be accepted", e.Type)
	}
	ch := e.ch
	ch.mu.Lock()
	ch.qps[q.handle] = q
	ch.mu.Unlock()
	var rep abi.ConnectReply
	if _, err := ch.vm.c.call(ctx, abi.OpAcceptRequest, &abi.AcceptRequest{Listener: e.listener, ID: e.id, QP: q.handle, PrivateData: priv}, &rep); err != nil {
		ch.mu.Lock()
		delete(ch.qps, q.handle)
		ch.mu.Unlock()
		return fmt.Errorf("vrdma: accept connection from %s/%s: %w", e.RemoteVM, e.RemoteAdapter, err)
	}
	q.setPath(rep.Path)
	return nil
}

// Reject refuses a CONNECT_REQUEST, sending priv (at most
// MaxPrivateDataReject bytes), as rdma_reject: the dialer gets REJECTED
// with RejectConsumer.
func (e *CMEvent) Reject(ctx context.Context, priv []byte) error {
	if e.Type != CMConnectRequest {
		return errorf(abi.CodeInvalid, "vrdma: reject a %s event: only a CONNECT_REQUEST can be rejected", e.Type)
	}
	_, err := e.ch.vm.c.call(ctx, abi.OpRejectRequest, &abi.RejectRequest{Listener: e.listener, ID: e.id, PrivateData: priv}, nil)
	if err != nil {
		return fmt.Errorf("vrdma: reject connection from %s/%s: %w", e.RemoteVM, e.RemoteAdapter, err)
	}
	return nil
}

// Disconnect disconnects q, connected through an event channel, as
// rdma_disconnect: q moves to ERR (its work requests flush), and both
// sides get DISCONNECTED then TIMEWAIT_EXIT (a side the peer disconnected
// first had them already).
func (q *QP) Disconnect(ctx context.Context) error {
	if _, err := q.vm.c.call(ctx, abi.OpCMDisconnect, &abi.CMDisconnect{QP: q.handle}, nil); err != nil {
		return fmt.Errorf("vrdma: disconnect QP 0x%x: %w", q.qpn, err)
	}
	return nil
}

// lookupName is remote as the agent takes it: an IP address, a GID,
// "vm/vrdmaN" as they are, and a name (a host's, or one an adapter's
// address has in /etc/hosts or DNS) looked up by this process, as a
// program's getaddrinfo would: its first IPv4 address, else its first.
func lookupName(ctx context.Context, remote string) (string, error) {
	if strings.Contains(remote, "/") {
		return remote, nil
	}
	if _, err := netip.ParseAddr(remote); err == nil {
		return remote, nil
	}
	if _, err := abi.ParseGID(remote); err == nil {
		return remote, nil
	}
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", remote)
	if err != nil || len(addrs) == 0 {
		return "", fmt.Errorf("vrdma: %q is not an address, a GID or \"vm/vrdmaN\", and does not resolve as a name: %v", remote, err)
	}
	for _, a := range addrs {
		if a.Unmap().Is4() {
			return a.Unmap().String(), nil
		}
	}
	return addrs[0].String(), nil
}
