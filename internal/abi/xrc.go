// SPDX-License-Identifier: Apache-2.0

package abi

// Extended reliable connected transport, XRC (ops 58 and 59,
// docs/wire-local.md §4.18, capability bit xrc). An XRC domain (open-xrcd)
// groups XRC SRQs and XRC target QPs; the processes of one VM that open
// it by the same file share it, as processes on one host share a domain
// opened through the same inode. An XRC SRQ (create-srq with Type
// SRQTypeXRC) has a CQ of its own and an SRQ number (CreateSRQReply.SRQN)
// that senders name. An XRC initiator QP (QPTypeXRCSend) is an RC
// requester whose every send WQE names the remote XRC SRQ (the WQE's
// xrc_srqn, SendWQE.XRCSRQN); an XRC target QP (QPTypeXRCRecv) is an RC
// responder with no queues of its own: each SEND it takes goes to the SRQ
// the sender named, which must be in the target QP's domain, and each
// RDMA operation is checked against that SRQ's protection domain.

// XRC QP types (IBV_QPT_XRC_SEND, IBV_QPT_XRC_RECV).
const (
	QPTypeXRCSend QPType = "XRC_SEND"
	QPTypeXRCRecv QPType = "XRC_RECV"
)

// IsXRC reports whether t is one of the XRC QP types.
func (t QPType) IsXRC() bool { return t == QPTypeXRCSend || t == QPTypeXRCRecv }

// SRQTypeXRC is the type of an XRC SRQ (IBV_SRQT_XRC); "" or "basic" is
// a basic SRQ.
const SRQTypeXRC = "xrc"

// MaxSRQN bounds SRQ numbers: 24 bits, as on the wire (XRCETH).
const MaxSRQN = 1<<24 - 1

// MaxXRCD is how many XRC domains a process context may hold open
// (max_xrcds).
const MaxXRCD = 1024

// OpenXRCD opens an XRC domain on an adapter (ibv_open_xrcd). With FD
// set, the request carries one file descriptor (SCM_RIGHTS) whose inode
// names the domain within the VM: the VM's processes that open the same
// file share the domain. OFlags are the open flags ibv_open_xrcd takes:
// O_CREAT creates the domain if the file names none yet, O_EXCL with it
// refuses a file that names one. Without FD the domain is new and
// private to the process.
type OpenXRCD struct {
	Adapter string `json:"adapter"`
	FD      bool   `json:"fd,omitempty"`
	OFlags  uint32 `json:"oflags,omitempty"`
}

// Open flags of OpenXRCD, valued as Linux's O_CREAT and O_EXCL.
const (
	XRCDCreate uint32 = 0o100
	XRCDExcl   uint32 = 0o200
)

// Validate checks the flags.
func (o *OpenXRCD) Validate() error {
	if o.OFlags&^(XRCDCreate|XRCDExcl) != 0 {
		return Errorf(CodeInvalid, "oflags", "open flags 0%o: only O_CREAT and O_EXCL are taken", o.OFlags&^(XRCDCreate|XRCDExcl))
	}
	if !o.FD && o.OFlags != 0 {
		return Errorf(CodeInvalid, "oflags", "open flags without a file: a domain without one is always new")
	}
	return nil
}

// OpenQP opens the XRC target QP numbered QPN in the XRC domain this
// process opened as XRCD (ibv_open_qp): a QP another process of the VM
// (or this one) created. The reply is a CreateQPReply with the handle of
// the open and the QPN; the handle serves modify-qp, query-qp and
// destroy-qp, which drops this open only: the QP lives until its creator
// and every process that opened it destroyed their handles.
type OpenQP struct {
	XRCD uint32 `json:"xrcd"`
	QPN  uint32 `json:"qpn"`
}

// Validate checks the QP number: 24 bits, as on the wire.
func (o *OpenQP) Validate() error {
	if o.QPN == 0 || o.QPN > MaxSRQN {
		return Errorf(CodeInvalid, "qpn", "QP number 0x%x is not a QP's (24 bits, not 0)", o.QPN)
	}
	return nil
}
