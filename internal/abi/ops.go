// SPDX-License-Identifier: Apache-2.0

package abi

import "fmt"

// OpInfo describes one op of the library↔agent ABI: the one table of
// operations (Ops) says, for every op, its wire number, its name, how to
// decode its request body and how the agent serves it. The agent's
// handlers are keyed by the same ops (internal/agent/ops.go), and a test
// there fails unless they cover this table exactly.
type OpInfo struct {
	// Op is the wire number: part of the ABI, never reused.
	Op Op
	// Name is the op's name in docs/wire-local.md §4, in logs and errors,
	// and in the C header (VRDMA_OP_<NAME>).
	Name string
	// Request returns a zero request body to decode into. It is nil for
	// the ops whose body another package defines (External).
	Request func() any
	// External: the request body is defined outside package abi — the
	// management commands' in package mgmt, which supplies it with
	// RegisterRequest from its init.
	External bool
	// Blocking: the agent serves the op off the session's goroutine, so
	// that it may wait (for a peer) while the session reads on
	// (wire-local.md §1.5). A blocking op needs an attached VM (Attach).
	Blocking bool
	// Attach: the op works on an attached VM's objects; without one the
	// agent answers bad-state.
	Attach bool
}

// body returns a constructor of new(T) bodies.
func body[T any]() func() any { return func() any { return new(T) } }

// opTable is the one table of operations, in wire-number order.
var opTable = [...]OpInfo{
	{Op: OpHello, Name: "hello", Request: body[Hello]()},
	{Op: OpAttach, Name: "attach", Request: body[Attach]()},
	{Op: OpQueryDevice, Name: "query-device", Request: body[AdapterRef](), Attach: true},
	{Op: OpQueryPort, Name: "query-port", Request: body[AdapterRef](), Attach: true},
	{Op: OpAllocPD, Name: "alloc-pd", Request: body[AdapterRef](), Attach: true},
	{Op: OpDeallocPD, Name: "dealloc-pd", Request: body[Handle](), Attach: true},
	{Op: OpRegMR, Name: "reg-mr", Request: body[RegMR](), Attach: true},
	{Op: OpDeregMR, Name: "dereg-mr", Request: body[Handle](), Attach: true},
	{Op: OpCreateCQ, Name: "create-cq", Request: body[CreateCQ](), Attach: true},
	{Op: OpDestroyCQ, Name: "destroy-cq", Request: body[Handle](), Attach: true},
	{Op: OpCreateQP, Name: "create-qp", Request: body[CreateQP](), Attach: true},
	{Op: OpModifyQP, Name: "modify-qp", Request: body[ModifyQP](), Attach: true},
	{Op: OpQueryQP, Name: "query-qp", Request: body[Handle](), Attach: true},
	{Op: OpDestroyQP, Name: "destroy-qp", Request: body[Handle](), Attach: true},
	{Op: OpListen, Name: "listen", Request: body[Listen](), Attach: true},
	{Op: OpGetRequest, Name: "get-request", Request: body[Handle](), Attach: true, Blocking: true},
	{Op: OpAcceptRequest, Name: "accept-request", Request: body[AcceptRequest](), Attach: true},
	{Op: OpRejectRequest, Name: "reject-request", Request: body[RejectRequest](), Attach: true},
	{Op: OpCloseListener, Name: "close-listener", Request: body[Handle](), Attach: true},
	{Op: OpConnect, Name: "connect", Request: body[Connect](), Attach: true, Blocking: true},
	{Op: OpStatus, Name: "status", Request: body[Empty]()},
	{Op: OpDefineVM, Name: "define-vm", External: true},
	{Op: OpUndefineVM, Name: "undefine-vm", External: true},
	{Op: OpListVMs, Name: "list-vms", Request: body[Empty]()},
	{Op: OpCreateVM, Name: "create-vm", External: true},
	{Op: OpGetVM, Name: "get-vm", External: true},
	{Op: OpEditVM, Name: "edit-vm", External: true},
	{Op: OpPowerOnVM, Name: "power-on-vm", External: true},
	{Op: OpPowerOffVM, Name: "power-off-vm", External: true},
	{Op: OpConnectVM, Name: "connect-vm", External: true},
	{Op: OpCreateSRQ, Name: "create-srq", Request: body[CreateSRQ](), Attach: true},
	{Op: OpModifySRQ, Name: "modify-srq", Request: body[ModifySRQ](), Attach: true},
	{Op: OpQuerySRQ, Name: "query-srq", Request: body[Handle](), Attach: true},
	{Op: OpDestroySRQ, Name: "destroy-srq", Request: body[Handle](), Attach: true},
	{Op: OpCreateAH, Name: "create-ah", Request: body[CreateAH](), Attach: true},
	{Op: OpDestroyAH, Name: "destroy-ah", Request: body[Handle](), Attach: true},
	{Op: OpCMOpenChannel, Name: "cm-open-channel", Request: body[Empty](), Attach: true},
	{Op: OpCMCloseChannel, Name: "cm-close-channel", Request: body[Handle](), Attach: true},
	{Op: OpCMListen, Name: "cm-listen", Request: body[CMListen](), Attach: true},
	{Op: OpCMCloseListen, Name: "cm-close-listen", Request: body[Handle](), Attach: true},
	{Op: OpCMResolve, Name: "cm-resolve", Request: body[CMResolve](), Attach: true},
	{Op: OpCMRoute, Name: "cm-route", Request: body[CMRoute](), Attach: true},
	{Op: OpCMConnect, Name: "cm-connect", Request: body[CMConnect](), Attach: true},
	{Op: OpCMDisconnect, Name: "cm-disconnect", Request: body[CMDisconnect](), Attach: true},
	{Op: OpAsyncOpen, Name: "async-open", Request: body[AdapterRef](), Attach: true},
	{Op: OpCMEstablish, Name: "cm-establish", Request: body[CMEstablish](), Attach: true},
	{Op: OpReregMR, Name: "rereg-mr", Request: body[ReregMR](), Attach: true},
	{Op: OpResizeCQ, Name: "resize-cq", Request: body[ResizeCQ](), Attach: true},
	{Op: OpAllocMW, Name: "alloc-mw", Request: body[AllocMW](), Attach: true},
	{Op: OpDeallocMW, Name: "dealloc-mw", Request: body[Handle](), Attach: true},
	{Op: OpOpenQP, Name: "open-qp", Request: body[OpenQP](), Attach: true},
	{Op: OpOpenXRCD, Name: "open-xrcd", Request: body[OpenXRCD](), Attach: true},
	{Op: OpCloseXRCD, Name: "close-xrcd", Request: body[Handle](), Attach: true},
	{Op: OpDirectOpen, Name: "direct-open", Request: body[Empty](), Attach: true},
	{Op: OpDirectMap, Name: "direct-map", Request: body[DirectMap](), Attach: true},
	{Op: OpCQNotify, Name: "cq-notify", Request: body[Handle](), Attach: true},
	{Op: OpDirectChannel, Name: "direct-channel", Request: body[Handle](), Attach: true},
	{Op: OpAttachMcast, Name: "attach-mcast", Request: body[Mcast](), Attach: true},
	{Op: OpDetachMcast, Name: "detach-mcast", Request: body[Mcast](), Attach: true},
	{Op: OpCMJoin, Name: "cm-join", Request: body[CMJoin](), Attach: true},
	{Op: OpDirectNotify, Name: "direct-notify", Request: body[DirectNotify](), Attach: true},
	{Op: OpAdviseMR, Name: "advise-mr", Request: body[AdviseMR](), Attach: true},
}

// opIndex maps a wire number to its row of opTable, plus one (0: not an
// op). checkOpTable builds it.
var opIndex [opMax]uint8

func init() {
	if err := checkOpTable(opTable[:]); err != nil {
		panic("abi: " + err.Error())
	}
	for i, in := range opTable {
		opIndex[in.Op] = uint8(i + 1)
	}
}

// checkOpTable checks that t names every op once, in wire-number order,
// below opMax, each with a name and either a request constructor or the
// External mark, and every blocking op marked Attach.
func checkOpTable(t []OpInfo) error {
	names := map[string]bool{}
	var last Op
	for _, in := range t {
		switch {
		case in.Op == 0 || in.Op >= opMax:
			return fmt.Errorf("op %d (%q) is out of range 1..%d", in.Op, in.Name, opMax-1)
		case in.Op <= last:
			return fmt.Errorf("op %d (%q) is listed twice or out of order", in.Op, in.Name)
		case in.Name == "" || names[in.Name]:
			return fmt.Errorf("op %d has no name or a name another op has (%q)", in.Op, in.Name)
		case (in.Request == nil) != in.External:
			return fmt.Errorf("op %d (%s) must have a request constructor, or be External, not both", in.Op, in.Name)
		case in.Blocking && !in.Attach:
			return fmt.Errorf("op %d (%s) blocks, so it must need an attached VM: the agent checks that before it starts the op's goroutine", in.Op, in.Name)
		}
		names[in.Name] = true
		last = in.Op
	}
	return nil
}

// Ops returns the table of operations, in wire-number order. The slice is
// a copy; its Request members are the table's.
func Ops() []OpInfo { return append([]OpInfo(nil), opTable[:]...) }

// Info returns op's row of the table, and whether op is an op of this ABI
// version.
func (o Op) Info() (OpInfo, bool) {
	if o >= opMax || opIndex[o] == 0 {
		return OpInfo{}, false
	}
	return opTable[opIndex[o]-1], true
}
