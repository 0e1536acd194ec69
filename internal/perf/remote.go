// SPDX-License-Identifier: Apache-2.0

package perf

// A run between two processes (vrdmactl perf without --local): each has
// an Endpoint, one side of the test, and learns the other's buffer from
// the rdma_cm handshake's private data, as perftest exchanges it over its
// socket. The client's REQ carries a Hello (the test, its parameters and
// the client's buffer); the server's REP carries its buffer (EncodePeer).
// At the end the client writes its Result into the server's buffer
// (EncodeResult) before it disconnects, so that the server prints the
// same figures, as perftest's server does.
//
// Bidirectional (perftest's -b): both sides run the BW loop at once, each
// toward the other's buffer. When its loop is done the server writes its
// own figures into the client's buffer past the bytes the loop touches
// (BidirOffset: the Result, then a ready word written after it landed);
// the client waits for them and adds them to its own, and that sum is
// what it writes to the server at the end.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/vrdma/vrdma"
)

// helloMagic starts a Hello and a peer record: "vp", version 1.
var helloMagic = [3]byte{'v', 'p', 1}

// HelloLen is the size of an encoded Hello: it fits a REQ's 56 bytes of
// private data.
const HelloLen = 34

// PeerLen is the size of an encoded peer record (the REP's private data).
const PeerLen = 15

// Hello is a client's request: the test to run and its buffer.
type Hello struct {
	Test    Test
	Atomic  Atomic
	Size    int
	Iters   int
	CQMod   int
	TxDepth int
	QPs     int  // QP pairs the client connects, each with this Hello (0 is 1)
	Peer    Peer // the client's buffer
	// Bidirectional: the server runs the BW loop toward the client too
	// (write_bw, read_bw, atomic_bw).
	Bidirectional bool
}

// Encode returns h as the REQ's private data.
func (h Hello) Encode() []byte {
	b := make([]byte, HelloLen)
	copy(b, helloMagic[:])
	for i, t := range Tests {
		if t == h.Test {
			b[3] = byte(i)
		}
	}
	if h.Atomic == CmpAndSwap {
		b[4] = 1
	}
	binary.LittleEndian.PutUint32(b[6:], uint32(h.Size))
	binary.LittleEndian.PutUint32(b[10:], uint32(h.Iters))
	binary.LittleEndian.PutUint16(b[14:], uint16(h.CQMod))
	binary.LittleEndian.PutUint16(b[16:], uint16(h.TxDepth))
	binary.LittleEndian.PutUint64(b[18:], h.Peer.Addr)
	binary.LittleEndian.PutUint32(b[26:], h.Peer.RKey)
	binary.LittleEndian.PutUint16(b[30:], uint16(max(h.QPs, 1)))
	if h.Bidirectional {
		b[5] |= helloBidir
	}
	return b
}

// helloBidir is the flag of byte 5 that asks for a bidirectional run.
const helloBidir = 1

// ParseHello reads a client's Hello, checking every field: the sizes and
// counts a server would allocate and loop on come from another process.
func ParseHello(b []byte) (Hello, error) {
	if len(b) < HelloLen || [3]byte(b[:3]) != helloMagic {
		return Hello{}, errors.New("perf: the client's request is not a vrdmactl perf request of this version")
	}
	if int(b[3]) >= len(Tests) || b[4] > 1 || b[5]&^helloBidir != 0 {
		return Hello{}, fmt.Errorf("perf: the client asks for test %d, operation %d, flags %#x: unknown", b[3], b[4], b[5])
	}
	h := Hello{Test: Tests[b[3]], Atomic: FetchAndAdd,
		Size:          int(binary.LittleEndian.Uint32(b[6:])),
		Iters:         int(binary.LittleEndian.Uint32(b[10:])),
		CQMod:         int(binary.LittleEndian.Uint16(b[14:])),
		TxDepth:       int(binary.LittleEndian.Uint16(b[16:])),
		QPs:           max(int(binary.LittleEndian.Uint16(b[30:])), 1),
		Peer:          Peer{Addr: binary.LittleEndian.Uint64(b[18:]), RKey: binary.LittleEndian.Uint32(b[26:]), Name: "the client"},
		Bidirectional: b[5]&helloBidir != 0}
	if b[4] == 1 {
		h.Atomic = CmpAndSwap
	}
	switch {
	case h.Size < 1 || h.Size > MaxRemoteSize:
		return Hello{}, fmt.Errorf("perf: the client asks for %d-byte messages: 1..%d are served", h.Size, MaxRemoteSize)
	case h.Test.Atomic() && h.Size != 8:
		return Hello{}, fmt.Errorf("perf: the client asks for %s of %d bytes: atomics are 8", h.Test, h.Size)
	case h.Iters < 1 || h.Iters > MaxRemoteIters:
		return Hello{}, fmt.Errorf("perf: the client asks for %d iterations: 1..%d are served", h.Iters, MaxRemoteIters)
	case h.CQMod < 1 || h.TxDepth < 1 || h.TxDepth > vrdma.MaxQPWR/2:
		return Hello{}, fmt.Errorf("perf: the client asks for CQ moderation %d, TX depth %d: want ≥ 1 and 1..%d", h.CQMod, h.TxDepth, vrdma.MaxQPWR/2)
	case h.Bidirectional && h.Test != WriteBW && h.Test != ReadBW && h.Test != AtomicBW:
		return Hello{}, fmt.Errorf("perf: the client asks for %s both ways: -b runs write_bw, read_bw and atomic_bw", h.Test)
	case h.QPs > 1 && h.Test.Latency():
		return Hello{}, fmt.Errorf("perf: the client asks for %s on %d QPs: latency tests run on one", h.Test, h.QPs)
	}
	cfg := PairConfig{TxDepth: h.TxDepth, QPs: h.QPs}
	if err := cfg.check(); err != nil {
		return Hello{}, fmt.Errorf("perf: the client asks for %d QPs with TX depth %d: %w", h.QPs, h.TxDepth, err)
	}
	return h, nil
}

// Bounds on what a server runs for a client.
const (
	MaxRemoteSize  = 1 << 26
	MaxRemoteIters = 100_000_000
)

// Config returns the run h asks for.
func (h Hello) Config() Config {
	return Config{Test: h.Test, Atomic: h.Atomic, Size: h.Size, Iters: h.Iters, CQMod: h.CQMod, TxDepth: h.TxDepth, Bidirectional: h.Bidirectional}
}

// EncodePeer returns p as the REP's private data.
func EncodePeer(p Peer) []byte {
	b := make([]byte, PeerLen)
	copy(b, helloMagic[:])
	binary.LittleEndian.PutUint64(b[3:], p.Addr)
	binary.LittleEndian.PutUint32(b[11:], p.RKey)
	return b
}

// ParsePeer reads the server's buffer from the REP's private data.
func ParsePeer(b []byte, name string) (Peer, error) {
	if len(b) < PeerLen || [3]byte(b[:3]) != helloMagic {
		return Peer{}, fmt.Errorf("perf: %s's answer is not a vrdmactl perf server's of this version", name)
	}
	return Peer{Addr: binary.LittleEndian.Uint64(b[3:]), RKey: binary.LittleEndian.Uint32(b[11:]), Name: name}, nil
}

// ResultLen is the size of an encoded Result.
const ResultLen = 3 + 4 + 8 + 10*8

// BidirOffset is where, in the client's buffer, the server of a
// bidirectional run of size-byte messages writes its ready word (4 bytes,
// 1 once its figures are there) and, 8 bytes on, its Result: past the
// size bytes the BW loops write and read.
func BidirOffset(size int) int { return (size + 63) &^ 63 }

// BidirBufSize is the buffer a side of a bidirectional run of size-byte
// messages needs.
func BidirBufSize(size int) int { return BidirOffset(size) + 8 + ResultLen }

// EncodeResult returns r's figures as the client writes them to the
// server.
func EncodeResult(r Result) []byte {
	b := make([]byte, ResultLen)
	copy(b, helloMagic[:])
	binary.LittleEndian.PutUint32(b[3:], uint32(r.Iters))
	binary.LittleEndian.PutUint64(b[7:], uint64(r.Elapsed))
	for i, f := range []float64{r.BWPeak, r.BWAvg, r.MsgRate, r.TMin, r.TMax, r.TTypical, r.TAvg, r.TStdev, r.P99, r.P999} {
		binary.LittleEndian.PutUint64(b[15+8*i:], math.Float64bits(f))
	}
	if r.PeakSeen {
		b[2] |= 0x80
	}
	return b
}

// ParseResult reads the figures the client wrote; a server that finds
// none (the client went before writing them) says so.
func ParseResult(b []byte) (Result, error) {
	if len(b) < ResultLen || b[0] != helloMagic[0] || b[1] != helloMagic[1] || b[2]&0x7f != helloMagic[2] {
		return Result{}, errors.New("perf: the client left without its results")
	}
	r := Result{Iters: int(binary.LittleEndian.Uint32(b[3:])), Elapsed: time.Duration(binary.LittleEndian.Uint64(b[7:])), PeakSeen: b[2]&0x80 != 0}
	f := make([]float64, 10)
	for i := range f {
		f[i] = math.Float64frombits(binary.LittleEndian.Uint64(b[15+8*i:]))
	}
	r.BWPeak, r.BWAvg, r.MsgRate, r.TMin, r.TMax, r.TTypical, r.TAvg, r.TStdev, r.P99, r.P999 = f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9]
	return r, nil
}

// Endpoint is one process's side of a run: its Side, the peer's buffer,
// and whether it drives the test (the client) or answers (the server).
type Endpoint struct {
	Side   *Side
	Peer   Peer
	Active bool
	cfg    PairConfig
}

// NewEndpoint makes an endpoint's side on ad: a PD, a registered buffer,
// a CQ and an RC QP sized by cfg, not yet connected.
func NewEndpoint(ctx context.Context, ad *vrdma.Adapter, cfg PairConfig, active bool) (*Endpoint, error) {
	cfg.defaults()
	s, err := newSide(ctx, ad, cfg)
	e := &Endpoint{Side: s, Active: active, cfg: cfg}
	if err != nil {
		e.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	s.alone = !cfg.AgentInProcess
	return e, nil
}

// Prepare readies e's buffer for run c before the connection is made
// (write_lat's watched bytes cleared; a bidirectional client's place for
// the server's figures cleared, the buffer being random bytes), so that
// the peer cannot write into it before.
func (e *Endpoint) Prepare(c Config) {
	if c.Test == WriteLat && 2*c.Size <= e.cfg.BufSize {
		clearLatBytes(e.Side, c.Size)
	}
	if b, off := e.Side.MR.Bytes(), BidirOffset(c.Size); c.Bidirectional && e.Active && len(b) >= off+8+ResultLen {
		clear(b[off : off+8+ResultLen])
	}
}

// Run runs e's part of c once both sides are connected: the client's
// measures; the server's answers (write_lat, send_lat), receives
// (send_bw), or has nothing to do (its agent answers RDMA and atomics).
func (e *Endpoint) Run(ctx context.Context, c Config) (Result, error) {
	c, err := c.normalize(e.cfg)
	if err != nil {
		return Result{}, err
	}
	s, peer := e.Side, e.Peer
	var r Result
	switch {
	case !e.Active && c.Test == WriteLat:
		err = latSide(ctx, s, peer, c, c.Iters, nil)
	case !e.Active && c.Test == SendLat:
		err = sendLatSide(ctx, s, c, nil)
	case !e.Active && c.Test == SendBW:
		err = receiveAll(ctx, s, c, make(chan error, 1), nil)
	case !e.Active && c.Bidirectional:
		if r, err = runBW(ctx, c, s, peer, c.bwOpcode()); err == nil {
			err = e.sendBidirResult(ctx, c, r)
		}
	case !e.Active:
	case c.Bidirectional:
		if r, err = runBW(ctx, c, s, peer, c.bwOpcode()); err == nil {
			var back Result
			if back, err = e.bidirResult(ctx, c); err == nil {
				r.add(back)
			}
		}
	case c.Test == WriteBW, c.Test == ReadBW, c.Test == AtomicBW:
		r, err = runBW(ctx, c, s, peer, c.bwOpcode())
	case c.Test == SendBW:
		r, err = runBW(ctx, c, s, peer, vrdma.OpSend)
	case c.Test == WriteLat:
		stamps := make([]int64, c.Iters+1)
		if err = latSide(ctx, s, peer, c, c.Iters, stamps); err == nil {
			r = halfRTT(stamps)
		}
	case c.Test == SendLat:
		stamps := make([]int64, c.Iters+1)
		if err = sendLatSide(ctx, s, c, stamps); err == nil {
			r = halfRTT(stamps)
		}
	case c.Test == ReadLat:
		r, err = runRoundTrip(ctx, c, s, peer, vrdma.OpRDMARead)
	case c.Test == AtomicLat:
		r, err = runRoundTrip(ctx, c, s, peer, c.Atomic.opcode())
	}
	if err != nil {
		return Result{}, fmt.Errorf("perf: %s: %w", c.Test, err)
	}
	r.Test, r.MsgSize, r.Path = c.Test, c.Size, s.QP.Path()
	return r, nil
}

// SendResult writes r into the peer's buffer (the client's last RDMA
// WRITE, signaled and waited for, so that it is there before the
// disconnect).
func (e *Endpoint) SendResult(ctx context.Context, r Result) error {
	return e.writeAt(ctx, 0, EncodeResult(r))
}

// sendBidirResult is the server's end of a bidirectional run: its own
// figures r into the client's buffer at BidirOffset, and then, once they
// landed, the ready word.
func (e *Endpoint) sendBidirResult(ctx context.Context, c Config, r Result) error {
	off := BidirOffset(c.Size)
	if err := e.writeAt(ctx, off+8, EncodeResult(r)); err != nil {
		return fmt.Errorf("perf: send this side's figures to %s: %w", e.Peer.Name, err)
	}
	if err := e.writeAt(ctx, off, []byte{1, 0, 0, 0}); err != nil {
		return fmt.Errorf("perf: send this side's figures to %s: %w", e.Peer.Name, err)
	}
	return nil
}

// bidirResult is the client's end of a bidirectional run: it waits for
// the server's figures (sendBidirResult) in its buffer and reads them.
func (e *Endpoint) bidirResult(ctx context.Context, c Config) (Result, error) {
	off := BidirOffset(c.Size)
	b := e.Side.MR.Bytes()
	if len(b) < off+8+ResultLen {
		return Result{}, fmt.Errorf("perf: a %d-byte buffer cannot carry the server's figures of a bidirectional run (%d bytes: BidirBufSize)", len(b), BidirBufSize(c.Size))
	}
	ready := (*uint32)(unsafe.Pointer(&b[off])) // written by the agent for the server
	for atomic.LoadUint32(ready) == 0 {
		select {
		case <-ctx.Done():
			return Result{}, fmt.Errorf("perf: waiting for %s's figures of its direction: %w", e.Peer.Name, context.Cause(ctx))
		case <-time.After(time.Millisecond):
		}
	}
	r, err := ParseResult(b[off+8 : off+8+ResultLen])
	if err != nil {
		return Result{}, fmt.Errorf("perf: %s's figures of its direction: %w", e.Peer.Name, err)
	}
	return r, nil
}

// writeAt writes data into the peer's buffer at off, from e's buffer at
// the same offset, with a signaled RDMA WRITE that it waits for.
func (e *Endpoint) writeAt(ctx context.Context, off int, data []byte) error {
	b := e.Side.MR.Bytes()
	if len(b) < off+len(data) {
		return fmt.Errorf("perf: a %d-byte buffer cannot carry %d bytes at %d", len(b), len(data), off)
	}
	copy(b[off:], data)
	wrs := []vrdma.SendWR{{ID: math.MaxUint64, Opcode: vrdma.OpRDMAWrite, Flags: vrdma.SendSignaled,
		SGL: []vrdma.SGE{e.Side.MR.SGE(off, len(data))}, RemoteAddr: e.Peer.Addr + uint64(off), RKey: e.Peer.RKey}}
	sp := e.Side.spinner(ctx)
	if err := postRetry(e.Side, wrs, &sp); err != nil {
		return err
	}
	wc := make([]vrdma.WorkCompletion, 16)
	for {
		n, err := e.Side.CQ.Poll(wc)
		if err != nil {
			return err
		}
		for i := range n {
			if wc[i].WRID == math.MaxUint64 {
				if wc[i].Status != vrdma.WCSuccess {
					return completionError(&wc[i])
				}
				return nil
			}
		}
		if n == 0 {
			if err := sp.spin(); err != nil {
				return err
			}
		}
	}
}

// Close destroys e's side.
func (e *Endpoint) Close(ctx context.Context) error {
	p := Pair{A: e.Side}
	return p.Close(ctx)
}
