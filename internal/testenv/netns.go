// SPDX-License-Identifier: Apache-2.0

package testenv

// Network namespaces for Cluster: named namespaces (ip netns add, so that
// they show in "ip netns list" and "ip netns exec NAME" reaches them while a
// test runs), a bridge in a "switch" namespace, and Go code run inside a
// namespace on a locked OS thread. Nothing here touches the root
// namespace's interfaces, addresses or routes: every link is created in
// the switch namespace and its peer moved straight into a host namespace.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/sys"
)

// netnsPrefix starts the name of every namespace a Cluster creates:
// vrdma-PID-RAND-ROLE, where PID is the test process (so that a sweep can
// tell a namespace left by a dead run from one of a live run).
const netnsPrefix = "vrdma-"

// netnsUsable reports whether this process can create network namespaces,
// and if not, why.
func netnsUsable() (bool, string) {
	if os.Geteuid() != 0 {
		return false, fmt.Sprintf("network namespaces need root (euid %d): run the test as root (CI does)", os.Geteuid())
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return false, "network namespaces need the ip command (iproute2), which is not in PATH: install iproute2"
	}
	return true, ""
}

// ipRun runs the ip command with args and returns an error that names the
// command and carries its output.
func ipRun(args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// netnsExists reports whether named namespace name exists.
func netnsExists(name string) bool {
	_, err := os.Stat(filepath.Join(sys.NetnsDir, name))
	return err == nil
}

// sweepStaleNetns deletes the namespaces that a cluster of a test process
// that is no longer running left behind (it was killed before its
// cleanup ran, by a test timeout for example). Namespaces of live
// processes are left alone.
func sweepStaleNetns() {
	ents, err := os.ReadDir(sys.NetnsDir)
	if err != nil {
		return
	}
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), netnsPrefix)
		if !ok {
			continue
		}
		pidText, _, ok := strings.Cut(rest, "-")
		if !ok {
			continue
		}
		pid, err := strconv.Atoi(pidText)
		if err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); err == nil || errors.Is(err, syscall.EPERM) {
			continue // alive
		}
		ipRun("netns", "delete", e.Name())
	}
}

// bridgeName is the bridge in the switch namespace.
const bridgeName = "br0"

// hostLink is the name of a host's interface inside its namespace.
const hostLink = "eth0"

// netnsNetwork is the namespaces of one cluster: the switch's, with a
// bridge, and one per host, each joined to the bridge by a veth pair.
type netnsNetwork struct {
	sw      string   // the switch namespace
	created []string // every namespace created, switch first
}

// newNetnsNetwork creates the switch namespace sw with its bridge; mtu is
// the bridge's MTU.
func newNetnsNetwork(sw string, mtu int) (*netnsNetwork, error) {
	n := &netnsNetwork{sw: sw}
	if err := ipRun("netns", "add", sw); err != nil {
		return n, fmt.Errorf("create the switch's network namespace: %w", err)
	}
	n.created = append(n.created, sw)
	for _, args := range [][]string{
		{"-n", sw, "link", "set", "lo", "up"},
		{"-n", sw, "link", "add", bridgeName, "mtu", strconv.Itoa(mtu), "type", "bridge"},
		{"-n", sw, "link", "set", bridgeName, "up"},
	} {
		if err := ipRun(args...); err != nil {
			return n, fmt.Errorf("set up the bridge in namespace %s: %w", sw, err)
		}
	}
	return n, nil
}

// addHost creates namespace ns with interface eth0 at addr/prefix, joined
// to the bridge through switch port port (a veth whose peer is eth0).
func (n *netnsNetwork) addHost(ns, port string, addr net.IP, prefix, mtu int) error {
	if err := ipRun("netns", "add", ns); err != nil {
		return fmt.Errorf("create a host's network namespace: %w", err)
	}
	n.created = append(n.created, ns)
	m := strconv.Itoa(mtu)
	for _, args := range [][]string{
		{"-n", ns, "link", "set", "lo", "up"},
		{"-n", n.sw, "link", "add", port, "mtu", m, "type", "veth", "peer", "name", hostLink, "mtu", m, "netns", ns},
		{"-n", n.sw, "link", "set", port, "master", bridgeName, "up"},
		{"-n", ns, "addr", "add", fmt.Sprintf("%s/%d", addr, prefix), "dev", hostLink},
		{"-n", ns, "link", "set", hostLink, "up"},
	} {
		if err := ipRun(args...); err != nil {
			return fmt.Errorf("join namespace %s to the switch: %w", ns, err)
		}
	}
	return nil
}

// close deletes every namespace of the network (a namespace goes away
// once the last process in it has exited) and returns what failed.
func (n *netnsNetwork) close() error {
	var errs []error
	for i := len(n.created) - 1; i >= 0; i-- {
		ns := n.created[i]
		if !netnsExists(ns) {
			continue
		}
		if err := ipRun("netns", "delete", ns); err != nil {
			errs = append(errs, err)
		}
	}
	n.created = nil
	return errors.Join(errs...)
}

// Netns is a network namespace of a test's own, with only its loopback
// interface, up: a "wire" that can be captured and configured (ethtool
// features) without touching the host's.
type Netns struct {
	Name string
}

// NewNetns creates a namespace for tb, removed at its cleanup; it skips
// tb when namespaces cannot be made here, and says why.
func NewNetns(tb testing.TB) *Netns {
	tb.Helper()
	if ok, why := netnsUsable(); !ok {
		tb.Skip(why)
	}
	sweepStaleNetns()
	n := &Netns{Name: netnsPrefix + clusterID() + "-own"}
	if err := ipRun("netns", "add", n.Name); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ipRun("netns", "delete", n.Name) })
	if err := ipRun("-n", n.Name, "link", "set", "lo", "up"); err != nil {
		tb.Fatal(err)
	}
	return n
}

// Run runs fn on a thread in the namespace: the sockets it creates belong
// to the namespace, whatever goroutine uses them later.
func (n *Netns) Run(fn func() error) error { return sys.InNetns(n.Name, fn) }

// Command is the command name args run in the namespace.
func (n *Netns) Command(name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", n.Name, name}, args...)...)
}
