// SPDX-License-Identifier: Apache-2.0

package cli

// exec --sysfs: the device view (view.go) and, in a network namespace of
// the program's own, a network interface per adapter. rdma-core's tests
// (and some programs) list /sys/class/infiniband/DEV/device/net/ for the
// device's network interface and ask `ip addr show` for its address; no
// library call is made, so the drop-in cannot answer. As root, exec can: a
// veth interface vrdmaN (its peer vrdmaN-peer beside it; this kernel may
// lack dummy) carries the adapter's MAC and IP addresses, as the PVRDMA
// adapter's interface does in a vSphere guest.

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/vmconfig"
)

// sysfsAdapter is what the view shows of one adapter; MAC and addresses
// may be unknown (empty, invalid): a VM not yet attached has only what its
// VMX says.
type sysfsAdapter struct {
	name     string
	index    int    // N of vrdmaN
	mac      string // xx:xx:xx:xx:xx:xx, or ""
	ip4, ip6 netip.Addr
	gid      abi.GID // the agent's; zero if unknown
}

// netScript returns the shell script that makes the adapters' interfaces
// of ads and then execs its arguments (the program): run by /bin/sh in a
// fresh network namespace, inside the device view. Every value in it was
// checked first.
func netScript(ads []sysfsAdapter) string {
	var b strings.Builder
	b.WriteString("set -e\nip link set lo up\n")
	for _, ad := range ads {
		fmt.Fprintf(&b, "ip link add %[1]s type veth peer name %[1]s-peer\n", ad.name)
		if ad.mac != "" {
			fmt.Fprintf(&b, "ip link set %s address %s\n", ad.name, ad.mac)
		}
		for _, ip := range []netip.Addr{ad.ip4, ad.ip6} {
			if ip.IsValid() {
				fmt.Fprintf(&b, "ip addr add %s/%d dev %s\n", ip, ip.BitLen(), ad.name)
			}
		}
		fmt.Fprintf(&b, "ip link set %[1]s-peer up\nip link set %[1]s up\n", ad.name)
	}
	b.WriteString("exec \"$@\"\n")
	return b.String()
}

// parseMAC checks a MAC address of the agent's and returns it in the
// lower-case colon form `ip link` takes.
func parseMAC(s string) (string, error) {
	var m [6]byte
	if n, err := fmt.Sscanf(strings.ToLower(s), "%02x:%02x:%02x:%02x:%02x:%02x", &m[0], &m[1], &m[2], &m[3], &m[4], &m[5]); err != nil || n != 6 {
		return "", fmt.Errorf("MAC %q is not xx:xx:xx:xx:xx:xx", s)
	}
	return fmt.Sprintf("%02x:%02x:%02x:%02x:%02x:%02x", m[0], m[1], m[2], m[3], m[4], m[5]), nil
}

// guidOfMAC is the EUI-64 node GUID of a MAC address, in sysfs's
// xxxx:xxxx:xxxx:xxxx form, as RoCE devices derive it.
func guidOfMAC(mac string) string {
	var m [6]byte
	fmt.Sscanf(mac, "%02x:%02x:%02x:%02x:%02x:%02x", &m[0], &m[1], &m[2], &m[3], &m[4], &m[5])
	return fmt.Sprintf("%02x%02x:%02xff:fe%02x:%02x%02x", m[0]^2, m[1], m[2], m[3], m[4], m[5])
}

// gidText is a GID as sysfs writes it: eight groups of four hex digits.
func gidText(g abi.GID) string {
	var parts []string
	for i := 0; i < 16; i += 2 {
		parts = append(parts, fmt.Sprintf("%02x%02x", g[i], g[i+1]))
	}
	return strings.Join(parts, ":")
}

// vmAdapters returns VM vm's adapters as the view shows them: the
// agent's (status: MACs, addresses, also those assigned from a subnet, and
// GIDs) for an attached VM, else the VMX's.
func (a *app) vmAdapters(ctx context.Context, vm string) ([]sysfsAdapter, error) {
	ads, _, err := a.vmNetwork(ctx, vm)
	return ads, err
}

// vmNetwork is vmAdapters with the attached VM's network namespace on
// this host ("" when the agent makes none).
func (a *app) vmNetwork(ctx context.Context, vm string) ([]sysfsAdapter, string, error) {
	ag, err := a.dialAgent(ctx)
	if err != nil {
		return nil, "", err
	}
	defer ag.Close()
	in, err := ag.VM(ctx, vm)
	if err != nil {
		return nil, "", fmt.Errorf("VM %s: %w", vm, err)
	}
	cfg, err := vmconfig.Parse([]byte(in.VMX))
	if err != nil {
		return nil, "", fmt.Errorf("VM %s's VMX: %w", vm, err)
	}
	var ads []sysfsAdapter
	for _, c := range cfg.Adapters {
		ad := sysfsAdapter{name: c.Name(), index: c.Index, ip4: c.IPv4, ip6: c.IPv6}
		if len(c.MAC) == 6 {
			ad.mac = c.MAC.String()
		}
		ads = append(ads, ad)
	}
	ns := ""
	if st, err := ag.Status(ctx); err == nil {
		for _, v := range st.VMs {
			if v.Name != vm || !v.Attached {
				continue
			}
			ns = v.Netns
			for _, info := range v.Adapters {
				for i := range ads {
					if ads[i].name != info.Name {
						continue
					}
					if mac, err := parseMAC(info.MAC); err == nil {
						ads[i].mac = mac
					}
					if ip, err := netip.ParseAddr(info.IPv4); err == nil && ip.Is4() {
						ads[i].ip4 = ip
					}
					if ip, err := netip.ParseAddr(info.IPv6); err == nil && ip.Is6() {
						ads[i].ip6 = ip
					}
					ads[i].gid = info.GID
				}
			}
		}
	}
	if len(ads) == 0 {
		return nil, "", fmt.Errorf("VM %s has no PVRDMA adapter", vm)
	}
	return ads, ns, nil
}

// netnsView returns the command that runs a program through exec --netns
// or --sysfs, and what to call once it ended. exec first attaches VM vm
// itself (held until release), so that the agent has assigned its
// addresses and, run with --vm-netns, made its namespace; the program
// then runs through vrdmactl's view helper in a new mount namespace,
// which enters the VM's network namespace. Without one, --netns is
// refused with what to do, and --sysfs gives the program a network
// namespace of its own where /bin/sh with netScript makes interfaces
// carrying the addresses (reaching nothing but the program itself).
func (a *app) netnsView(ctx context.Context, vm, prog string, args []string, sysfs bool) (c *exec.Cmd, release func(), err error) {
	flag := "--netns"
	if sysfs {
		flag = "--sysfs"
	}
	if os.Geteuid() != 0 {
		return nil, nil, fmt.Errorf("exec %s needs root: it enters network and mount namespaces (without it, exec gives the device view alone)", flag)
	}
	held, err := vrdma.Open(ctx, vm, vrdma.WithSocket(a.socket))
	if err != nil {
		return nil, nil, fmt.Errorf("exec %s: %w", flag, err)
	}
	defer func() {
		if err != nil {
			held.Close()
		}
	}()
	ads, ns, err := a.vmNetwork(ctx, vm)
	if err != nil {
		return nil, nil, fmt.Errorf("exec %s: %w", flag, err)
	}
	spec := viewSpecOf(vm, ads)
	var self string
	var argv []string
	var extra uintptr
	switch {
	case ns != "":
		spec.Netns = ns
		self, argv, err = viewCommand(spec, prog, args)
	case !sysfs:
		return nil, nil, fmt.Errorf("exec --netns: the agent on this host makes no network namespaces for VMs: start vrdmad with --vm-netns (as root), or run the program with --sysfs (a namespace of its own, reaching nothing) or without either (the host's network)")
	default:
		for _, ad := range ads {
			if !ad.ip4.IsValid() && !ad.ip6.IsValid() {
				fmt.Fprintf(a.stderr, "vrdmactl: exec --sysfs: %s/%s has no address (neither the VMX nor its port group's subnet gives one): its interface has none\n", vm, ad.name)
			}
		}
		sh := []string{"-c", netScript(ads), "vrdma-sysfs", prog}
		self, argv, err = viewCommand(spec, "/bin/sh", append(sh, args...))
		extra = syscall.CLONE_NEWNET
	}
	if err != nil {
		return nil, nil, err
	}
	c = exec.Command(self)
	c.Args = argv
	c.SysProcAttr = viewAttr(extra)
	return c, func() { held.Close() }, nil
}
