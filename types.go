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

// WCWithImm says the completion carries immediate data.
const WCWithImm = abi.WCWithImm

// Access is a set of memory access rights (IBV_ACCESS_*).
type Access = abi.Access

// Access flags.
const (
	AccessLocalWrite   = abi.AccessLocalWrite
	AccessRemoteWrite  = abi.AccessRemoteWrite
	AccessRemoteRead   = abi.AccessRemoteRead
	AccessRemoteAtomic = abi.AccessRemoteAtomic
	AccessAll          = abi.AccessAll
)

// QPType is a queue pair's transport (IBV_QPT_*).
type QPType = abi.QPType

// QP types.
const (
	QPTypeRC = abi.QPTypeRC // reliable connected
	QPTypeUC = abi.QPTypeUC // unreliable connected: SEND and RDMA WRITE, no ACKs, no retransmission
	QPTypeUD = abi.QPTypeUD // unreliable datagram (ud.go)
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
	RKey       uint32 // RDMA and atomics: target region's rkey
	CompareAdd uint64 // ATOMIC_CMP_AND_SWP: compare; ATOMIC_FETCH_AND_ADD: add
	Swap       uint64 // ATOMIC_CMP_AND_SWP: swap; ATOMIC_WRITE: the 8 bytes
	// A UD QP's destination (ud.go): the address handle, the remote QP
	// number and its Q_Key (one with PrivilegedQKey set: the QP's own).
	AH         *AH
	RemoteQPN  uint32
	RemoteQKey uint32
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
