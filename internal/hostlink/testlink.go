// SPDX-License-Identifier: Apache-2.0

package hostlink

// The test link (package testenv's Options.TestLink): QPs between two VMs
// of this host are bound to the tcp path's requester and responder over a
// link to this host itself whose frames go through an in-process pipe
// with faults (package testlink) instead of TCP. Every RC rule the
// requester and the responder follow — PSNs, go-back-N, the retry budget,
// duplicate detection and the response cache — then meets lost,
// duplicated, reordered and late frames, with the same fates for the
// same seed.
//
// Unlike TCP the link loses frames without losing the connection, so a
// request unanswered within the QP's timeout is retried at once
// (Peer.Lossy) rather than taken for a dead peer. The link's pipes are
// its connections: Peer.Conn makes one (requester end: a readResponses
// goroutine; responder end: a serveRequests goroutine, both owned by the
// Links' wait group).

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/vrdma/vrdma/internal/clock"
	"github.com/vrdma/vrdma/internal/tcpwire"
	"github.com/vrdma/vrdma/internal/testlink"
)

// tcpFraming is where a tcp path frame ends, for the test link's shapers.
var tcpFraming = testlink.Framing{HeaderLen: tcpwire.HeaderLen, Len: func(h []byte) (int, error) {
	return int(binary.BigEndian.Uint32(h[4:8])), nil
}}

// NewTestLink makes the agent's loopback test link: an Links with one
// link, to this host itself, over in-process pipes with faults f on
// clock clk, counting frames in stats. Nothing listens.
func NewTestLink(cfg Config, f testlink.Faults, clk clock.Clock, stats *testlink.Stats) (*Links, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	if cfg.Responder == nil {
		return nil, errors.New("test link: no responder (Config.Responder)")
	}
	u := &Links{cfg: cfg, log: cfg.Log.With("component", "testlink"), links: map[string]*Peer{}, stop: make(chan struct{})}
	l := &Peer{u: u, peerID: cfg.HostID, peerName: cfg.Host + " (test link)", in: map[*Conn]struct{}{}, lossy: true}
	l.pipe = func(n uint64) (*Conn, *Conn, error) {
		req, resp, err := testlink.Pipe(f, f.Seed+n, tcpFraming, clk, stats)
		if err != nil {
			return nil, nil, err
		}
		return newConn(l, req, true, tcpwire.Version), newConn(l, resp, false, tcpwire.Version), nil
	}
	u.links[cfg.HostID] = l
	return u, nil
}

// pipeConn makes a new pipe for the test link: its requester end becomes
// the link's connection for requests, its responder end is served as a
// connection the peer opened.
func (l *Peer) pipeConn() (*Conn, error) {
	u := l.u
	c, s, err := l.pipe(l.dials.Add(1))
	if err != nil {
		return nil, fmt.Errorf("test link: %w", err)
	}
	l.dialsOK.Add(1)
	c.handshaking, s.handshaking = false, false
	u.mu.Lock()
	if u.closed {
		u.mu.Unlock()
		c.Close(errors.New("agent stopping"))
		s.Close(errors.New("agent stopping"))
		return nil, errors.New("agent stopping")
	}
	// Registered before u.mu is let go: a close that follows finds both
	// ends (dropAll) and its wait covers their readers.
	u.wg.Add(2)
	l.mu.Lock()
	l.in[s] = struct{}{}
	l.mu.Unlock()
	l.out.Store(c)
	u.mu.Unlock()
	go func() {
		defer u.wg.Done()
		c.readResponses()
	}()
	go func() {
		defer u.wg.Done()
		s.serveRequests()
	}()
	return c, nil
}
