// SPDX-License-Identifier: Apache-2.0

// Package nativepeer is vrdmactl native-peer: a plain RoCEv2 peer and its
// counterpart in a VM. One side listens, the other connects; over that
// TCP connection they exchange what ibv_rc_pingpong and perftest exchange
// out of band (GID, QPN, PSN, and the rkey and address of a region), one
// JSON line each, connect an RC QP to each other, and the connecting side
// (active) runs every operation against the listening side (passive):
// SEND/RECV, RDMA WRITE with immediate, RDMA READ, compare and swap,
// fetch and add. Each side checks what it can see; the passive side
// checks its memory when the active one asks, and says the verdict.
//
// Each side's region is laid out alike (Layout): the passive side's
// pattern, which the active side reads; the area the active side writes
// its own pattern into; the receive buffer; the 8-byte atomic target; the
// atomic result.
package nativepeer

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"

	"github.com/vrdma/vrdma"
)

// Limits of a region's pattern size (Info.Size).
const (
	MinSize = 64
	MaxSize = 1 << 20
)

// The region's layout, for a pattern size of n bytes.
const (
	recvLen = 256 // the receive buffer
)

// Layout gives the offsets of the region of a side with pattern size n.
type Layout struct{ n uint64 }

// Read is the offset of the passive side's pattern (n bytes).
func (l Layout) Read() uint64 { return 0 }

// Write is the offset of the area the active side writes (n bytes).
func (l Layout) Write() uint64 { return l.n }

// Recv is the offset of the receive buffer (256 bytes).
func (l Layout) Recv() uint64 { return 2 * l.n }

// Atomic is the offset of the 8-byte atomic target.
func (l Layout) Atomic() uint64 { return 2*l.n + recvLen }

// Result is the offset of the 8 bytes an atomic returns into.
func (l Layout) Result() uint64 { return 2*l.n + recvLen + 8 }

// Len is the region's length.
func (l Layout) Len() int { return int(2*l.n + recvLen + 16) }

// Info is what a side tells the other out of band: one JSON line.
type Info struct {
	GID  netip.Addr `json:"gid"`  // the side's GID: its uplink's IP address (IPv4-mapped for IPv4)
	QPN  uint32     `json:"qpn"`  // its QP's number, as RoCE packets carry it
	PSN  uint32     `json:"psn"`  // the first PSN it sends
	RKey uint32     `json:"rkey"` // its region's rkey
	Addr uint64     `json:"addr"` // its region's address, as RETHs and AtomicETHs carry it
	Size uint32     `json:"size"` // the pattern size n of its region (Layout)
}

// maxLine bounds an exchange line.
const maxLine = 1024

// ParseInfo parses and checks an exchange line from the other side.
func ParseInfo(line []byte) (Info, error) {
	var in Info
	d := json.NewDecoder(bytes.NewReader(line))
	d.DisallowUnknownFields()
	if err := d.Decode(&in); err != nil {
		return Info{}, fmt.Errorf("the peer's exchange line is not the JSON of {gid, qpn, psn, rkey, addr, size}: %v", err)
	}
	if err := in.check(); err != nil {
		return Info{}, err
	}
	return in, nil
}

// check checks what the other side told: its QP (checkQP) and region.
func (in Info) check() error {
	if err := checkQP(in.GID, in.QPN, in.PSN); err != nil {
		return err
	}
	switch {
	case in.Size < MinSize || in.Size > MaxSize:
		return fmt.Errorf("the peer's size %d is outside %d..%d", in.Size, MinSize, MaxSize)
	case in.Addr > ^uint64(0)-uint64(Layout{uint64(in.Size)}.Len()):
		return fmt.Errorf("the peer's region at %#x of %d bytes wraps around", in.Addr, Layout{uint64(in.Size)}.Len())
	}
	return nil
}

// checkQP checks the QP an exchange line names: its GID, QPN and first
// PSN.
func checkQP(gid netip.Addr, qpn, psn uint32) error {
	switch {
	case !gid.IsValid():
		return errors.New("the peer's exchange line has no gid")
	case qpn < 2 || qpn > 0xffffff:
		return fmt.Errorf("the peer's QPN %#x is not a 24-bit QPN of an RC QP (2..0xffffff)", qpn)
	case psn > 0xffffff:
		return fmt.Errorf("the peer's PSN %#x is wider than 24 bits", psn)
	}
	return nil
}

// line returns i as an exchange line.
func (i Info) line() []byte {
	b, _ := json.Marshal(i) // a struct of plain fields always marshals
	return append(b, '\n')
}

// Side is one end: its QP, CQs and registered region.
type Side struct {
	vm     *vrdma.VM
	qp     *vrdma.QP
	scq    *vrdma.CQ
	rcq    *vrdma.CQ
	mr     *vrdma.MR
	layout Layout
	local  Info
	mtu    uint32
}

// NewSide creates the QP and the region of pattern size size on adapter
// ad of vm; gid is the GID the other side is to reach it at.
func NewSide(ctx context.Context, vm *vrdma.VM, ad *vrdma.Adapter, gid netip.Addr, size int) (*Side, error) {
	if size < MinSize || size > MaxSize {
		return nil, fmt.Errorf("size %d is outside %d..%d", size, MinSize, MaxSize)
	}
	s := &Side{vm: vm, layout: Layout{uint64(size)}, mtu: 1024}
	pd, err := ad.AllocPD(ctx)
	if err != nil {
		return nil, err
	}
	if s.scq, err = ad.CreateCQ(ctx, 16); err != nil {
		return nil, err
	}
	if s.rcq, err = ad.CreateCQ(ctx, 16); err != nil {
		return nil, err
	}
	caps := vrdma.QPCaps{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}
	if s.qp, err = pd.CreateQP(ctx, vrdma.QPInitAttr{SendCQ: s.scq, RecvCQ: s.rcq, Caps: caps}); err != nil {
		return nil, err
	}
	buf, err := vm.Alloc(s.layout.Len())
	if err != nil {
		return nil, err
	}
	acc := vrdma.AccessLocalWrite | vrdma.AccessRemoteWrite | vrdma.AccessRemoteRead | vrdma.AccessRemoteAtomic
	if s.mr, err = pd.RegMR(ctx, buf, acc); err != nil {
		return nil, err
	}
	ep := s.qp.Endpoint()
	s.local = Info{GID: netip.AddrFrom16(gid.As16()), QPN: ep.QPN, PSN: ep.PSN, RKey: s.mr.RKey(), Addr: s.mr.Addr(), Size: uint32(size)}
	return s, nil
}

// Local is what this side tells the other.
func (s *Side) Local() Info { return s.local }

// connect brings the QP to RTS facing remote.
func (s *Side) connect(ctx context.Context, remote Info) error {
	ep := vrdma.Endpoint{GID: vrdma.GID(remote.GID.As16()), QPN: remote.QPN, PSN: remote.PSN, MTU: s.mtu}
	if err := s.qp.ConnectTo(ctx, ep); err != nil {
		return fmt.Errorf("connect QP 0x%x to QPN 0x%x at %s: %w", s.qp.QPN(), remote.QPN, remote.GID, err)
	}
	return nil
}

// pattern fills b with the pattern of seed.
func pattern(b []byte, seed byte) {
	for i := range b {
		b[i] = seed + byte(i*7)
	}
}

// Seeds of the two patterns.
const (
	passiveSeed = 's'
	activeSeed  = 'c'
	hello       = "native-peer hello"
	imm         = 0x4e415449 // "NATI"
	atomicStart = 100
)

// Result is one operation's outcome.
type Result struct {
	Op      string        `json:"op"`
	Latency time.Duration `json:"latency_ns"`
}

// Serve is the passive side over connection c: it reads the active
// side's Info, connects, answers with its own, and checks what the
// active side does; it returns nil once everything checked out.
func (s *Side) Serve(ctx context.Context, c net.Conn) error {
	r := bufio.NewReaderSize(io.LimitReader(c, 4*maxLine), maxLine)
	remote, err := readLine(r, ParseInfo)
	if err != nil {
		return err
	}
	if err := s.connect(ctx, remote); err != nil {
		return err
	}
	// The receives are posted before the active side learns where to
	// send: its SEND finds one.
	if err := s.preparePassive(); err != nil {
		return err
	}
	if _, err := c.Write(s.local.line()); err != nil {
		return fmt.Errorf("send this side's exchange line: %w", err)
	}
	problems, err := s.awaitActive(ctx)
	if err != nil {
		return err
	}
	if line, err := r.ReadString('\n'); err != nil || line != "check\n" {
		return fmt.Errorf("the active side did not ask for the check (%q, %v)", line, err)
	}
	problems = append(problems, s.checkMemory(remote)...)
	verdict := "ok\n"
	if problems != nil {
		verdict = fmt.Sprintf("failed: %q\n", problems)
	}
	if _, err := c.Write([]byte(verdict)); err != nil {
		return err
	}
	if problems != nil {
		return fmt.Errorf("passive side: %q", problems)
	}
	return nil
}

// preparePassive lays out the passive side's region (its pattern, the
// atomic target) and posts the receives of the active side's SEND and
// RDMA WRITE with immediate; its QP is in INIT or later.
func (s *Side) preparePassive() error {
	m, l := s.mr.Bytes(), s.layout
	pattern(m[l.Read():l.Write()], passiveSeed)
	binary.LittleEndian.PutUint64(m[l.Atomic():], atomicStart)
	sge := s.mr.SGE(int(l.Recv()), recvLen)
	return s.qp.PostRecv([]vrdma.RecvWR{{ID: 1, SGL: []vrdma.SGE{sge}}, {ID: 2, SGL: []vrdma.SGE{sge}}})
}

// postRecv posts one receive into the receive buffer.
func (s *Side) postRecv(id uint64) error {
	return s.qp.PostRecv([]vrdma.RecvWR{{ID: id, SGL: []vrdma.SGE{s.mr.SGE(int(s.layout.Recv()), recvLen)}}})
}

// awaitActive waits for the completions of the active side's SEND and
// RDMA WRITE with immediate, and says what is wrong with them.
func (s *Side) awaitActive(ctx context.Context) ([]string, error) {
	var problems []string
	wcs, err := wait(ctx, s.rcq, 2)
	if err != nil {
		return nil, err
	}
	if w := wcs[0]; w.Status != vrdma.WCSuccess || w.Opcode != vrdma.WCRecv || w.ByteLen != uint32(len(hello)) {
		problems = append(problems, fmt.Sprintf("the SEND completed %+v, want a RECV of %d bytes", w, len(hello)))
	}
	if w := wcs[1]; w.Status != vrdma.WCSuccess || w.Opcode != vrdma.WCRecvRDMAWithImm || w.Imm != imm {
		problems = append(problems, fmt.Sprintf("the RDMA WRITE with immediate completed %+v, want RECV_RDMA_WITH_IMM with imm %#x", w, imm))
	}
	return problems, nil
}

// checkMemory says what is wrong with the passive side's region after
// the active side (remote) ran every operation.
func (s *Side) checkMemory(remote Info) []string {
	m, l := s.mr.Bytes(), s.layout
	var problems []string
	want := make([]byte, min(l.n, uint64(remote.Size)))
	pattern(want, activeSeed)
	if !bytes.Equal(m[l.Write():l.Write()+uint64(len(want))], want) {
		problems = append(problems, "the RDMA WRITE's data is not the active side's pattern")
	}
	if got := binary.LittleEndian.Uint64(m[l.Atomic():]); got != 205 {
		problems = append(problems, fmt.Sprintf("the atomic target holds %d after compare-and-swap 100->200 and fetch-and-add 5, want 205", got))
	}
	return problems
}

// Drive is the active side over connection c: it sends its Info, reads
// the passive side's, connects, runs every operation and returns their
// outcomes, and an error if any failed or the passive side's check did.
func (s *Side) Drive(ctx context.Context, c net.Conn) ([]Result, error) {
	if _, err := c.Write(s.local.line()); err != nil {
		return nil, fmt.Errorf("send this side's exchange line: %w", err)
	}
	r := bufio.NewReaderSize(io.LimitReader(c, 4*maxLine), maxLine)
	remote, err := readLine(r, ParseInfo)
	if err != nil {
		return nil, err
	}
	if err := s.connect(ctx, remote); err != nil {
		return nil, err
	}
	out, err := s.operations(ctx, remote)
	if err != nil {
		return out, err
	}
	if _, err := c.Write([]byte("check\n")); err != nil {
		return out, err
	}
	verdict, err := r.ReadString('\n')
	if err != nil {
		return out, fmt.Errorf("the passive side's verdict: %w", err)
	}
	if verdict != "ok\n" {
		return out, fmt.Errorf("the passive side's check: %s", bytes.TrimSpace([]byte(verdict)))
	}
	return out, nil
}

// operations runs every operation against the passive side's region
// (remote), checking each, and returns their outcomes.
func (s *Side) operations(ctx context.Context, remote Info) ([]Result, error) {
	m, l, rl := s.mr.Bytes(), s.layout, Layout{uint64(remote.Size)}
	n := min(l.n, rl.n)
	copy(m[l.Recv():], hello)
	pattern(m[l.Write():l.Write()+n], activeSeed)
	var out []Result
	run := func(op string, wr vrdma.SendWR) error {
		wr.ID, wr.Flags = uint64(len(out)+1), vrdma.SendSignaled
		t0 := time.Now()
		if err := s.qp.PostSend([]vrdma.SendWR{wr}); err != nil {
			return fmt.Errorf("%s: post: %w", op, err)
		}
		wcs, err := wait(ctx, s.scq, 1)
		if err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
		if wcs[0].Status != vrdma.WCSuccess {
			return fmt.Errorf("%s completed with status %v", op, wcs[0].Status)
		}
		out = append(out, Result{Op: op, Latency: time.Since(t0)})
		return nil
	}
	result := func() uint64 { return binary.LittleEndian.Uint64(m[l.Result():]) }
	steps := []struct {
		op    string
		wr    vrdma.SendWR
		check func() error
	}{
		{"SEND", vrdma.SendWR{Opcode: vrdma.OpSend, SGL: []vrdma.SGE{s.mr.SGE(int(l.Recv()), len(hello))}}, nil},
		{"RDMA_WRITE_WITH_IMM", vrdma.SendWR{Opcode: vrdma.OpRDMAWriteWithImm, Imm: imm, SGL: []vrdma.SGE{s.mr.SGE(int(l.Write()), int(n))},
			RemoteAddr: remote.Addr + rl.Write(), RKey: remote.RKey}, nil},
		{"RDMA_READ", vrdma.SendWR{Opcode: vrdma.OpRDMARead, SGL: []vrdma.SGE{s.mr.SGE(int(l.Read()), int(n))},
			RemoteAddr: remote.Addr + rl.Read(), RKey: remote.RKey}, func() error {
			want := make([]byte, n)
			pattern(want, passiveSeed)
			if !bytes.Equal(m[l.Read():l.Read()+n], want) {
				return errors.New("RDMA_READ returned other bytes than the passive side's pattern")
			}
			return nil
		}},
		{"ATOMIC_CMP_AND_SWP", vrdma.SendWR{Opcode: vrdma.OpAtomicCmpAndSwp, CompareAdd: atomicStart, Swap: 200, SGL: []vrdma.SGE{s.mr.SGE(int(l.Result()), 8)},
			RemoteAddr: remote.Addr + rl.Atomic(), RKey: remote.RKey}, func() error {
			if got := result(); got != atomicStart {
				return fmt.Errorf("ATOMIC_CMP_AND_SWP returned %d, want %d", got, atomicStart)
			}
			return nil
		}},
		{"ATOMIC_FETCH_AND_ADD", vrdma.SendWR{Opcode: vrdma.OpAtomicFetchAdd, CompareAdd: 5, SGL: []vrdma.SGE{s.mr.SGE(int(l.Result()), 8)},
			RemoteAddr: remote.Addr + rl.Atomic(), RKey: remote.RKey}, func() error {
			if got := result(); got != 200 {
				return fmt.Errorf("ATOMIC_FETCH_AND_ADD returned %d, want 200", got)
			}
			return nil
		}},
	}
	for _, st := range steps {
		if err := run(st.op, st.wr); err != nil {
			return out, err
		}
		if st.check != nil {
			if err := st.check(); err != nil {
				return out, err
			}
		}
	}
	return out, nil
}

// readLine reads the other side's exchange line and parses it.
func readLine[T any](r *bufio.Reader, parse func([]byte) (T, error)) (T, error) {
	line, err := r.ReadSlice('\n')
	if err != nil {
		var zero T
		return zero, fmt.Errorf("read the peer's exchange line: %w", err)
	}
	return parse(line)
}

// wait returns n completions of cq, or an error when ctx ends first.
func wait(ctx context.Context, cq *vrdma.CQ, n int) ([]vrdma.WorkCompletion, error) {
	wc := make([]vrdma.WorkCompletion, n)
	got := 0
	for got < n {
		k, err := cq.Poll(wc[got:])
		if err != nil {
			return nil, err
		}
		got += k
		if got < n && k == 0 {
			if err := cq.Wait(ctx); err != nil {
				return nil, fmt.Errorf("waiting for completion %d of %d: %w", got+1, n, err)
			}
		}
	}
	return wc, nil
}
