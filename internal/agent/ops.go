// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"reflect"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/abi/mgmt"
	"github.com/vrdma/vrdma/internal/device"
	"github.com/vrdma/vrdma/internal/sys"
)

// opHandler serves one op of the table of operations (abi.Ops) for a
// session. v is the session's VM: never nil for an op the table marks
// Attach (serve checks first), possibly nil for the others. The body, on
// success, is the reply; fds ride along with it (see givenAway).
type opHandler struct {
	req reflect.Type // the request body it takes, *T
	fn  func(s *session, v *device.Context, req any) (body any, fds []int, err error)
}

// on makes the handler of an op whose request body is a *T.
func on[T any](fn func(s *session, v *device.Context, req *T) (any, []int, error)) opHandler {
	return opHandler{req: reflect.TypeFor[*T](), fn: func(s *session, v *device.Context, req any) (any, []int, error) {
		return fn(s, v, req.(*T))
	}}
}

// handlers serve the ops: one for every op of abi.Ops, keyed by the op
// (TestHandlersCoverOps). Whether an op blocks or needs an attached VM
// is the table's to say, not the handler's.
var handlers = map[abi.Op]opHandler{
	abi.OpHello:  on((*session).hello),
	abi.OpAttach: on((*session).attach),
	abi.OpStatus: on(func(s *session, _ *device.Context, _ *abi.Empty) (any, []int, error) {
		return s.a.statusFor(s.caller()), nil, nil
	}),
	abi.OpListVMs: on(func(s *session, _ *device.Context, _ *abi.Empty) (any, []int, error) {
		return mgmt.VMList{VMs: s.a.statusFor(s.caller()).VMs}, nil, nil
	}),

	// The VM procedures (internal/manage).
	abi.OpDefineVM: on(func(s *session, _ *device.Context, r *mgmt.DefineVM) (any, []int, error) {
		return abi.Empty{}, nil, s.a.proc.Define(s.caller(), r)
	}),
	abi.OpUndefineVM: on(func(s *session, _ *device.Context, r *mgmt.VMRef) (any, []int, error) {
		return abi.Empty{}, nil, s.a.proc.Undefine(s.caller(), r.Name)
	}),
	abi.OpCreateVM: on(func(s *session, _ *device.Context, r *mgmt.CreateVM) (any, []int, error) {
		return noFDs(s.a.proc.CreateVM(s.caller(), r))
	}),
	abi.OpGetVM: on(func(s *session, _ *device.Context, r *mgmt.VMRef) (any, []int, error) {
		return noFDs(s.a.proc.GetVM(s.caller(), r))
	}),
	abi.OpEditVM: on(func(s *session, _ *device.Context, r *mgmt.EditVM) (any, []int, error) {
		return noFDs(s.a.proc.EditVM(s.caller(), r))
	}),
	abi.OpPowerOnVM: on(func(s *session, _ *device.Context, r *mgmt.PowerOnVM) (any, []int, error) {
		return noFDs(s.a.proc.PowerOn(s.caller(), r))
	}),
	abi.OpPowerOffVM: on(func(s *session, _ *device.Context, r *mgmt.VMRef) (any, []int, error) {
		return noFDs(s.a.proc.PowerOff(s.caller(), r))
	}),
	abi.OpConnectVM: on(func(s *session, _ *device.Context, r *mgmt.ConnectAdapter) (any, []int, error) {
		return noFDs(s.a.proc.ConnectAdapter(s.caller(), r))
	}),

	// The verbs of an attached VM (internal/device).
	abi.OpQueryDevice: on(func(_ *session, v *device.Context, r *abi.AdapterRef) (any, []int, error) {
		ad, err := v.Adapter(r.Adapter)
		if err != nil {
			return nil, nil, err
		}
		return v.DeviceAttr(ad), nil, nil
	}),
	abi.OpQueryPort: on(func(s *session, v *device.Context, r *abi.AdapterRef) (any, []int, error) {
		ad, err := v.Adapter(r.Adapter)
		if err != nil {
			return nil, nil, err
		}
		pa := ad.PortAttr()
		pa.NativeGID = s.a.nativeGID(ad) // native.go
		return pa, nil, nil
	}),
	abi.OpAllocPD: on(func(_ *session, v *device.Context, r *abi.AdapterRef) (any, []int, error) {
		h, err := v.AllocPD(r.Adapter)
		return abi.Handle{Handle: h}, nil, err
	}),
	abi.OpDeallocPD: on(func(_ *session, v *device.Context, r *abi.Handle) (any, []int, error) {
		return abi.Empty{}, nil, v.DeallocPD(r.Handle)
	}),
	abi.OpRegMR: on(func(_ *session, v *device.Context, r *abi.RegMR) (any, []int, error) {
		return noFDs(v.RegMR(r))
	}),
	abi.OpDeregMR: on(func(_ *session, v *device.Context, r *abi.Handle) (any, []int, error) {
		return abi.Empty{}, nil, v.DeregMR(r.Handle)
	}),
	abi.OpCreateCQ: on(func(s *session, v *device.Context, r *abi.CreateCQ) (any, []int, error) {
		c, err := v.CreateCQ(r)
		if err != nil {
			return nil, nil, err
		}
		s.watchCQ(c) // events.go
		rep, fds := c.Reply()
		return rep, fds, nil
	}),
	abi.OpResizeCQ: on(func(_ *session, v *device.Context, r *abi.ResizeCQ) (any, []int, error) {
		return v.ResizeCQ(r)
	}),
	abi.OpReregMR: on(func(_ *session, v *device.Context, r *abi.ReregMR) (any, []int, error) {
		return noFDs(v.ReregMR(r))
	}),
	abi.OpAllocMW: on(func(_ *session, v *device.Context, r *abi.AllocMW) (any, []int, error) {
		return noFDs(v.AllocMW(r))
	}),
	abi.OpDeallocMW: on(func(_ *session, v *device.Context, r *abi.Handle) (any, []int, error) {
		return abi.Empty{}, nil, v.DeallocMW(r.Handle)
	}),
	abi.OpAdviseMR: on(func(_ *session, v *device.Context, r *abi.AdviseMR) (any, []int, error) {
		return abi.Empty{}, nil, v.AdviseMR(r)
	}),
	abi.OpDestroyCQ: on(func(_ *session, v *device.Context, r *abi.Handle) (any, []int, error) {
		return abi.Empty{}, nil, v.DestroyCQ(r.Handle)
	}),
	abi.OpCreateQP: on(func(s *session, v *device.Context, r *abi.CreateQP) (any, []int, error) {
		q, err := v.CreateQP(r)
		if err != nil {
			return nil, nil, err
		}
		s.watchFatal(q) // events.go
		rep, fds := q.Reply()
		return rep, fds, nil
	}),
	abi.OpModifyQP: on(func(s *session, v *device.Context, r *abi.ModifyQP) (any, []int, error) {
		q, err := v.QPByHandle(r.Handle)
		if err != nil {
			return nil, nil, err
		}
		if err := s.checkQKey(r); err != nil { // ud.go
			return nil, nil, err
		}
		return abi.Empty{}, nil, q.Modify(r)
	}),
	abi.OpQueryQP: on(func(_ *session, v *device.Context, r *abi.Handle) (any, []int, error) {
		q, err := v.QPByHandle(r.Handle)
		if err != nil {
			return nil, nil, err
		}
		return q.Query(), nil, nil
	}),
	abi.OpDestroyQP: on(func(s *session, v *device.Context, r *abi.Handle) (any, []int, error) {
		q, err := v.DestroyQPHandle(r.Handle) // an opened XRC target QP: the open only
		if err != nil {
			return nil, nil, err
		}
		if q.IsUD() {
			s.a.syncMcast(q.Adapter()) // mcast.go: it left its groups
		}
		return abi.Empty{}, nil, nil
	}),
	abi.OpAsyncOpen: on((*session).asyncOpen), // events.go
	abi.OpCreateSRQ: on(func(s *session, v *device.Context, r *abi.CreateSRQ) (any, []int, error) {
		q, err := v.CreateSRQ(r)
		if err != nil {
			return nil, nil, err
		}
		s.watchSRQ(q) // events.go
		rep, fds := q.Reply()
		return rep, fds, nil
	}),
	abi.OpModifySRQ: on(func(_ *session, v *device.Context, r *abi.ModifySRQ) (any, []int, error) {
		q, err := v.SRQByHandle(r.Handle)
		if err != nil {
			return nil, nil, err
		}
		return abi.Empty{}, nil, q.Modify(r)
	}),
	abi.OpQuerySRQ: on(func(_ *session, v *device.Context, r *abi.Handle) (any, []int, error) {
		q, err := v.SRQByHandle(r.Handle)
		if err != nil {
			return nil, nil, err
		}
		return q.Query(), nil, nil
	}),
	abi.OpDestroySRQ: on(func(_ *session, v *device.Context, r *abi.Handle) (any, []int, error) {
		return abi.Empty{}, nil, v.DestroySRQ(r.Handle)
	}),
	abi.OpOpenXRCD: on((*session).openXRCD), // xrc.go
	abi.OpOpenQP: on(func(s *session, v *device.Context, r *abi.OpenQP) (any, []int, error) {
		o, err := v.OpenQP(r)
		if err != nil {
			return nil, nil, err
		}
		s.watchOpen(o) // events.go
		return abi.CreateQPReply{Handle: o.Handle(), QPN: o.QP().QPN()}, nil, nil
	}),
	abi.OpCloseXRCD: on(func(_ *session, v *device.Context, r *abi.Handle) (any, []int, error) {
		return abi.Empty{}, nil, v.CloseXRCD(r.Handle)
	}),
	abi.OpCreateAH: on(func(_ *session, v *device.Context, r *abi.CreateAH) (any, []int, error) {
		ah, err := v.CreateAH(r)
		if err != nil {
			return nil, nil, err
		}
		return abi.CreateAHReply{Handle: ah.Handle(), Path: ah.Info()}, nil, nil
	}),
	abi.OpDestroyAH: on(func(_ *session, v *device.Context, r *abi.Handle) (any, []int, error) {
		return abi.Empty{}, nil, v.DestroyAH(r.Handle)
	}),
	abi.OpAttachMcast: on(func(s *session, v *device.Context, r *abi.Mcast) (any, []int, error) {
		return abi.Empty{}, nil, s.a.mcastOp(v, r, true) // mcast.go
	}),
	abi.OpDetachMcast: on(func(s *session, v *device.Context, r *abi.Mcast) (any, []int, error) {
		return abi.Empty{}, nil, s.a.mcastOp(v, r, false)
	}),

	// Connection management (internal/cm).
	abi.OpListen: on(func(s *session, v *device.Context, r *abi.Listen) (any, []int, error) {
		id, err := s.cm.Listen(v, r)
		if err != nil {
			return nil, nil, err
		}
		return abi.Handle{Handle: id}, nil, nil
	}),
	abi.OpCloseListener: on(func(s *session, _ *device.Context, r *abi.Handle) (any, []int, error) {
		return abi.Empty{}, nil, s.cm.CloseListener(r.Handle)
	}),
	abi.OpGetRequest: on(func(s *session, _ *device.Context, r *abi.Handle) (any, []int, error) {
		return noFDs(s.cm.GetRequest(r.Handle))
	}),
	abi.OpAcceptRequest: on((*session).acceptRequest),
	abi.OpRejectRequest: on(func(s *session, _ *device.Context, r *abi.RejectRequest) (any, []int, error) {
		return abi.Empty{}, nil, s.cm.Reject(r)
	}),
	abi.OpConnect: on(func(s *session, _ *device.Context, r *abi.Connect) (any, []int, error) {
		return noFDs(s.connect(r))
	}),

	// rdma_cm's event channels (internal/cm, events.go).
	abi.OpCMOpenChannel: on(func(s *session, _ *device.Context, _ *abi.Empty) (any, []int, error) {
		h, fd, err := s.cmEv.OpenChannel()
		if err != nil {
			return nil, nil, err
		}
		return givenAway{abi.Handle{Handle: h}, []int{fd}}, nil, nil
	}),
	abi.OpCMCloseChannel: on(func(s *session, _ *device.Context, r *abi.Handle) (any, []int, error) {
		return abi.Empty{}, nil, s.cmEv.CloseChannel(r.Handle)
	}),
	abi.OpCMListen: on(func(s *session, v *device.Context, r *abi.CMListen) (any, []int, error) {
		// Only a process in the agent's network, the host's, holds
		// ports of the host's addresses (cm/hostaddr.go).
		h, err := s.cmEv.Listen(v, r, r.HostPort != "" && s.cred && sys.SameNetns(s.pid))
		if err != nil {
			return nil, nil, err
		}
		return abi.Handle{Handle: h}, nil, nil
	}),
	abi.OpCMCloseListen: on(func(s *session, _ *device.Context, r *abi.Handle) (any, []int, error) {
		return abi.Empty{}, nil, s.cmEv.CloseListen(r.Handle)
	}),
	abi.OpCMResolve: on(func(s *session, v *device.Context, r *abi.CMResolve) (any, []int, error) {
		return abi.Empty{}, nil, s.cmEv.Resolve(v, r)
	}),
	abi.OpCMJoin: on(func(s *session, v *device.Context, r *abi.CMJoin) (any, []int, error) {
		return abi.Empty{}, nil, s.cmEv.Join(v, r)
	}),
	abi.OpCMRoute: on(func(s *session, _ *device.Context, r *abi.CMRoute) (any, []int, error) {
		return abi.Empty{}, nil, s.cmEv.Route(r)
	}),
	abi.OpCMConnect: on(func(s *session, v *device.Context, r *abi.CMConnect) (any, []int, error) {
		return abi.Empty{}, nil, s.cmEv.Connect(v, r)
	}),
	abi.OpCMDisconnect: on(func(s *session, v *device.Context, r *abi.CMDisconnect) (any, []int, error) {
		return abi.Empty{}, nil, s.cmEv.Disconnect(v, r)
	}),
	abi.OpCMEstablish: on(func(s *session, v *device.Context, r *abi.CMEstablish) (any, []int, error) {
		return abi.Empty{}, nil, s.cmEv.Establish(v, r)
	}),
}

// noFDs is the handler result of a reply without descriptors.
func noFDs[R any](r R, err error) (any, []int, error) { return r, nil, err }
