// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/control/admin"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
)

// Several hosts on one machine: quickstart and perf --local --path tcp
// start host agents on loopback addresses (127.0.0.2, 127.0.0.3, ...: every
// 127/8 address is the loopback interface's on Linux, no root needed), the
// first with its embedded control plane (etcd), the others joined to it,
// all on one distributed switch with one port group. Each listens for the
// tcp path on its own address (--pvrdma-address, --firewall-pvrdma). A
// host with RDMA runs a software RoCEv2 uplink on the same address (UDP
// 4791, --rdma-uplink), declared lossless (the loopback reports no DCB,
// and the network checks would keep the pair on tcp: docs/network.md):
// two such hosts get the rdma path, others the tcp path.

// localHostSpec is one host to start.
type localHostSpec struct {
	Name string         // --host
	Addr netip.AddrPort // --pvrdma-address; port 0: a port free on Addr's IP
	RDMA bool           // a software RoCEv2 uplink on Addr's IP, UDP 4791
}

// localHost is a started host: its agent process and where it listens.
type localHost struct {
	*localAgent
	Name string
	Addr netip.AddrPort // its PVRDMA address: the tcp path's listener
	RDMA bool           // it has a software RoCEv2 uplink on Addr's IP
}

// localFabric is the hosts of one local control plane.
type localFabric struct {
	Hosts     []*localHost // the first runs the embedded etcd
	Endpoint  string       // the etcd's client URL
	Switch    string
	PortGroup string
}

// localSubnet is the subnet of a local fabric's port group: the control
// plane gives each adapter on it an address there, which rdma_cm resolves
// (rping -a, ib_write_bw -R). It exists only inside vrdma: no interface
// of the machine has it.
const localSubnet = "10.77.0.0/24"

// defaultLocalHostAddrs are the loopback addresses of the local hosts,
// the first host first.
var defaultLocalHostAddrs = []netip.Addr{netip.AddrFrom4([4]byte{127, 0, 0, 2}), netip.AddrFrom4([4]byte{127, 0, 0, 3})}

// parseHostAddr parses IP or IP:PORT (port 0 when none is given).
func parseHostAddr(s string) (netip.AddrPort, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap, nil
	}
	ip, err := netip.ParseAddr(s)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("%q: want IP or IP:PORT", s)
	}
	return netip.AddrPortFrom(ip, 0), nil
}

// freeHostPort returns a TCP port of ip that was free a moment ago.
func freeHostPort(ip netip.Addr) (uint16, error) {
	ln, err := net.Listen("tcp", netip.AddrPortFrom(ip, 0).String())
	if err != nil {
		hint := " (an address of this machine, such as 127.0.0.2)"
		if ip.IsLoopback() {
			hint = " (on Linux every 127.0.0.0/8 address belongs to the loopback interface: is it up?)"
		}
		return 0, fmt.Errorf("cannot listen on %s: %w%s", ip, err, hint)
	}
	defer ln.Close()
	return uint16(ln.Addr().(*net.TCPAddr).Port), nil
}

// startLocalHost starts host s's agent with temporary state on switch sw:
// with the embedded etcd when endpoint is "", else joined to the etcd at
// endpoint.
func startLocalHost(ctx context.Context, s localHostSpec, sw, endpoint string) (*localHost, error) {
	if s.Addr.Port() == 0 {
		p, err := freeHostPort(s.Addr.Addr())
		if err != nil {
			return nil, fmt.Errorf("host %s: %w", s.Name, err)
		}
		s.Addr = netip.AddrPortFrom(s.Addr.Addr(), p)
	}
	args := []string{"--host", s.Name, "--switch", sw, "--pvrdma-address", s.Addr.String(), "--firewall-pvrdma"}
	if endpoint != "" {
		args = append(args, "--etcd-endpoints", endpoint)
	}
	if s.RDMA {
		args = append(args, "--rdma-uplink", "rocev2-soft/"+s.Addr.Addr().String(), "--rdma-uplink-lossless", "3")
	}
	ag, err := startLocalAgent(ctx, args...)
	if err != nil {
		return nil, fmt.Errorf("host %s (%s): %w", s.Name, s.Addr, err)
	}
	return &localHost{localAgent: ag, Name: s.Name, Addr: s.Addr, RDMA: s.RDMA}, nil
}

// etcdEndpoint returns the client URL of the host's embedded etcd.
func (h *localHost) etcdEndpoint() (string, error) {
	url, err := store.ReadEndpointFile(filepath.Join(h.Dir, "state", "etcd"))
	if err != nil {
		return "", fmt.Errorf("host %s's control plane: %w", h.Name, err)
	}
	return url, nil
}

// createLocalFabric creates switch sw and port group pg on it in the etcd
// at endpoint.
func createLocalFabric(ctx context.Context, endpoint, sw, pg string) error {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	st, err := store.Open(ctx, store.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		return fmt.Errorf("the control plane at %s: %w", endpoint, err)
	}
	defer st.Close()
	if _, err := admin.CreateSwitch(ctx, st, records.Switch{Name: sw, MTU: 9000, UplinkPolicy: records.UplinkSingle}); err != nil {
		return err
	}
	name := strings.TrimPrefix(pg, "dvportgroup-")
	p := records.PortGroup{Name: name, Key: pg, Switch: sw, VLAN: 100, PFCPriority: 3, DSCP: 26, RoCEVersion: records.RoCEv2, // RoCE in a VLAN with PFC on its priority (roce-vlan-pfc)
		Subnet: localSubnet} // every adapter gets an address: rdma_cm programs connect by it
	if _, err := st.Create(ctx, records.PortGroupKey(p.Key), p); err != nil {
		return fmt.Errorf("create port group %s: %w", p.Key, err)
	}
	return nil
}

// startLocalFabric starts the hosts (the first with the embedded etcd,
// the others joined to it) and creates switch sw and port group pg. On
// error, what it started is stopped and removed.
func startLocalFabric(ctx context.Context, sw, pg string, specs []localHostSpec) (_ *localFabric, err error) {
	f := &localFabric{Switch: sw, PortGroup: pg}
	defer func() {
		if err != nil {
			f.Close()
		}
	}()
	first, err := startLocalHost(ctx, specs[0], sw, "")
	if err != nil {
		return nil, err
	}
	f.Hosts = append(f.Hosts, first)
	if f.Endpoint, err = first.etcdEndpoint(); err != nil {
		return nil, err
	}
	// The records and the other hosts at once: neither needs the other.
	rest := make([]*localHost, len(specs)-1)
	errs := make([]error, len(specs))
	var wg sync.WaitGroup
	wg.Go(func() { errs[0] = createLocalFabric(ctx, f.Endpoint, sw, pg) })
	for i, s := range specs[1:] {
		wg.Go(func() { rest[i], errs[i+1] = startLocalHost(ctx, s, sw, f.Endpoint) })
	}
	wg.Wait()
	for _, h := range rest {
		if h != nil {
			f.Hosts = append(f.Hosts, h)
		}
	}
	return f, errors.Join(errs...)
}

// Close stops the hosts, the last first (the first serves the others'
// etcd), and removes their temporary state.
func (f *localFabric) Close() error {
	var errs []error
	for i := len(f.Hosts) - 1; i >= 0; i-- {
		if err := f.Hosts[i].Close(); err != nil {
			errs = append(errs, fmt.Errorf("host %s: %w", f.Hosts[i].Name, err))
		}
	}
	return errors.Join(errs...)
}

// uplinkBytes returns the bytes the hosts sent over their uplinks so far:
// the tcp path's links and the RDMA uplinks.
func uplinkBytes(ctx context.Context, hosts ...*localHost) (uint64, error) {
	var sum uint64
	for _, h := range hosts {
		ag, err := vrdma.DialAgent(ctx, vrdma.WithSocket(h.Socket))
		if err != nil {
			return 0, fmt.Errorf("host %s: %w", h.Name, err)
		}
		st, err := ag.Status(ctx)
		ag.Close()
		if err != nil {
			return 0, fmt.Errorf("host %s: status: %w", h.Name, err)
		}
		for _, u := range st.Uplinks {
			sum += u.BytesOut
		}
		for _, u := range st.RDMA {
			sum += u.BytesOut
		}
	}
	return sum, nil
}

// label returns "NAME ADDRESS:PORT".
func (h *localHost) label() string { return h.Name + " " + h.Addr.String() }
