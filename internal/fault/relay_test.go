// SPDX-License-Identifier: Apache-2.0

package fault

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/internal/sys"
)

// relayNet is two namespaces, a and b, each with eth0 on a bridge in a
// third, sw, through ports pa and pb.
type relayNet struct{ sw, a, b string }

func newRelayNet(t *testing.T) relayNet {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the relay needs network namespaces and AF_PACKET: run as root (CI does)")
	}
	for _, tool := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("the relay test needs %s (iproute2, nftables): %v", tool, err)
		}
	}
	pre := fmt.Sprintf("vrdma-%d-%x-", os.Getpid(), rand.Uint32())
	n := relayNet{sw: pre + "sw", a: pre + "a", b: pre + "b"}
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	for _, ns := range []string{n.sw, n.a, n.b} {
		run("netns", "add", ns)
		t.Cleanup(func() { exec.Command("ip", "netns", "delete", ns).Run() })
	}
	run("-n", n.sw, "link", "add", "br0", "type", "bridge")
	run("-n", n.sw, "link", "set", "br0", "up")
	for i, h := range []string{n.a, n.b} {
		port := []string{"pa", "pb"}[i]
		run("-n", n.sw, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", h)
		run("-n", n.sw, "link", "set", port, "master", "br0", "up")
		run("-n", h, "addr", "add", fmt.Sprintf("10.99.0.%d/24", i+1), "dev", "eth0")
		run("-n", h, "link", "set", "eth0", "up")
	}
	return n
}

// udpIn opens a UDP socket on addr in namespace ns ("" for this one).
func udpIn(t *testing.T, ns, addr string) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	open := func() error {
		a, err := net.ResolveUDPAddr("udp4", addr)
		if err != nil {
			return err
		}
		if c, err = net.ListenUDP("udp4", a); err != nil {
			return err
		}
		// Room for every datagram of a stream, so that none is lost
		// while this process's reader waits for a core.
		rc, err := c.SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 16<<20)
		}); err != nil {
			return err
		}
		return serr
	}
	err := open()
	if ns != "" {
		err = sys.InNetns(ns, open)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// stream sends n numbered datagrams from a to b, paced so that none is
// lost in a socket buffer, and returns how many arrived, how many twice,
// and how many arrived after one numbered higher.
func stream(t *testing.T, a, b *net.UDPConn, first, n int) (got, twice, late int) {
	t.Helper()
	to := b.LocalAddr().(*net.UDPAddr)
	seen := map[int]bool{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 64)
		high := -1
		for {
			b.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
			k, _, err := b.ReadFromUDP(buf)
			if err != nil {
				return
			}
			if k != 8 {
				continue
			}
			v := int(binary.BigEndian.Uint64(buf))
			if seen[v] {
				twice++
				continue
			}
			seen[v] = true
			if v < high {
				late++
			}
			high = max(high, v)
		}
	}()
	msg := make([]byte, 8)
	for i := first; i < first+n; i++ {
		binary.BigEndian.PutUint64(msg, uint64(i))
		if _, err := a.WriteToUDP(msg, to); err != nil {
			t.Fatal(err)
		}
		if i%16 == 0 {
			time.Sleep(100 * time.Microsecond)
		}
	}
	<-done
	return len(seen), twice, late
}

// waitLink sends single datagrams from a to b until one arrives, then
// drains b. A veth that was just set up drops what it is given until
// the kernel's link watcher activates it, up to a second later, and an
// ARP request lost then is sent again only after another second: the
// relay test's own streams, which give up after 300 ms of silence, must
// start on a link that already works.
func waitLink(t *testing.T, a, b *net.UDPConn) {
	t.Helper()
	to := b.LocalAddr().(*net.UDPAddr)
	msg := make([]byte, 8)
	buf := make([]byte, 64)
	deadline := time.Now().Add(10 * time.Second)
	for i := uint64(1 << 40); ; i++ {
		binary.BigEndian.PutUint64(msg, i)
		if _, err := a.WriteToUDP(msg, to); err != nil {
			t.Fatal(err)
		}
		b.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		if _, _, err := b.ReadFromUDP(buf); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no datagram from %s reached %s in 10 s: the link never came up", a.LocalAddr(), to)
		}
	}
	for {
		b.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		if _, _, err := b.ReadFromUDP(buf); err != nil {
			return
		}
	}
}

// TestRelay checks what the relay promises, between namespaces and on
// lo: every frame goes through once, a share of them out of order by
// reordering or by delay, the counters count them, and after Remove the
// link carries the frames again.
func TestRelay(t *testing.T) {
	n := newRelayNet(t)
	t.Run("netns", func(t *testing.T) {
		a := udpIn(t, n.a, "10.99.0.1:7000")
		b := udpIn(t, n.b, "10.99.0.2:7000")
		testRelay(t, a, b, func(q Queueing) (*Relay, error) {
			return StartRelay(t.Context(), n.sw, []string{"pa", "pb"}, q)
		})
	})
	t.Run("loopback", func(t *testing.T) {
		// Addresses of lo no other test uses, so that the relay on this
		// namespace's lo strikes nothing else.
		x := byte(rand.IntN(200) + 20)
		aa, ba := netip.AddrFrom4([4]byte{127, 99, x, 1}), netip.AddrFrom4([4]byte{127, 99, x, 2})
		a := udpIn(t, "", netip.AddrPortFrom(aa, 7000).String())
		b := udpIn(t, "", netip.AddrPortFrom(ba, 7000).String())
		// A bystander between a and another address: the relay must
		// leave it alone.
		c := udpIn(t, "", netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 99, x, 3}), 7000).String())
		testRelay(t, a, b, func(q Queueing) (*Relay, error) {
			r, err := StartLoopbackRelay(t.Context(), aa, ba, q)
			if err == nil {
				before := r.Forwarded.Load()
				if got, twice, _ := stream(t, a, c, 50000, 200); got != 200 || twice != 0 {
					t.Errorf("between %s and a bystander %d of 200 datagrams arrived, %d twice", aa, got, twice)
				}
				if k := r.Forwarded.Load() - before; k != 0 {
					t.Errorf("the relay between %s and %s carried %d frames to a bystander", aa, ba, k)
				}
			}
			return r, err
		})
	})
}

// testRelay streams datagrams from a to b under relays start starts, one
// reordering and one delaying.
func testRelay(t *testing.T, a, b *net.UDPConn, start func(Queueing) (*Relay, error)) {
	waitLink(t, a, b)
	// Neighbours resolved first, before any relay.
	if got, _, _ := stream(t, a, b, 0, 10); got != 10 {
		t.Fatalf("the link alone delivered %d of 10 datagrams", got)
	}
	const count = 3000
	for _, tc := range []struct {
		name string
		q    Queueing
	}{
		{"reorder", Queueing{Reorder: 0.05, Seed: 1}},
		{"delay", Queueing{Delay: 0.05, DelayBy: 3 * time.Millisecond, Seed: 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := start(tc.q)
			if err != nil {
				t.Fatal(err)
			}
			got, twice, late := stream(t, a, b, 1000, count)
			ro, d := r.Reordered.Load(), r.Delayed.Load()
			fwd, refused := r.Forwarded.Load(), r.SendErrors.Load()
			if err := r.Remove(t.Context()); err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %d of %d arrived, %d twice, %d late; relay: %d forwarded, %d reordered, %d delayed, %d refused",
				tc.q, got, count, twice, late, fwd, ro, d, refused)
			if got != count || twice != 0 || refused != 0 {
				t.Errorf("the relay lost or doubled frames: %d of %d arrived, %d twice, %d refused where sent", got, count, twice, refused)
			}
			struck := ro + d
			if struck < count/50 || struck > count/10 {
				t.Errorf("%d frames reordered or delayed, want about 5%% of %d", struck, count)
			}
			if late == 0 {
				t.Errorf("no datagram arrived out of order with %d frames reordered or delayed", struck)
			}
			if got, _, _ := stream(t, a, b, 10000, 100); got != 100 {
				t.Errorf("after Remove the link delivered %d of 100 datagrams", got)
			}
		})
	}
}

// TestRelayRefusesBadFaults checks the relay's argument checks.
func TestRelayRefusesBadFaults(t *testing.T) {
	for _, tc := range []struct {
		q     Queueing
		ports []string
		want  string
	}{
		{Queueing{Reorder: 1.5}, []string{"a", "b"}, "each must be in [0, 1]"},
		{Queueing{Reorder: 0.6, Delay: 0.6}, []string{"a", "b"}, "their sum too"},
		{Queueing{Delay: -0.1}, []string{"a", "b"}, "each must be in [0, 1]"},
		{Queueing{Reorder: 0.1}, []string{"a"}, "exactly two ports"},
	} {
		if _, err := StartLoopbackRelay(t.Context(), netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("10.0.0.1"), Queueing{}); err == nil ||
			!strings.Contains(err.Error(), "IPv4 loopback addresses") {
			t.Errorf("StartLoopbackRelay to 10.0.0.1 = %v, want a refusal", err)
		}
		_, err := StartRelay(t.Context(), "unused", tc.ports, tc.q)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("StartRelay(%s, %v) = %v, want an error saying %q", tc.q, tc.ports, err, tc.want)
		}
	}
}
