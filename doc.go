// SPDX-License-Identifier: Apache-2.0

// Package vrdma is the client library of vrdma, a paravirtual RDMA fabric:
// a workload attaches to a VM on its host's agent (vrdmad) and gets the VM's
// RDMA adapters with verbs semantics — protection domains, memory regions,
// completion queues and reliable-connected queue pairs with SEND, RDMA
// WRITE/READ and atomics. The agent moves the bytes by the best path to the
// peer (memcpy on the same host; RoCEv2 or TCP between hosts), which a
// connected QP reports with Path.
//
// The library is a thin driver. Commands go to the agent over a Unix socket;
// work requests and completions travel through rings in memory shared with
// the agent, so PostSend, PostRecv and Poll make no system call unless the
// agent sleeps and must be woken. Buffers, memory regions and the targets of
// remote operations live in the VM's guest memory (VM.Alloc, VM.Memory).
//
//	vm, err := vrdma.Open(ctx, "vm1")
//	ad, _ := vm.Adapter("vrdma0")
//	pd, _ := ad.AllocPD(ctx)
//	buf, _ := vm.Alloc(4096)
//	mr, _ := pd.RegMR(ctx, buf, vrdma.AccessLocalWrite)
//	cq, _ := ad.CreateCQ(ctx, 256)
//	qp, _ := pd.CreateQP(ctx, vrdma.QPInitAttr{SendCQ: cq, RecvCQ: cq, Caps: vrdma.QPCaps{MaxSendWR: 64, MaxRecvWR: 64}})
//	err = qp.Connect(ctx, "vm2/vrdma0", 7471)       // vm2 listens with ad.Listen and accepts
//	err = qp.PostSend([]vrdma.SendWR{{ID: 1, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: []vrdma.SGE{mr.SGE(0, 64)}}})
//	wc := make([]vrdma.WorkCompletion, 16)
//	cq.Wait(ctx)
//	n, _ := cq.Poll(wc)
//
// Many QPs can take their receives from one shared receive queue
// (PD.CreateSRQ, QPInitAttr.SRQ, SRQ.PostRecv): each receive completes in
// the receiving QP's CQ with that QP's QPN, and the SRQ's limit event
// arrives on the adapter's AsyncEvents.
//
// Unreliable datagram QPs (QPInitAttr.Type QPTypeUD) are never connected:
// one UD QP talks to many peers, each SEND naming an address handle
// (PD.CreateAH, or PD.CreateAHFromWC to answer a receive), the remote QPN
// and its Q_Key; every receive starts with the 40-byte GRH (ParseGRH).
//
//	ud, _ := pd.CreateQP(ctx, vrdma.QPInitAttr{Type: vrdma.QPTypeUD, SendCQ: cq, RecvCQ: cq, Caps: vrdma.QPCaps{MaxSendWR: 64, MaxRecvWR: 64}})
//	err = ud.ReadyUD(ctx, 0x11111111)
//	ah, _ := pd.CreateAH(ctx, vrdma.AHAttr{DGID: peerGID})
//	err = ud.PostSend([]vrdma.SendWR{{ID: 2, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: []vrdma.SGE{mr.SGE(0, 64)},
//		AH: ah, RemoteQPN: peerQPN, RemoteQKey: 0x11111111}})
//
// Errors say what failed and what to do, and those with a cause a program
// can act on have a class that errors.Is tests: ErrLimit, ErrState,
// ErrNotFound and the others (see ErrInvalid). If the agent dies, every
// pending and later call fails with ErrAgentGone.
package vrdma
