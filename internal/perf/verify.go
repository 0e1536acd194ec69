// SPDX-License-Identifier: Apache-2.0

package perf

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/vrdma/vrdma"
)

// Opcodes lists the send opcodes CheckOpcodes exercises, in order.
var Opcodes = []vrdma.Opcode{
	vrdma.OpSend, vrdma.OpSendWithImm, vrdma.OpRDMAWrite, vrdma.OpRDMAWriteWithImm,
	vrdma.OpRDMARead, vrdma.OpAtomicCmpAndSwp, vrdma.OpAtomicFetchAdd,
}

// OpcodeResult is the outcome of one opcode's check; Err is nil when the
// data arrived intact with the right completions.
type OpcodeResult struct {
	Opcode vrdma.Opcode
	Err    error
}

// checkMsg is the message size of the data-moving checks.
const checkMsg = 64

// Buffer layout of the checks: each opcode uses its own 256-byte slot of
// both sides' buffers, so a stray write shows up as a mismatch elsewhere.
const checkSlot = 256

// CheckOpcodes runs every opcode once from A to B and verifies the data,
// the completions (opcode, length, immediate) and, for atomics, the
// returned and the remote values. It needs a 2 KiB buffer per side. Each
// check has its own deadline within ctx; a failed check moves the QPs to
// ERR, so the checks after it fail too.
func (p *Pair) CheckOpcodes(ctx context.Context) []OpcodeResult {
	out := make([]OpcodeResult, 0, len(Opcodes))
	for i, op := range Opcodes {
		var err error
		if need := (i + 1) * checkSlot; need > p.cfg.BufSize {
			err = fmt.Errorf("the pair's %d-byte buffers are too small: %d bytes needed", p.cfg.BufSize, need)
		} else {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err = p.checkOne(cctx, op, i*checkSlot)
			cancel()
		}
		out = append(out, OpcodeResult{Opcode: op, Err: err})
	}
	return out
}

func (p *Pair) checkOne(ctx context.Context, op vrdma.Opcode, off int) error {
	a, b := p.A, p.B
	abuf, bbuf := a.MR.Bytes()[off:off+checkSlot], b.MR.Bytes()[off:off+checkSlot]
	clear(abuf)
	clear(bbuf)
	pattern := make([]byte, checkMsg)
	rand.Read(pattern)
	var imm [4]byte
	rand.Read(imm[:])
	immVal := binary.LittleEndian.Uint32(imm[:])

	wr := vrdma.SendWR{ID: uint64(op) + 1, Opcode: op, Flags: vrdma.SendSignaled,
		RemoteAddr: b.MR.Addr() + uint64(off), RKey: b.MR.RKey()}
	wantRecv := vrdma.WCOpcode(0)
	switch op {
	case vrdma.OpSend, vrdma.OpSendWithImm, vrdma.OpRDMAWrite, vrdma.OpRDMAWriteWithImm:
		copy(abuf, pattern)
		wr.SGL = []vrdma.SGE{a.MR.SGE(off, checkMsg)}
		if op == vrdma.OpSend || op == vrdma.OpSendWithImm {
			wantRecv = vrdma.WCRecv
		} else if op == vrdma.OpRDMAWriteWithImm {
			wantRecv = vrdma.WCRecvRDMAWithImm
		}
		wr.Imm = immVal
	case vrdma.OpRDMARead:
		copy(bbuf, pattern)
		wr.SGL = []vrdma.SGE{a.MR.SGE(off, checkMsg)}
	case vrdma.OpAtomicCmpAndSwp, vrdma.OpAtomicFetchAdd:
		binary.LittleEndian.PutUint64(bbuf, binary.LittleEndian.Uint64(pattern))
		wr.SGL = []vrdma.SGE{a.MR.SGE(off, 8)}
		wr.CompareAdd = binary.LittleEndian.Uint64(pattern) // CAS compare; FAA: added
		wr.Swap = binary.LittleEndian.Uint64(pattern[8:])
		if op == vrdma.OpAtomicFetchAdd {
			wr.CompareAdd = 0x1234567
		}
	}
	if wantRecv != 0 {
		if err := b.QP.PostRecv([]vrdma.RecvWR{{ID: 1000 + uint64(op), SGL: []vrdma.SGE{b.MR.SGE(off, checkSlot)}}}); err != nil {
			return fmt.Errorf("post receive on %s: %w", b.Name(), err)
		}
	}
	if err := a.QP.PostSend([]vrdma.SendWR{wr}); err != nil {
		return fmt.Errorf("post on %s: %w", a.Name(), err)
	}
	wc, err := waitOne(ctx, a.CQ)
	if err != nil {
		return fmt.Errorf("%s's completion: %w", a.Name(), err)
	}
	if wc.Status != vrdma.WCSuccess {
		return completionError(&wc)
	}
	if want := opcodeWC(op); wc.Opcode != want {
		return fmt.Errorf("completion opcode %s, want %s", wc.Opcode, want)
	}
	if wantRecv != 0 {
		rc, err := waitOne(ctx, b.CQ)
		if err != nil {
			return fmt.Errorf("%s's receive completion: %w", b.Name(), err)
		}
		switch {
		case rc.Status != vrdma.WCSuccess:
			return fmt.Errorf("receive on %s: %w", b.Name(), completionError(&rc))
		case rc.Opcode != wantRecv:
			return fmt.Errorf("receive completion opcode %s, want %s", rc.Opcode, wantRecv)
		case rc.ByteLen != checkMsg:
			return fmt.Errorf("receive completion of %d bytes, want %d", rc.ByteLen, checkMsg)
		case rc.SrcQP != a.QP.QPN():
			return fmt.Errorf("receive completion from QP 0x%x, want 0x%x", rc.SrcQP, a.QP.QPN())
		}
		withImm := op == vrdma.OpSendWithImm || op == vrdma.OpRDMAWriteWithImm
		if got := rc.Flags&vrdma.WCWithImm != 0; got != withImm {
			return fmt.Errorf("receive completion has immediate data: %v, want %v", got, withImm)
		}
		if withImm && rc.Imm != immVal {
			return fmt.Errorf("immediate data 0x%x, want 0x%x", rc.Imm, immVal)
		}
	}
	switch op {
	case vrdma.OpSend, vrdma.OpSendWithImm, vrdma.OpRDMAWrite, vrdma.OpRDMAWriteWithImm:
		if !bytes.Equal(bbuf[:checkMsg], pattern) {
			return fmt.Errorf("%s received %x…, want %x…", b.Name(), bbuf[:8], pattern[:8])
		}
		if !allZero(bbuf[checkMsg:]) {
			return fmt.Errorf("%s: bytes past the %d-byte message were written", b.Name(), checkMsg)
		}
	case vrdma.OpRDMARead:
		if !bytes.Equal(abuf[:checkMsg], pattern) {
			return fmt.Errorf("%s read %x…, want %x…", a.Name(), abuf[:8], pattern[:8])
		}
		if !allZero(abuf[checkMsg:]) {
			return fmt.Errorf("%s: bytes past the %d-byte read were written", a.Name(), checkMsg)
		}
	case vrdma.OpAtomicCmpAndSwp, vrdma.OpAtomicFetchAdd:
		orig := binary.LittleEndian.Uint64(pattern)
		want := wr.Swap
		if op == vrdma.OpAtomicFetchAdd {
			want = orig + wr.CompareAdd
		}
		if got := binary.LittleEndian.Uint64(abuf); got != orig {
			return fmt.Errorf("%s returned 0x%x, want the original 0x%x", op, got, orig)
		}
		if got := binary.LittleEndian.Uint64(bbuf); got != want {
			return fmt.Errorf("%s left 0x%x in %s, want 0x%x", op, got, b.Name(), want)
		}
	}
	return nil
}

func opcodeWC(op vrdma.Opcode) vrdma.WCOpcode {
	switch op {
	case vrdma.OpRDMAWrite, vrdma.OpRDMAWriteWithImm:
		return vrdma.WCRDMAWrite
	case vrdma.OpRDMARead:
		return vrdma.WCRDMARead
	case vrdma.OpAtomicCmpAndSwp:
		return vrdma.WCCompSwap
	case vrdma.OpAtomicFetchAdd:
		return vrdma.WCFetchAdd
	}
	return vrdma.WCSend
}

// waitOne waits for one completion on cq.
func waitOne(ctx context.Context, cq *vrdma.CQ) (vrdma.WorkCompletion, error) {
	var wc [1]vrdma.WorkCompletion
	for {
		n, err := cq.Poll(wc[:])
		if err != nil {
			return wc[0], err
		}
		if n == 1 {
			return wc[0], nil
		}
		if err := cq.Wait(ctx); err != nil {
			return wc[0], err
		}
	}
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
