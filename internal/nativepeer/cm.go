// SPDX-License-Identifier: Apache-2.0

package nativepeer

// The sides connected with RDMA CM instead of the TCP exchange, as
// rping and ib_write_bw -R do: the active side connects by IP address and
// port (a REQ on QP1 when the other side is a native endpoint), the
// passive side listens and accepts. Each side's region (Region, 16
// bytes) travels as the private data of the REQ and of the REP; the
// GID and QPN are the CM's. The active side then runs every operation,
// asks for the check with a SEND ("check"), gets the passive side's
// verdict in a SEND, and disconnects (a DREQ, answered by a DREP).

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/vrdma/vrdma"
)

// RegionLen is the length of a region's private data.
const RegionLen = 16

// region is this side's region as private data: its address, rkey and
// pattern size, big-endian.
func (s *Side) region() []byte {
	b := make([]byte, RegionLen)
	binary.BigEndian.PutUint64(b, s.local.Addr)
	binary.BigEndian.PutUint32(b[8:], s.local.RKey)
	binary.BigEndian.PutUint32(b[12:], s.local.Size)
	return b
}

// ParseRegion reads the other side's region from private data priv (at
// least RegionLen bytes: CM private data is padded), the side being QP
// qpn at gid, and checks it as ParseInfo does.
func ParseRegion(priv []byte, gid netip.Addr, qpn uint32) (Info, error) {
	if len(priv) < RegionLen {
		return Info{}, fmt.Errorf("the peer's private data has %d bytes, want its region's %d (address, rkey, size)", len(priv), RegionLen)
	}
	in := Info{GID: gid, QPN: qpn, Addr: binary.BigEndian.Uint64(priv), RKey: binary.BigEndian.Uint32(priv[8:]), Size: binary.BigEndian.Uint32(priv[12:])}
	if err := in.check(); err != nil {
		return Info{}, err
	}
	return in, nil
}

// nextEvent waits for ch's next event, which must be of type want.
func nextEvent(ctx context.Context, ch *vrdma.EventChannel, want vrdma.CMEventType) (*vrdma.CMEvent, error) {
	ev, err := ch.Next(ctx)
	if err != nil {
		return nil, fmt.Errorf("waiting for %s: %w", want, err)
	}
	if ev.Type != want {
		return nil, fmt.Errorf("rdma_cm: %s (status %d: %s), want %s", ev.Type, ev.Status, ev.Message, want)
	}
	return ev, nil
}

// Verdicts the passive side sends.
const (
	checkMsg  = "check"
	verdictOK = "ok"
)

// ServeCM is the passive side with RDMA CM: it listens on port of this
// side's adapter on channel ch, accepts the first request, checks what
// the active side does, and waits for its disconnect.
func (s *Side) ServeCM(ctx context.Context, ch *vrdma.EventChannel, adapter string, port uint16) error {
	l, err := ch.Listen(ctx, adapter, port)
	if err != nil {
		return err
	}
	defer l.Close(context.Background())
	req, err := nextEvent(ctx, ch, vrdma.CMConnectRequest)
	if err != nil {
		return err
	}
	remote, err := ParseRegion(req.PrivateData, netip.AddrFrom16(req.RemoteGID), req.RemoteQPN)
	if err != nil {
		req.Reject(ctx, nil)
		return err
	}
	// In INIT, as rdma_create_qp leaves it, to post the receives before
	// the active side can send.
	if err := s.qp.Modify(ctx, &vrdma.QPAttr{State: vrdma.QPSInit, Port: 1, AccessFlags: vrdma.AccessAll}, vrdma.MaskState|vrdma.MaskPort|vrdma.MaskAccessFlags); err != nil {
		return err
	}
	if err := s.preparePassive(); err != nil {
		return err
	}
	if err := s.postRecv(3); err != nil { // the check
		return err
	}
	if err := req.Accept(ctx, s.qp, s.region()); err != nil {
		return err
	}
	if _, err := nextEvent(ctx, ch, vrdma.CMEstablished); err != nil {
		return err
	}
	problems, err := s.awaitActive(ctx)
	if err != nil {
		return err
	}
	wcs, err := wait(ctx, s.rcq, 1)
	if err != nil {
		return fmt.Errorf("the active side's check: %w", err)
	}
	m, lay := s.mr.Bytes(), s.layout
	if w := wcs[0]; w.Status != vrdma.WCSuccess || string(m[lay.Recv():lay.Recv()+uint64(w.ByteLen)]) != checkMsg {
		return fmt.Errorf("the active side did not ask for the check: %+v", w)
	}
	problems = append(problems, s.checkMemory(remote)...)
	verdict := verdictOK
	if problems != nil {
		verdict = fmt.Sprintf("failed: %q", problems)
	}
	n := copy(m[lay.Recv():lay.Recv()+recvLen], verdict)
	if err := s.sendAndWait(ctx, 4, int(lay.Recv()), n); err != nil {
		return fmt.Errorf("send the verdict: %w", err)
	}
	if _, err := nextEvent(ctx, ch, vrdma.CMDisconnected); err != nil {
		return err
	}
	if problems != nil {
		return fmt.Errorf("passive side: %q", problems)
	}
	return nil
}

// sendAndWait SENDs n bytes at offset off of the region and waits for
// its completion.
func (s *Side) sendAndWait(ctx context.Context, id uint64, off, n int) error {
	if err := s.qp.PostSend([]vrdma.SendWR{{ID: id, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: []vrdma.SGE{s.mr.SGE(off, n)}}}); err != nil {
		return err
	}
	wcs, err := wait(ctx, s.scq, 1)
	if err != nil {
		return err
	}
	if wcs[0].Status != vrdma.WCSuccess {
		return fmt.Errorf("the SEND completed with status %v", wcs[0].Status)
	}
	return nil
}

// DriveCM is the active side with RDMA CM: it connects to the listener
// on port of peer (an IP address) on channel ch, runs every operation,
// asks for the passive side's check, and disconnects.
func (s *Side) DriveCM(ctx context.Context, ch *vrdma.EventChannel, peer string, port uint16) ([]Result, error) {
	timeout := 10 * time.Second
	if d, ok := ctx.Deadline(); ok {
		timeout = time.Until(d)
	}
	if _, err := ch.Connect(ctx, s.qp, peer, port, s.region(), timeout); err != nil {
		return nil, err
	}
	ev, err := nextEvent(ctx, ch, vrdma.CMEstablished)
	if err != nil {
		return nil, err
	}
	remote, err := ParseRegion(ev.PrivateData, netip.AddrFrom16(ev.RemoteGID), ev.RemoteQPN)
	if err != nil {
		s.qp.Disconnect(ctx)
		return nil, err
	}
	out, err := s.operations(ctx, remote)
	if err != nil {
		return out, err
	}
	m, l := s.mr.Bytes(), s.layout
	if err := s.postRecv(10); err != nil { // the verdict
		return out, err
	}
	copy(m[l.Result():], checkMsg)
	if err := s.sendAndWait(ctx, 11, int(l.Result()), len(checkMsg)); err != nil {
		return out, fmt.Errorf("ask for the check: %w", err)
	}
	wcs, err := wait(ctx, s.rcq, 1)
	if err != nil {
		return out, fmt.Errorf("the passive side's verdict: %w", err)
	}
	verdict := string(m[l.Recv() : l.Recv()+uint64(min(wcs[0].ByteLen, recvLen))])
	if err := s.qp.Disconnect(ctx); err != nil {
		return out, err
	}
	if _, err := nextEvent(ctx, ch, vrdma.CMDisconnected); err != nil {
		return out, err
	}
	if wcs[0].Status != vrdma.WCSuccess || verdict != verdictOK {
		return out, fmt.Errorf("the passive side's check: %s (%v)", strings.TrimSpace(verdict), wcs[0].Status)
	}
	return out, nil
}
