// SPDX-License-Identifier: Apache-2.0

package vrdma

import (
	"context"
	"fmt"
	"os"
	"runtime"

	"github.com/vrdma/vrdma/internal/abi"
)

// XRCD is an XRC domain (ibv_xrcd): XRC SRQs (PD.CreateXRCSRQ) and XRC
// target QPs (CreateTargetQP) that senders reach through the SRQ numbers
// they name. The VM's processes that open a domain through the same file
// share it, as processes on one host share a domain opened through the
// same inode.
type XRCD struct {
	ad     *Adapter
	handle uint32
}

// OpenXRCD opens an XRC domain on the adapter (ibv_open_xrcd): with file,
// the domain the VM's processes share through it, which create makes if
// the file names none yet (O_CREAT) and excl refuses if it names one
// (O_EXCL); with a nil file, a new domain of this process's own.
func (a *Adapter) OpenXRCD(ctx context.Context, file *os.File, create, excl bool) (*XRCD, error) {
	v := a.vm
	req := &abi.OpenXRCD{Adapter: a.name}
	var fds []int
	if file != nil {
		req.FD = true
		if create {
			req.OFlags |= abi.XRCDCreate
		}
		if excl {
			req.OFlags |= abi.XRCDExcl
		}
		fds = []int{int(file.Fd())}
	}
	var r abi.Handle
	got, err := v.c.call(ctx, abi.OpOpenXRCD, req, &r, fds...)
	runtime.KeepAlive(file) // its descriptor stays open until the request left
	closeFDs(got)
	if err != nil {
		return nil, fmt.Errorf("vrdma: OpenXRCD: %w", err)
	}
	return &XRCD{ad: a, handle: r.Handle}, nil
}

// Close closes the domain (ibv_close_xrcd); one with SRQs or target QPs
// of this process is refused (ErrState, EBUSY).
func (x *XRCD) Close(ctx context.Context) error {
	if _, err := x.ad.vm.c.call(ctx, abi.OpCloseXRCD, &abi.Handle{Handle: x.handle}, nil); err != nil {
		return fmt.Errorf("vrdma: close XRC domain: %w", err)
	}
	return nil
}

// CreateXRCSRQ creates an XRC SRQ in pd and XRC domain x (ibv_create_srq_ex
// with IBV_SRQT_XRC): its receives complete in cq, with the QPN of the
// target QP that took each message. SRQ.Num is the number senders name.
func (pd *PD) CreateXRCSRQ(ctx context.Context, x *XRCD, cq *CQ, attr SRQAttr) (*SRQ, error) {
	if x == nil || cq == nil {
		return nil, errorf(abi.CodeInvalid, "vrdma: CreateXRCSRQ: an XRC SRQ needs its XRC domain and its CQ")
	}
	return pd.createSRQ(ctx, &abi.CreateSRQ{PD: pd.handle, Attr: attr, Type: abi.SRQTypeXRC, XRCD: x.handle, CQ: cq.handle})
}

// Num returns an XRC SRQ's number (ibv_get_srq_num): what an XRC
// initiator's SendWR.XRCSRQN names. 0 for a basic SRQ.
func (s *SRQ) Num() uint32 { return s.srqn }

// CreateTargetQP creates an XRC target QP in the domain (ibv_create_qp_ex
// with IBV_QPT_XRC_RECV): an RC responder with no PD, CQs or queues,
// connected as any RC QP (ConnectTo, Modify) to an XRC initiator (a
// QPTypeXRCSend QP). Each message it takes goes to the XRC SRQ of its
// domain the sender names.
func (x *XRCD) CreateTargetQP(ctx context.Context) (*QP, error) {
	return x.targetQP(ctx, "CreateTargetQP", abi.OpCreateQP, &abi.CreateQP{Type: QPTypeXRCRecv, XRCD: x.handle})
}

// OpenQP opens the XRC target QP numbered qpn in the domain
// (ibv_open_qp): one that this or another process of the VM created in
// it, as processes share one. The QP it returns is this process's handle
// of it: it modifies and connects the QP as any target QP, and Destroy
// drops this handle only — the QP lives until its creator's handle and
// every open are gone, or its creator's process ends. A number that is
// not a target QP of the domain (another type's, another domain's,
// another VM's) is refused (ErrInvalid). Needs an agent with capability
// open-qp.
func (x *XRCD) OpenQP(ctx context.Context, qpn uint32) (*QP, error) {
	if !x.ad.vm.caps.Has(abi.CapOpenQP) {
		return nil, errorf(abi.CodeInvalid, "vrdma: OpenQP: the agent cannot open XRC target QPs (capability open-qp): upgrade vrdmad")
	}
	return x.targetQP(ctx, "OpenQP", abi.OpOpenQP, &abi.OpenQP{XRCD: x.handle, QPN: qpn})
}

// targetQP makes a target QP of the domain through op (create or open),
// whose reply carries no descriptors.
func (x *XRCD) targetQP(ctx context.Context, what string, op abi.Op, req any) (*QP, error) {
	v := x.ad.vm
	var r abi.CreateQPReply
	fds, err := v.c.call(ctx, op, req, &r)
	if err != nil {
		return nil, fmt.Errorf("vrdma: %s: %w", what, err)
	}
	if len(fds) != 0 {
		closeFDs(fds)
		v.c.call(ctx, abi.OpDestroyQP, &abi.Handle{Handle: r.Handle}, nil)
		return nil, fmt.Errorf("vrdma: %s: the agent sent %d descriptors, want none", what, len(fds))
	}
	q := &QP{pd: &PD{ad: x.ad}, vm: v, handle: r.Handle, qpn: r.QPN, typ: QPTypeXRCRecv}
	q.psn = randomPSN()
	return q, nil
}
