// SPDX-License-Identifier: Apache-2.0

package cli

// perf without --local: server and client in two processes, as perftest
// runs (ib_write_bw on one machine, ib_write_bw SERVER on the other), each
// a workload of a VM of a running agent. The server listens on its
// adapter's port through an rdma_cm event channel; the client connects by
// the server adapter's IP address, GID or "vm/vrdmaN", carrying the test
// and its buffer in the REQ's private data (perf.Hello); the server sizes
// its buffer to the request and answers with it in the REP. At the end the
// client writes its figures into the server's buffer and disconnects: both
// print the result (the server only for BW tests, as perftest's). With -b
// the server runs the BW loop toward the client too and hands the client
// its figures, which the client adds to its own (perf.Endpoint).

import (
	"context"
	"fmt"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/perf"
)

// perfRemoteTimeout bounds the wait for a client, and for a server's
// answer.
const perfRemoteTimeout = 60 * time.Second

func (o *perfOptions) checkRemote() error {
	switch {
	case o.vm == "":
		return usageErrorf("perf: without --local, --vm NAME names the VM this side is a workload of (on the agent at --socket)")
	case o.all:
		return usageErrorf("perf: -a runs with --local; between a server and a client, run one size (-s)")
	case o.duration > 0:
		return usageErrorf("perf: -D runs with --local; between a server and a client, count iterations (-n)")
	case o.path != "" || o.hostAddrs != "" || o.async:
		return usageErrorf("perf: --path, --pvrdma-addresses and --async shape --local runs; a server and a client take the path their VMs have")
	case o.port < 1 || o.port > 65535:
		return usageErrorf("perf: -p %d out of range 1..65535", o.port)
	}
	return nil
}

// perfRemote runs o as the server (server == "") or as the client of the
// server at server.
func (a *app) perfRemote(ctx context.Context, o perfOptions, server string) error {
	if err := o.checkRemote(); err != nil {
		return err
	}
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	v, err := vrdma.Open(octx, o.vm, vrdma.WithSocket(a.socket))
	cancel()
	if err != nil {
		return fmt.Errorf("perf: attach VM %s: %w", o.vm, err)
	}
	defer v.Close()
	var ad *vrdma.Adapter
	for _, x := range v.Adapters() {
		if x.Name() == o.device {
			ad = x
		}
	}
	if ad == nil {
		return usageErrorf("perf: VM %s has no adapter %s (-d)", o.vm, o.device)
	}
	ch, err := v.OpenEventChannel(ctx)
	if err != nil {
		return fmt.Errorf("perf: %w", err)
	}
	defer ch.Close(context.WithoutCancel(ctx))
	if server == "" {
		return a.perfServe(ctx, o, ad, ch)
	}
	return a.perfDial(ctx, o, ad, ch, server)
}

// nextEvent waits for an event of type want on ch, skipping others.
func nextEvent(ctx context.Context, ch *vrdma.EventChannel, want ...vrdma.CMEventType) (*vrdma.CMEvent, error) {
	for {
		ev, err := ch.Next(ctx)
		if err != nil {
			return nil, err
		}
		for _, w := range want {
			if ev.Type == w {
				return ev, nil
			}
		}
	}
}

func (a *app) perfServe(ctx context.Context, o perfOptions, ad *vrdma.Adapter, ch *vrdma.EventChannel) error {
	// As perftest's server on the any address: the host's port too, so
	// that a client may dial this host's address (when this process is
	// in the host's network).
	l, err := ch.Listen(ctx, ad.Name(), uint16(o.port), vrdma.HostPort(false))
	if err != nil {
		return fmt.Errorf("perf: listen on %s port %d: %w", ad.Name(), o.port, err)
	}
	defer l.Close(context.WithoutCancel(ctx))
	if o.text() {
		fmt.Fprintln(a.stdout, "\n************************************\n* Waiting for client to connect... *\n************************************")
	}
	wctx, cancel := context.WithTimeout(ctx, perfRemoteTimeout)
	req, err := nextEvent(wctx, ch, vrdma.CMConnectRequest)
	cancel()
	if err != nil {
		return fmt.Errorf("perf: no client connected to %s port %d in %v: %w", ad.Name(), o.port, perfRemoteTimeout, err)
	}
	h, err := perf.ParseHello(req.PrivateData)
	if err != nil {
		req.Reject(context.WithoutCancel(ctx), nil)
		return fmt.Errorf("perf: client %s/%s refused: %w", req.RemoteVM, req.RemoteAdapter, err)
	}
	o.test, o.atomic, o.size, o.iters, o.cqMod, o.txDepth, o.qps, o.bidir = h.Test, string(h.Atomic), h.Size, h.Iters, h.CQMod, h.TxDepth, h.QPs, h.Bidirectional
	c := h.Config()
	e, err := perf.NewEndpoint(ctx, ad, endpointConfig(o, h.Size), false)
	if err != nil {
		req.Reject(context.WithoutCancel(ctx), nil)
		return fmt.Errorf("perf: %w", err)
	}
	defer e.Close(context.WithoutCancel(ctx))
	e.Peer = h.Peer
	e.Peer.Name = req.RemoteVM + "/" + req.RemoteAdapter
	e.Prepare(c)
	if err := acceptAll(ctx, ch, req, e, h); err != nil {
		return err
	}
	info := a.remoteInfo(o, e)
	if o.text() {
		printPerfHeader(a.stdout, info, o)
	}
	rctx, cancel := context.WithTimeout(ctx, runTimeout(c))
	defer cancel()
	if _, err := e.Run(rctx, c); err != nil {
		return err
	}
	for range o.qps {
		if _, err := nextEvent(rctx, ch, vrdma.CMDisconnected); err != nil {
			return fmt.Errorf("perf: waiting for %s to end the run: %w", e.Peer.Name, err)
		}
	}
	if o.test.Latency() { // as perftest's: latency servers print no results
		if o.text() {
			fmt.Fprintln(a.stdout, perfRule)
		}
		return nil
	}
	r, err := perf.ParseResult(e.Side.MR.Bytes())
	if err != nil {
		return err
	}
	r.Test, r.MsgSize, r.Path = c.Test, c.Size, e.Side.QP.Path()
	return a.perfReport(o, info, r)
}

// acceptAll accepts the client's first request, req (whose Hello is h),
// with e's first QP, and its h.QPs-1 others, each asking for the same run,
// with the next; it returns once every connection is ESTABLISHED.
func acceptAll(ctx context.Context, ch *vrdma.EventChannel, req *vrdma.CMEvent, e *perf.Endpoint, h perf.Hello) error {
	ctx, cancel := context.WithTimeout(ctx, perfRemoteTimeout)
	defer cancel()
	accepted, established := 0, 0
	for established < len(e.Side.QPs) {
		if req != nil {
			if accepted > 0 {
				if h2, err := perf.ParseHello(req.PrivateData); err != nil || h2.Peer.Addr != h.Peer.Addr || h2.Peer.RKey != h.Peer.RKey || h2.Config() != h.Config() || h2.QPs != h.QPs {
					req.Reject(context.WithoutCancel(ctx), nil)
					return fmt.Errorf("perf: connection %d of %d from %s/%s does not ask for the run the first asked for (%v)", accepted+1, h.QPs, req.RemoteVM, req.RemoteAdapter, err)
				}
			}
			if err := req.Accept(ctx, e.Side.QPs[accepted], perf.EncodePeer(e.Side.Peer())); err != nil {
				return fmt.Errorf("perf: accept %s (QP %d of %d): %w", e.Peer.Name, accepted+1, h.QPs, err)
			}
			accepted++
			req = nil
		}
		ev, err := nextEvent(ctx, ch, vrdma.CMEstablished, vrdma.CMConnectRequest)
		if err != nil {
			return fmt.Errorf("perf: %s's connections: %d of %d accepted, %d established: %w", e.Peer.Name, accepted, h.QPs, established, err)
		}
		switch {
		case ev.Type == vrdma.CMEstablished:
			established++
		case accepted < len(e.Side.QPs):
			req = ev
		default:
			ev.Reject(context.WithoutCancel(ctx), nil)
		}
	}
	return nil
}

func (a *app) perfDial(ctx context.Context, o perfOptions, ad *vrdma.Adapter, ch *vrdma.EventChannel, server string) error {
	c := perf.Config{Test: o.test, Size: o.size, Iters: o.iters, TxDepth: o.txDepth, CQMod: o.cqMod, UseEvent: o.useEvent, Atomic: perf.Atomic(o.atomic), Bidirectional: o.bidir}
	if c.Size <= 0 {
		c.Size = o.test.DefaultSize()
	}
	if c.Iters <= 0 {
		c.Iters = o.test.DefaultIters()
	}
	c.CQMod = min(o.cqModFor(c.Size), c.TxDepth)
	o.cqMod = c.CQMod // the header's
	if c.Size > perf.MaxRemoteSize || c.Iters > perf.MaxRemoteIters {
		return usageErrorf("perf: a server runs at most %d-byte messages and %d iterations", perf.MaxRemoteSize, perf.MaxRemoteIters)
	}
	o.size, o.iters = c.Size, c.Iters
	e, err := perf.NewEndpoint(ctx, ad, endpointConfig(o, c.Size), true)
	if err != nil {
		return fmt.Errorf("perf: %w", err)
	}
	defer e.Close(context.WithoutCancel(ctx))
	e.Prepare(c)
	h := perf.Hello{Test: c.Test, Atomic: c.Atomic, Size: c.Size, Iters: c.Iters, CQMod: c.CQMod, TxDepth: c.TxDepth, QPs: o.qps, Peer: e.Side.Peer(), Bidirectional: c.Bidirectional}
	if h.Atomic == "" {
		h.Atomic = perf.FetchAndAdd
	}
	disconnect := func() {
		for _, q := range e.Side.QPs {
			if q.State() == vrdma.QPSRTS {
				q.Disconnect(context.WithoutCancel(ctx))
			}
		}
	}
	for i, q := range e.Side.QPs {
		which := "" // which QP, when there are several
		if o.qps > 1 {
			which = fmt.Sprintf(" (QP %d of %d)", i+1, o.qps)
		}
		cookie, err := ch.Connect(ctx, q, server, uint16(o.port), h.Encode(), perfRemoteTimeout)
		if err != nil {
			disconnect()
			return fmt.Errorf("perf: connect to %s port %d%s: %w", server, o.port, which, err)
		}
		ev, err := nextEvent(ctx, ch, vrdma.CMEstablished, vrdma.CMRejected, vrdma.CMUnreachable)
		if err == nil && (ev.Type != vrdma.CMEstablished || ev.Cookie != cookie) {
			err = fmt.Errorf("%s (status %d): %s", ev.Type, ev.Status, ev.Message)
		}
		if err == nil && i == 0 {
			e.Peer, err = perf.ParsePeer(ev.PrivateData, server)
		}
		if err != nil {
			disconnect()
			return fmt.Errorf("perf: connect to %s port %d%s: %w", server, o.port, which, err)
		}
	}
	info := a.remoteInfo(o, e)
	if o.text() {
		printPerfHeader(a.stdout, info, o)
	}
	rctx, cancel := context.WithTimeout(ctx, runTimeout(c))
	defer cancel()
	r, err := e.Run(rctx, c)
	if err == nil && !o.test.Latency() {
		err = e.SendResult(rctx, r)
	}
	for _, q := range e.Side.QPs {
		if derr := q.Disconnect(context.WithoutCancel(ctx)); err == nil && derr != nil {
			err = fmt.Errorf("perf: disconnect: %w", derr)
		}
	}
	if err != nil {
		return err
	}
	return a.perfReport(o, info, r)
}

// endpointConfig sizes one side for o's test of size bytes (with -b,
// with room for the server's figures).
func endpointConfig(o perfOptions, size int) perf.PairConfig {
	buf := max(o.test.BufSize(size), 4096)
	if o.bidir {
		buf = max(buf, perf.BidirBufSize(size))
	}
	return perf.PairConfig{BufSize: buf, TxDepth: o.txDepth, QPs: o.qps, MaxInline: o.maxInline()}
}

// remoteInfo is the report's header for a side of a two-process run.
func (a *app) remoteInfo(o perfOptions, e *perf.Endpoint) perfInfo {
	path := e.Side.QP.Path()
	info := perfInfo{Test: string(o.test), Title: o.test.Title(perf.Atomic(o.atomic)), Device: e.Side.Adapter.Name(), NumberOfQPs: o.qps,
		TransportType: "IB", ConnectionType: "RC", UsingSRQ: "OFF", TXDepth: o.txDepth, CQModeration: min(o.cqMod, o.txDepth), UseEvent: o.useEvent,
		Mtu: 1024, LinkType: "Ethernet", RdmaCMQPs: "ON", DataExMethod: "rdma_cm",
		Transport: string(path.Path), Path: string(path.Path), Reason: path.Reason, Bidirectional: o.bidir}
	info.MaxInlineData = o.maxInline()
	if o.test.Latency() {
		info.TXDepth = 1
	} else {
		info.BWUnit = "MiB/sec"
		if o.gbits {
			info.BWUnit = "Gb/sec"
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if qi, err := e.Side.QP.Query(ctx); err == nil {
		info.Mtu = int(qi.Attr.PathMTU)
		info.Local = addressLine(e.Side, qi.Attr.SQPSN)
	}
	info.Remote = fmt.Sprintf("%s VAddr 0x%014x RKey 0x%06x", e.Peer.Name, e.Peer.Addr, e.Peer.RKey)
	return info
}

// perfReport prints one result, as text or JSON, as --local runs do.
func (a *app) perfReport(o perfOptions, info perfInfo, r perf.Result) error {
	r = o.shape(r)
	switch {
	case o.text():
		printPerfResult(a.stdout, r)
		fmt.Fprintln(a.stdout, perfRule)
	case !o.outJSON:
		printPerfOutput(a.stdout, o.output, r)
	}
	if o.outJSON || o.outJSONFile != "" {
		b, err := perfJSON(info, []perfResult{{Result: r}}, false)
		if err != nil {
			return err
		}
		return a.writeReport(o, append(b, '\n'))
	}
	return nil
}
