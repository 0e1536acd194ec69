// SPDX-License-Identifier: Apache-2.0

package vrdma

import (
	"context"
	"errors"
	"fmt"

	"github.com/vrdma/vrdma/internal/abi"
)

// UD attribute mask bits (IBV_QP_PKEY_INDEX, IBV_QP_QKEY).
const (
	MaskPKeyIndex = abi.MaskPKeyIndex
	MaskQKey      = abi.MaskQKey
)

// WCGRH says a receive's buffer starts with the 40-byte GRH (IBV_WC_GRH):
// every receive of a UD QP.
const WCGRH = abi.WCGRH

// GRHSize is the length of the GRH in front of a UD receive's message.
const GRHSize = abi.GRHSize

// PrivilegedQKey is the Q_Key bit only root (or CAP_NET_RAW) may set on a
// QP; a SendWR whose RemoteQKey has it uses the QP's own Q_Key.
const PrivilegedQKey = abi.PrivilegedQKey

// GRH are the fields of the GRH a UD receive starts with.
type GRH = abi.GRH

// ParseGRH reads the GRH at the start of a UD receive's buffer (GRHSize
// bytes): the sender's GID (SGID), the receiver's (DGID), traffic class,
// hop limit and flow label.
func ParseGRH(b []byte) (GRH, error) { return abi.ParseGRH(b) }

// AHAttr is an address handle's destination (ibv_ah_attr with its GRH:
// RoCE has no LIDs).
type AHAttr struct {
	DGID         GID
	HopLimit     uint8 // 0: 64
	TrafficClass uint8
	FlowLabel    uint32
}

// AH is an address handle (ibv_ah): the destination of UD SENDs. It is
// safe for concurrent use.
type AH struct {
	pd     *PD
	handle uint32
	path   PathInfo
}

// CreateAH creates an address handle in pd (ibv_create_ah). The agent
// resolves attr.DGID by the rules connections obey (same switch, port
// group and VLAN): a destination a connection could not reach is
// refused here.
func (pd *PD) CreateAH(ctx context.Context, attr AHAttr) (*AH, error) {
	var r abi.CreateAHReply
	req := &abi.CreateAH{PD: pd.handle, DGID: attr.DGID, HopLimit: attr.HopLimit, TrafficClass: attr.TrafficClass,
		FlowLabel: attr.FlowLabel, Port: 1}
	if _, err := pd.ad.vm.c.call(ctx, abi.OpCreateAH, req, &r); err != nil {
		return nil, fmt.Errorf("vrdma: CreateAH to %s: %w", attr.DGID, err)
	}
	return &AH{pd: pd, handle: r.Handle, path: r.Path}, nil
}

// CreateAHFromWC creates an address handle back to the sender of a UD
// receive (ibv_create_ah_from_wc): wc is its completion, grh the first
// GRHSize bytes of its buffer.
func (pd *PD) CreateAHFromWC(ctx context.Context, wc *WorkCompletion, grh []byte) (*AH, error) {
	if wc.Flags&WCGRH == 0 {
		return nil, errorf(abi.CodeInvalid, "vrdma: CreateAHFromWC: the completion has no GRH (not a UD receive)")
	}
	g, err := ParseGRH(grh)
	if err != nil {
		return nil, errorf(abi.CodeInvalid, "vrdma: CreateAHFromWC: %v", err)
	}
	return pd.CreateAH(ctx, AHAttr{DGID: g.SGID, TrafficClass: g.TrafficClass, FlowLabel: g.FlowLabel})
}

// Path reports the path the address handle's datagrams take, and why.
func (ah *AH) Path() PathInfo { return ah.path }

// Destroy destroys the address handle (ibv_destroy_ah). Work requests
// posted with it before still execute with it, as on hardware; one
// posted after fails with LOC_QP_OP_ERR.
func (ah *AH) Destroy(ctx context.Context) error {
	if _, err := ah.pd.ad.vm.c.call(ctx, abi.OpDestroyAH, &abi.Handle{Handle: ah.handle}, nil); err != nil && !errors.Is(err, ErrAgentGone) {
		return fmt.Errorf("vrdma: destroy AH %d: %w", ah.handle, err)
	}
	return nil
}

// ReadyUD moves a UD QP from RESET through INIT and RTR to RTS with Q_Key
// qkey, the one modify sequence a UD QP needs (ibv_ud_pingpong's).
func (q *QP) ReadyUD(ctx context.Context, qkey uint32) error {
	steps := []struct {
		attr QPAttr
		mask QPAttrMask
	}{
		{QPAttr{State: QPSInit, Port: 1, QKey: qkey}, MaskState | MaskPKeyIndex | MaskPort | MaskQKey},
		{QPAttr{State: QPSRTR}, MaskState},
		{QPAttr{State: QPSRTS, SQPSN: q.psn}, MaskState | MaskSQPSN},
	}
	for _, s := range steps {
		if err := q.Modify(ctx, &s.attr, s.mask); err != nil {
			return err
		}
	}
	return nil
}

// encodeUD writes a UD QP's send WR's destination into w.
func encodeUD(w *abi.SendWQE, wr *SendWR) error {
	if wr.Opcode != OpSend && wr.Opcode != OpSendWithImm {
		return errorf(abi.CodeInvalid, "a UD QP sends SEND and SEND_WITH_IMM only, not %s", wr.Opcode)
	}
	if wr.AH == nil {
		return errorf(abi.CodeInvalid, "a UD send work request needs an address handle (SendWR.AH)")
	}
	abi.SetUDDest(w, wr.AH.handle, wr.RemoteQPN, wr.RemoteQKey)
	return nil
}
