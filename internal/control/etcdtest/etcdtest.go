// SPDX-License-Identifier: Apache-2.0

// Package etcdtest starts real embedded etcd members for tests of the
// control plane: one member, or a cluster of several, each with its data
// in the test's temporary directory, fsync off and short raft timers. No
// mocks: everything talks to a real etcd over real sockets.
//
// Everything started here is stopped by the test's Cleanup.
package etcdtest

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/control/store"
)

// Raft timers of test members: a fast election after a leader is lost,
// still well above scheduling hiccups under the race detector on two
// cores.
const (
	TickMs     = 50
	ElectionMs = 500
)

// log returns where etcd's own logs go: stderr when VRDMA_ETCD_LOG is set,
// nowhere otherwise.
func log() io.Writer {
	if os.Getenv("VRDMA_ETCD_LOG") != "" {
		return os.Stderr
	}
	return nil
}

// Config returns the configuration of a test member in dir.
func Config(dir string) store.EmbedConfig {
	return store.EmbedConfig{
		Dir:           dir,
		TickMs:        TickMs,
		ElectionMs:    ElectionMs,
		UnsafeNoFsync: true,
		StartTimeout:  30 * time.Second,
		Log:           log(),
		LogLevel:      "warn",
	}
}

// Start starts a single-member etcd in a new temporary directory.
func Start(tb testing.TB) *store.Embedded {
	tb.Helper()
	return StartConfig(tb, Config(tb.TempDir()))
}

// StartConfig starts a member with cfg and stops it at cleanup.
func StartConfig(tb testing.TB, cfg store.EmbedConfig) *store.Embedded {
	tb.Helper()
	m, err := store.StartEmbedded(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("start etcd: %v", err)
	}
	tb.Cleanup(m.Close)
	return m
}

// Open opens a store on endpoints with a separate client, closed at
// cleanup. Lookups that cannot reach etcd give up after a few seconds.
func Open(tb testing.TB, endpoints ...string) *store.Store {
	tb.Helper()
	s, err := store.Open(context.Background(), store.Config{
		Endpoints:   endpoints,
		DialTimeout: 10 * time.Second,
		EtcdLog:     log(),
	})
	if err != nil {
		tb.Fatalf("open store: %v", err)
	}
	tb.Cleanup(func() { s.Close() })
	return s
}

// OpenEmbedded opens a store that runs its own embedded etcd in a new
// temporary directory (as an agent does by default), closed at cleanup.
func OpenEmbedded(tb testing.TB) *store.Store {
	tb.Helper()
	cfg := Config("")
	s, err := store.Open(context.Background(), store.Config{
		DataDir:       tb.TempDir(),
		Embed:         cfg,
		UnsafeNoFsync: true,
		EtcdLog:       log(),
	})
	if err != nil {
		tb.Fatalf("open embedded store: %v", err)
	}
	tb.Cleanup(func() { s.Close() })
	return s
}

// Cluster is a cluster of embedded members on 127.0.0.1, each with its own
// data directory and ports. Clients reach each member through a Proxy, so
// that stopping a member resets its clients' connections as the death of
// an etcd process would.
type Cluster struct {
	tb      testing.TB
	mu      sync.Mutex
	cfgs    []store.EmbedConfig
	proxies []*Proxy
	// nil while stopped
	members []*store.Embedded // +checklocks:mu
	// closed when a killed member has closed
	closing []chan struct{} // +checklocks:mu
}

// StartCluster starts an n-member cluster and waits until it serves.
func StartCluster(tb testing.TB, n int) *Cluster {
	tb.Helper()
	c := &Cluster{tb: tb, cfgs: make([]store.EmbedConfig, n), members: make([]*store.Embedded, n), closing: make([]chan struct{}, n)}
	var initial []string
	for i := range n {
		cfg := Config(filepath.Join(tb.TempDir(), fmt.Sprintf("m%d", i)))
		cfg.Name = fmt.Sprintf("m%d", i)
		cfg.ClientURL = "http://" + freeAddr(tb)
		cfg.PeerURL = "http://" + freeAddr(tb)
		cfg.InsecurePeer = true // test members on 127.0.0.1
		cfg.ClusterToken = "vrdma-test"
		c.cfgs[i] = cfg
		initial = append(initial, cfg.Name+"="+cfg.PeerURL)
	}
	for i := range c.cfgs {
		c.cfgs[i].InitialCluster = strings.Join(initial, ",")
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			c.members[i], errs[i] = store.StartEmbedded(context.Background(), c.cfgs[i]) // +checklocksignore: c is not published yet; one element per goroutine, ordered by wg.Wait
		})
	}
	wg.Wait()
	tb.Cleanup(c.Close)
	for i, err := range errs {
		if err != nil {
			tb.Fatalf("start member %d: %v", i, err)
		}
	}
	for i := range n {
		c.proxies = append(c.proxies, NewProxy(tb, c.cfgs[i].ClientURL))
	}
	return c
}

// Endpoints returns the client URL of every member (through its proxy).
func (c *Cluster) Endpoints() []string {
	var eps []string
	for _, p := range c.proxies {
		eps = append(eps, p.URL())
	}
	return eps
}

// Member returns member i (nil while stopped).
func (c *Cluster) Member(i int) *store.Embedded {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.members[i]
}

// Kill crashes member i: its clients' connections are reset and its raft
// stops at once, without handing leadership over (store.Embedded.Kill).
// Kill returns then; the member finishes closing in the background, and
// Restart and Close wait for it.
func (c *Cluster) Kill(i int) { c.stop(i, true) }

// Stop stops member i gracefully (a leader hands leadership over first).
func (c *Cluster) Stop(i int) { c.stop(i, false) }

func (c *Cluster) stop(i int, kill bool) {
	c.mu.Lock()
	m := c.members[i]
	c.members[i] = nil
	c.mu.Unlock()
	if m == nil {
		return
	}
	if i < len(c.proxies) {
		c.proxies[i].Cut()
	}
	if !kill {
		m.Close()
		return
	}
	m.Kill()
	closed := make(chan struct{})
	c.mu.Lock()
	c.closing[i] = closed
	c.mu.Unlock()
	go func() {
		m.Close()
		close(closed)
	}()
}

// waitClosed waits until a killed member i has finished closing.
func (c *Cluster) waitClosed(i int) {
	c.mu.Lock()
	closed := c.closing[i]
	c.closing[i] = nil
	c.mu.Unlock()
	if closed != nil {
		<-closed
	}
}

// Restart starts member i again on its data directory and ports.
func (c *Cluster) Restart(i int) {
	c.tb.Helper()
	c.waitClosed(i)
	m, err := store.StartEmbedded(context.Background(), c.cfgs[i])
	if err != nil {
		c.tb.Fatalf("restart member %d: %v", i, err)
	}
	c.mu.Lock()
	c.members[i] = m
	c.mu.Unlock()
	c.proxies[i].Heal()
}

// Close kills every member (a graceful stop would only slow tests down)
// and waits until they have closed.
func (c *Cluster) Close() {
	for i := range c.cfgs {
		c.Kill(i)
	}
	for i := range c.cfgs {
		c.waitClosed(i)
	}
}

// freeAddr returns 127.0.0.1:<port> with a port that was free a moment
// ago.
func freeAddr(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("free port: %v", err)
	}
	defer ln.Close()
	return "127.0.0.1:" + strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}

// ownGoroutines are the functions of the goroutines the control-plane
// packages start; each must be gone once its owner is closed.
var ownGoroutines = []string{
	"control/member.(*Cache).run",
	"control/member.(*Member).keepalive",
	"control/store.(*Embedded).monitor",
	"control/etcdtest.(*Proxy).accept",
	"control/etcdtest.(*Proxy).pipe",
}

// LeakedGoroutines returns the stacks of control-plane goroutines still
// running, waiting up to two seconds for them to end. Call it from
// TestMain after every test has run and cleaned up.
func LeakedGoroutines() []string {
	deadline := time.Now().Add(2 * time.Second)
	for {
		buf := make([]byte, 1<<20)
		for {
			n := runtime.Stack(buf, true)
			if n < len(buf) {
				buf = buf[:n]
				break
			}
			buf = make([]byte, 2*len(buf))
		}
		var leaked []string
		for _, g := range strings.Split(string(buf), "\n\n") {
			for _, f := range ownGoroutines {
				if strings.Contains(g, f) {
					leaked = append(leaked, g)
					break
				}
			}
		}
		if len(leaked) == 0 || time.Now().After(deadline) {
			return leaked
		}
		time.Sleep(50 * time.Millisecond)
	}
}
