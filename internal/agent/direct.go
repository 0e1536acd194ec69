// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"fmt"
	"slices"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/device"
	"github.com/vrdma/vrdma/internal/vmconfig"
)

// The memcpy-direct ops (wire-local.md §4.21): the device does the work
// (internal/device/direct.go); the descriptors are the workload's once
// sent.
func init() {
	handlers[abi.OpDirectOpen] = on(func(s *session, v *device.Context, _ *abi.Empty) (any, []int, error) {
		rep, fds, err := v.OpenDirect()
		if err != nil {
			return nil, nil, err
		}
		return givenAway{body: rep, fds: fds}, nil, nil
	})
	handlers[abi.OpDirectMap] = on(func(s *session, v *device.Context, r *abi.DirectMap) (any, []int, error) {
		rep, fds, err := v.Grant(r.QP, r.RKey)
		if err != nil {
			return nil, nil, err
		}
		return givenAway{body: rep, fds: fds}, nil, nil
	})
	handlers[abi.OpCQNotify] = on(func(s *session, v *device.Context, r *abi.Handle) (any, []int, error) {
		return abi.Empty{}, nil, v.NotifyCQ(r.Handle)
	})
	// The send channel (wire-local.md §4.22, device/direct_send.go).
	handlers[abi.OpDirectChannel] = on(func(s *session, v *device.Context, r *abi.Handle) (any, []int, error) {
		rep, fds, err := v.Channel(r.Handle)
		if err != nil {
			return nil, nil, err
		}
		return givenAway{body: rep, fds: fds}, nil, nil
	})
	handlers[abi.OpDirectNotify] = on(func(s *session, v *device.Context, r *abi.DirectNotify) (any, []int, error) {
		return abi.Empty{}, nil, v.NotifyPeer(r.QP, r.CQ, r.Solicited)
	})
}

// directVerdict says whether QP q's connection to peer QP t, both of this
// agent, may use the memcpy-direct path, and if not, which rule refused
// it (wire-local.md §4.21). apply is false when neither VM sets
// vrdma.directPeers: then nothing is reported.
func directVerdict(q, t *device.QP) (ok, apply bool, why string) {
	return directVerdictVMs(q.Context(), t.Context())
}

// directVerdictVMs is directVerdict for the sessions qv and tv: the two
// VMs' vrdma.directPeers (vmconfig.DirectVerdict), then both sessions'
// hello capability.
func directVerdictVMs(qv, tv *device.Context) (ok, apply bool, why string) {
	ok, apply, why = vmconfig.DirectVerdict(qv.Name(), tv.Name(), qv.Config(), tv.Config())
	if !ok {
		return ok, apply, why
	}
	switch {
	case !qv.DirectCapable():
		return false, true, fmt.Sprintf("the workload of VM %q (pid %d) did not set capability memcpy-direct in its hello", qv.Name(), qv.PID())
	case !tv.DirectCapable():
		return false, true, fmt.Sprintf("the workload of VM %q (pid %d) did not set capability memcpy-direct in its hello", tv.Name(), tv.PID())
	}
	return true, true, why
}

// directAH reports an address handle from adapter from to ad, both of
// this host, as memcpy-direct when the two VMs allow it: datagrams are
// relayed all the same (only an RC QP's library executes anything
// itself), but the pair's path is the one its connected QPs get.
func directAH(from, ad *device.Adapter, info abi.PathInfo) abi.PathInfo {
	if from == nil || ad == nil {
		return info
	}
	ok, apply, why := directVerdictVMs(from.Context(), ad.Context())
	switch {
	case ok:
		return abi.PathInfo{Path: abi.PathMemcpyDirect, Reason: why + "; datagrams are relayed", Rejected: info.Rejected}
	case apply:
		info.Rejected = append(slices.Clone(info.Rejected), abi.PathRejection{Path: abi.PathMemcpyDirect, Why: why})
	}
	return info
}
