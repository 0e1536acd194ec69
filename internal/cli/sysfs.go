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
	ag, err := a.dialAgent(ctx)
	if err != nil {
		return nil, err
	}
	defer ag.Close()
	in, err := ag.VM(ctx, vm)
	if err != nil {
		return nil, fmt.Errorf("VM %s: %w", vm, err)
	}
	cfg, err := vmconfig.Parse([]byte(in.VMX))
	if err != nil {
		return nil, fmt.Errorf("VM %s's VMX: %w", vm, err)
	}
	var ads []sysfsAdapter
	for _, c := range cfg.Adapters {
		ad := sysfsAdapter{name: c.Name(), index: c.Index, ip4: c.IPv4, ip6: c.IPv6}
		if len(c.MAC) == 6 {
			ad.mac = c.MAC.String()
		}
		ads = append(ads, ad)
	}
	if st, err := ag.Status(ctx); err == nil {
		for _, v := range st.VMs {
			if v.Name != vm || !v.Attached {
				continue
			}
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
		return nil, fmt.Errorf("VM %s has no PVRDMA adapter", vm)
	}
	return ads, nil
}

// sysfsView returns the command that runs a program through exec --sysfs:
// vrdmactl's view helper in new mount and network namespaces, running
// /bin/sh with netScript, which execs the program.
func (a *app) sysfsView(ctx context.Context, vm, prog string, args []string) (*exec.Cmd, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("exec --sysfs needs root: it makes network interfaces, in a network namespace of the program's own (without it, exec gives the device view alone)")
	}
	ads, err := a.vmAdapters(ctx, vm)
	if err != nil {
		return nil, fmt.Errorf("exec --sysfs: %w", err)
	}
	for _, ad := range ads {
		if !ad.ip4.IsValid() && !ad.ip6.IsValid() {
			fmt.Fprintf(a.stderr, "vrdmactl: exec --sysfs: %s/%s has no address yet (one the control plane assigns appears once the VM is attached): its interface has none\n", vm, ad.name)
		}
	}
	sh := []string{"-c", netScript(ads), "vrdma-sysfs", prog}
	self, argv, err := viewCommand(viewSpecOf(vm, ads), "/bin/sh", append(sh, args...))
	if err != nil {
		return nil, err
	}
	c := exec.Command(self)
	c.Args = argv
	c.SysProcAttr = viewAttr(syscall.CLONE_NEWNET)
	return c, nil
}
