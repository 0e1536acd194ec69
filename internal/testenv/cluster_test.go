// SPDX-License-Identifier: Apache-2.0

package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/control/pathsel"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
	"github.com/vrdma/vrdma/internal/sys"
)

// reach dials addr from h: nil when h reaches the address's host, whether
// something listens there (the handshake completes) or not (its stack
// answers with a reset: connection refused).
func reach(h *Host, addr string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c, err := h.Dial(ctx, "tcp", addr)
	if err == nil {
		c.Close()
		return nil
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		return nil
	}
	return err
}

// echoServer serves an echo service on h's PVRDMA IP address (another
// port than the agent's) in h's namespace until the test ends, and
// returns its address.
func echoServer(t *testing.T, h *Host) string {
	t.Helper()
	ln, err := h.Listen("tcp", netip.AddrPortFrom(h.Addr(), 0).String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

// echo sends a message from h to the echo service at addr and checks that
// it comes back, within timeout.
func echo(h *Host, addr string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c, err := h.Dial(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	msg := []byte("hello from " + h.Name)
	if _, err := c.Write(msg); err != nil {
		return fmt.Errorf("%s: write to %s: %w", h.Name, addr, err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		return fmt.Errorf("%s: read from %s: %w", h.Name, addr, err)
	}
	if !bytes.Equal(got, msg) {
		return fmt.Errorf("%s: %s echoed %q, want %q", h.Name, addr, got, msg)
	}
	return nil
}

func adapter0(t *testing.T, v *vrdma.VM) *vrdma.Adapter {
	t.Helper()
	ad, err := v.Adapter("vrdma0")
	if err != nil {
		t.Fatal(err)
	}
	return ad
}

func decide(t *testing.T, c *Cluster, a, b string) (pathsel.Decision, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return c.Decide(ctx, a, b)
}

// wantPath checks that the control plane decides path between a and b.
func wantPath(t *testing.T, c *Cluster, a, b string, path pathsel.Path) {
	t.Helper()
	d, err := decide(t, c, a, b)
	if err != nil || d.Path != path || d.Reason == "" {
		t.Errorf("path %s ↔ %s: %+v, %v; want %s with a reason", a, b, d, err, path)
	}
}

// sameNetns reports whether process pid is in named namespace ns.
func sameNetns(t *testing.T, pid int, ns string) bool {
	t.Helper()
	var p, n syscall.Stat_t
	if err := syscall.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &p); err != nil {
		t.Fatalf("namespace of pid %d: %v", pid, err)
	}
	if err := syscall.Stat(filepath.Join(sys.NetnsDir, ns), &n); err != nil {
		t.Fatalf("namespace %s: %v", ns, err)
	}
	return p.Dev == n.Dev && p.Ino == n.Ino
}

func processGone(pid int) bool {
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

func TestCluster(t *testing.T) {
	c := StartCluster(t, ClusterOptions{Hosts: 3})
	if ok, _ := netnsUsable(); ok && os.Getenv(NetnsEnv) != "off" && !c.Netns {
		t.Fatalf("as root the hosts must be in network namespaces: %s", c.NoNetnsReason)
	}
	a, b, hc := c.Hosts[0], c.Hosts[1], c.Hosts[2]

	t.Run("Registered", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// The records as the store holds them ("vrdmactl host list" reads
		// them through a cache of the same store).
		hosts, _, bad, err := store.List[records.Host](ctx, c.Store(), records.HostPrefix)
		if err != nil || len(bad) > 0 {
			t.Fatalf("list hosts: %v, bad records %v", err, bad)
		}
		if len(hosts) != len(c.Hosts) {
			t.Errorf("%d host records, want %d: %+v", len(hosts), len(c.Hosts), hosts)
		}
		byID := map[string]records.Host{}
		for _, it := range hosts {
			byID[it.Value.ID] = it.Value
		}
		addrs := map[netip.AddrPort]string{}
		for _, h := range c.Hosts {
			if len(h.ID()) != 32 {
				t.Errorf("%s: host ID %q", h.Name, h.ID())
			}
			if o, dup := addrs[h.PVRDMAAddress]; dup {
				t.Errorf("%s and %s share PVRDMA address %s", o, h.Name, h.PVRDMAAddress)
			}
			addrs[h.PVRDMAAddress] = h.Name
			r, ok := byID[h.ID()]
			if !ok {
				t.Errorf("%s (%s): no host record", h.Name, h.ID())
				continue
			}
			if r.Name != h.Name || r.PVRDMAAddress != h.PVRDMAAddress || r.Switch != c.Switch.Name || !r.FirewallPVRDMA || len(r.Uplinks) != 0 {
				t.Errorf("%s: record %+v; want name %s, PVRDMA address %s, switch %s, firewall on, no RDMA uplink",
					h.Name, r, h.Name, h.PVRDMAAddress, c.Switch.Name)
			}
			hs, err := c.HostStatus(ctx, h)
			if err != nil || hs.Host.State != records.HostUp || hs.Alive == nil {
				t.Errorf("%s: status %+v, %v; want up with a lease", h.Name, hs, err)
			}
			if c.Netns {
				if !ClusterSubnet.Contains(h.Addr()) {
					t.Errorf("%s: PVRDMA address %s is not in %s", h.Name, h.PVRDMAAddress, ClusterSubnet)
				}
			} else if !h.Addr().IsLoopback() {
				t.Errorf("%s: PVRDMA address %s is not a loopback address", h.Name, h.PVRDMAAddress)
			}
		}
		if n := len(c.Cache().Hosts()); n != len(c.Hosts) {
			t.Errorf("the cache holds %d hosts, want %d", n, len(c.Hosts))
		}
		if !c.Netns {
			return
		}
		// Each agent runs in its host's namespace, which holds the
		// address; the root namespace holds none of the cluster's.
		for _, h := range c.Hosts {
			if !sameNetns(t, h.Pid(), h.Netns) {
				t.Errorf("%s: vrdmad (pid %d) is not in namespace %s", h.Name, h.Pid(), h.Netns)
			}
			out, err := h.Exec("ip", "-o", "-4", "addr", "show", "dev", h.Link)
			if err != nil || !strings.Contains(out, h.Addr().String()+"/24") {
				t.Errorf("%s: ip addr in %s: %v\n%s", h.Name, h.Netns, err, out)
			}
		}
		ifaddrs, err := net.InterfaceAddrs()
		if err != nil {
			t.Fatal(err)
		}
		for _, ia := range ifaddrs {
			if p, err := netip.ParsePrefix(ia.String()); err == nil && ClusterSubnet.Contains(p.Addr()) {
				t.Errorf("the root namespace has address %s of the cluster's subnet", ia)
			}
		}
	})

	t.Run("PathIsTCP", func(t *testing.T) {
		vm1 := a.Open(t, "vm1", VMOptions{})
		vm2 := b.Open(t, "vm2", VMOptions{})
		a.Open(t, "vm3", VMOptions{})
		if vm1.Host() != a.Name || vm2.Host() != b.Name {
			t.Errorf("vm1 on %q, vm2 on %q; want %s and %s", vm1.Host(), vm2.Host(), a.Name, b.Name)
		}
		wantPath(t, c, "vm1/vrdma0", "vm2/vrdma0", pathsel.TCP)
		wantPath(t, c, "vm2/vrdma0", "vm1/vrdma0", pathsel.TCP)
		wantPath(t, c, "vm1/vrdma0", adapter0(t, vm2).GID().String(), pathsel.TCP)
		wantPath(t, c, "vm1/vrdma0", "vm3/vrdma0", pathsel.Memcpy)
	})

	t.Run("Connectivity", func(t *testing.T) {
		servers := map[*Host]string{}
		for _, h := range c.Hosts {
			servers[h] = echoServer(t, h)
		}
		for _, from := range c.Hosts {
			for _, to := range c.Hosts {
				if from == to {
					continue
				}
				// The agent's PVRDMA address: reached (refused until the
				// agent listens on it).
				if err := reach(from, to.PVRDMAAddress.String(), 5*time.Second); err != nil {
					t.Errorf("%s → %s's PVRDMA address: %v", from.Name, to.Name, err)
				}
				if err := echo(from, servers[to], 5*time.Second); err != nil {
					t.Errorf("%s → %s: %v", from.Name, to.Name, err)
				}
			}
		}
	})

	t.Run("LinkDownUp", func(t *testing.T) {
		if !c.Netns {
			t.Skipf("link faults need the hosts in network namespaces: %s", c.NoNetnsReason)
		}
		toB, toC := echoServer(t, b), echoServer(t, hc)
		b.LinkDown(t)
		if err := echo(a, toB, 500*time.Millisecond); err == nil {
			t.Errorf("%s → %s with %s's link down: reached", a.Name, b.Name, b.Name)
		} else if errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("%s → %s with %s's link down: %v (a reset came back: the link is not cut)", a.Name, b.Name, b.Name, err)
		} else {
			t.Logf("%s → %s, link down: %v", a.Name, b.Name, err)
		}
		if err := reach(b, a.PVRDMAAddress.String(), 500*time.Millisecond); err == nil {
			t.Errorf("%s → %s with %s's link down: reached", b.Name, a.Name, b.Name)
		}
		if err := echo(a, toC, 5*time.Second); err != nil {
			t.Errorf("%s → %s with %s's link down: %v", a.Name, hc.Name, b.Name, err)
		}
		b.LinkUp(t)
		t0 := time.Now()
		for {
			err := echo(a, toB, time.Second)
			if err == nil {
				break
			}
			if time.Since(t0) > 10*time.Second {
				t.Fatalf("%s → %s after link up: %v", a.Name, b.Name, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Logf("%s → %s restored %v after link up", a.Name, b.Name, time.Since(t0).Round(time.Millisecond))
		if err := reach(b, a.PVRDMAAddress.String(), 5*time.Second); err != nil {
			t.Errorf("%s → %s after link up: %v", b.Name, a.Name, err)
		}
	})

	t.Run("KillRestart", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		a.Open(t, "vm5", VMOptions{})
		hc.Open(t, "vm6", VMOptions{})
		wantPath(t, c, "vm5/vrdma0", "vm6/vrdma0", pathsel.TCP)
		before, err := c.HostStatus(ctx, hc)
		if err != nil || before.Alive == nil {
			t.Fatalf("%s: %+v, %v", hc.Name, before, err)
		}
		id, pid := hc.ID(), hc.Pid()

		hc.Kill()
		if hc.Running() || !processGone(pid) {
			t.Fatalf("%s: vrdmad (pid %d) still runs after Kill", hc.Name, pid)
		}
		if _, err := vrdma.DialAgent(ctx, vrdma.WithSocket(hc.Socket)); err == nil {
			t.Errorf("%s: the agent answers after Kill", hc.Name)
		}
		hc.ExpireLease(t)
		c.WaitHost(t, hc, records.HostDown, 5*time.Second)
		if _, err := decide(t, c, "vm5/vrdma0", "vm6/vrdma0"); !errors.Is(err, pathsel.ErrHostDown) {
			t.Errorf("path to a VM of a killed host: %v, want %v", err, pathsel.ErrHostDown)
		}

		t0 := time.Now()
		hc.Restart(t)
		t.Logf("restart after Kill and ExpireLease: %v", time.Since(t0).Round(time.Millisecond))
		if hc.ID() != id || hc.Pid() == pid || !hc.Running() {
			t.Errorf("%s after restart: host ID %s (was %s), pid %d (was %d), running %v", hc.Name, hc.ID(), id, hc.Pid(), pid, hc.Running())
		}
		after := c.WaitHost(t, hc, records.HostUp, 5*time.Second)
		if after.Alive == nil || after.Alive.Lease == before.Alive.Lease {
			t.Errorf("%s after restart: lease %+v, want a new one (was %x)", hc.Name, after.Alive, before.Alive.Lease)
		}
		// The restarted agent removed the VM its previous run left.
		for deadline := time.Now().Add(5 * time.Second); ; {
			_, err := decide(t, c, "vm5/vrdma0", "vm6/vrdma0")
			if errors.Is(err, store.ErrNotFound) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("vm6 of the killed agent is still in the control plane: %v", err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		hc.Open(t, "vm7", VMOptions{})
		wantPath(t, c, "vm5/vrdma0", "vm7/vrdma0", pathsel.TCP)

		// A graceful stop leaves the control plane at once.
		t0 = time.Now()
		hc.Stop(t)
		c.WaitHost(t, hc, records.HostDown, 3*time.Second)
		hc.Restart(t)
		c.WaitHost(t, hc, records.HostUp, 5*time.Second)
		t.Logf("stop and restart: %v", time.Since(t0).Round(time.Millisecond))
		if strings.Count(hc.Stderr(), "restarted at") != 2 {
			t.Errorf("%s's stderr does not mark its 2 restarts:\n%s", hc.Name, hc.Stderr())
		}
	})
}

// TestClusterLoopback runs a cluster on loopback addresses, as a test
// does when not root.
func TestClusterLoopback(t *testing.T) {
	c := StartCluster(t, ClusterOptions{Hosts: 2, Netns: NetnsOff})
	a, b := c.Hosts[0], c.Hosts[1]
	aa, ba := a.Addr().As4(), b.Addr().As4()
	if c.Netns || a.Netns != "" || aa[0] != 127 || aa[1] < 64 || aa[3] != 2 || ba != [4]byte{127, aa[1], aa[2], 3} {
		t.Fatalf("hosts at %s (%q) and %s (%q); want 127.X.Y.2 and 127.X.Y.3 (X ≥ 64: the cluster's own) without namespaces", a.PVRDMAAddress, a.Netns, b.PVRDMAAddress, b.Netns)
	}
	if c2 := StartCluster(t, ClusterOptions{Hosts: 1, Netns: NetnsOff}); c2.Hosts[0].Addr() == a.Addr() {
		t.Fatalf("a second cluster's host is at %s too", a.Addr())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, h := range c.Hosts {
		hs, err := c.HostStatus(ctx, h)
		if err != nil || hs.Host.State != records.HostUp || hs.Host.PVRDMAAddress != h.PVRDMAAddress {
			t.Errorf("%s: %+v, %v", h.Name, hs, err)
		}
	}
	a.Open(t, "vm1", VMOptions{})
	b.Open(t, "vm2", VMOptions{})
	wantPath(t, c, "vm1/vrdma0", "vm2/vrdma0", pathsel.TCP)
	if err := reach(a, b.PVRDMAAddress.String(), 5*time.Second); err != nil {
		t.Errorf("%s → %s's PVRDMA address: %v", a.Name, b.Name, err)
	}
	if err := echo(b, echoServer(t, a), 5*time.Second); err != nil {
		t.Error(err)
	}
	if out, err := a.Exec("true"); err != nil {
		t.Errorf("Exec: %v: %s", err, out)
	}
	// LinkDown skips a test whose hosts are not in namespaces.
	stb := &skipTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.LinkDown(stb)
		t.Error("LinkDown on a loopback host did not skip the test")
	}()
	<-done
	if !strings.Contains(stb.skipped, "network namespaces") {
		t.Errorf("LinkDown on a loopback host: skip message %q does not say it needs network namespaces", stb.skipped)
	}
}

// skipTB records a skip and ends the goroutine, as testing.T's Skipf ends
// the test.
type skipTB struct {
	testing.TB
	skipped string
}

func (s *skipTB) Skipf(format string, args ...any) {
	s.skipped = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// failingTB is a test that has failed, whose cleanups run when the test
// says so.
type failingTB struct {
	testing.TB
	cleanups []func()
	logs     []string
}

func (f *failingTB) Cleanup(fn func()) { f.cleanups = append(f.cleanups, fn) }
func (f *failingTB) Failed() bool      { return true }
func (f *failingTB) Logf(format string, args ...any) {
	f.logs = append(f.logs, fmt.Sprintf(format, args...))
}

func (f *failingTB) runCleanups() {
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
	f.cleanups = nil
}

// TestClusterCleanup checks that a failed test's cleanup leaves nothing
// behind: no agent, no namespace, no directory; and logs the agents'
// stderr.
func TestClusterCleanup(t *testing.T) {
	ftb := &failingTB{TB: t}
	defer ftb.runCleanups() // if the test stops early
	c := StartCluster(ftb, ClusterOptions{Hosts: 2})
	c.Hosts[0].Open(ftb, "vm1", VMOptions{})
	var pids []int
	var spaces []string
	for _, h := range c.Hosts {
		pids = append(pids, h.Pid())
		if h.Netns != "" {
			spaces = append(spaces, h.Netns)
		}
	}
	if c.Netns {
		spaces = append(spaces, c.SwitchNetns())
		for _, ns := range spaces {
			if !netnsExists(ns) {
				t.Fatalf("namespace %s does not exist while the cluster runs", ns)
			}
		}
		// A process started in a namespace is no obstacle to deleting it.
		if out, err := c.Hosts[1].Exec("ip", "link", "show", c.Hosts[1].Link); err != nil {
			t.Errorf("Exec: %v\n%s", err, out)
		}
	}
	dir := c.dir
	t0 := time.Now()
	ftb.runCleanups()
	t.Logf("cleanup: %v", time.Since(t0).Round(time.Millisecond))
	for i, pid := range pids {
		if !processGone(pid) {
			t.Errorf("%s's vrdmad (pid %d) still runs after cleanup", c.Hosts[i].Name, pid)
		}
	}
	for _, ns := range spaces {
		if netnsExists(ns) {
			t.Errorf("namespace %s still exists after cleanup", ns)
		}
	}
	if ents, _ := os.ReadDir(sys.NetnsDir); c.Netns {
		for _, e := range ents {
			if strings.Contains(e.Name(), c.ID) {
				t.Errorf("namespace %s of the cluster still exists after cleanup", e.Name())
			}
		}
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the cluster's directory %s: %v, want it gone", dir, err)
	}
	logged := strings.Join(ftb.logs, "\n")
	for _, h := range c.Hosts {
		if !strings.Contains(logged, h.Name+" (pid") || !strings.Contains(logged, "vrdmad serving") {
			t.Errorf("a failed test's cleanup did not log %s's stderr:\n%s", h.Name, logged)
		}
	}
}
