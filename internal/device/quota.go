// SPDX-License-Identifier: Apache-2.0

package device

// The caps a VM's workloads share (Limits: max_qp, max_cq, max_mr,
// CQEs and WRs across all the VM's processes) and the per-uid caps of
// the agent's ledger (package quota: ring and registered memory, pinned
// guest memory), charged when an object is made and refunded when it
// goes.

import (
	"sync"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/quota"
)

// vmUse is what all the processes of one VM hold of the VM-wide caps.
type vmUse struct {
	mu  sync.Mutex
	got vmCharge // +checklocks:mu
}

// vmCharge is an amount of the VM-wide caps.
type vmCharge struct {
	qps, cqs, mrs int
	cqe, wr       uint64 // CQ entries; send and receive queue entries
}

// chargeVM charges c to v's VM, or refuses (CodeLimit) naming the cap.
func (v *Context) chargeVM(c vmCharge) error {
	l := v.d.cfg.Limits
	u := &v.procs.use
	u.mu.Lock()
	defer u.mu.Unlock()
	g := u.got
	var name, flag, what, do string
	var have, max uint64
	switch {
	case l.MaxQP > 0 && g.qps+c.qps > l.MaxQP:
		name, flag, what, do, have, max = "max_qp", "--max-qp", "QPs", "destroy some", uint64(g.qps), uint64(l.MaxQP)
	case l.MaxCQ > 0 && g.cqs+c.cqs > l.MaxCQ:
		name, flag, what, do, have, max = "max_cq", "--max-cq", "CQs", "destroy some", uint64(g.cqs), uint64(l.MaxCQ)
	case l.MaxMR > 0 && g.mrs+c.mrs > l.MaxMR:
		name, flag, what, do, have, max = "max_mr", "--max-mr", "memory regions", "deregister some", uint64(g.mrs), uint64(l.MaxMR)
	case l.MaxCQEPerVM > 0 && g.cqe+c.cqe > uint64(l.MaxCQEPerVM):
		name, flag, what, do, have, max = "cqe-per-vm", "--max-cqe-per-vm", "CQ entries", "destroy CQs or create smaller ones", g.cqe, uint64(l.MaxCQEPerVM)
	case l.MaxWRPerVM > 0 && g.wr+c.wr > uint64(l.MaxWRPerVM):
		name, flag, what, do, have, max = "wr-per-vm", "--max-wr-per-vm", "work-request slots (send and receive queue entries of its QPs)", "destroy QPs or create them with fewer WRs", g.wr, uint64(l.MaxWRPerVM)
	default:
		u.got = vmCharge{g.qps + c.qps, g.cqs + c.cqs, g.mrs + c.mrs, g.cqe + c.cqe, g.wr + c.wr}
		return nil
	}
	return abi.Errorf(abi.CodeLimit, "", "limit %s: VM %q has %d %s in all its workloads together, and the limit is %d (vrdmad %s); %s first, or have the administrator raise the limit",
		name, v.name, have, what, max, flag, do)
}

// refundVM gives back c, which chargeVM took.
func (v *Context) refundVM(c vmCharge) {
	u := &v.procs.use
	u.mu.Lock()
	defer u.mu.Unlock()
	g := &u.got
	g.qps -= min(c.qps, g.qps)
	g.cqs -= min(c.cqs, g.cqs)
	g.mrs -= min(c.mrs, g.mrs)
	g.cqe -= min(c.cqe, g.cqe)
	g.wr -= min(c.wr, g.wr)
}

// chargeUser charges n of r to the uid of v's workload (quota.Ledger).
func (v *Context) chargeUser(r quota.Resource, n uint64) error {
	return v.d.cfg.Quota.Take(v.owner.UID(), r, n)
}

// refundUser gives back what chargeUser took.
func (v *Context) refundUser(r quota.Resource, n uint64) {
	v.d.cfg.Quota.Give(v.owner.UID(), r, n)
}

// chargeQueue charges a CQ or QP with ring of size bytes and charge c to
// v's VM and its workload's uid.
func (v *Context) chargeQueue(c vmCharge, size uint32) error {
	if err := v.chargeVM(c); err != nil {
		return err
	}
	if err := v.chargeUser(quota.RingMemory, uint64(size)); err != nil {
		v.refundVM(c)
		return err
	}
	return nil
}

// refundQueue gives back what chargeQueue took.
func (v *Context) refundQueue(c vmCharge, size uint32) {
	v.refundVM(c)
	v.refundUser(quota.RingMemory, uint64(size))
}

func cqCharge(l abi.CQLayout) vmCharge { return vmCharge{cqs: 1, cqe: uint64(l.Entries)} }

func qpCharge(l abi.QPLayout) vmCharge {
	return vmCharge{qps: 1, wr: uint64(l.SQEntries) + uint64(l.RQEntries)}
}
