// SPDX-License-Identifier: Apache-2.0

// Package abi defines the interface between the vrdma client library and the
// host agent: the verbs enums (opcodes, completion statuses, access flags,
// QP states), the shared-memory ring layouts with their work-request and
// completion encodings, and the command messages carried on the agent's Unix
// socket. Both sides import it; neither trusts what the other wrote. The
// layouts are documented in docs/wire-local.md.
package abi

import "fmt"

// Version is the version of this ABI: command messages carry it, and the
// agent refuses a library that speaks another.
const Version = 1

// Opcode is a send work request's operation (IBV_WR_*).
type Opcode uint8

// Send opcodes, numbered as in the PVRDMA device ABI.
const (
	OpRDMAWrite        Opcode = 0
	OpRDMAWriteWithImm Opcode = 1
	OpSend             Opcode = 2
	OpSendWithImm      Opcode = 3
	OpRDMARead         Opcode = 4
	OpAtomicCmpAndSwp  Opcode = 5
	OpAtomicFetchAdd   Opcode = 6
	// The memory-window opcodes (capability mw, mw.go): LOCAL_INV and
	// BIND_MW are executed by the agent at the QP, SEND_WITH_INV is a
	// SEND that invalidates an rkey at its target.
	OpLocalInv    Opcode = 7
	OpBindMW      Opcode = 8
	OpSendWithInv Opcode = 9
	// OpAtomicWrite writes 8 bytes (the WR's data: one SGE or inline)
	// at RemoteAddr, atomically at the responder (IBV_WR_ATOMIC_WRITE;
	// capability atomic-write). RC only; the target region needs
	// REMOTE_WRITE and the address 8-byte alignment.
	OpAtomicWrite Opcode = 15
	// OpMax bounds the send opcodes: arrays indexed by one have OpMax
	// entries.
	OpMax = OpAtomicWrite + 1
)

var opcodeNames = [OpMax]string{OpRDMAWrite: "RDMA_WRITE", OpRDMAWriteWithImm: "RDMA_WRITE_WITH_IMM", OpSend: "SEND",
	OpSendWithImm: "SEND_WITH_IMM", OpRDMARead: "RDMA_READ", OpAtomicCmpAndSwp: "ATOMIC_CMP_AND_SWP",
	OpAtomicFetchAdd: "ATOMIC_FETCH_AND_ADD", OpLocalInv: "LOCAL_INV", OpBindMW: "BIND_MW", OpSendWithInv: "SEND_WITH_INV",
	OpAtomicWrite: "ATOMIC_WRITE"}

func (o Opcode) String() string {
	if o < OpMax && opcodeNames[o] != "" {
		return opcodeNames[o]
	}
	return fmt.Sprintf("Opcode(%d)", uint8(o))
}

// Valid reports whether o is a known send opcode.
func (o Opcode) Valid() bool { return o < OpMax && opcodeNames[o] != "" }

// IsLocal reports whether o is executed at its own QP, sending nothing:
// BIND_MW and LOCAL_INV.
func (o Opcode) IsLocal() bool { return o == OpLocalInv || o == OpBindMW }

// IsMW reports whether o is a memory-window opcode: BIND_MW, LOCAL_INV,
// SEND_WITH_INV (RC QPs only).
func (o Opcode) IsMW() bool { return o == OpLocalInv || o == OpBindMW || o == OpSendWithInv }

// IsSend reports whether o is a SEND: its message takes a receive WQE
// and carries data into it.
func (o Opcode) IsSend() bool { return o == OpSend || o == OpSendWithImm || o == OpSendWithInv }

// IsAtomic reports whether o is an atomic operation.
func (o Opcode) IsAtomic() bool { return o == OpAtomicCmpAndSwp || o == OpAtomicFetchAdd }

// IsRdAtomic reports whether o is an RDMA READ or an atomic: the requests
// max_rd_atomic and max_dest_rd_atomic count, and the ones a fence waits
// for.
func (o Opcode) IsRdAtomic() bool { return o == OpRDMARead || o.IsAtomic() }

// CarriesEvent reports whether o's message consumes a receive at its
// target (SEND, SEND_WITH_IMM, RDMA_WRITE_WITH_IMM): the opcodes whose
// solicited bit (SendSolicited) reaches the target.
func (o Opcode) CarriesEvent() bool {
	return o.IsSend() || o == OpRDMAWriteWithImm
}

// WCOpcode is the operation a work completion reports (IBV_WC_*).
type WCOpcode uint8

// Completion opcodes, numbered as in ib_wc_opcode.
const (
	WCSend            WCOpcode = 0
	WCRDMAWrite       WCOpcode = 1
	WCRDMARead        WCOpcode = 2
	WCCompSwap        WCOpcode = 3
	WCFetchAdd        WCOpcode = 4
	WCBindMW          WCOpcode = 5
	WCLocalInv        WCOpcode = 6
	WCAtomicWrite     WCOpcode = 9
	WCRecv            WCOpcode = 128
	WCRecvRDMAWithImm WCOpcode = 129
)

func (o WCOpcode) String() string {
	switch o {
	case WCSend:
		return "SEND"
	case WCRDMAWrite:
		return "RDMA_WRITE"
	case WCRDMARead:
		return "RDMA_READ"
	case WCCompSwap:
		return "COMP_SWAP"
	case WCFetchAdd:
		return "FETCH_ADD"
	case WCBindMW:
		return "BIND_MW"
	case WCLocalInv:
		return "LOCAL_INV"
	case WCAtomicWrite:
		return "ATOMIC_WRITE"
	case WCRecv:
		return "RECV"
	case WCRecvRDMAWithImm:
		return "RECV_RDMA_WITH_IMM"
	}
	return fmt.Sprintf("WCOpcode(%d)", uint8(o))
}

// WCOpcodeOf returns the completion opcode of a send opcode.
func WCOpcodeOf(o Opcode) WCOpcode {
	switch o {
	case OpRDMAWrite, OpRDMAWriteWithImm:
		return WCRDMAWrite
	case OpRDMARead:
		return WCRDMARead
	case OpAtomicCmpAndSwp:
		return WCCompSwap
	case OpAtomicFetchAdd:
		return WCFetchAdd
	case OpBindMW:
		return WCBindMW
	case OpLocalInv:
		return WCLocalInv
	case OpAtomicWrite:
		return WCAtomicWrite
	}
	return WCSend
}

// WCStatus is a work completion's status (IBV_WC_*), a closed set.
type WCStatus uint8

// Completion statuses, numbered as in ib_wc_status.
const (
	WCSuccess        WCStatus = 0
	WCLocLenErr      WCStatus = 1
	WCLocQPOpErr     WCStatus = 2
	WCLocEECOpErr    WCStatus = 3
	WCLocProtErr     WCStatus = 4
	WCWRFlushErr     WCStatus = 5
	WCMWBindErr      WCStatus = 6
	WCBadRespErr     WCStatus = 7
	WCLocAccessErr   WCStatus = 8
	WCRemInvReqErr   WCStatus = 9
	WCRemAccessErr   WCStatus = 10
	WCRemOpErr       WCStatus = 11
	WCRetryExcErr    WCStatus = 12
	WCRNRRetryExcErr WCStatus = 13
	WCLocRDDViolErr  WCStatus = 14
	WCRemInvRDReqErr WCStatus = 15
	WCRemAbortErr    WCStatus = 16
	WCInvEECNErr     WCStatus = 17
	WCInvEECStateErr WCStatus = 18
	WCFatalErr       WCStatus = 19
	WCRespTimeoutErr WCStatus = 20
	WCGeneralErr     WCStatus = 21
)

var statusNames = [...]string{"SUCCESS", "LOC_LEN_ERR", "LOC_QP_OP_ERR", "LOC_EEC_OP_ERR", "LOC_PROT_ERR",
	"WR_FLUSH_ERR", "MW_BIND_ERR", "BAD_RESP_ERR", "LOC_ACCESS_ERR", "REM_INV_REQ_ERR", "REM_ACCESS_ERR",
	"REM_OP_ERR", "RETRY_EXC_ERR", "RNR_RETRY_EXC_ERR", "LOC_RDD_VIOL_ERR", "REM_INV_RD_REQ_ERR",
	"REM_ABORT_ERR", "INV_EECN_ERR", "INV_EEC_STATE_ERR", "FATAL_ERR", "RESP_TIMEOUT_ERR", "GENERAL_ERR"}

func (s WCStatus) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("WCStatus(%d)", uint8(s))
}

// Access is a memory region's (or QP's) access flag set (IBV_ACCESS_*).
type Access uint32

// Access flags, valued as in ibv_access_flags.
const (
	AccessLocalWrite   Access = 1 << 0
	AccessRemoteWrite  Access = 1 << 1
	AccessRemoteRead   Access = 1 << 2
	AccessRemoteAtomic Access = 1 << 3
	// AccessMWBind: memory windows may be bound to the region (capability
	// mw).
	AccessMWBind Access = 1 << 4
)

// AccessAll is every flag vrdma knows.
const AccessAll = AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic | AccessMWBind

// AccessRemote is the remote rights: what a memory window grants.
const AccessRemote = AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic

func (a Access) String() string {
	if a == 0 {
		return "NONE"
	}
	s := ""
	add := func(f Access, n string) {
		if a&f != 0 {
			if s != "" {
				s += "|"
			}
			s += n
		}
	}
	add(AccessLocalWrite, "LOCAL_WRITE")
	add(AccessRemoteWrite, "REMOTE_WRITE")
	add(AccessRemoteRead, "REMOTE_READ")
	add(AccessRemoteAtomic, "REMOTE_ATOMIC")
	add(AccessMWBind, "MW_BIND")
	add(AccessOnDemand, "ON_DEMAND")
	if a&^AccessMR != 0 {
		s += fmt.Sprintf("|0x%x", uint32(a&^AccessMR))
	}
	return s
}

// QPState is a queue pair's state (IBV_QPS_*).
type QPState uint8

// QP states, numbered as in ibv_qp_state.
const (
	QPSReset QPState = 0
	QPSInit  QPState = 1
	QPSRTR   QPState = 2
	QPSRTS   QPState = 3
	QPSSQD   QPState = 4
	QPSSQE   QPState = 5
	QPSErr   QPState = 6
)

var stateNames = [...]string{"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"}

func (s QPState) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("QPState(%d)", uint8(s))
}

// SendFlags modify a send work request (IBV_SEND_*).
type SendFlags uint8

// Send flags.
const (
	SendSignaled  SendFlags = 1 << 0
	SendSolicited SendFlags = 1 << 1
	SendInline    SendFlags = 1 << 2
	SendFence     SendFlags = 1 << 3
)

// WCFlags describe a completion (IBV_WC_*).
type WCFlags uint8

// Completion flags.
const (
	WCWithImm WCFlags = 1 << 0
	// WCWithInv: the message was a SEND with invalidate; the CQE's Imm is
	// the rkey it invalidated (capability mw).
	WCWithInv WCFlags = 1 << 2
)

// PathKind names the way a connected QP's bytes move.
type PathKind string

// The paths between two QPs (docs/architecture.md).
const (
	PathNone         PathKind = ""
	PathMemcpy       PathKind = "memcpy"
	PathMemcpyDirect PathKind = "memcpy-direct"
	PathTCP          PathKind = "tcp"
	PathRDMA         PathKind = "rdma"
	// PathTest is the test transport: the tcp path's RC protocol over an
	// in-process link with faults, between two VMs of one agent started
	// with a test link. Path selection never chooses it.
	PathTest PathKind = "test"
)
