// SPDX-License-Identifier: Apache-2.0

package fault

import (
	"context"
	"errors"
	"fmt"

	"github.com/vrdma/vrdma"
)

// Layout is how a side's region is cut: four areas of Slots slots of
// SlotSize bytes each, then the FETCH_ADD target.
//
//	[0, S)    own slots: the sources and destinations of the side's own WRs
//	[S, 2S)   write slots: the targets of the peer's WRITEs
//	[2S, 3S)  read slots: what the peer READs, filled by ReadSlotID at setup
//	[3S, 4S)  receive slots: the buffers of the side's receives
//	[4S, +8)  the FETCH_ADD target, 0 at setup
//
// where S is Slots × SlotSize.
type Layout struct {
	Slots    int `json:"slots"`
	SlotSize int `json:"slot_size"`
}

// DefaultLayout has room for 32 WRs in flight of up to 4 KiB.
var DefaultLayout = Layout{Slots: 32, SlotSize: 4096}

// The areas of a Layout, in slot-area units.
const (
	areaOwn = iota
	areaWrite
	areaRead
	areaRecv
	areas
)

// Size returns the bytes of a region with layout l.
func (l Layout) Size() int { return areas*l.Slots*l.SlotSize + 8 }

// slot returns the offset of slot i of area a.
func (l Layout) slot(a, i int) int { return (a*l.Slots + i) * l.SlotSize }

// OwnOffset returns the offset in the region of own slot i.
func (l Layout) OwnOffset(i int) int { return l.slot(areaOwn, i) }

// WriteOffset returns the offset in the region of write slot i.
func (l Layout) WriteOffset(i int) int { return l.slot(areaWrite, i) }

// ReadOffset returns the offset in the region of read slot i.
func (l Layout) ReadOffset(i int) int { return l.slot(areaRead, i) }

// counter returns the offset of the FETCH_ADD target.
func (l Layout) counter() int { return areas * l.Slots * l.SlotSize }

// validate checks that l is usable.
func (l Layout) validate() error {
	if l.Slots < 2 || l.SlotSize < 64 || l.SlotSize%8 != 0 {
		return fmt.Errorf("fault: layout %+v: want at least 2 slots of at least 64 bytes, a multiple of 8", l)
	}
	return nil
}

// ReadSlotID is the ID whose payload (Fill) read slot i holds.
func ReadSlotID(i int) uint64 { return 1<<62 | uint64(i) }

// RC are the reliable-connection attributes a side connects with.
type RC struct {
	Timeout     uint8 // local ACK timeout, 4.096 µs × 2^Timeout
	RetryCnt    uint8 // retries after a timeout
	RNRRetry    uint8 // retries after an RNR NAK; 7: forever
	MinRNRTimer uint8 // the delay this side asks for in its RNR NAKs
}

// DefaultRC is what a lossless path runs with: 67 ms × 8 attempts, RNR
// retried forever every 0.01 ms.
var DefaultRC = RC{Timeout: 14, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 1}

// Side is one end of a connection: a QP with its own PD, send and receive
// CQs, and a region of Layout.Size() bytes with every access right. Its
// methods are for one goroutine at a time, except that the requester
// (Run) and the responder (Respond) of a side may run at once.
type Side struct {
	VM  *vrdma.VM
	PD  *vrdma.PD
	SCQ *vrdma.CQ
	RCQ *vrdma.CQ
	QP  *vrdma.QP
	MR  *vrdma.MR
	L   Layout
}

// NewSide creates a side in vm's first adapter with layout l and fills
// its read slots from seed and its FETCH_ADD target with 0. On error it
// releases what it created.
func NewSide(ctx context.Context, vm *vrdma.VM, l Layout, seed uint64) (s *Side, err error) {
	if err := l.validate(); err != nil {
		return nil, err
	}
	s = &Side{VM: vm, L: l}
	defer func() {
		if err != nil {
			s.Close(context.WithoutCancel(ctx))
			s = nil
		}
	}()
	ad := vm.Adapters()[0]
	if s.PD, err = ad.AllocPD(ctx); err != nil {
		return nil, fmt.Errorf("fault: side in VM %s: %w", vm.Name(), err)
	}
	depth := 2 * l.Slots
	if s.SCQ, err = ad.CreateCQ(ctx, depth); err != nil {
		return nil, fmt.Errorf("fault: side in VM %s: send CQ: %w", vm.Name(), err)
	}
	if s.RCQ, err = ad.CreateCQ(ctx, depth); err != nil {
		return nil, fmt.Errorf("fault: side in VM %s: receive CQ: %w", vm.Name(), err)
	}
	caps := vrdma.QPCaps{MaxSendWR: uint32(depth), MaxRecvWR: uint32(depth), MaxSendSGE: 1, MaxRecvSGE: 1}
	if s.QP, err = s.PD.CreateQP(ctx, vrdma.QPInitAttr{SendCQ: s.SCQ, RecvCQ: s.RCQ, Caps: caps}); err != nil {
		return nil, fmt.Errorf("fault: side in VM %s: %w", vm.Name(), err)
	}
	buf, err := vm.Alloc(l.Size())
	if err != nil {
		return nil, fmt.Errorf("fault: side in VM %s: %w", vm.Name(), err)
	}
	for i := range l.Slots {
		o := l.slot(areaRead, i)
		Fill(buf[o:o+l.SlotSize], seed, ReadSlotID(i))
	}
	clear(buf[l.counter():])
	if s.MR, err = s.PD.RegMR(ctx, buf, vrdma.AccessAll); err != nil {
		return nil, fmt.Errorf("fault: side in VM %s: %w", vm.Name(), err)
	}
	return s, nil
}

// Target is what a requester needs to know of its peer side: its QP's
// endpoint and its region.
type Target struct {
	Endpoint vrdma.Endpoint `json:"endpoint"`
	Addr     uint64         `json:"addr"`
	RKey     uint32         `json:"rkey"`
	Layout   Layout         `json:"layout"`
}

// Target returns what the peer of s needs to know of it.
func (s *Side) Target() Target {
	return Target{Endpoint: s.QP.Endpoint(), Addr: s.MR.Addr(), RKey: s.MR.RKey(), Layout: s.L}
}

// Connect brings the side's QP from RESET to RTS facing peer, with path
// MTU 1024 (messages of more than one packet on the wire paths) and the
// device's most outstanding READs and atomics.
func (s *Side) Connect(ctx context.Context, peer vrdma.Endpoint, rc RC) error {
	dev, err := s.VM.Adapters()[0].QueryDevice(ctx)
	if err != nil {
		return fmt.Errorf("fault: connect QP 0x%x: %w", s.QP.QPN(), err)
	}
	steps := []struct {
		attr vrdma.QPAttr
		mask vrdma.QPAttrMask
	}{
		{vrdma.QPAttr{State: vrdma.QPSInit, Port: 1, AccessFlags: vrdma.AccessAll}, vrdma.MaskState | vrdma.MaskPort | vrdma.MaskAccessFlags},
		{vrdma.QPAttr{State: vrdma.QPSRTR, DGID: peer.GID, PathMTU: 1024, DestQPN: peer.QPN, RQPSN: peer.PSN,
			MaxDestRdAtomic: uint8(min(dev.MaxQPRdAtom, 255)), MinRNRTimer: rc.MinRNRTimer},
			vrdma.MaskState | vrdma.MaskAV | vrdma.MaskPathMTU | vrdma.MaskDestQPN | vrdma.MaskRQPSN | vrdma.MaskMaxDestRdAtomic | vrdma.MaskMinRNRTimer},
		{vrdma.QPAttr{State: vrdma.QPSRTS, SQPSN: s.QP.Endpoint().PSN, Timeout: rc.Timeout, RetryCnt: rc.RetryCnt, RNRRetry: rc.RNRRetry,
			MaxRdAtomic: uint8(min(dev.MaxQPInitRdAtom, 255))},
			vrdma.MaskState | vrdma.MaskSQPSN | vrdma.MaskTimeout | vrdma.MaskRetryCnt | vrdma.MaskRNRRetry | vrdma.MaskMaxRdAtomic},
	}
	for _, st := range steps {
		if err := s.QP.Modify(ctx, &st.attr, st.mask); err != nil {
			return fmt.Errorf("fault: connect QP 0x%x of VM %s to QP 0x%x: %w", s.QP.QPN(), s.VM.Name(), peer.QPN, err)
		}
	}
	return nil
}

// Fail moves the side's QP to ERR, so that every WR it still holds
// flushes: how a run closes its books.
func (s *Side) Fail(ctx context.Context) error {
	err := s.QP.Modify(ctx, &vrdma.QPAttr{State: vrdma.QPSErr}, vrdma.MaskState)
	if err != nil && !errors.Is(err, vrdma.ErrAgentGone) {
		return fmt.Errorf("fault: move QP 0x%x of VM %s to ERR: %w", s.QP.QPN(), s.VM.Name(), err)
	}
	return nil
}

// Close destroys the side's objects (only what this process holds, once
// the agent is gone) and returns the first error.
func (s *Side) Close(ctx context.Context) error {
	var errs []error
	gone := func(err error) error {
		if errors.Is(err, vrdma.ErrAgentGone) {
			return nil
		}
		return err
	}
	if s.QP != nil {
		errs = append(errs, s.QP.Destroy(ctx))
	}
	if s.MR != nil {
		errs = append(errs, gone(s.MR.Dereg(ctx)))
	}
	for _, cq := range []*vrdma.CQ{s.SCQ, s.RCQ} {
		if cq != nil {
			errs = append(errs, cq.Destroy(ctx))
		}
	}
	if s.PD != nil {
		errs = append(errs, gone(s.PD.Dealloc(ctx)))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("fault: close side in VM %s: %w", s.VM.Name(), err)
	}
	return nil
}
