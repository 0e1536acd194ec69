// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/perf"
	"github.com/vrdma/vrdma/internal/testenv"
)

// Tests of the commands that talk to a running agent, against an agent in
// this process.

func TestDevinfo(t *testing.T) {
	isolate(t)
	env := testenv.Start(t)
	env.Define(t, "vm1", testenv.VMOptions{Adapters: 2})

	out := runOK(t, "--socket", env.Socket, "devinfo", "--vm", "vm1")
	for _, want := range []string{"hca_id:\tvrdma0", "hca_id:\tvrdma1", "\ttransport:\t\t\tInfiniBand", "\tvendor_id:\t\t\t0x15ad",
		"\tphys_port_cnt:\t\t\t1", "\t\tport:\t1", "state:\t\t\tPORT_ACTIVE (4)", "max_mtu:\t\t4096 (5)", "active_mtu:\t\t1024 (3)",
		"link_layer:\t\tEthernet", "GID[  0]:\t\tfe80::"} {
		if !strings.Contains(out, want) {
			t.Errorf("devinfo lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "max_qp") {
		t.Errorf("devinfo without -v shows limits:\n%s", out)
	}
	out = runOK(t, "--socket", env.Socket, "devinfo", "--vm", "vm1", "-v")
	for _, want := range []string{"max_qp:", "max_qp_wr:", "max_sge:", "max_cq:", "max_cqe:", "max_mr:", "max_mr_size:", "max_pd:",
		"max_qp_rd_atom:", "max_inline_data:", "atomic_cap:\t\t\tATOMIC_HCA"} {
		if !strings.Contains(out, want) {
			t.Errorf("devinfo -v lacks %q:\n%s", want, out)
		}
	}

	var rep devinfoReport
	runJSON(t, &rep, "--socket", env.Socket, "devinfo", "--vm", "vm1", "-o", "json")
	if rep.VM != "vm1" || rep.Host != "hostA" || len(rep.HCAs) != 2 {
		t.Fatalf("report %+v", rep)
	}
	for i, h := range rep.HCAs {
		d := h.Device
		if h.HCAID != "vrdma"+string(rune('0'+i)) || d.VendorID != 0x15ad || d.PhysPortCnt != 1 || d.MaxQP == 0 || d.MaxQPWR == 0 ||
			d.MaxSGE == 0 || d.MaxCQE == 0 || d.MaxMRSize != 4<<20 || d.NodeGUID == "" || d.FWVer == "" {
			t.Errorf("hca %d: %+v", i, h)
		}
		if len(h.Ports) != 1 || h.Ports[0].Port != 1 || h.Ports[0].State != "PORT_ACTIVE" || h.Ports[0].GID.IsZero() || h.Ports[0].LinkLayer != "Ethernet" {
			t.Errorf("hca %d ports: %+v", i, h.Ports)
		}
	}
	if rep.HCAs[0].Ports[0].GID == rep.HCAs[1].Ports[0].GID {
		t.Errorf("both adapters have GID %s", rep.HCAs[0].Ports[0].GID)
	}
	if d0, d1 := rep.HCAs[0].Device, rep.HCAs[1].Device; d0.NodeGUID == d1.NodeGUID || d0.SysImageGUID != d1.SysImageGUID {
		t.Errorf("adapters' GUIDs: node %s and %s (want distinct), system image %s and %s (want one)",
			d0.NodeGUID, d1.NodeGUID, d0.SysImageGUID, d1.SysImageGUID)
	}

	// A VM a workload holds is queried beside it (another context on the
	// same adapters); one with reserved, locked memory cannot be, and
	// devinfo says why.
	held := env.Open(t, "vm2", testenv.VMOptions{})
	out, errs, code := run(t, "", "--socket", env.Socket, "devinfo", "--vm", "vm2")
	if code != 0 || !strings.Contains(out, held.Adapters()[0].GID().String()) {
		t.Errorf("devinfo on a VM a workload holds: exit %d, %q, %q; want its adapter's GID %s", code, out, errs, held.Adapters()[0].GID())
	}
	env.Define(t, "pinned", testenv.VMOptions{Locked: true})
	if p, err := vrdma.Open(t.Context(), "pinned", vrdma.WithSocket(env.Socket)); err == nil {
		defer p.Close()
		_, errs, code = run(t, "", "--socket", env.Socket, "devinfo", "--vm", "pinned")
		if code != exitFailure || !strings.Contains(errs, "a workload holds it") {
			t.Errorf("devinfo on a locked VM a workload holds: exit %d, %q", code, errs)
		}
	} else if os.Geteuid() == 0 {
		t.Errorf("attach a VM with 4 MiB locked, as root: %v", err)
	}
	_, errs, code = run(t, "", "--socket", env.Socket, "devinfo", "--vm", "nosuchvm")
	if code != exitFailure || !strings.Contains(errs, "not defined") {
		t.Errorf("devinfo on an unknown VM: exit %d, %q", code, errs)
	}
}

// TestAddressShown checks that devinfo and status show an adapter's
// address (vrdmaN.ipAddress) and its IPv4-mapped GID.
func TestAddressShown(t *testing.T) {
	isolate(t)
	env := testenv.Start(t)
	env.Define(t, "vm1", testenv.VMOptions{IPv4: []string{"10.9.1.1"}})
	out := runOK(t, "--socket", env.Socket, "devinfo", "--vm", "vm1")
	for _, want := range []string{"ipv4:\t\t\t\t10.9.1.1", "GID[  0]:\t\t::ffff:10.9.1.1"} {
		if !strings.Contains(out, want) {
			t.Errorf("devinfo lacks %q:\n%s", want, out)
		}
	}
	env.Open(t, "vm1", testenv.VMOptions{IPv4: []string{"10.9.1.1"}})
	if out := runOK(t, "--socket", env.Socket, "status"); !strings.Contains(out, "vrdma0 10.9.1.1 ::ffff:10.9.1.1") {
		t.Errorf("status lacks vm1's address:\n%s", out)
	}
}

func TestStatus(t *testing.T) {
	isolate(t)
	env := testenv.Start(t)
	v1 := env.Open(t, "vm1", testenv.VMOptions{Locked: true})
	v2 := env.Open(t, "vm2", testenv.VMOptions{Async: true})
	env.Define(t, "vm3", testenv.VMOptions{MemMB: 8, Adapters: 3})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := perf.Connect(ctx, v1.Adapters()[0], v2.Adapters()[0], perf.PairConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(ctx)

	var rep statusReport
	runJSON(t, &rep, "--socket", env.Socket, "status", "-o", "json")
	if rep.Host != "hostA" || rep.HostID == "" || rep.AgentVersion == "" || rep.Socket != env.Socket || len(rep.VMs) != 3 {
		t.Fatalf("report %+v", rep)
	}
	vm1, vm2, vm3 := rep.VMs[0], rep.VMs[1], rep.VMs[2]
	if vm1.Name != "vm1" || !vm1.Attached || !vm1.MemLocked || vm1.MemSize != 4<<20 || len(vm1.Adapters) != 1 || vm1.Adapters[0].GID.IsZero() {
		t.Errorf("vm1 %+v", vm1)
	}
	if vm2.Name != "vm2" || !vm2.Attached || vm2.MemLocked || !vm2.AsyncMode {
		t.Errorf("vm2 %+v", vm2)
	}
	if vm3.Name != "vm3" || vm3.Attached || vm3.MemSize != 8<<20 || len(vm3.Adapters) != 3 || len(vm3.QPs) != 0 {
		t.Errorf("vm3 %+v", vm3)
	}
	if len(vm1.QPs) != 1 || len(vm2.QPs) != 1 {
		t.Fatalf("QPs: vm1 %+v, vm2 %+v", vm1.QPs, vm2.QPs)
	}
	q1, q2 := vm1.QPs[0], vm2.QPs[0]
	if q1.QPN != p.A.QP.QPN() || q1.State != "RTS" || q1.Peer != "vm2/vrdma0" || q1.PeerQPN != q2.QPN || q1.Path.Path != "memcpy" || q1.Path.Reason == "" {
		t.Errorf("vm1's QP %+v", q1)
	}
	if q2.State != "RTS" || q2.Peer != "vm1/vrdma0" || q2.PeerQPN != q1.QPN || q2.Path.Path != "memcpy" {
		t.Errorf("vm2's QP %+v", q2)
	}

	out := runOK(t, "--socket", env.Socket, "status")
	for _, want := range []string{"host hostA", "VM", "vm1", "attached", "4 MiB, locked", "vm3", "defined", "vrdma0, vrdma1, vrdma2",
		"QPN", "RTS", "vm2/vrdma0", "memcpy", q1.Path.Reason} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}

	_, errs, code := run(t, "", "--socket", filepath.Join(t.TempDir(), "none.sock"), "status")
	if code != exitFailure || !strings.Contains(errs, "is vrdmad running?") {
		t.Errorf("status without an agent: exit %d, %q", code, errs)
	}
}

func TestVM(t *testing.T) {
	isolate(t)
	env := testenv.Start(t)
	file := filepath.Join(t.TempDir(), "web.vmx")
	if err := os.WriteFile(file, []byte(testenv.VMX(testenv.VMOptions{MemMB: 16, Adapters: 2})), 0o600); err != nil {
		t.Fatal(err)
	}
	// Defined, powered on, with the power-on rules it breaks as a warning:
	// its memory is not reserved, its adapters on no distributed port
	// group.
	out, errs, code := run(t, "", "--socket", env.Socket, "vm", "define", "web", file)
	if code != 0 || !strings.Contains(out, "VM web defined") {
		t.Errorf("define: exit %d, %q, %q", code, out, errs)
	}
	for _, want := range []string{"warning: VM web breaks", "error   memory-reservation", "error   distributed-portgroup"} {
		if !strings.Contains(errs, want) {
			t.Errorf("define of a VM that breaks power-on rules: stderr %q does not say %q", errs, want)
		}
	}
	if _, errs, code := run(t, testenv.VMX(testenv.VMOptions{}), "--socket", env.Socket, "vm", "define", "db", "-"); code != 0 {
		t.Fatalf("define from stdin: exit %d, %s", code, errs)
	}
	var list struct {
		VMs []struct {
			Name     string `json:"name"`
			Attached bool   `json:"attached"`
			MemSize  uint64 `json:"mem_size"`
		} `json:"vms"`
	}
	runJSON(t, &list, "--socket", env.Socket, "vm", "list", "-o", "json")
	if len(list.VMs) != 2 || list.VMs[0].Name != "db" || list.VMs[1].Name != "web" || list.VMs[1].MemSize != 16<<20 || list.VMs[1].Attached {
		t.Errorf("list %+v", list)
	}
	if out := runOK(t, "--socket", env.Socket, "vm", "list"); !strings.Contains(out, "web") || !strings.Contains(out, "16 MiB") || !strings.Contains(out, "vrdma0,vrdma1") {
		t.Errorf("list:\n%s", out)
	}

	// The agent checks the VMX and says what to fix.
	bad := filepath.Join(t.TempDir(), "bad.vmx")
	os.WriteFile(bad, []byte("memSize = \"lots\"\n"), 0o600)
	if _, errs, code := run(t, "", "--socket", env.Socket, "vm", "define", "bad", bad); code != exitFailure || !strings.Contains(errs, "memSize") {
		t.Errorf("define bad VMX: exit %d, %q", code, errs)
	}
	// An attached VM can be neither redefined nor undefined.
	env.Open(t, "db", testenv.VMOptions{})
	if _, errs, code := run(t, "", "--socket", env.Socket, "vm", "undefine", "db"); code != exitFailure || !strings.Contains(errs, "attached") {
		t.Errorf("undefine attached: exit %d, %q", code, errs)
	}

	runOK(t, "--socket", env.Socket, "vm", "undefine", "web")
	runJSON(t, &list, "--socket", env.Socket, "vm", "list", "-o", "json")
	if len(list.VMs) != 1 || list.VMs[0].Name != "db" {
		t.Errorf("after undefine: %+v", list)
	}
	if _, errs, code := run(t, "", "--socket", env.Socket, "vm", "undefine", "web"); code != exitFailure || !strings.Contains(errs, "not defined") {
		t.Errorf("undefine twice: exit %d, %q", code, errs)
	}
}
