// SPDX-License-Identifier: Apache-2.0

package abi

// rdma_cm's event channels (ops 40..47, docs/wire-local.md §4.12). A
// session opens a channel and gets a socket end on which the agent writes
// one CMEvent per message, as JSON; the channel's listens, address and
// route resolutions, connects and disconnects are commands that answer at
// once, and their outcome arrives as an event. This is the shape of
// librdmacm's event channel, whose fd programs poll.

import (
	"encoding/hex"
	"fmt"
)

// The private data sizes rdma_cm gives RDMA_PS_TCP consumers: the IBTA
// sizes of REQ (92), REP (196) and REJ (148) private data, less the 36
// bytes of rdma_cm's own header in a REQ.
const (
	MaxPrivateDataREQ = 56
	MaxPrivateDataREP = 196
	MaxPrivateDataREJ = 148
)

// The private data sizes rdma_cm gives RDMA_PS_UDP consumers, whose
// "connections" are service ID resolutions (SIDR): the IBTA size of a
// SIDR REQ's private data (216) less rdma_cm's 36-byte header, and a
// SIDR REP's (136).
const (
	MaxPrivateDataSIDRREQ = 180
	MaxPrivateDataSIDRREP = 136
)

// PrivateData is connection private data, written as hex in JSON.
type PrivateData []byte

// MarshalText writes p in lower-case hex.
func (p PrivateData) MarshalText() ([]byte, error) {
	return []byte(hex.EncodeToString(p)), nil
}

// UnmarshalText reads hex; more than 4096 digits is refused before
// decoding (no private data is that large).
func (p *PrivateData) UnmarshalText(b []byte) error {
	if len(b) > 4096 {
		return fmt.Errorf("private data of %d hex digits: at most %d bytes are allowed", len(b), MaxPrivateDataREP)
	}
	d := make([]byte, hex.DecodedLen(len(b)))
	if _, err := hex.Decode(d, b); err != nil {
		return fmt.Errorf("private data is not hex: %v", err)
	}
	*p = d
	return nil
}

func checkPrivateData(p PrivateData, limit int, what string) error {
	if len(p) > limit {
		return Errorf(CodeInvalid, "private_data", "%d bytes of %s private data: at most %d are allowed (IBTA)", len(p), what, limit)
	}
	return nil
}

// IBTA CM reject reasons (ib_cm's IB_CM_REJ_*) that vrdma sends.
const (
	RejectTimeout          = 4  // IB_CM_REJ_TIMEOUT
	RejectInvalidServiceID = 8  // IB_CM_REJ_INVALID_SERVICE_ID: nothing listens on the port
	RejectConsumer         = 28 // IB_CM_REJ_CONSUMER_DEFINED: the listener rejected
)

// RejectInfo is a CM reject: its IBTA reason and the REJ's private data.
type RejectInfo struct {
	Reason      uint16      `json:"reason"`
	PrivateData PrivateData `json:"private_data,omitempty"`
}

// CM event types, numbered as rdma_cm's enum rdma_cm_event_type.
const (
	CMEventAddrResolved   = 0
	CMEventAddrError      = 1
	CMEventRouteResolved  = 2
	CMEventRouteError     = 3
	CMEventConnectRequest = 4
	// CONNECT_RESPONSE: the REP of a connect whose QP the workload moves
	// itself (CMConnect.QPN); rdma_establish (cm-establish) follows.
	CMEventConnectResponse = 5
	CMEventUnreachable     = 7
	CMEventRejected        = 8
	CMEventEstablished     = 9
	CMEventDisconnected    = 10
	CMEventTimewaitExit    = 15
)

// CMListen listens on an adapter of the attached VM, or on every one
// (Adapter ""), on Port; requests arrive on channel Channel as
// CONNECT_REQUEST events carrying Cookie. With UD it listens in
// rdma_cm's UDP port space (RDMA_PS_UDP), a port space of its own: its
// requests are service ID resolutions (SIDR), answered with a UD QP's
// number and Q_Key (accept-request) and no connection.
//
// HostPort also makes the VM the listener of Port on this host's own
// addresses (its loopback and PVRDMA addresses), as rdma_cm's listeners on
// a host address or the any address are on a device of the host's
// network: a connect or resolve to such an address and Port reaches it,
// from this host or another. One VM holds a host port at a time: another
// is CodeExists (EADDRINUSE). Only a process in the agent's own network
// namespace may hold one; from another (a VM's namespace), HostPort
// "addr" is CodeInvalid and "any" is ignored.
type CMListen struct {
	Channel  uint32 `json:"channel"`
	Adapter  string `json:"adapter"`
	Port     uint16 `json:"port"`
	Cookie   uint64 `json:"cookie"`
	UD       bool   `json:"ud,omitempty"`
	HostPort string `json:"host_port,omitempty"` // "", "addr" (bound to a host address) or "any" (to the any address)
}

// Validate checks the adapter and port.
func (l *CMListen) Validate() error {
	if l.Adapter != "" {
		if err := ValidAdapter(l.Adapter); err != nil {
			return err
		}
	}
	if l.Port == 0 {
		return Errorf(CodeInvalid, "port", "service port 0 is reserved: pick 1..65535")
	}
	switch l.HostPort {
	case "", HostPortAddr, HostPortAny:
	default:
		return Errorf(CodeInvalid, "host_port", "host_port %q is not \"\", %q or %q", l.HostPort, HostPortAddr, HostPortAny)
	}
	return nil
}

// CMListen.HostPort's values.
const (
	HostPortAddr = "addr" // bound to an address of the host: the host port is required
	HostPortAny  = "any"  // bound to the any address: the host port too, for a process in the host's network
)

// CMResolve resolves Remote (an adapter's IPv4 address, a GID or
// "vm/vrdmaN") to an adapter of the fabric and picks the local adapter
// that reaches it (Adapter, if given); the answer is ADDR_RESOLVED or
// ADDR_ERROR with Cookie on Channel.
//
// Remote may also be an address of a host — its loopback address (this
// host) or a host's PVRDMA address — with Port, the port rdma_resolve_addr
// was given: it resolves to the adapter of the VM that holds that host's
// port (CMListen.HostPort), or, while none does, to the host alone (no
// remote adapter: the connect looks again).
type CMResolve struct {
	Channel uint32 `json:"channel"`
	Cookie  uint64 `json:"cookie"`
	Remote  string `json:"remote"`
	Adapter string `json:"adapter"`
	Port    uint16 `json:"port,omitempty"`
	UD      bool   `json:"ud,omitempty"` // Port is of the UDP port space (a UD ID's)
}

// Validate checks the remote's length and the adapter.
func (r *CMResolve) Validate() error {
	if r.Remote == "" || len(r.Remote) > 128 {
		return Errorf(CodeInvalid, "remote", "remote %q must be an IP address, a GID or \"vm/vrdmaN\"", r.Remote)
	}
	if r.Adapter != "" {
		return ValidAdapter(r.Adapter)
	}
	return nil
}

// CMRoute resolves the route of a resolved address: ROUTE_RESOLVED with
// Cookie on Channel (a vrdma path is chosen at connect).
type CMRoute struct {
	Channel uint32 `json:"channel"`
	Cookie  uint64 `json:"cookie"`
}

// CMConnect dials Remote and Port with QP (in RESET or INIT) and
// PrivateData in the REQ; the outcome is ESTABLISHED (the QP is in RTS),
// REJECTED or UNREACHABLE with Cookie on Channel. With QPN instead of QP,
// the session's QP of that number (in RESET or INIT) is one the workload
// moves itself, rdma_cm's "external" QP: the agent leaves it alone, the
// outcome is CONNECT_RESPONSE with the peer's QPN and GID, the PSNs and
// the path MTU to move it with, and the acceptor's ESTABLISHED waits for
// the workload's cm-establish (rdma_establish).
//
// With UD, QP (or QPN) is a UD QP and the connect is a service ID
// resolution (a SIDR REQ) to a listener of the UDP port space: the agent
// leaves the QP alone, and the outcome is ESTABLISHED with the listener's
// UD QP number, GID and Q_Key (its SIDR REP), or REJECTED or UNREACHABLE;
// nothing is connected, so no DISCONNECTED follows.
type CMConnect struct {
	Channel     uint32      `json:"channel"`
	Cookie      uint64      `json:"cookie"`
	QP          uint32      `json:"qp"`
	QPN         uint32      `json:"qpn,omitempty"`
	Remote      string      `json:"remote"`
	Port        uint16      `json:"port"`
	TimeoutMS   uint32      `json:"timeout_ms"`
	PrivateData PrivateData `json:"private_data,omitempty"`
	// AckTimeout is as Connect's.
	AckTimeout *uint8 `json:"ack_timeout,omitempty"`
	UD         bool   `json:"ud,omitempty"`
}

// Validate checks the port, the remote, the ACK timeout and the private
// data's size.
func (c *CMConnect) Validate() error {
	if err := checkOneQP(c.QP, c.QPN); err != nil {
		return err
	}
	if err := (&Connect{Remote: c.Remote, Port: c.Port, AckTimeout: c.AckTimeout}).Validate(); err != nil {
		return err
	}
	if c.UD {
		return checkPrivateData(c.PrivateData, MaxPrivateDataSIDRREQ, "SIDR REQ (connect of a UD ID)")
	}
	return checkPrivateData(c.PrivateData, MaxPrivateDataREQ, "REQ (connect)")
}

// CMDisconnect disconnects QP, connected by cm-connect or by an accept of
// a cm-listen request: it moves to ERR (flushing), and both sides get
// DISCONNECTED then TIMEWAIT_EXIT.
type CMDisconnect struct {
	QP uint32 `json:"qp"`
}

// CMEstablish is rdma_establish: the dialer of a connection whose QP it
// moves itself (CMConnect.QPN) has its QP in RTS; the acceptor gets
// ESTABLISHED (the RTU). QP is that QP's handle, as CONNECT_RESPONSE names
// it.
type CMEstablish struct {
	QP uint32 `json:"qp"`
}

// CMEvent is one message of an event channel.
type CMEvent struct {
	Event  int    `json:"event"`            // CMEvent*
	Status int    `json:"status"`           // 0, a negative errno, or (REJECTED) the IBTA reject reason
	Cookie uint64 `json:"cookie,omitempty"` // the request's cookie (listen, resolve, route, connect)
	// Listener and ID name a CONNECT_REQUEST (for accept-request and
	// reject-request) and the passive side's ESTABLISHED.
	Listener uint32 `json:"listener,omitempty"`
	ID       uint32 `json:"id,omitempty"`
	QP       uint32 `json:"qp,omitempty"` // ESTABLISHED, DISCONNECTED, TIMEWAIT_EXIT: the QP's handle
	// The peer, and this side's adapter.
	RemoteVM      string `json:"remote_vm,omitempty"`
	RemoteAdapter string `json:"remote_adapter,omitempty"`
	RemoteGID     GID    `json:"remote_gid"`
	RemoteQPN     uint32 `json:"remote_qpn,omitempty"`
	Adapter       string `json:"adapter,omitempty"`
	Port          uint16 `json:"port,omitempty"`
	// PrivateData is the REQ's (CONNECT_REQUEST), the REP's (ESTABLISHED
	// of the dialer) or the REJ's (REJECTED).
	PrivateData PrivateData `json:"private_data,omitempty"`
	Path        *PathInfo   `json:"path,omitempty"`
	Message     string      `json:"message,omitempty"` // why, for people
	// CONNECT_REQUEST and CONNECT_RESPONSE: what a QP the workload moves
	// itself needs (ConnRequest's SQPSN, RQPSN and MTU).
	SQPSN uint32 `json:"sq_psn,omitempty"`
	RQPSN uint32 `json:"rq_psn,omitempty"`
	MTU   uint32 `json:"mtu,omitempty"`
	// QKey, in the ESTABLISHED of a UD connect, is the listener's UD QP's
	// Q_Key (RemoteQPN is that QP's number).
	QKey uint32 `json:"qkey,omitempty"`
	// LocalIP and PeerIP are the addresses a connection by a host's
	// address uses: in ADDR_RESOLVED the address the dialer dials from
	// (its host's: 127.0.0.1 to this host, else its PVRDMA address), in
	// CONNECT_REQUEST as ConnRequest's.
	LocalIP string `json:"local_ip,omitempty"`
	PeerIP  string `json:"peer_ip,omitempty"`
}
