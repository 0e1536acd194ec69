// SPDX-License-Identifier: Apache-2.0

package agent

// VM network namespaces (Config.VMNetns, package vmnet): the first
// workload's attach makes the VM's namespace, with an interface per
// adapter carrying the address the control plane assigned; the last
// workload's detach removes it. A goroutine keeps the tunnels' far ends
// the other hosts' PVRDMA addresses, as hosts come and go in the control
// plane's cache.

import (
	"context"
	"net/netip"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/device"
	"github.com/vrdma/vrdma/internal/vmnet"
)

// startVMNet makes the agent's vmnet.Net (sweeping what a previous run
// left) and, with a control plane, starts following the other hosts.
func (a *Agent) startVMNet() error {
	cfg := vmnet.Config{HostID: a.hostID, Log: a.log}
	if a.cfg.Control != nil {
		cfg.Local = a.cfg.Control.PVRDMAAddress.Addr().Unmap()
	}
	n, err := vmnet.New(cfg)
	if err != nil {
		return err
	}
	a.vmnet = n
	a.vmnetStop = make(chan struct{})
	a.vmnetDone = make(chan struct{})
	go a.followPeers()
	return nil
}

// stopVMNet stops following the hosts and removes every namespace,
// bridge and tunnel.
func (a *Agent) stopVMNet() {
	if a.vmnet == nil {
		return
	}
	close(a.vmnetStop)
	<-a.vmnetDone
	if err := a.vmnet.Close(); err != nil {
		a.log.Warn("VM namespaces not all removed", "err", err)
	}
}

// followPeers sets the tunnels' far ends to every other host up with a
// PVRDMA address, at each change of the control plane's cache.
func (a *Agent) followPeers() {
	defer close(a.vmnetDone)
	if a.ctl == nil {
		return
	}
	for {
		changed := a.ctl.cache.Changed()
		var peers []netip.Addr
		for _, h := range a.ctl.cache.Hosts() {
			if h.Host.ID != a.hostID && h.Host.State == records.HostUp && h.Host.PVRDMAAddress.IsValid() {
				peers = append(peers, h.Host.PVRDMAAddress.Addr())
			}
		}
		a.vmnet.SetPeers(peers)
		select {
		case <-a.vmnetStop:
			return
		case <-changed:
		}
	}
}

// addVMNet makes attached VM v's namespace; the error (code invalid or
// unavailable) says why it cannot be made and what to do.
func (a *Agent) addVMNet(v *device.Context) error {
	var ads []vmnet.Adapter
	for i, ad := range v.Adapters() {
		pgKey := v.Config().Adapters[i].PortGroupID
		g := vmnet.Group{Key: pgKey}
		var subnet netip.Prefix
		if pgKey != "" {
			vlan := 0
			if a.ctl != nil {
				ctx, cancel := context.WithTimeout(context.Background(), a.ctl.cfg.LookupTimeout)
				p, err := a.ctl.cache.PortGroup(ctx, pgKey)
				cancel()
				if err == nil {
					vlan = p.VLAN
					subnet, _ = p.SubnetPrefix()
				}
			}
			vni, err := vmnet.VNI(pgKey, vlan)
			if err != nil {
				return abi.Errorf(abi.CodeInvalid, "vm", "VM %s, adapter %s: %v", v.Name(), ad.Name(), err)
			}
			g.VNI = vni
		}
		va := vmnet.Adapter{Name: ad.Name(), MAC: ad.MAC(), Group: g}
		for _, ip := range []netip.Addr{ad.IPv4(), ad.IPv6()} {
			if ip.IsValid() {
				va.Addrs = append(va.Addrs, onLink(ip, subnet))
			}
		}
		ads = append(ads, va)
	}
	if _, err := a.vmnet.AddVM(v.Name(), ads); err != nil {
		return abi.Errorf(abi.CodeUnavailable, "vm", "VM %s's network namespace: %v (or run vrdmad without --vm-netns)", v.Name(), err)
	}
	return nil
}

// onLink is ip with the prefix length that puts its port group's subnet
// on-link: the subnet's when it holds ip, else /24 for IPv4 and /64 for
// IPv6, as a guest with that address and the usual mask has it.
func onLink(ip netip.Addr, subnet netip.Prefix) netip.Prefix {
	if subnet.IsValid() && subnet.Contains(ip) {
		return netip.PrefixFrom(ip, subnet.Bits())
	}
	if ip.Is4() {
		return netip.PrefixFrom(ip, 24)
	}
	return netip.PrefixFrom(ip, 64)
}

// vmNamespace is the name of VM name's namespace, "" without one.
func (a *Agent) vmNamespace(name string) string {
	if a.vmnet == nil {
		return ""
	}
	ns, _ := a.vmnet.Namespace(name)
	return ns
}
