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
	"errors"
	"fmt"

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
}

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
}

// Side is one end of a pair: its adapter and verbs objects. The buffer is
// MR.Bytes().
type Side struct {
	Adapter *vrdma.Adapter
	PD      *vrdma.PD
	CQ      *vrdma.CQ
	QP      *vrdma.QP
	MR      *vrdma.MR
}

// Name returns "vm/vrdmaN".
func (s *Side) Name() string { return s.Adapter.VM().Name() + "/" + s.Adapter.Name() }

// Pair is two connected RC QPs: A dialed B through the CM.
type Pair struct {
	A, B *Side
	cfg  PairConfig
}

// Connect creates a PD, a CQ, a QP and a registered buffer on adapters a
// and b, has b listen and a dial it (rdma_cm style), and returns the
// connected pair. The pair's path is A.QP.Path().
func Connect(ctx context.Context, a, b *vrdma.Adapter, cfg PairConfig) (_ *Pair, err error) {
	cfg.defaults()
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
	l, err := b.Listen(ctx, cfg.Port)
	if err != nil {
		return nil, err
	}
	defer l.Close(context.WithoutCancel(ctx))
	accepted := make(chan error, 1)
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		r, err := l.Accept(actx)
		if err == nil {
			err = r.Accept(actx, p.B.QP)
		}
		accepted <- err
	}()
	if err := p.A.QP.Connect(ctx, p.B.Name(), cfg.Port); err != nil {
		cancel()
		<-accepted
		return nil, err
	}
	if err := <-accepted; err != nil {
		return nil, fmt.Errorf("perf: %s accepting %s: %w", p.B.Name(), p.A.Name(), err)
	}
	return p, nil
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
	if s.MR, err = s.PD.RegMR(ctx, buf, vrdma.AccessAll); err != nil {
		return s, err
	}
	// The receive queue is 4× the send depth, perftest's rx_depth of 512
	// for the default 128: send_bw's receiver reposts in bursts, and a
	// sender that finds the queue empty waits an RNR timer (0.64 ms).
	rq := min(4*cfg.TxDepth, vrdma.MaxQPWR)
	// Room for every signaled send, plus a full receive queue (send_bw),
	// plus the receives CheckOpcodes posts.
	if s.CQ, err = ad.CreateCQ(ctx, cfg.TxDepth+rq+64); err != nil {
		return s, err
	}
	// Twice the depth: a completion can be seen a moment before the agent
	// frees its send-queue slot.
	sq := min(2*cfg.TxDepth, vrdma.MaxQPWR)
	s.QP, err = s.PD.CreateQP(ctx, vrdma.QPInitAttr{SendCQ: s.CQ, RecvCQ: s.CQ,
		Caps: vrdma.QPCaps{MaxSendWR: uint32(sq), MaxRecvWR: uint32(rq), MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: uint32(cfg.MaxInline)}})
	return s, err
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
		if s.QP != nil {
			errs = append(errs, s.QP.Destroy(ctx))
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
