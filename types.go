// SPDX-License-Identifier: Apache-2.0

package vrdma

import "github.com/vrdma/vrdma/internal/abi"

// Opcode is a send work request's operation (IBV_WR_*).
type Opcode = abi.Opcode

// Send opcodes.
const (
	OpRDMAWrite        = abi.OpRDMAWrite
	OpRDMAWriteWithImm = abi.OpRDMAWriteWithImm
	OpSend             = abi.OpSend
	OpSendWithImm      = abi.OpSendWithImm
	OpRDMARead         = abi.OpRDMARead
	OpAtomicCmpAndSwp  = abi.OpAtomicCmpAndSwp
	OpAtomicFetchAdd   = abi.OpAtomicFetchAdd
	// Memory windows (mw.go): BIND_MW binds SendWR.MW, LOCAL_INV
	// invalidates the window whose rkey is SendWR.RKey, SEND_WITH_INV is a
	// SEND that invalidates SendWR.RKey at its target.
	OpLocalInv    = abi.OpLocalInv
	OpBindMW      = abi.OpBindMW
	OpSendWithInv = abi.OpSendWithInv
	// OpAtomicWrite stores SendWR.Swap's 8 bytes (little-endian, as in
	// memory) at RemoteAddr at once; no SGL; RC only, from an agent with
	// CapAtomicWrite.
	OpAtomicWrite = abi.OpAtomicWrite
)

// WCOpcode is the operation a work completion reports (IBV_WC_*).
type WCOpcode = abi.WCOpcode

// Completion opcodes.
const (
	WCSend            = abi.WCSend
	WCRDMAWrite       = abi.WCRDMAWrite
	WCRDMARead        = abi.WCRDMARead
	WCCompSwap        = abi.WCCompSwap
	WCFetchAdd        = abi.WCFetchAdd
	WCBindMW          = abi.WCBindMW
	WCLocalInv        = abi.WCLocalInv
	WCAtomicWrite     = abi.WCAtomicWrite
	WCRecv            = abi.WCRecv
	WCRecvRDMAWithImm = abi.WCRecvRDMAWithImm
)

// WCStatus is a work completion's status (IBV_WC_*), a closed set.
type WCStatus = abi.WCStatus

// Completion statuses.
const (
	WCSuccess        = abi.WCSuccess
	WCLocLenErr      = abi.WCLocLenErr
	WCLocQPOpErr     = abi.WCLocQPOpErr
	WCLocProtErr     = abi.WCLocProtErr
	WCWRFlushErr     = abi.WCWRFlushErr
	WCMWBindErr      = abi.WCMWBindErr
	WCLocAccessErr   = abi.WCLocAccessErr
	WCRemInvReqErr   = abi.WCRemInvReqErr
	WCRemAccessErr   = abi.WCRemAccessErr
	WCRemOpErr       = abi.WCRemOpErr
	WCRetryExcErr    = abi.WCRetryExcErr
	WCRNRRetryExcErr = abi.WCRNRRetryExcErr
	WCFatalErr       = abi.WCFatalErr
	WCGeneralErr     = abi.WCGeneralErr
)

// WCFlags describe a completion.
type WCFlags = abi.WCFlags

// Completion flags: WCWithImm, the completion carries immediate data
// (Imm); WCWithInv, the message was a SEND with invalidate and Imm is the
// rkey it invalidated.
const (
	WCWithImm = abi.WCWithImm
	WCWithInv = abi.WCWithInv
)

// Access is a set of memory access rights (IBV_ACCESS_*).
type Access = abi.Access

// Access flags.
const (
	AccessLocalWrite   = abi.AccessLocalWrite
	AccessRemoteWrite  = abi.AccessRemoteWrite
	AccessRemoteRead   = abi.AccessRemoteRead
	AccessRemoteAtomic = abi.AccessRemoteAtomic
	AccessMWBind       = abi.AccessMWBind // memory windows may be bound to the region (mw.go)
	AccessAll          = abi.AccessAll
)

// QPType is a queue pair's transport (IBV_QPT_*).
type QPType = abi.QPType

// QP types.
const (
	QPTypeRC = abi.QPTypeRC // reliable connected
	QPTypeUC = abi.QPTypeUC // unreliable connected: SEND and RDMA WRITE, no ACKs, no retransmission
	QPTypeUD = abi.QPTypeUD // unreliable datagram (ud.go)
	// XRC (xrc.go): an initiator QP, an RC requester whose every SendWR
	// names the remote XRC SRQ (SendWR.XRCSRQN), and a target QP, an RC
	// responder with no queues (XRCD.CreateTargetQP).
	QPTypeXRCSend = abi.QPTypeXRCSend
	QPTypeXRCRecv = abi.QPTypeXRCRecv
)

// QPState is a queue pair's state (IBV_QPS_*).
type QPState = abi.QPState

// QP states.
const (
	QPSReset = abi.QPSReset
	QPSInit  = abi.QPSInit
	QPSRTR   = abi.QPSRTR
	QPSRTS   = abi.QPSRTS
	QPSSQD   = abi.QPSSQD
	QPSSQE   = abi.QPSSQE
	QPSErr   = abi.QPSErr
)

// SendFlags modify a send work request (IBV_SEND_*).
type SendFlags = abi.SendFlags

// Send flags.
const (
	SendSignaled  = abi.SendSignaled
	SendSolicited = abi.SendSolicited
	SendInline    = abi.SendInline
	SendFence     = abi.SendFence
)

// QPAttr are a queue pair's attributes (ibv_qp_attr, RC subset).
type QPAttr = abi.QPAttr

// QPAttrMask selects attributes in Modify (IBV_QP_*).
type QPAttrMask = abi.QPAttrMask

// Attribute mask bits.
const (
	MaskState           = abi.MaskState
	MaskAccessFlags     = abi.MaskAccessFlags
	MaskPort            = abi.MaskPort
	MaskAV              = abi.MaskAV
	MaskPathMTU         = abi.MaskPathMTU
	MaskTimeout         = abi.MaskTimeout
	MaskRetryCnt        = abi.MaskRetryCnt
	MaskRNRRetry        = abi.MaskRNRRetry
	MaskRQPSN           = abi.MaskRQPSN
	MaskMaxRdAtomic     = abi.MaskMaxRdAtomic
	MaskMinRNRTimer     = abi.MaskMinRNRTimer
	MaskSQPSN           = abi.MaskSQPSN
	MaskMaxDestRdAtomic = abi.MaskMaxDestRdAtomic
	MaskDestQPN         = abi.MaskDestQPN
)

// QPCaps are a queue pair's sizes (ibv_qp_cap).
type QPCaps = abi.QPCaps

// GID is a RoCE global identifier in IPv6 form.
type GID = abi.GID

// ParseGID parses a GID written as an IPv6 (or IPv4) address.
func ParseGID(s string) (GID, error) { return abi.ParseGID(s) }

// DeviceAttr are an adapter's device attributes (ibv_device_attr).
type DeviceAttr = abi.DeviceAttr

// PortAttr are an adapter port's attributes (ibv_port_attr).
type PortAttr = abi.PortAttr

// PathKind names how a connected QP moves its bytes.
type PathKind = abi.PathKind

// Paths. An agent started by a test may also report the test transport
// (abi.PathTest, "test"), which no production agent uses.
const (
	PathMemcpy       = abi.PathMemcpy
	PathMemcpyDirect = abi.PathMemcpyDirect
	PathTCP          = abi.PathTCP
	PathRDMA         = abi.PathRDMA
)

// PathInfo is a connected QP's path and the reason it was chosen.
type PathInfo = abi.PathInfo

// SGE is a scatter/gather element: Length bytes at guest address Addr in
// the memory region with local key LKey.
type SGE = abi.SGE

// Limits of the device.
const (
	MaxSGE    = abi.MaxSGE
	MaxInline = abi.MaxInline
	MaxQPWR   = abi.MaxQPWR
	MaxCQE    = abi.MaxCQE
)

// SendWR is a send work request (ibv_send_wr). With SendInline the bytes
// the SGL names are copied into the work request when posted, and need no
// memory region.
type SendWR struct {
	ID         uint64
	Opcode     Opcode
	Flags      SendFlags
	SGL        []SGE
	Imm        uint32 // SEND_WITH_IMM, RDMA_WRITE_WITH_IMM
	RemoteAddr uint64 // RDMA and atomics: target guest address
	// RKey: RDMA and atomics, the target region's (or window's) rkey;
	// LOCAL_INV and SEND_WITH_INV, the window's rkey to invalidate;
	// BIND_MW, the window's new rkey (IncRKey).
	RKey       uint32
	CompareAdd uint64 // ATOMIC_CMP_AND_SWP: compare; ATOMIC_FETCH_AND_ADD: add
	Swap       uint64 // ATOMIC_CMP_AND_SWP: swap; ATOMIC_WRITE: the 8 bytes
	// A UD QP's destination (ud.go): the address handle, the remote QP
	// number and its Q_Key (one with PrivilegedQKey set: the QP's own).
	AH         *AH
	RemoteQPN  uint32
	RemoteQKey uint32
	// BIND_MW: the window and what it is bound to (mw.go).
	MW   *MW
	Bind MWBind
	// XRCSRQN: an XRC initiator QP's (xrc.go): the number of the XRC SRQ
	// at the target the request is for (wr.qp_type.xrc.remote_srqn).
	XRCSRQN uint32
}

// RecvWR is a receive work request (ibv_recv_wr).
type RecvWR struct {
	ID  uint64
	SGL []SGE
}

// WorkCompletion is a work completion (ibv_wc).
type WorkCompletion struct {
	WRID    uint64
	Status  WCStatus
	Opcode  WCOpcode
	Flags   WCFlags
	ByteLen uint32
	Imm     uint32
	QPNum   uint32
	SrcQP   uint32
}
