package verbsabi

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/testenv"
)

// syncBuffer is a bytes.Buffer a program writes while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// mckeyGroup is the group the mckey tests join.
const mckeyGroup = "239.77.0.9"

// TestRDMACMMckey runs rdmacm-utils' mckey, unmodified, over memcpy, tcp
// and rdma (RoCE v2, and RoCE v1 frames): a receiver on vmA joins the multicast group (rdma_resolve_addr
// to the group, rdma_join_multicast, MULTICAST_JOIN with the group's
// address handle attributes, QPN 0xFFFFFF and Q_Key), then a sender on
// vmB (hostB on tcp and rdma) joins it and sends 20 datagrams to the
// group, which the receiver must all receive; both end with status 0.
func TestRDMACMMckey(t *testing.T) {
	lib := BuildRDMACM(t)
	NeedProgram(t, "/usr/bin/mckey", "rdmacm-utils")
	for _, name := range []string{"memcpy", "tcp", "rdma", "rdma-v1"} {
		t.Run(name, func(t *testing.T) {
			e := mckeyEnv(t, name)
			path := e.path
			before := uint64(0)
			if path != "memcpy" {
				before = uplinkBytesMoved(t, e.sockA, path, "")
			}
			rcv, snd := runMckey(t, lib, cmSide{e.sockA, "vmA", "/usr/bin/mckey", []string{"-m", mckeyGroup, "-b", cmAddrA, "-C", "20", "-S", "100"}},
				cmSide{e.sockB, "vmB", "/usr/bin/mckey", []string{"-m", mckeyGroup, "-b", cmAddrB, "-s", "-C", "20", "-S", "100"}})
			for side, out := range map[string]string{"receiver": rcv, "sender": snd} {
				for _, want := range []string{"mckey: joined dgid: ::ffff:" + mckeyGroup, "data transfers complete", "test complete", "return status 0"} {
					if !strings.Contains(out, want) {
						t.Errorf("%s: no %q:\n%s", side, want, out)
					}
				}
			}
			if path != "memcpy" {
				if moved := uplinkBytesMoved(t, e.sockA, path, "") - before; moved < 20*100 {
					t.Errorf("hostA's %s uplinks moved %d bytes: the datagrams did not take the %s path", path, moved, path)
				}
			}
		})
	}
}

// mckeyEnv is startCMEnv, but the rdma path's hosts are in network
// namespaces of their own, joined by a bridge, as hosts on a network
// are: a group's socket binds the group's address on UDP port 4791,
// which Linux refuses while another socket of the namespace holds the
// port without SO_REUSEADDR (other tests' engines, in the test
// process's namespace).
func mckeyEnv(t *testing.T, name string) cmEnv {
	if name != "rdma" && name != "rdma-v1" {
		return startCMEnv(t, name)
	}
	v := records.RoCEv2
	if name == "rdma-v1" {
		v = records.RoCEv1
	}
	c := testenv.StartCluster(t, testenv.ClusterOptions{Hosts: 2, Netns: testenv.NetnsOn, RDMA: true, RoCEVersion: v})
	c.Hosts[0].Define(t, "vmA", testenv.VMOptions{MemMB: 32, IPv4: []string{cmAddrA}})
	c.Hosts[1].Define(t, "vmB", testenv.VMOptions{MemMB: 32, IPv4: []string{cmAddrB}})
	return cmEnv{"rdma", c.Hosts[0].Socket, c.Hosts[1].Socket}
}

// runMckey starts mckey's receiver, waits until it has joined, runs the
// sender, and returns both outputs once the receiver has ended.
func runMckey(t *testing.T, lib string, rcv, snd cmSide) (string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Line-buffered, so that the test sees "receiving data transfers",
	// printed once the receiver has joined, while it waits.
	r := exec.CommandContext(ctx, "stdbuf", append([]string{"-oL", rcv.prog}, rcv.args...)...)
	r.Env = Env(lib, rcv.socket, rcv.vm)
	var rout syncBuffer
	r.Stdout, r.Stderr = &rout, &rout
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Wait() }()
	for !strings.Contains(rout.String(), "receiving data transfers") {
		select {
		case err := <-done:
			t.Fatalf("mckey's receiver ended before it joined: %v\n%s", err, rout.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	s := exec.CommandContext(ctx, snd.prog, snd.args...)
	s.Env = Env(lib, snd.socket, snd.vm)
	out, err := s.CombinedOutput()
	if err != nil {
		t.Errorf("mckey's sender: %v\n%s", err, out)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("mckey's receiver: %v", err)
		}
	case <-time.After(20 * time.Second):
		r.Process.Kill()
		t.Errorf("mckey's receiver still waiting 20 s after the sender ended (%v)", <-done)
	}
	t.Logf("receiver:\n%s\nsender:\n%s", rout.String(), out)
	return rout.String(), string(out)
}

// TestMcastVerbs runs guest/ibverbs/tests/mcast_check.c on one host
// (memcpy), for an IPv4 group in its RoCE v2 form and an IPv6 one:
// ibv_attach_mcast and ibv_detach_mcast with their refusals (a unicast
// GID, an RC QP, a QP not attached), the device's multicast limits, a
// group's datagram reaching its members only (with QPN 0xFFFFFF), a
// detached QP no longer receiving, the sender receiving its own datagram
// only while attached, and a destroyed QP leaving its group.
func TestMcastVerbs(t *testing.T) {
	lib := Build(t)
	env := testenv.Start(t)
	env.Define(t, "vm1", testenv.VMOptions{MemMB: 8})
	for _, group := range []string{"::ffff:239.1.2.3", "ff0e::7:1"} {
		t.Run(group, func(t *testing.T) {
			out, _ := runCSource(t, lib, env.Socket, "vm1", filepath.Join(SourceDir(), "tests", "mcast_check.c"),
				[]string{"libibverbs.so.1"}, group)
			if n := strings.Count(out, "ok "); n < 17 {
				t.Errorf("only %d checks ran:\n%s", n, out)
			}
		})
	}
}

// TestMckeyCrossPortGroup runs mckey's receivers on vmA (hostA) and on
// vmC (hostB, a port group of another VLAN), then its sender on vmB
// (hostB, vmA's port group), over tcp: vmA receives every datagram, and
// vmC, though on the sender's host and joined to the same group, none —
// nothing crosses port groups.
func TestMckeyCrossPortGroup(t *testing.T) {
	lib := BuildRDMACM(t)
	NeedProgram(t, "/usr/bin/mckey", "rdmacm-utils")
	c := testenv.StartCluster(t, testenv.ClusterOptions{Hosts: 2, Netns: testenv.NetnsOff})
	pg := records.PortGroup{Name: "other-vlan", Key: "dvportgroup-20", Switch: c.Switch.Name, VLAN: 20,
		PFCPriority: 3, DSCP: 26, RoCEVersion: records.RoCEv2}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := c.Store().Create(ctx, records.PortGroupKey(pg.Key), pg); err != nil {
		t.Fatal(err)
	}
	a, b := c.Hosts[0], c.Hosts[1]
	a.Define(t, "vmA", testenv.VMOptions{MemMB: 32, IPv4: []string{cmAddrA}})
	b.Define(t, "vmB", testenv.VMOptions{MemMB: 32, IPv4: []string{cmAddrB}})
	b.DefineVMX(t, "vmC", testenv.VMXOn(testenv.VMOptions{MemMB: 32, IPv4: []string{"10.77.0.3"}}, c.Switch.UUID, pg.Key))
	other := exec.CommandContext(ctx, "stdbuf", "-oL", "/usr/bin/mckey", "-m", mckeyGroup, "-b", "10.77.0.3", "-C", "5", "-S", "100")
	other.Env = Env(lib, b.Socket, "vmC")
	var oout syncBuffer
	other.Stdout, other.Stderr = &oout, &oout
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- other.Wait() }()
	for !strings.Contains(oout.String(), "receiving data transfers") {
		select {
		case err := <-done:
			t.Fatalf("vmC's mckey ended before it joined: %v\n%s", err, oout.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	rcv, _ := runMckey(t, lib, cmSide{a.Socket, "vmA", "/usr/bin/mckey", []string{"-m", mckeyGroup, "-b", cmAddrA, "-C", "5", "-S", "100"}},
		cmSide{b.Socket, "vmB", "/usr/bin/mckey", []string{"-m", mckeyGroup, "-b", cmAddrB, "-s", "-C", "5", "-S", "100"}})
	if !strings.Contains(rcv, "data transfers complete") {
		t.Errorf("vmA, on the sender's port group, did not receive:\n%s", rcv)
	}
	select {
	case err := <-done:
		t.Errorf("vmC's mckey, on another port group, ended (%v): it received the group's datagrams:\n%s", err, oout.String())
	case <-time.After(2 * time.Second):
		other.Process.Kill()
		<-done
	}
	if strings.Contains(oout.String(), "data transfers complete") {
		t.Errorf("vmC received the datagrams of another port group's group:\n%s", oout.String())
	}
}
