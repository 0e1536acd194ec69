// SPDX-License-Identifier: Apache-2.0

package abi

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
)

// Command messages travel on the agent's SOCK_SEQPACKET Unix socket, one
// message per packet: a 16-byte header, then a JSON body.
//
//	0      2        3      4      6          8      12         16
//	| "VR" | version| flags| op   | reserved | seq  | body len | JSON body ...
//
// A response carries the request's op and seq with FlagResponse set, and
// FlagError when its body is an *Error. File descriptors ride along as
// SCM_RIGHTS on the messages that the op's documentation names.

// CmdHeaderSize is the size of a command message header (WireMsgHeader).
const CmdHeaderSize = 16

// MaxMessage bounds a command message, header included.
const MaxMessage = 1 << 20

// Header flags.
const (
	FlagResponse = 1 << 0
	FlagError    = 1 << 1
)

// Op identifies a command.
type Op uint16

// Commands. Their request and response bodies are the types named in the
// comment; "fds:" lists descriptors the response carries, in order. The
// table of operations (ops.go) gives each its name, request body and how
// the agent serves it.
const (
	OpHello         Op = 1  // Hello → HelloReply
	OpAttach        Op = 2  // Attach → AttachReply; fds: guest memory memfd
	OpQueryDevice   Op = 3  // AdapterRef → DeviceAttr
	OpQueryPort     Op = 4  // AdapterRef → PortAttr
	OpAllocPD       Op = 5  // AdapterRef → Handle
	OpDeallocPD     Op = 6  // Handle → Empty
	OpRegMR         Op = 7  // RegMR → RegMRReply
	OpDeregMR       Op = 8  // Handle → Empty
	OpCreateCQ      Op = 9  // CreateCQ → CreateCQReply; fds: ring memfd, event socket (socketpair end)
	OpDestroyCQ     Op = 10 // Handle → Empty
	OpCreateQP      Op = 11 // CreateQP → CreateQPReply; fds: ring memfd, doorbell socket (socketpair end)
	OpModifyQP      Op = 12 // ModifyQP → Empty
	OpQueryQP       Op = 13 // Handle → QueryQPReply
	OpDestroyQP     Op = 14 // Handle → Empty
	OpListen        Op = 15 // Listen → Handle
	OpGetRequest    Op = 16 // Handle (listener) → ConnRequest; blocks until a peer dials
	OpAcceptRequest Op = 17 // AcceptRequest → ConnectReply
	OpRejectRequest Op = 18 // RejectRequest → Empty
	OpCloseListener Op = 19 // Handle → Empty
	OpConnect       Op = 20 // Connect → ConnectReply; blocks until accepted or refused
	OpStatus        Op = 21 // Empty → Status
	OpDefineVM      Op = 22 // DefineVM → Empty
	OpUndefineVM    Op = 23 // VMRef → Empty
	OpListVMs       Op = 24 // Empty → VMList
	OpCreateVM      Op = 25 // CreateVM → VMInfo
	OpGetVM         Op = 26 // VMRef → VMInfo
	OpEditVM        Op = 27 // EditVM → EditReply
	OpPowerOnVM     Op = 28 // PowerOnVM → PowerReply
	OpPowerOffVM    Op = 29 // VMRef → PowerReply
	OpConnectVM     Op = 30 // ConnectAdapter → ConnectReply
	// 31..34: shared receive queues (srq.go).
	OpCreateSRQ  Op = 31 // CreateSRQ → CreateSRQReply; fds: ring memfd
	OpModifySRQ  Op = 32 // ModifySRQ → Empty
	OpQuerySRQ   Op = 33 // Handle → SRQAttr
	OpDestroySRQ Op = 34 // Handle → Empty

	OpCreateAH  Op = 35 // CreateAH → CreateAHReply
	OpDestroyAH Op = 36 // Handle → Empty
	// 35..39 are left for other commands; 40..47 are rdma_cm's event
	// channels (cmev.go).
	OpCMOpenChannel  Op = 40 // Empty → Handle; fds: event socket (socketpair end)
	OpCMCloseChannel Op = 41 // Handle → Empty
	OpCMListen       Op = 42 // CMListen → Handle
	OpCMCloseListen  Op = 43 // Handle → Empty
	OpCMResolve      Op = 44 // CMResolve → Empty; then ADDR_RESOLVED or ADDR_ERROR
	OpCMRoute        Op = 45 // CMRoute → Empty; then ROUTE_RESOLVED
	OpCMConnect      Op = 46 // CMConnect → Empty; then ESTABLISHED, REJECTED or UNREACHABLE
	OpCMDisconnect   Op = 47 // CMDisconnect → Empty; then DISCONNECTED on both sides
	// 48: ibv_get_async_event's source (events.go).
	OpAsyncOpen Op = 48 // AdapterRef → Empty; fds: event socket (socketpair end)
	// 49: rdma_establish of a connection whose QP the program moves itself.
	OpCMEstablish Op = 49 // CMEstablish → Empty; then the acceptor's ESTABLISHED
	// 52, 53: ibv_rereg_mr and ibv_resize_cq (coreverbs.go).
	OpReregMR  Op = 52 // ReregMR → RegMRReply
	OpResizeCQ Op = 53 // ResizeCQ → CreateCQReply; fds: the new ring memfd
	// 54, 55: memory windows (mw.go).
	OpAllocMW   Op = 54 // AllocMW → AllocMWReply
	OpDeallocMW Op = 55 // Handle → Empty
	// 56: ibv_open_qp; 58, 59: XRC domains (xrc.go).
	OpOpenQP    Op = 56 // OpenQP → CreateQPReply (handle and QPN only)
	OpOpenXRCD  Op = 58 // OpenXRCD → Handle; the request carries the domain's file (SCM_RIGHTS) when OpenXRCD.FD
	OpCloseXRCD Op = 59 // Handle → Empty

	OpDirectOpen Op = 60 // Empty → DirectOpenReply; fds: grant table memfd, revocation socket (socketpair end)
	OpDirectMap  Op = 61 // DirectMap → DirectGrant; fds: the peer session's guest memory memfd
	OpCQNotify   Op = 62 // Handle (CQ) → Empty
	// 63, 67: the memcpy-direct send channel (direct_send.go).
	OpDirectChannel Op = 63 // Handle (QP) → DirectChannel; fds: the channel file
	OpDirectNotify  Op = 67 // DirectNotify → Empty
	// 64..66: UD multicast (mcast.go).
	OpAttachMcast Op = 64 // Mcast → Empty
	OpDetachMcast Op = 65 // Mcast → Empty
	OpCMJoin      Op = 66 // CMJoin → Empty; then MULTICAST_JOIN or MULTICAST_ERROR
	// 68: ibv_advise_mr of on-demand regions (odp.go).
	OpAdviseMR Op = 68 // AdviseMR → Empty
	opMax      Op = 72
)

// Known reports whether o is an op of this ABI version.
func (o Op) Known() bool { _, ok := o.Info(); return ok }

// String returns the op's name (OpInfo.Name), or "op(N)" for a number
// that is not an op.
func (o Op) String() string {
	if in, ok := o.Info(); ok {
		return in.Name
	}
	return fmt.Sprintf("op(%d)", uint16(o))
}

// Header is a decoded command message header.
type Header struct {
	Version uint8
	Flags   uint8
	Op      Op
	Seq     uint32
	Len     uint32
}

// AppendMessage appends a message with header h (Len is computed) and the
// JSON encoding of body to dst.
func AppendMessage(dst []byte, h Header, body any) ([]byte, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return dst, fmt.Errorf("encode %s body: %w", h.Op, err)
	}
	if CmdHeaderSize+len(b) > MaxMessage {
		return dst, fmt.Errorf("%s message of %d bytes exceeds the %d-byte limit", h.Op, CmdHeaderSize+len(b), MaxMessage)
	}
	var hdr [CmdHeaderSize]byte
	hdr[mhMagic], hdr[mhMagic+1] = 'V', 'R'
	hdr[mhVersion] = h.Version
	hdr[mhFlags] = h.Flags
	binary.LittleEndian.PutUint16(hdr[mhOp:], uint16(h.Op))
	binary.LittleEndian.PutUint32(hdr[mhSeq:], h.Seq)
	binary.LittleEndian.PutUint32(hdr[mhLen:], uint32(len(b)))
	return append(append(dst, hdr[:]...), b...), nil
}

// PeekOp returns the op of message msg, which holds at least a header,
// without checking it.
func PeekOp(msg []byte) Op { return Op(binary.LittleEndian.Uint16(msg[mhOp:])) }

// ParseMessage splits msg into its header and body, checking the magic,
// the version, the op and the length.
func ParseMessage(msg []byte) (Header, []byte, error) {
	var h Header
	if len(msg) < CmdHeaderSize {
		return h, nil, Errorf(CodeInvalid, "header", "message of %d bytes is shorter than the %d-byte header", len(msg), CmdHeaderSize)
	}
	if msg[mhMagic] != 'V' || msg[mhMagic+1] != 'R' {
		return h, nil, Errorf(CodeInvalid, "magic", "message does not start with the \"VR\" magic: not a vrdma client")
	}
	h.Version = msg[mhVersion]
	h.Flags = msg[mhFlags]
	h.Op = Op(binary.LittleEndian.Uint16(msg[mhOp:]))
	h.Seq = binary.LittleEndian.Uint32(msg[mhSeq:])
	h.Len = binary.LittleEndian.Uint32(msg[mhLen:])
	if h.Version != Version {
		return h, nil, Errorf(CodeInvalid, "version", "ABI version %d, but this side speaks %d: use a library and agent of the same release", h.Version, Version)
	}
	if !h.Op.Known() {
		return h, nil, Errorf(CodeInvalid, "op", "unknown op %d", uint16(h.Op))
	}
	if uint64(h.Len) != uint64(len(msg)-CmdHeaderSize) {
		return h, nil, Errorf(CodeInvalid, "len", "header says %d body bytes, message has %d", h.Len, len(msg)-CmdHeaderSize)
	}
	return h, msg[CmdHeaderSize:], nil
}

// NewRequest returns a zero request body for op, to decode into: from the
// table of operations (ops.go), or from the constructor registered for an
// External op. It returns nil for an unknown op, and for an External op
// whose package this program does not link.
func NewRequest(op Op) any {
	in, ok := op.Info()
	switch {
	case !ok:
		return nil
	case in.Request != nil:
		return in.Request()
	case registered[op] != nil:
		return registered[op]()
	}
	return nil
}

// registered are the constructors of the External ops' request bodies:
// the management commands' (package mgmt).
var registered [opMax]func() any

// RegisterRequest makes NewRequest return bodies of op from mk, for an op
// the table marks External (package mgmt calls it from its init).
// Registering an op twice, or one whose body package abi defines, is a
// programming error: it panics.
func RegisterRequest(op Op, mk func() any) {
	if in, ok := op.Info(); !ok || !in.External || registered[op] != nil {
		panic(fmt.Sprintf("abi: RegisterRequest(%s): not an External op, or its body is registered already", op))
	}
	registered[op] = mk
}

// Validator is implemented by request bodies with checks beyond decoding.
type Validator interface {
	Validate() error
}

// DecodeRequest parses a whole request message into its header and a
// validated body. Errors name the field at fault.
func DecodeRequest(msg []byte) (Header, any, error) {
	h, body, err := ParseMessage(msg)
	if err != nil {
		return h, nil, err
	}
	if h.Flags&FlagResponse != 0 {
		return h, nil, fmt.Errorf("%s: %w", h.Op, Errorf(CodeInvalid, "flags", "a response where a request was expected"))
	}
	req := NewRequest(h.Op)
	if req == nil {
		return h, nil, fmt.Errorf("%s: %w", h.Op, Errorf(CodeInvalid, "op", "this program does not serve %s (its body is defined in a package it does not link)", h.Op))
	}
	if err := json.Unmarshal(body, req); err != nil {
		// Name the field at fault when the decoder knows it.
		field := "body"
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			field = te.Field
		}
		return h, nil, fmt.Errorf("%s: %w", h.Op, Errorf(CodeInvalid, field, "decode body: %v", err))
	}
	if v, ok := req.(Validator); ok {
		if err := v.Validate(); err != nil {
			return h, nil, fmt.Errorf("%s: %w", h.Op, err)
		}
	}
	return h, req, nil
}

// Error codes, stable strings that scripts may match.
const (
	CodeInvalid     = "invalid-argument"
	CodeNotFound    = "not-found"
	CodeLimit       = "limit-exceeded"
	CodeState       = "bad-state"
	CodeExists      = "already-exists"
	CodePermission  = "permission-denied"
	CodeUnavailable = "unavailable"
	CodeRefused     = "refused"
	CodeInternal    = "internal"
)

// ErrorCodes returns every error code of this ABI version, in the order
// of docs/wire-local.md §3.
func ErrorCodes() []string {
	return []string{CodeInvalid, CodeNotFound, CodeLimit, CodeState, CodeExists, CodePermission, CodeUnavailable, CodeRefused, CodeInternal}
}

// Error is the body of an error response.
type Error struct {
	Code    string `json:"code"`
	Field   string `json:"field,omitempty"`
	Message string `json:"message"`
	// Reject, on a refused connect (CodeRefused), is the IBTA reject the
	// listener's side sent: its reason and private data.
	Reject *RejectInfo `json:"reject,omitempty"`
}

func (e *Error) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("%s (field %s): %s", e.Message, e.Field, e.Code)
	}
	return e.Message
}

// Errorf returns an *Error with code and a formatted message.
func Errorf(code, field, format string, args ...any) *Error {
	return &Error{Code: code, Field: field, Message: fmt.Sprintf(format, args...)}
}

// Empty is a body with no fields.
type Empty struct{}

// Hello opens a session. It is optional: a session may start with any
// command, but only hello tells the client what the agent serves.
type Hello struct {
	Client string `json:"client"`
	// Caps are the features the client knows (see Caps); a client older
	// than capability bits sends none.
	Caps Caps `json:"caps"`
}

// HelloReply describes the agent.
type HelloReply struct {
	Host         string `json:"host"`
	HostID       string `json:"host_id"`
	AgentVersion string `json:"agent_version"`
	// Caps are the features this agent serves to this session (see
	// Caps); 0 from an agent older than capability bits, which serves
	// CapsBaseline.
	Caps Caps `json:"caps"`
}

// Attach attaches the session to a VM by name.
type Attach struct {
	VM string `json:"vm"`
}

// Validate checks the VM name.
func (a *Attach) Validate() error { return ValidName("vm", a.VM) }

// AdapterInfo describes one adapter of an attached VM.
type AdapterInfo struct {
	Name  string `json:"name"`
	Index int    `json:"index"`
	MAC   string `json:"mac"`
	GID   GID    `json:"gid"`
	// IPv4 and IPv6 are the adapter's addresses on its port group
	// (omitted when it has none); with IPv4, GID is its IPv4-mapped form.
	IPv4 string `json:"ipv4,omitempty"`
	IPv6 string `json:"ipv6,omitempty"`
}

// AttachReply describes the attached VM; the guest memory memfd rides along.
type AttachReply struct {
	VM        string        `json:"vm"`
	Host      string        `json:"host"`
	MemSize   uint64        `json:"mem_size"`
	MemLocked bool          `json:"mem_locked"`
	AsyncMode bool          `json:"async_mode"`
	Adapters  []AdapterInfo `json:"adapters"`
}

// AdapterRef names an adapter of the attached VM ("vrdma0").
type AdapterRef struct {
	Adapter string `json:"adapter"`
}

// Validate checks the adapter name.
func (a *AdapterRef) Validate() error { return ValidAdapter(a.Adapter) }

// ValidAdapter checks an adapter name: vrdmaN, N of at most three digits.
func ValidAdapter(s string) error {
	if len(s) < 6 || len(s) > 8 || s[:5] != "vrdma" {
		return Errorf(CodeInvalid, "adapter", "adapter %q is not of the form vrdmaN", s)
	}
	for _, c := range s[5:] {
		if c < '0' || c > '9' {
			return Errorf(CodeInvalid, "adapter", "adapter %q is not of the form vrdmaN", s)
		}
	}
	return nil
}

// Handle names an object of the session (PD, MR, CQ, QP, listener).
type Handle struct {
	Handle uint32 `json:"handle"`
}

// RegMR registers a memory region of guest memory.
type RegMR struct {
	PD     uint32 `json:"pd"`
	Addr   uint64 `json:"addr"`
	Length uint64 `json:"length"`
	Access Access `json:"access"`
	// IOVA, when present (CapMRIOVA), is the address of the region's
	// first byte as SGEs and remote addresses name it; absent, it is Addr
	// (the guest address), as before the bit.
	IOVA *uint64 `json:"iova,omitempty"`
}

// Validate checks the access flags and the iova's range.
func (r *RegMR) Validate() error {
	if r.IOVA != nil && r.Length > 0 && *r.IOVA+r.Length-1 < *r.IOVA {
		return Errorf(CodeInvalid, "iova", "region [iova 0x%x, +%d) wraps around the 64-bit address space", *r.IOVA, r.Length)
	}
	if r.Access&^AccessMR != 0 {
		return Errorf(CodeInvalid, "access", "unknown access flags 0x%x", uint32(r.Access&^AccessMR))
	}
	if r.Access&(AccessRemoteWrite|AccessRemoteAtomic) != 0 && r.Access&AccessLocalWrite == 0 {
		return Errorf(CodeInvalid, "access", "REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE too (as in ibv_reg_mr)")
	}
	return nil
}

// RegMRReply returns the new region's handle and keys.
type RegMRReply struct {
	Handle uint32 `json:"handle"`
	LKey   uint32 `json:"lkey"`
	RKey   uint32 `json:"rkey"`
}

// CreateCQ creates a completion queue of at least CQE entries.
type CreateCQ struct {
	Adapter string `json:"adapter"`
	CQE     uint32 `json:"cqe"`
	// Overrun (capability cq-overrun) makes a full CQ overrun as a
	// device's does: the completion that finds every entry taken breaks
	// the CQ (IBV_EVENT_CQ_ERR, its QPs to ERR). Without it the agent
	// holds the CQ's producers back until the consumer makes room.
	Overrun bool `json:"overrun,omitempty"`
}

// Validate checks the adapter and size.
func (c *CreateCQ) Validate() error {
	if err := ValidAdapter(c.Adapter); err != nil {
		return err
	}
	if c.CQE == 0 || c.CQE > MaxCQE {
		return Errorf(CodeInvalid, "cqe", "cqe %d out of range 1..%d (max_cqe)", c.CQE, MaxCQE)
	}
	return nil
}

// CreateCQReply returns the CQ and its ring geometry.
type CreateCQReply struct {
	Handle uint32   `json:"handle"`
	Layout CQLayout `json:"layout"`
}

// QPType is a queue pair's transport type.
type QPType string

// QP types.
const (
	QPTypeRC QPType = "RC"
	// QPTypeUC is an unreliable connected QP (capability uc): SEND and
	// RDMA WRITE, with and without immediate, no ACKs and no
	// retransmission; a message a lost packet broke is dropped whole.
	QPTypeUC QPType = "UC"
)

// CreateQP creates a queue pair.
type CreateQP struct {
	PD       uint32 `json:"pd"`
	SendCQ   uint32 `json:"send_cq"`
	RecvCQ   uint32 `json:"recv_cq"`
	Type     QPType `json:"qp_type"`
	SQSigAll bool   `json:"sq_sig_all"`
	Caps     QPCaps `json:"caps"`
	// SRQ, when nonzero, is the handle of the shared receive queue the QP
	// takes its receives from (ibv_qp_init_attr.srq); its own receive
	// queue then holds nothing, and Caps' receive sizes are ignored.
	SRQ uint32 `json:"srq,omitempty"`
	// XRCD is the handle of the XRC domain of an XRC target QP
	// (QPTypeXRCRecv, xrc.go), which has no PD, CQs or queues: PD,
	// SendCQ, RecvCQ and Caps are ignored. An XRC initiator QP
	// (QPTypeXRCSend) has a PD and a send CQ, and no receive CQ (RecvCQ
	// 0 is taken as SendCQ: the QP never receives).
	XRCD uint32 `json:"xrcd,omitempty"`
}

// Validate checks the type; caps are checked by NewQPLayout.
func (c *CreateQP) Validate() error {
	switch {
	case c.Type != QPTypeRC && c.Type != QPTypeUD && c.Type != QPTypeUC && !c.Type.IsXRC():
		return Errorf(CodeInvalid, "qp_type", "QP type %q is not supported: only RC, UC, UD, XRC_SEND and XRC_RECV", c.Type)
	case c.Type == QPTypeXRCRecv && c.XRCD == 0:
		return Errorf(CodeInvalid, "xrcd", "an XRC_RECV QP needs its XRC domain (IBV_QP_INIT_ATTR_XRCD)")
	case c.Type.IsXRC() && c.SRQ != 0:
		return Errorf(CodeInvalid, "srq", "an XRC QP takes no SRQ: an XRC target QP's receives go to the SRQ each sender names")
	}
	return nil
}

// CreateQPReply returns the QP, its number, real caps and ring geometry.
type CreateQPReply struct {
	Handle uint32   `json:"handle"`
	QPN    uint32   `json:"qpn"`
	Caps   QPCaps   `json:"caps"`
	Layout QPLayout `json:"layout"`
}

// QPAttrMask selects the attributes a ModifyQP applies (IBV_QP_*).
type QPAttrMask uint32

// Attribute mask bits, valued as in ibv_qp_attr_mask.
const (
	MaskState           QPAttrMask = 1 << 0
	MaskAccessFlags     QPAttrMask = 1 << 3
	MaskPort            QPAttrMask = 1 << 5
	MaskAV              QPAttrMask = 1 << 7
	MaskPathMTU         QPAttrMask = 1 << 8
	MaskTimeout         QPAttrMask = 1 << 9
	MaskRetryCnt        QPAttrMask = 1 << 10
	MaskRNRRetry        QPAttrMask = 1 << 11
	MaskRQPSN           QPAttrMask = 1 << 12
	MaskMaxRdAtomic     QPAttrMask = 1 << 13
	MaskMinRNRTimer     QPAttrMask = 1 << 15
	MaskSQPSN           QPAttrMask = 1 << 16
	MaskMaxDestRdAtomic QPAttrMask = 1 << 17
	MaskDestQPN         QPAttrMask = 1 << 20
)

// QPAttr are a queue pair's attributes (ibv_qp_attr, the RC subset).
type QPAttr struct {
	State           QPState `json:"qp_state"`
	AccessFlags     Access  `json:"qp_access_flags"`
	Port            uint8   `json:"port_num"`
	PathMTU         uint32  `json:"path_mtu"`
	DestQPN         uint32  `json:"dest_qp_num"`
	DGID            GID     `json:"dgid"`
	RQPSN           uint32  `json:"rq_psn"`
	SQPSN           uint32  `json:"sq_psn"`
	Timeout         uint8   `json:"timeout"`
	RetryCnt        uint8   `json:"retry_cnt"`
	RNRRetry        uint8   `json:"rnr_retry"`
	MinRNRTimer     uint8   `json:"min_rnr_timer"`
	MaxRdAtomic     uint8   `json:"max_rd_atomic"`
	MaxDestRdAtomic uint8   `json:"max_dest_rd_atomic"`
	// QKey is a UD QP's Q_Key (IBV_QP_QKEY, ud.go).
	QKey uint32 `json:"qkey,omitempty"`
	// PKeyIndex is a UD QP's P_Key index (IBV_QP_PKEY_INDEX): 0, the only one.
	PKeyIndex uint16 `json:"pkey_index,omitempty"`
}

// ModifyQP changes the attributes in Mask.
type ModifyQP struct {
	Handle uint32     `json:"handle"`
	Mask   QPAttrMask `json:"mask"`
	Attr   QPAttr     `json:"attr"`
}

// Validate checks the ranges of the attributes the mask selects.
func (m *ModifyQP) Validate() error {
	a := &m.Attr
	switch {
	case m.Mask&MaskState != 0 && a.State > QPSErr:
		return Errorf(CodeInvalid, "qp_state", "QP state %d is not a state (0..6)", a.State)
	case m.Mask&MaskAccessFlags != 0 && a.AccessFlags&^AccessAll != 0:
		return Errorf(CodeInvalid, "qp_access_flags", "unknown access flags 0x%x", uint32(a.AccessFlags&^AccessAll))
	case m.Mask&MaskPort != 0 && a.Port != 1:
		return Errorf(CodeInvalid, "port_num", "port %d does not exist: adapters have port 1", a.Port)
	case m.Mask&MaskPathMTU != 0 && !validMTU(a.PathMTU):
		return Errorf(CodeInvalid, "path_mtu", "path MTU %d is not one of 256, 512, 1024, 2048, 4096", a.PathMTU)
	case m.Mask&MaskDestQPN != 0 && a.DestQPN >= 1<<24:
		return Errorf(CodeInvalid, "dest_qp_num", "QPN 0x%x does not fit 24 bits", a.DestQPN)
	case m.Mask&MaskRQPSN != 0 && a.RQPSN >= 1<<24:
		return Errorf(CodeInvalid, "rq_psn", "PSN 0x%x does not fit 24 bits", a.RQPSN)
	case m.Mask&MaskSQPSN != 0 && a.SQPSN >= 1<<24:
		return Errorf(CodeInvalid, "sq_psn", "PSN 0x%x does not fit 24 bits", a.SQPSN)
	case m.Mask&MaskTimeout != 0 && a.Timeout > 31:
		return Errorf(CodeInvalid, "timeout", "timeout %d out of range 0..31", a.Timeout)
	case m.Mask&MaskRetryCnt != 0 && a.RetryCnt > 7:
		return Errorf(CodeInvalid, "retry_cnt", "retry_cnt %d out of range 0..7", a.RetryCnt)
	case m.Mask&MaskRNRRetry != 0 && a.RNRRetry > 7:
		return Errorf(CodeInvalid, "rnr_retry", "rnr_retry %d out of range 0..7 (7 = infinite)", a.RNRRetry)
	case m.Mask&MaskMinRNRTimer != 0 && a.MinRNRTimer > 31:
		return Errorf(CodeInvalid, "min_rnr_timer", "min_rnr_timer %d out of range 0..31", a.MinRNRTimer)
	case m.Mask&MaskMaxRdAtomic != 0 && a.MaxRdAtomic > MaxRdAtom:
		return Errorf(CodeInvalid, "max_rd_atomic", "max_rd_atomic %d exceeds max_qp_init_rd_atom %d", a.MaxRdAtomic, MaxRdAtom)
	case m.Mask&MaskPKeyIndex != 0 && a.PKeyIndex != 0:
		return Errorf(CodeInvalid, "pkey_index", "P_Key index %d does not exist: adapters have one P_Key, index 0", a.PKeyIndex)
	case m.Mask&MaskMaxDestRdAtomic != 0 && a.MaxDestRdAtomic > MaxRdAtom:
		return Errorf(CodeInvalid, "max_dest_rd_atomic", "max_dest_rd_atomic %d exceeds max_qp_rd_atom %d", a.MaxDestRdAtomic, MaxRdAtom)
	}
	return nil
}

func validMTU(m uint32) bool { return m == 256 || m == 512 || m == 1024 || m == 2048 || m == 4096 }

// ValidMTU reports whether m is a RoCE (InfiniBand) MTU: 256, 512, 1024,
// 2048 or 4096 bytes.
func ValidMTU(m uint32) bool { return validMTU(m) }

// MaxRdAtom is the device's max_qp_rd_atom and max_qp_init_rd_atom.
const MaxRdAtom = 16

// The RC attributes a connection gets when its program does not choose
// them — the connection manager's and the library's QP.ConnectTo —:
// rc_pingpong's, with the device's full READ and atomic depth (MaxRdAtom).
//
// DefaultPathMTU is also an adapter's active MTU until its port group
// says otherwise (device.Adapter.SetActiveMTU); a connection's path MTU
// is the smaller of its two adapters' active MTUs.
const (
	DefaultPathMTU     = 1024
	DefaultMinRNRTimer = 12 // 0.64 ms
	DefaultTimeout     = 14 // 67 ms
	DefaultRetryCnt    = 7
	DefaultRNRRetry    = 7 // infinite
)

// PathInfo says how a connected QP moves its bytes and why: the path
// decision as the QP was bound at RTR, with every candidate it rejected.
type PathInfo struct {
	Path     PathKind        `json:"path"`
	Reason   string          `json:"reason"`
	Rejected []PathRejection `json:"rejected,omitempty"`
}

// PathRejection is a candidate path a decision did not choose, and why.
type PathRejection struct {
	Path PathKind `json:"path"`
	Why  string   `json:"why"`
}

// QueryQPReply returns a QP's attributes and path.
type QueryQPReply struct {
	QPN  uint32   `json:"qpn"`
	Attr QPAttr   `json:"attr"`
	Caps QPCaps   `json:"caps"`
	Path PathInfo `json:"path"`
}

// Listen starts listening for connections on (adapter, port).
type Listen struct {
	Adapter string `json:"adapter"`
	Port    uint16 `json:"port"`
}

// Validate checks the adapter and port.
func (l *Listen) Validate() error {
	if err := ValidAdapter(l.Adapter); err != nil {
		return err
	}
	if l.Port == 0 {
		return Errorf(CodeInvalid, "port", "service port 0 is reserved: pick 1..65535")
	}
	return nil
}

// ConnRequest is a peer's connection request, delivered to a listener.
type ConnRequest struct {
	ID            uint32 `json:"id"`
	RemoteVM      string `json:"remote_vm"`
	RemoteAdapter string `json:"remote_adapter"`
	RemoteGID     GID    `json:"remote_gid"`
	RemoteQPN     uint32 `json:"remote_qpn"`
	Port          uint16 `json:"port"`
	// PrivateData is the dialer's REQ private data (at most
	// MaxPrivateDataREQ bytes); omitted when empty.
	PrivateData PrivateData `json:"private_data,omitempty"`
	// Adapter is the listening adapter the request came to.
	Adapter string `json:"adapter,omitempty"`
	// The connection's numbers, for an acceptor that moves its QP
	// itself (AcceptRequest.QPN): the PSN it sends from (SQPSN, in the
	// REP), the one it expects (RQPSN, the REQ's starting PSN) and the
	// path MTU (the smaller of the two adapters' active MTUs).
	SQPSN uint32 `json:"sq_psn"`
	RQPSN uint32 `json:"rq_psn"`
	MTU   uint32 `json:"mtu,omitempty"`
	// LocalIP and PeerIP, for a request that came to an address of this
	// host (a listener's host port, CMListen.HostPort), are the address
	// the dialer dialed and the address it dialed from: its host's
	// (127.0.0.1 from this host); omitted otherwise.
	LocalIP string `json:"local_ip,omitempty"`
	PeerIP  string `json:"peer_ip,omitempty"`
}

// AcceptRequest accepts a connection request with a QP of this session in
// RESET or INIT; the agent brings both QPs to RTS. Or, with QPN instead
// of QP, with the session's QP of that number, which the workload moves to
// RTS itself with the request's numbers (ConnRequest: rdma_init_qp_attr,
// an "external" QP of rdma_cm): the agent answers the dialer and leaves
// that QP alone.
type AcceptRequest struct {
	Listener uint32 `json:"listener"`
	ID       uint32 `json:"id"`
	QP       uint32 `json:"qp"`
	QPN      uint32 `json:"qpn,omitempty"`
	// PrivateData goes to the dialer in the REP: at most
	// MaxPrivateDataREP bytes.
	PrivateData PrivateData `json:"private_data,omitempty"`
	// Channel, for a request of a cm-listen, is the event channel that
	// gets the connection's events (ESTABLISHED, DISCONNECTED,
	// TIMEWAIT_EXIT); 0 is the listen's own (rdma_migrate_id of a
	// request's ID before it is accepted).
	Channel uint32 `json:"channel,omitempty"`
	// AckTimeout is the local ACK timeout QP enters RTS with (the
	// exponent of 4.096 µs × 2^n, RDMA_OPTION_ID_ACK_TIMEOUT);
	// omitted: DefaultTimeout.
	AckTimeout *uint8 `json:"ack_timeout,omitempty"`
}

// Validate checks that one QP is named, the private data's size and the
// ACK timeout.
func (a *AcceptRequest) Validate() error {
	if err := checkOneQP(a.QP, a.QPN); err != nil {
		return err
	}
	if err := checkAckTimeout(a.AckTimeout); err != nil {
		return err
	}
	return checkPrivateData(a.PrivateData, MaxPrivateDataREP, "REP (accept)")
}

// checkOneQP checks that a connection names its QP one way: by handle, or
// by number for a QP the workload moves itself.
func checkOneQP(handle, qpn uint32) error {
	if handle != 0 && qpn != 0 {
		return Errorf(CodeInvalid, "qpn", "both a QP handle (%d) and a QP number (0x%x): name a QP the agent moves by its handle, or one the workload moves itself by its number", handle, qpn)
	}
	if qpn > 0xffffff {
		return Errorf(CodeInvalid, "qpn", "QP number 0x%x does not fit in 24 bits", qpn)
	}
	return nil
}

// checkAckTimeout checks an ACK timeout exponent: 5 bits, as in
// ibv_qp_attr.timeout.
func checkAckTimeout(t *uint8) error {
	if t != nil && *t > 31 {
		return Errorf(CodeInvalid, "ack_timeout", "ACK timeout %d is out of range: it is the exponent n of 4.096 µs × 2^n, 0..31", *t)
	}
	return nil
}

// AckTimeoutOr is t, or DefaultTimeout when t is nil.
func AckTimeoutOr(t *uint8) uint8 {
	if t == nil {
		return DefaultTimeout
	}
	return *t
}

// RejectRequest refuses a connection request.
type RejectRequest struct {
	Listener uint32 `json:"listener"`
	ID       uint32 `json:"id"`
	Reason   string `json:"reason"`
	// PrivateData goes to the dialer in the REJ: at most
	// MaxPrivateDataREJ bytes.
	PrivateData PrivateData `json:"private_data,omitempty"`
}

// Validate checks the private data's size.
func (r *RejectRequest) Validate() error {
	return checkPrivateData(r.PrivateData, MaxPrivateDataREJ, "REJ (reject)")
}

// Connect dials "vm/vrdmaN" (or a GID) and service port with a QP of this
// session in RESET or INIT; on success both QPs are in RTS.
type Connect struct {
	QP        uint32 `json:"qp"`
	Remote    string `json:"remote"`
	Port      uint16 `json:"port"`
	TimeoutMS uint32 `json:"timeout_ms"`
	// AckTimeout is the local ACK timeout QP enters RTS with; omitted:
	// DefaultTimeout (AcceptRequest.AckTimeout).
	AckTimeout *uint8 `json:"ack_timeout,omitempty"`
}

// Validate checks the port, the remote's length and the ACK timeout.
func (c *Connect) Validate() error {
	if err := checkAckTimeout(c.AckTimeout); err != nil {
		return err
	}
	if c.Port == 0 {
		return Errorf(CodeInvalid, "port", "service port 0 is reserved: pick 1..65535")
	}
	if c.Remote == "" || len(c.Remote) > 128 {
		return Errorf(CodeInvalid, "remote", "remote %q must be \"vm/vrdmaN\" or a GID", c.Remote)
	}
	return nil
}

// ConnectReply reports the connected peer and the path.
type ConnectReply struct {
	RemoteQPN uint32   `json:"remote_qpn"`
	RemoteGID GID      `json:"remote_gid"`
	Path      PathInfo `json:"path"`
	// PrivateData, to a dialer, is the acceptor's REP private data;
	// omitted when empty.
	PrivateData PrivateData `json:"private_data,omitempty"`
	// For a QP its workload moves itself (CMConnect.QPN): the PSN it
	// sends from, the PSN it expects and the path MTU.
	SQPSN uint32 `json:"sq_psn,omitempty"`
	RQPSN uint32 `json:"rq_psn,omitempty"`
	MTU   uint32 `json:"mtu,omitempty"`
	// QKey, to the dialer of a UD connect (CMConnect.UD), is the
	// accepting UD QP's Q_Key.
	QKey uint32 `json:"qkey,omitempty"`
}

// ValidName checks a VM or object name: 1..64 characters of letters,
// digits, '-', '_' and '.', not starting with '.' or '-'.
func ValidName(field, s string) error {
	if len(s) == 0 || len(s) > 64 {
		return Errorf(CodeInvalid, field, "name %q must be 1..64 characters", s)
	}
	for i, c := range s {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' ||
			(i > 0 && (c == '-' || c == '.'))
		if !ok {
			return Errorf(CodeInvalid, field, "name %q: character %q at %d not allowed (letters, digits, _ - .)", s, c, i)
		}
	}
	return nil
}

// GID is a 128-bit RoCE global identifier, written in IPv6 form.
type GID [16]byte

func (g GID) String() string { return netip.AddrFrom16(g).String() }

// MarshalText writes the IPv6 form.
func (g GID) MarshalText() ([]byte, error) { return []byte(g.String()), nil }

// UnmarshalText parses an IPv6 (or IPv4, mapped) address.
func (g *GID) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*g = GID{}
		return nil
	}
	a, err := netip.ParseAddr(string(b))
	if err != nil {
		return fmt.Errorf("GID %q: %w", b, err)
	}
	*g = GID(a.As16())
	return nil
}

// ParseGID parses a GID in IPv6 or IPv4 form.
func ParseGID(s string) (GID, error) {
	var g GID
	err := g.UnmarshalText([]byte(s))
	return g, err
}

// IsZero reports whether g is all zeros.
func (g GID) IsZero() bool { return g == GID{} }

// DeviceAttr are an adapter's device attributes (ibv_device_attr).
type DeviceAttr struct {
	FWVer           string `json:"fw_ver"`
	NodeGUID        string `json:"node_guid"`
	SysImageGUID    string `json:"sys_image_guid"`
	VendorID        uint32 `json:"vendor_id"`
	VendorPartID    uint32 `json:"vendor_part_id"`
	HWVer           uint32 `json:"hw_ver"`
	MaxMRSize       uint64 `json:"max_mr_size"`
	PageSizeCap     uint64 `json:"page_size_cap"`
	MaxQP           uint32 `json:"max_qp"`
	MaxQPWR         uint32 `json:"max_qp_wr"`
	MaxSGE          uint32 `json:"max_sge"`
	MaxCQ           uint32 `json:"max_cq"`
	MaxCQE          uint32 `json:"max_cqe"`
	MaxMR           uint32 `json:"max_mr"`
	MaxPD           uint32 `json:"max_pd"`
	MaxQPRdAtom     uint32 `json:"max_qp_rd_atom"`
	MaxQPInitRdAtom uint32 `json:"max_qp_init_rd_atom"`
	MaxInlineData   uint32 `json:"max_inline_data"`
	MaxSRQ          uint32 `json:"max_srq"`
	MaxSRQWR        uint32 `json:"max_srq_wr"`
	MaxSRQSGE       uint32 `json:"max_srq_sge"`
	// MaxAH is how many address handles a process context may hold
	// (ud.go); absent from an agent without UD.
	MaxAH uint32 `json:"max_ah,omitempty"`
	// MaxMW is how many memory windows a process context may hold (mw.go);
	// absent from an agent without memory windows.
	MaxMW uint32 `json:"max_mw,omitempty"`
	// MaxXRCD is how many XRC domains a process context may hold open
	// (xrc.go); absent from an agent without XRC.
	MaxXRCD uint32 `json:"max_xrcds,omitempty"`
	// Multicast (mcast.go): the groups an adapter's QPs may attach to,
	// the QPs one group may hold, and the attachments of the adapter in
	// all; absent from an agent without multicast.
	MaxMcastGrp           uint32 `json:"max_mcast_grp,omitempty"`
	MaxMcastQPAttach      uint32 `json:"max_mcast_qp_attach,omitempty"`
	MaxTotalMcastQPAttach uint32 `json:"max_total_mcast_qp_attach,omitempty"`
	AtomicCap             string `json:"atomic_cap"`
	PhysPortCnt           uint32 `json:"phys_port_cnt"`
	TransportType         string `json:"transport_type"`
}

// GIDTableLen is the size of an adapter's GID table (gid_tbl_len). Index
// 0 holds the adapter's GID, its address as RoCE v2 names it; index 1,
// of an adapter with native endpoints, the address RoCE peers that are
// not vrdma VMs reach its QPs at (PortAttr.NativeGID); the other entries
// are empty, as the entries of a RoCE device's table that no address of
// its netdev takes (ibv_query_gid_ex: ENODATA).
const GIDTableLen = 16

// NativeGIDIndex is the GID table index of PortAttr.NativeGID.
const NativeGIDIndex = 1

// PortAttr are an adapter port's attributes (ibv_port_attr).
type PortAttr struct {
	State        string   `json:"state"`
	MaxMTU       uint32   `json:"max_mtu"`
	ActiveMTU    uint32   `json:"active_mtu"`
	GIDTblLen    uint32   `json:"gid_tbl_len"` // GIDTableLen
	LinkLayer    string   `json:"link_layer"`
	GID          GID      `json:"gid"`
	MAC          string   `json:"mac"`
	ActiveSpeed  string   `json:"active_speed"`
	PortCapFlags []string `json:"port_cap_flags"`
	// NativeGID, for an adapter with native endpoints, is its host's
	// RDMA uplink address as a RoCE v2 GID (IPv4-mapped for IPv4): where
	// native endpoints reach its QPs, and its GID table's entry
	// NativeGIDIndex.
	NativeGID *GID `json:"native_gid,omitempty"`
}
