// SPDX-License-Identifier: Apache-2.0

package etcdtest

// Goroutines. A Proxy owns an accept loop while it is up (between New/Heal
// and Cut/Close) and two copy goroutines per connection, one each way.
// Cut closes the listener and every connection, then waits for all of
// them, so after Cut nothing of the proxy runs.

import (
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
)

// Proxy forwards TCP connections from a local port to an etcd member's
// client URL. Cutting it does to the clients what the death of the etcd
// process does: every connection is reset at once and new ones are
// refused. (An in-process member's Close instead lets open watch streams
// drain for several seconds.) Heal listens again on the same port.
//
// A Proxy is safe for concurrent use.
type Proxy struct {
	tb      testing.TB
	network string // of the target: "tcp" or "unix"
	target  string
	addr    string // where the proxy listens, 127.0.0.1:port

	mu sync.Mutex
	// nil while cut
	ln net.Listener // +checklocks:mu
	// both sides of every connection
	conns map[net.Conn]struct{} // +checklocks:mu
	wg    sync.WaitGroup
}

// NewProxy starts a proxy to the member at targetURL (http://host:port or
// unix:///path) and closes it at cleanup.
func NewProxy(tb testing.TB, targetURL string) *Proxy {
	tb.Helper()
	u, err := url.Parse(targetURL)
	if err != nil {
		tb.Fatalf("proxy target %q: %v", targetURL, err)
	}
	p := &Proxy{tb: tb, network: "tcp", target: u.Host, conns: map[net.Conn]struct{}{}}
	if strings.HasPrefix(u.Scheme, "unix") {
		p.network, p.target = "unix", u.Host+u.Path
	}
	p.addr = freeAddr(tb)
	p.Heal()
	tb.Cleanup(p.Cut)
	return p
}

// URL returns the proxy's client URL.
func (p *Proxy) URL() string { return "http://" + p.addr }

// Heal accepts connections again (on the same port).
func (p *Proxy) Heal() {
	p.tb.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		return
	}
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		p.tb.Fatalf("proxy listen %s: %v", p.addr, err)
	}
	p.ln = ln
	p.wg.Go(func() { p.accept(ln) })
}

// Cut resets every connection and refuses new ones until Heal.
func (p *Proxy) Cut() {
	p.mu.Lock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0) // reset, as a dead process's kernel does
		}
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Proxy) accept(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial(p.network, p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		if p.ln != ln { // cut meanwhile
			p.mu.Unlock()
			c.Close()
			up.Close()
			return
		}
		p.conns[c], p.conns[up] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Go(func() { p.pipe(c, up) })
		p.wg.Go(func() { p.pipe(up, c) })
	}
}

// pipe copies from src to dst until either ends, then closes both.
func (p *Proxy) pipe(dst, src net.Conn) {
	io.Copy(dst, src)
	dst.Close()
	src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}
