// SPDX-License-Identifier: Apache-2.0

package vrdma

import "github.com/vrdma/vrdma/internal/abi"

// Unreliable connected QPs (QPTypeUC). A UC QP connects as an RC one
// does (Modify to INIT, RTR and RTS; RTR takes the address, path MTU,
// remote QPN and rq_psn, RTS the sq_psn, and neither takes RC's timeout,
// retry, RNR or READ/atomic attributes: ErrInvalid), and carries SEND and
// RDMA WRITE, with and without immediate. No ACK answers it and nothing
// is retransmitted: a work request completes once it has left, whether
// or not the message arrived; a message that a lost packet broke, or that
// its responder cannot take (no receive posted, a bad rkey, a receive too
// small), is dropped at the responder, whole, and the QP goes on.

// Type is the QP's transport, QPTypeRC or QPTypeUC.
func (q *QP) Type() QPType { return q.typ }

// checkUC refuses the work requests a UC QP has no use for: RDMA READ and
// atomics (EINVAL at post, as rdma-core's providers).
func (q *QP) checkUC(wr *SendWR) error {
	if q.typ == QPTypeUC && (wr.Opcode.IsRdAtomic() || wr.Opcode.IsMW()) {
		return errorf(abi.CodeInvalid, "%s on UC QP 0x%x: a UC QP carries SEND and RDMA WRITE only (use an RC QP)", wr.Opcode, q.qpn)
	}
	return nil
}
