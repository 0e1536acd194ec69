// SPDX-License-Identifier: Apache-2.0

package nicstate

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/netcheck"
)

// ip runs iproute2's ip.
func ip(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// TestNetworkNICStateVeth reads this machine's kernel: a veth pair in a
// fresh network namespace, one end a bridge port. A veth has no DCB or
// pause support, so its PFC, trust and pause are unknown with the
// kernel's answer (EOPNOTSUPP), its MTU and team membership known; and the
// checks then say unknown with that answer and how to declare the state.
func TestNetworkNICStateVeth(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a network namespace (CI runs as root)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2's ip (Debian package iproute2)")
	}
	ns := fmt.Sprintf("vrdma-nicstate-%d", os.Getpid())
	exec.Command("ip", "netns", "del", ns).Run() // left by a run that crashed
	ip(t, "netns", "add", ns)
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v\n%s", ns, err, out)
		}
	})
	ip(t, "-n", ns, "link", "add", "v0", "mtu", "9000", "type", "veth", "peer", "name", "v1")
	ip(t, "-n", ns, "link", "add", "br0", "type", "bridge")
	ip(t, "-n", ns, "link", "set", "v1", "master", "br0")

	f, err := os.Open("/run/netns/" + ns)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	k, err := Dial(int(f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()

	st, err := Read(k, "v0")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("v0: %+v", st)
	if st.Kind != "veth" || st.MTU != 9000 || st.Teamed == nil || *st.Teamed || st.PFC != nil || st.Pause != nil || st.Trust != "" {
		t.Errorf("v0: %+v", st)
	}
	for _, f := range []string{records.FieldPFC, records.FieldTrust, records.FieldPause} {
		if !strings.Contains(st.Unknown[f], "operation not supported (EOPNOTSUPP)") {
			t.Errorf("v0: unknown %s: %q; want the kernel's EOPNOTSUPP", f, st.Unknown[f])
		}
	}
	if v1, err := Read(k, "v1"); err != nil || v1.Teamed == nil || *v1.Teamed || v1.Team != "" {
		t.Errorf("v1, a bridge port: %+v, %v; want not teamed", v1, err)
	}
	if lo, err := Read(k, "lo"); err != nil || lo.MTU != 65536 || lo.PFC != nil || lo.Unknown[records.FieldPFC] == "" {
		t.Errorf("lo: %+v, %v", lo, err)
	}
	// The namespace is the test's own: the machine's other NICs are not in it.
	if _, err := Read(k, "eth0"); !errors.Is(err, ErrNoDevice) {
		t.Errorf("eth0 in a fresh namespace: %v; want ErrNoDevice", err)
	}
	// The checks see what the kernel said.
	a := netip.MustParseAddr("192.0.2.1")
	u := records.Uplink{Kind: records.UplinkSoftRoCEv2, Device: "v0", Address: a, GID: records.GIDOf(a), Observed: st.NICState}
	h := records.Host{ID: "h1", Name: "esx1", Switch: "dvs1", Uplinks: []records.Uplink{u}, AgentVersion: "t", State: records.HostUp}
	sw := records.Switch{Name: "dvs1", UUID: "501d0b8e-8d95-4e2b-b25c-2f3aa61a9e1d", MTU: 9000, UplinkPolicy: records.UplinkSingle}
	pg := records.PortGroup{Name: "pg", Key: "pg", Switch: "dvs1", VLAN: 100, PFCPriority: 3, DSCP: 26, RoCEVersion: records.RoCEv2}
	rs := netcheck.Uplink(sw, pg, netcheck.End{Host: h, Uplink: u})
	l2 := rs[0]
	if l2.Check != netcheck.CheckL2Lossless || l2.Status != netcheck.Unknown ||
		!strings.Contains(l2.Detail, "the kernel cannot report the PFC of uplink v0 of host esx1 (RTM_GETDCB DCB_CMD_IEEE_GET for v0: operation not supported (EOPNOTSUPP)") ||
		!strings.Contains(l2.Fix, "vrdmactl host uplink declare esx1 v0 --pfc PRIORITIES --pause rx,tx|off") {
		t.Errorf("roce-l2-lossless on a veth: %+v", l2)
	}
	if nt := rs[2]; nt.Check != netcheck.CheckNoTeaming || nt.Status != netcheck.Pass || !strings.Contains(nt.Detail, "reported by the kernel") {
		t.Errorf("roce-no-teaming on a veth: %+v", nt)
	}
	// Declared, the state counts where the kernel cannot report it.
	pfc := records.PrioritiesOf(3)
	u.Declared = records.NICState{PFC: &pfc}
	if r := netcheck.Uplink(sw, pg, netcheck.End{Host: h, Uplink: u})[0]; r.Status != netcheck.Pass || !strings.Contains(r.Detail, "(declared)") {
		t.Errorf("roce-l2-lossless with PFC declared: %+v", r)
	}
}
