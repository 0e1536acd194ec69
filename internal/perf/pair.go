// SPDX-License-Identifier: Apache-2.0

// Package perf is the measuring engine behind "vrdmactl perf" and the
// samples of "vrdmactl quickstart": it connects a pair of QPs between two
// adapters, checks every opcode end to end, and runs perftest's write_bw,
// read_bw and write_lat tests with perftest's arithmetic (BW peak and
// average in MiB/s, message rate in Mpps, latency as RTT/2 in µs). Go
// benchmarks use it too.
//
// Both sides run in this process: each is a VM attachment of its own (its
// own session with the agent), driven by its own goroutine where the test
// needs the passive side to act (write_lat).
package perf

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/vrdma/vrdma"
)

// DefaultPort is the CM service port a pair connects on (perftest's).
const DefaultPort = 18515

// PairConfig sizes the objects of a pair.
type PairConfig struct {
	// BufSize is the size of the registered buffer on each side (default
	// 4096). Tests use its start: BW tests need Size bytes, write_lat 2×Size,
	// CheckOpcodes 4 KiB.
	BufSize int
	// TxDepth is the number of send work requests a side may have
	// outstanding (default 128, perftest's -t).
	TxDepth int
	// MaxInline is the QP's max_inline_data (default 0).
	MaxInline int
	// Port is the CM service port B listens on (default DefaultPort).
	Port uint16
	// QPs is the number of connected QP pairs (default 1, perftest's
	// -q): BW tests keep TxDepth work requests outstanding on each, and
	// all of a side's QPs share its CQ and buffer.
	QPs int
	// MTU, if set (256 … 4096, perftest's -m), connects the QPs out of
	// band, as perftest does without rdma_cm, with this path MTU (or the
	// adapters' active MTU, if smaller); zero connects them through the
	// CM, which picks the path MTU.
	MTU uint32
	// AgentInProcess says an Endpoint's agent runs in its own process
	// (vrdmactl native-peer's plain peer): its measuring loops yield the
	// Go scheduler to the agent's goroutines, as a Pair's two sides yield
	// to each other.
	AgentInProcess bool
}

// MaxQPs bounds PairConfig.QPs.
const MaxQPs = 4096

func (c *PairConfig) defaults() {
	if c.BufSize <= 0 {
		c.BufSize = 4096
	}
	if c.TxDepth <= 0 {
		c.TxDepth = 128
	}
	if c.Port == 0 {
		c.Port = DefaultPort
	}
	if c.QPs <= 0 {
		c.QPs = 1
	}
}

// check reports a configuration no side can be built with.
func (c *PairConfig) check() error {
	switch {
	case c.QPs > MaxQPs:
		return fmt.Errorf("perf: %d QPs: at most %d", c.QPs, MaxQPs)
	case c.MTU != 0 && !validMTU(c.MTU):
		return fmt.Errorf("perf: MTU %d: want 256, 512, 1024, 2048 or 4096", c.MTU)
	case c.QPs*(c.TxDepth+1)+64 > vrdma.MaxCQE:
		return fmt.Errorf("perf: %d QPs with %d work requests outstanding each need more than the CQ's %d entries: lower -q or -t", c.QPs, c.TxDepth, vrdma.MaxCQE)
	}
	return nil
}

func validMTU(m uint32) bool { return m >= 256 && m <= 4096 && m&(m-1) == 0 }

// Side is one end of a pair: its adapter and verbs objects. The buffer is
// MR.Bytes().
type Side struct {
	Adapter *vrdma.Adapter
	PD      *vrdma.PD
	CQ      *vrdma.CQ
	QP      *vrdma.QP   // QPs[0]
	QPs     []*vrdma.QP // all of them, sharing CQ and MR
	MR      *vrdma.MR

	recvOut []int // send_bw's receives left posted on each QP by earlier runs
	alone   bool  // the only side of its pair in this process (an Endpoint)
}

// Name returns "vm/vrdmaN".
func (s *Side) Name() string { return s.Adapter.VM().Name() + "/" + s.Adapter.Name() }

// Pair is two connected RC QPs: A dialed B through the CM.
type Pair struct {
	A, B *Side
	cfg  PairConfig
	// ConnectTime is how long connecting the QPs took, one pair after
	// another (the objects' creation not included).
	ConnectTime time.Duration
}

// Connect creates a PD, a CQ, cfg.QPs QPs and a registered buffer on
// adapters a and b and connects A's QPs to B's: through the CM (b listens,
// a dials each, rdma_cm style), or out of band with cfg.MTU. The pair's
// path is A.QP.Path().
func Connect(ctx context.Context, a, b *vrdma.Adapter, cfg PairConfig) (_ *Pair, err error) {
	cfg.defaults()
	if err := cfg.check(); err != nil {
		return nil, err
	}
	p := &Pair{cfg: cfg}
	defer func() {
		if err != nil {
			p.Close(context.WithoutCancel(ctx))
		}
	}()
	if p.A, err = newSide(ctx, a, cfg); err != nil {
		return nil, err
	}
	if p.B, err = newSide(ctx, b, cfg); err != nil {
		return nil, err
	}
	start := time.Now()
	defer func() { p.ConnectTime = time.Since(start) }()
	if cfg.MTU != 0 {
		return p, p.connectOutOfBand(ctx)
	}
	l, err := b.Listen(ctx, cfg.Port)
	if err != nil {
		return nil, err
	}
	defer l.Close(context.WithoutCancel(ctx))
	for i, qa := range p.A.QPs {
		accepted := make(chan error, 1)
		actx, cancel := context.WithCancel(ctx)
		go func() {
			r, err := l.Accept(actx)
			if err == nil {
				err = r.Accept(actx, p.B.QPs[i])
			}
			accepted <- err
		}()
		if err := qa.Connect(ctx, p.B.Name(), cfg.Port); err != nil {
			cancel()
			<-accepted
			return nil, fmt.Errorf("perf: QP %d of %d: %w", i+1, cfg.QPs, err)
		}
		err := <-accepted
		cancel()
		if err != nil {
			return nil, fmt.Errorf("perf: %s accepting %s (QP %d of %d): %w", p.B.Name(), p.A.Name(), i+1, cfg.QPs, err)
		}
	}
	return p, nil
}

// connectOutOfBand connects each QP of A to its twin on B as perftest does
// without rdma_cm: each side is given the other's endpoint (GID, QPN, PSN)
// and an MTU, and moves its QP to RTS itself.
func (p *Pair) connectOutOfBand(ctx context.Context) error {
	for i := range p.A.QPs {
		qa, qb := p.A.QPs[i], p.B.QPs[i]
		ea, eb := qa.Endpoint(), qb.Endpoint()
		ea.MTU, eb.MTU = min(ea.MTU, p.cfg.MTU), min(eb.MTU, p.cfg.MTU)
		if err := qa.ConnectTo(ctx, eb); err != nil {
			return fmt.Errorf("perf: connect %s's QP 0x%x to %s's 0x%x: %w", p.A.Name(), qa.QPN(), p.B.Name(), qb.QPN(), err)
		}
		if err := qb.ConnectTo(ctx, ea); err != nil {
			return fmt.Errorf("perf: connect %s's QP 0x%x to %s's 0x%x: %w", p.B.Name(), qb.QPN(), p.A.Name(), qa.QPN(), err)
		}
	}
	return nil
}

func newSide(ctx context.Context, ad *vrdma.Adapter, cfg PairConfig) (*Side, error) {
	s := &Side{Adapter: ad}
	var err error
	if s.PD, err = ad.AllocPD(ctx); err != nil {
		return s, err
	}
	buf, err := ad.VM().Alloc(cfg.BufSize)
	if err != nil {
		return s, err
	}
	fillRandom(buf)
	if s.MR, err = s.PD.RegMR(ctx, buf, vrdma.AccessAll); err != nil {
		return s, err
	}
	// The receive queue is 4× the send depth, perftest's rx_depth of 512
	// for the default 128: send_bw's receiver reposts in bursts, and a
	// sender that finds the queue empty waits an RNR timer (0.64 ms).
	// With many QPs it shrinks so that every QP's fit the one CQ.
	rq := min(4*cfg.TxDepth, vrdma.MaxQPWR, (vrdma.MaxCQE-64)/cfg.QPs-cfg.TxDepth)
	// Room for every signaled send, plus full receive queues (send_bw),
	// plus the receives CheckOpcodes posts.
	if s.CQ, err = ad.CreateCQ(ctx, cfg.QPs*(cfg.TxDepth+rq)+64); err != nil {
		return s, err
	}
	// Twice the depth: a completion can be seen a moment before the agent
	// frees its send-queue slot.
	sq := min(2*cfg.TxDepth, vrdma.MaxQPWR)
	for range cfg.QPs {
		q, err := s.PD.CreateQP(ctx, vrdma.QPInitAttr{SendCQ: s.CQ, RecvCQ: s.CQ,
			Caps: vrdma.QPCaps{MaxSendWR: uint32(sq), MaxRecvWR: uint32(rq), MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: uint32(cfg.MaxInline)}})
		if err != nil {
			return s, err
		}
		s.QPs = append(s.QPs, q)
		s.QP = s.QPs[0]
	}
	return s, nil
}

// fillRandom fills buf with pseudo-random bytes, as perftest fills its
// buffers with rand() (write_lat's it clears; here write_lat clears the
// bytes it watches, clearLatBytes). What a test moves must look like data: on some machines a
// copy of zero bytes runs far faster than one of anything else (1 MiB
// copies here: 67 GB/s of zeros, 39 of random bytes; see docs/PERF-LOG.md,
// stop 30), so a buffer left as allocated would measure that, not the path.
func fillRandom(buf []byte) {
	var seed [32]byte
	for i := 0; i < len(seed); i += 8 {
		binary.LittleEndian.PutUint64(seed[i:], rand.Uint64())
	}
	rng := rand.NewChaCha8(seed)
	_, _ = rng.Read(buf) // ChaCha8.Read never fails
}

// Path returns the path A's QP reports.
func (p *Pair) Path() vrdma.PathInfo { return p.A.QP.Path() }

// Config returns the configuration the pair was built with.
func (p *Pair) Config() PairConfig { return p.cfg }

// Close destroys both sides' QPs, CQs, MRs and PDs (the VMs stay attached).
func (p *Pair) Close(ctx context.Context) error {
	var errs []error
	for _, s := range []*Side{p.A, p.B} {
		if s == nil {
			continue
		}
		for _, q := range s.QPs {
			errs = append(errs, q.Destroy(ctx))
		}
		if s.CQ != nil {
			errs = append(errs, s.CQ.Destroy(ctx))
		}
		if s.MR != nil {
			errs = append(errs, s.MR.Dereg(ctx))
		}
		if s.PD != nil {
			errs = append(errs, s.PD.Dealloc(ctx))
		}
	}
	return errors.Join(errs...)
}

// Peer is what a side knows of the other's buffer: where its RDMA
// operations go.
type Peer struct {
	Addr uint64
	RKey uint32
	Name string // for messages: "vm/vrdmaN"
}

// Peer returns s's buffer as its peer addresses it.
func (s *Side) Peer() Peer { return Peer{Addr: s.MR.Addr(), RKey: s.MR.RKey(), Name: s.Name()} }
