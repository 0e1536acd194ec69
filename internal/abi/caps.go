// SPDX-License-Identifier: Apache-2.0

package abi

import (
	"fmt"
	"strings"
)

// Caps is a set of capability bits, exchanged in hello so that a client and
// an agent of different releases (both speaking ABI Version) can tell what
// the other does. The client sends the features it knows (Hello.Caps); the
// agent answers with the features it serves (HelloReply.Caps). The rules
// (docs/wire-local.md, "Capability bits"):
//
//   - a side ignores the bits it does not know;
//   - a client uses a feature only if the agent set its bit, except that
//     an agent that sends no caps at all (one older than capability bits)
//     serves CapsBaseline;
//   - an agent starts a behaviour that a client could notice (a new
//     completion flag, a new doorbell rule) only for a client that set its
//     bit: a client that sends no caps gets ABI 1 as first shipped.
//
// Only bits 0..52 are used, so that the value stays exact in any JSON
// reader (a double holds 53 bits).
type Caps uint64

// Capability bits. A bit, once assigned, keeps its meaning.
const (
	// CapAsyncMode: the agent honours vrdma.asyncMode, polling an async
	// VM's queues instead of sleeping on their doorbells; attach reports
	// the VM's mode (async_mode).
	CapAsyncMode Caps = 1 << 0
	// CapFence: IBV_SEND_FENCE is honoured on every path: a fenced work
	// request starts only after every earlier RDMA READ and atomic of its
	// QP has completed.
	CapFence Caps = 1 << 1
	// CapPathMemcpy: QPs whose peers are VMs on the same host connect
	// over the memcpy path.
	CapPathMemcpy Caps = 1 << 2
	// CapPathTCP: QPs whose peers are on other hosts connect over the
	// tcp path. Set only by an agent that runs with a control plane and a
	// PVRDMA address (an agent without them reaches same-host peers only).
	CapPathTCP Caps = 1 << 3
	// CapCM: the connection-management commands (listen, get-request,
	// accept-request, reject-request, close-listener, connect).
	CapCM Caps = 1 << 4
	// CapQPCounters: the QPs of a status report carry their RC counters
	// (QPStatus.Counters).
	CapQPCounters Caps = 1 << 5
	// CapVMManage: the VM commands (define-vm through power-off-vm), with
	// the owner checks and the PVRDMA rules.
	CapVMManage Caps = 1 << 6
	// CapMRIOVA: reg-mr takes an iova (RegMR.IOVA): the region's addresses
	// as the workload names them in SGEs and as peers name them in remote
	// addresses, translated by the agent to the guest memory it lies in.
	// It is what lets a C program register its own buffers (adopted into
	// guest memory) and hand their virtual addresses to peers.
	CapMRIOVA Caps = 1 << 7
	// CapAsyncEvents: async-open (op 48) gives an adapter's event socket,
	// on which the agent reports the session's QPs it moves to ERR for an
	// error it detected (IBV_EVENT_QP_FATAL).
	CapAsyncEvents Caps = 1 << 8
	// CapSRQ: shared receive queues (ops 31..34, CreateQP.SRQ), with
	// IBV_EVENT_SRQ_LIMIT_REACHED and IBV_EVENT_QP_LAST_WQE_REACHED on
	// the event sockets.
	CapSRQ Caps = 1 << 9
	// CapUD: unreliable datagram QPs (CreateQP.Type UD) and address
	// handles (ops 35 and 36), on every path the agent has.
	CapUD Caps = 1 << 10
	// CapUC: unreliable connected QPs (CreateQP.Type QPTypeUC) on every
	// path: SEND and RDMA WRITE with and without immediate, no READ or
	// atomics, a message a lost packet broke dropped whole.
	CapUC Caps = 1 << 11
	// CapCoreVerbs: rereg-mr (op 52: ibv_rereg_mr's translation, PD and
	// access), resize-cq (op 53), and CQs armed for solicited
	// completions only (ArmSolicited in the armed word), with the
	// solicited-event bit carried on every path.
	CapCoreVerbs Caps = 1 << 12
	// CapQPEvents: the event sockets also carry IBV_EVENT_COMM_EST (a QP
	// in RTR received its first message) and IBV_EVENT_SQ_DRAINED (a QP
	// moved to SQD has no send work left in flight), for a client that
	// set this bit in its hello.
	CapQPEvents Caps = 1 << 13
	// CapMW: memory windows of type 1 and 2 (ops 54 and 55, the
	// BIND_MW, LOCAL_INV and SEND_WITH_INV opcodes, AccessMWBind), with
	// SEND with invalidate carried on every path.
	CapMW Caps = 1 << 14
	// CapXRC: XRC domains (ops 58..60), XRC SRQs (CreateSRQ.Type), XRC
	// initiator and target QPs (CreateQP.Type XRC_SEND and XRC_RECV)
	// with the send WQE's xrc_srqn, on every path.
	CapXRC Caps = 1 << 15
	// CapMcast: UD multicast: attach-mcast and detach-mcast (ops 64, 65),
	// address handles to a multicast GID, whose datagrams (to QPN
	// MulticastQPN) reach every QP attached to the group on the sender's
	// switch and port group, on every path; and rdma_cm's joins (cm-join,
	// op 66).
	CapMcast Caps = 1 << 16
	// CapODP: reg-mr takes AccessOnDemand and advise-mr (op 68)
	// prefetches on-demand regions (odp.go); the drop-in reports ODP
	// capabilities in ibv_query_device_ex only for an agent with it.
	CapODP Caps = 1 << 17
	// CapAtomicWrite: the send opcode OpAtomicWrite (IBV_WR_ATOMIC_WRITE)
	// on RC QPs, on every path: 8 bytes written atomically at the
	// responder, RDMA_ATOMIC_WRITE on the rdma path, ATOMIC_WRITE frames
	// on tcp.
	CapAtomicWrite Caps = 1 << 18
	// CapCQOverrun: create-cq's overrun (a full CQ overruns: CQ_ERR and
	// its QPs to ERR, as a device's) is honoured.
	CapCQOverrun Caps = 1 << 19
	// CapOpenQP: open-qp (op 56, ibv_open_qp) opens an XRC target QP of
	// the VM by its number, and a target QP delivers to the XRC SRQs of
	// every process of the VM in its domain.
	CapOpenQP Caps = 1 << 20
	// CapDirect: the memcpy-direct path (ops 60..62, direct.go): an RC
	// QP between two VMs of the agent that list each other in
	// vrdma.directPeers, both of whose sessions set this bit in hello,
	// is bound to memcpy-direct, and the initiator's library executes
	// RDMA WRITE, READ and atomics itself on granted mappings of the
	// target's regions. The agent binds it only for sessions that set it.
	CapDirect Caps = 1 << 21
	// CapDirectSend: the memcpy-direct path's send channel (ops 63 and
	// 67, direct_send.go): between two sessions that set CapDirect and
	// this bit, the libraries of an RC QP pair bound to memcpy-direct
	// pass small SENDs through a shared ring the agent grants them. The
	// agent grants a channel only to a session that set it.
	CapDirectSend Caps = 1 << 22
)

// CapsKnown is every bit this package defines: what a client built on it
// knows, and sends in its hello.
const CapsKnown = CapAsyncMode | CapFence | CapPathMemcpy | CapPathTCP | CapCM | CapQPCounters | CapVMManage | CapMRIOVA | CapAsyncEvents | CapSRQ | CapUD | CapUC | CapCoreVerbs | CapQPEvents | CapMW | CapXRC | CapMcast | CapODP | CapAtomicWrite | CapCQOverrun | CapOpenQP | CapDirect | CapDirectSend

// CapsBaseline is what every ABI 1 agent serves, including those older than
// capability bits, which send none: a client may assume these of an agent
// whose HelloReply.Caps is 0. (Older agents did not honour a fence on the
// tcp path, reported no counters, and some lacked ops 25..29.)
const CapsBaseline = CapAsyncMode | CapPathMemcpy | CapCM

// capNames names the bits by their index; an index without a name is a
// bit this build does not define.
var capNames = [...]string{0: "async-mode", 1: "fence", 2: "path-memcpy", 3: "path-tcp", 4: "cm", 5: "qp-counters", 6: "vm-manage",
	7: "mr-iova", 8: "async-events", 9: "srq", 10: "ud", 11: "uc", 12: "core-verbs", 13: "qp-events", 14: "mw", 15: "xrc", 16: "mcast", 17: "odp", 18: "atomic-write", 19: "cq-overrun", 20: "open-qp", 21: "memcpy-direct", 22: "direct-send"}

// Has reports whether c holds every bit of x.
func (c Caps) Has(x Caps) bool { return c&x == x }

// Effective returns the features an agent that answered c serves: c, or
// CapsBaseline when c is 0 (an agent older than capability bits).
func (c Caps) Effective() Caps {
	if c == 0 {
		return CapsBaseline
	}
	return c
}

// String names the bits, "fence|cm", with unknown bits in hex.
func (c Caps) String() string {
	if c == 0 {
		return "none"
	}
	var names []string
	for i, n := range capNames {
		if n != "" && c&(1<<i) != 0 {
			names = append(names, n)
		}
	}
	if rest := c &^ CapsKnown; rest != 0 {
		names = append(names, fmt.Sprintf("0x%x", uint64(rest)))
	}
	return strings.Join(names, "|")
}
