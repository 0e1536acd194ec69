package agent

// The test path (Config.TestLink; issue 9's test transport): QPs between
// two VMs of this host are bound to the tcp path's requester (tcpPath) and
// responder (tconn.serveRequests), over a loopback link whose frames go
// through an in-process pipe with faults (package testlink) instead of
// TCP. Every RC rule the requester and the responder follow — PSNs,
// go-back-N, the retry budget, duplicate detection and the response
// cache — then meets lost, duplicated, reordered and late frames, with the
// same fates for the same seed.
//
// Unlike TCP the link loses frames without losing the connection, so a
// request unanswered within the QP's timeout is retried at once (link.lossy)
// rather than taken for a dead peer. The link's pipes are its connections:
// conn makes one (requester end: a readResponses goroutine; responder end:
// a serveRequests goroutine, both owned by the loop uplink's wait group).

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/tcpwire"
	"github.com/vrdma/vrdma/internal/testlink"
)

// tcpFraming is where a tcp path frame ends, for the test link's shapers.
var tcpFraming = testlink.Framing{HeaderLen: tcpwire.HeaderLen, Len: func(h []byte) (int, error) {
	return int(binary.BigEndian.Uint32(h[4:8])), nil
}}

// startTestLink makes the agent's loopback test link.
func (a *Agent) startTestLink(f testlink.Faults) error {
	if err := f.Validate(); err != nil {
		return err
	}
	u := &uplink{a: a, log: a.log.With("component", "testlink"), links: map[string]*link{}, stop: make(chan struct{})}
	l := &link{u: u, peerID: a.hostID, in: map[*tconn]struct{}{}, lossy: true}
	l.peerName = a.cfg.Host + " (test link)"
	l.pipe = func(n uint64) (*tconn, *tconn, error) {
		req, resp, err := testlink.Pipe(f, f.Seed+n, tcpFraming, a.clk, &a.testStats)
		if err != nil {
			return nil, nil, err
		}
		return newTconn(l, req, true, tcpwire.Version), newTconn(l, resp, false, tcpwire.Version), nil
	}
	u.links[a.hostID] = l
	a.loop = l
	return nil
}

// TestLinkStats returns the frames the test link carried, by fate; nil
// without a test link.
func (a *Agent) TestLinkStats() *testlink.Stats {
	if a.loop == nil {
		return nil
	}
	return &a.testStats
}

// pipeConn makes a new pipe for the test link: its requester end becomes
// the link's connection for requests, its responder end is served as a
// connection the peer opened.
func (l *link) pipeConn() (*tconn, error) {
	u := l.u
	c, s, err := l.pipe(l.dials.Add(1))
	if err != nil {
		return nil, fmt.Errorf("test link: %w", err)
	}
	c.handshaking, s.handshaking = false, false
	u.mu.Lock()
	if u.closed {
		u.mu.Unlock()
		c.close(errors.New("agent stopping"))
		s.close(errors.New("agent stopping"))
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

// bindTestLocked binds q to the test path towards a QP of this host.
//
// +checklocks:q.mu
func (q *QP) bindTestLocked(dgid abi.GID, qpn uint32, ad *Adapter) {
	a := q.vm.a
	q.remoteGID, q.remoteQPN = dgid, qpn
	t := newTCPPath(q, a.hostID, a.loop)
	t.pathKind = abi.PathTest
	q.bindPathLocked(t, abi.PathInfo{Path: abi.PathTest, Reason: fmt.Sprintf("test: both VMs (%s, %s) on host %s, over the agent's test link", q.vm.name, ad.vm.name, a.cfg.Host),
		Rejected: []abi.PathRejection{{Path: abi.PathMemcpy, Why: "the agent runs with a test link (tests only)"}}})
}
