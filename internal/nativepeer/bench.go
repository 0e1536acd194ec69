// SPDX-License-Identifier: Apache-2.0

package nativepeer

// A benchmark run (vrdmactl native-peer --bench TEST): perftest's tests
// between the two sides instead of the functional checks, the same code
// as vrdmactl perf's (perf.Endpoint) on each side. Both sides name the
// test, as perftest's two programs do. The active side sends one
// BenchLine: its QP and buffer, and the run (test, size, iterations, the
// MTU it can use); the passive side makes its buffer for that run and
// answers with its own BenchLine, the run repeated with the MTU both can
// use. Both connect and run; the active side measures, and at the end
// sends its figures as one JSON line, which the passive side reports too
// (as perftest's server prints the bandwidth).

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/perf"
)

// Bounds of a benchmark run.
const (
	MaxBenchSize  = 8 << 20 // perftest's -a goes to 8 MiB
	MaxBenchIters = 100_000_000
)

// BenchLine is a side's exchange line in a benchmark run: its QP and
// buffer, and the run.
type BenchLine struct {
	GID   netip.Addr `json:"gid"`   // the side's GID (IPv4-mapped for IPv4)
	QPN   uint32     `json:"qpn"`   // its QP's number
	PSN   uint32     `json:"psn"`   // the first PSN it sends
	RKey  uint32     `json:"rkey"`  // its buffer's rkey
	Addr  uint64     `json:"addr"`  // its buffer's address
	Len   uint64     `json:"len"`   // its buffer's length
	Test  perf.Test  `json:"test"`  // the test (perf.Tests)
	Size  int        `json:"size"`  // message size in bytes
	Iters int        `json:"iters"` // iterations
	MTU   uint32     `json:"mtu"`   // path MTU: the active side's, then what both can use
}

// ParseBenchLine parses and checks a benchmark exchange line from the
// other side.
func ParseBenchLine(line []byte) (BenchLine, error) {
	var l BenchLine
	d := json.NewDecoder(bytes.NewReader(line))
	d.DisallowUnknownFields()
	if err := d.Decode(&l); err != nil {
		return BenchLine{}, fmt.Errorf("the peer's benchmark line is not the JSON of {gid, qpn, psn, rkey, addr, len, test, size, iters, mtu}: %v", err)
	}
	if _, err := perf.ParseTest(string(l.Test)); err != nil {
		return BenchLine{}, fmt.Errorf("the peer's benchmark line: %w", err)
	}
	if err := checkQP(l.GID, l.QPN, l.PSN); err != nil {
		return BenchLine{}, err
	}
	switch {
	case l.Size < 1 || l.Size > MaxBenchSize:
		return BenchLine{}, fmt.Errorf("the peer's message size %d is outside 1..%d", l.Size, MaxBenchSize)
	case l.Iters < 1 || l.Iters > MaxBenchIters:
		return BenchLine{}, fmt.Errorf("the peer's iteration count %d is outside 1..%d", l.Iters, MaxBenchIters)
	case l.MTU < 256 || l.MTU > 4096 || l.MTU&(l.MTU-1) != 0:
		return BenchLine{}, fmt.Errorf("the peer's MTU %d is not 256, 512, 1024, 2048 or 4096", l.MTU)
	case l.Len < uint64(l.Test.BufSize(l.Size)):
		return BenchLine{}, fmt.Errorf("the peer's buffer of %d bytes is smaller than %s of %d bytes needs (%d)", l.Len, l.Test, l.Size, l.Test.BufSize(l.Size))
	case l.Addr > ^uint64(0)-l.Len:
		return BenchLine{}, fmt.Errorf("the peer's buffer at %#x of %d bytes wraps around", l.Addr, l.Len)
	}
	return l, nil
}

// config is the run l asks for.
func (l BenchLine) config() perf.Config {
	return perf.Config{Test: l.Test, Size: l.Size, Iters: l.Iters}
}

// line returns l as an exchange line.
func (l BenchLine) line() []byte {
	b, _ := json.Marshal(l) // a struct of plain fields always marshals
	return append(b, '\n')
}

// BenchSide is this side of a benchmark run.
type BenchSide struct {
	Adapter *vrdma.Adapter // the adapter it runs on
	GID     netip.Addr     // the GID the other side reaches it at
	// AgentInProcess says the adapter's agent runs in this process (the
	// plain peer, Standalone): the measuring loops yield to its
	// goroutines.
	AgentInProcess bool
}

// endpoint makes b's perf endpoint for run c and the line that tells it,
// with path MTU at most mtu.
func (b BenchSide) endpoint(ctx context.Context, c perf.Config, mtu uint32, active bool) (*perf.Endpoint, BenchLine, error) {
	e, err := perf.NewEndpoint(ctx, b.Adapter, perf.PairConfig{BufSize: c.Test.BufSize(c.Size), AgentInProcess: b.AgentInProcess}, active)
	if err != nil {
		return nil, BenchLine{}, err
	}
	e.Prepare(c)
	ep := e.Side.QP.Endpoint()
	l := BenchLine{GID: netip.AddrFrom16(b.GID.As16()), QPN: ep.QPN, PSN: ep.PSN, RKey: e.Side.MR.RKey(), Addr: e.Side.MR.Addr(),
		Len: uint64(len(e.Side.MR.Bytes())), Test: c.Test, Size: c.Size, Iters: c.Iters, MTU: min(ep.MTU, mtu)}
	return e, l, nil
}

// benchConnect connects e's QP to the other side's, remote, with path
// MTU mtu.
func benchConnect(ctx context.Context, e *perf.Endpoint, remote BenchLine, mtu uint32) error {
	ep := vrdma.Endpoint{GID: vrdma.GID(remote.GID.As16()), QPN: remote.QPN, PSN: remote.PSN, MTU: mtu}
	if err := e.Side.QP.ConnectTo(ctx, ep); err != nil {
		return fmt.Errorf("connect QP 0x%x to QPN 0x%x at %s: %w", e.Side.QP.QPN(), remote.QPN, remote.GID, err)
	}
	e.Peer = perf.Peer{Addr: remote.Addr, RKey: remote.RKey, Name: remote.GID.Unmap().String()}
	return nil
}

// Active is the active side of a benchmark run of c over connection cn:
// it measures and returns the figures.
func (b BenchSide) Active(ctx context.Context, c perf.Config, cn net.Conn) (perf.Result, error) {
	if c.Iters <= 0 {
		c.Iters = c.Test.DefaultIters()
	}
	if c.Size <= 0 {
		c.Size = c.Test.DefaultSize()
	}
	e, local, err := b.endpoint(ctx, c, 4096, true)
	if err != nil {
		return perf.Result{}, err
	}
	defer e.Close(context.WithoutCancel(ctx))
	if _, err := cn.Write(local.line()); err != nil {
		return perf.Result{}, fmt.Errorf("send this side's benchmark line: %w", err)
	}
	r := bufio.NewReaderSize(io.LimitReader(cn, 4*maxLine), maxLine)
	remote, err := readLine(r, ParseBenchLine)
	if err != nil {
		return perf.Result{}, err
	}
	if remote.Test != c.Test || remote.Size != c.Size || remote.Iters != c.Iters || remote.MTU > local.MTU {
		return perf.Result{}, fmt.Errorf("the passive side answered a run of %s, %d bytes, %d iterations, MTU %d; this side asked for %s, %d, %d, MTU %d at most",
			remote.Test, remote.Size, remote.Iters, remote.MTU, c.Test, c.Size, c.Iters, local.MTU)
	}
	if err := benchConnect(ctx, e, remote, remote.MTU); err != nil {
		return perf.Result{}, err
	}
	res, err := e.Run(ctx, c)
	if err != nil {
		return perf.Result{}, err
	}
	out, _ := json.Marshal(res)
	if _, err := cn.Write(append(out, '\n')); err != nil {
		return res, fmt.Errorf("send the figures to the passive side: %w", err)
	}
	return res, nil
}

// Passive is the passive side of a benchmark run of test over connection
// cn: it answers the active side's run and returns the figures the active
// side measured.
func (b BenchSide) Passive(ctx context.Context, test perf.Test, cn net.Conn) (perf.Result, error) {
	r := bufio.NewReaderSize(io.LimitReader(cn, 4*maxLine), maxLine)
	remote, err := readLine(r, ParseBenchLine)
	if err != nil {
		return perf.Result{}, err
	}
	if remote.Test != test {
		return perf.Result{}, fmt.Errorf("the active side asks for %s; this side runs %s (give both sides the same --bench)", remote.Test, test)
	}
	c := remote.config()
	e, local, err := b.endpoint(ctx, c, remote.MTU, false)
	if err != nil {
		return perf.Result{}, err
	}
	defer e.Close(context.WithoutCancel(ctx))
	if err := benchConnect(ctx, e, remote, local.MTU); err != nil {
		return perf.Result{}, err
	}
	if _, err := cn.Write(local.line()); err != nil {
		return perf.Result{}, fmt.Errorf("send this side's benchmark line: %w", err)
	}
	if _, err := e.Run(ctx, c); err != nil {
		return perf.Result{}, err
	}
	line, err := r.ReadSlice('\n')
	if err != nil {
		return perf.Result{}, fmt.Errorf("the active side's figures: %w", err)
	}
	var res perf.Result
	if err := json.Unmarshal(line, &res); err != nil {
		return perf.Result{}, fmt.Errorf("the active side's figures are not a JSON result: %v", err)
	}
	res.Test, res.MsgSize, res.Path = c.Test, c.Size, e.Side.QP.Path()
	return res, nil
}
