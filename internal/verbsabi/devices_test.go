// SPDX-License-Identifier: Apache-2.0

package verbsabi

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/agent"
	"github.com/vrdma/vrdma/internal/testenv"
)

// run runs an unmodified program as a workload of vm and returns its
// standard output and error.
func run(t *testing.T, lib, socket, vm string, prog string, args ...string) (string, string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, prog, args...)
	cmd.Env = Env(lib, socket, vm)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	return out.String(), errb.String(), err
}

// openVM attaches to vm from Go, retrying while its last workload is still
// being detached.
func openVM(t *testing.T, socket, vm string) *vrdma.VM {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		v, err := vrdma.Open(ctx, vm, vrdma.WithSocket(socket))
		cancel()
		if err == nil {
			t.Cleanup(func() { v.Close() })
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("open VM %s: %v", vm, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// devinfoBlocks splits ibv_devinfo output into one map per hca_id: the
// "key: value" lines, the first occurrence of each key, values trimmed.
func devinfoBlocks(out string) map[string]map[string]string {
	blocks := map[string]map[string]string{}
	var cur map[string]string
	for _, l := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(l), ":")
		if !ok {
			continue
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if k == "hca_id" {
			cur = map[string]string{}
			blocks[v] = cur
			continue
		}
		if cur == nil {
			continue
		}
		if _, dup := cur[k]; !dup {
			cur[k] = v
		}
	}
	return blocks
}

var limits = agent.Limits{MaxQP: 77, MaxCQ: 99, MaxMR: 333, MaxPD: 55}

// TestVerbsABIDevices runs Debian's unmodified ibv_devices and ibv_devinfo
// -v against the drop-in, as a workload of a VM with two adapters on a
// real vrdmad started with non-default limits, and checks every figure
// they print against what the agent reports to the Go library.
func TestVerbsABIDevices(t *testing.T) {
	lib := Build(t)
	NeedProgram(t, "/usr/bin/ibv_devinfo", "ibverbs-utils")
	env := testenv.StartProcess(t, testenv.ProcessOptions{Limits: limits})
	env.Define(t, "vm1", testenv.VMOptions{MemMB: 8, Adapters: 2})

	devs, stderr, err := run(t, lib, env.Socket, "vm1", "/usr/bin/ibv_devices")
	if err != nil {
		t.Fatalf("ibv_devices: %v\n%s%s", err, devs, stderr)
	}
	info, stderr2, err := run(t, lib, env.Socket, "vm1", "/usr/bin/ibv_devinfo", "-v")
	if err != nil {
		t.Fatalf("ibv_devinfo -v: %v\n%s%s", err, info, stderr2)
	}
	if stderr+stderr2 != "" {
		t.Errorf("the programs wrote to stderr:\n%s%s", stderr, stderr2)
	}
	t.Logf("ibv_devices:\n%s", devs)

	// What the agent says, through the Go library (the C programs have
	// exited: their session detached the VM).
	v := openVM(t, env.Socket, "vm1")
	ctx := context.Background()
	blocks := devinfoBlocks(info)
	if len(blocks) != 2 {
		t.Fatalf("ibv_devinfo shows %d devices, want 2:\n%s", len(blocks), info)
	}
	guids := map[string]bool{}
	for _, ad := range v.Adapters() {
		d, err := ad.QueryDevice(ctx)
		if err != nil {
			t.Fatal(err)
		}
		p, err := ad.QueryPort(ctx)
		if err != nil {
			t.Fatal(err)
		}
		guids[d.NodeGUID] = true
		// ibv_devices: "    vrdma0   020c29fffe38a81a"
		want := regexp.MustCompile(`(?m)^\s+` + ad.Name() + `\s+` + strings.ReplaceAll(d.NodeGUID, ":", "") + `\s*$`)
		if !want.MatchString(devs) {
			t.Errorf("ibv_devices lacks %s with GUID %s:\n%s", ad.Name(), d.NodeGUID, devs)
		}
		b := blocks[ad.Name()]
		if b == nil {
			t.Errorf("ibv_devinfo has no hca_id %s:\n%s", ad.Name(), info)
			continue
		}
		hex := func(x uint64) string { return fmt.Sprintf("0x%x", x) }
		dec := func(x uint32) string { return strconv.FormatUint(uint64(x), 10) }
		mtu := func(bytes uint32) string {
			return fmt.Sprintf("%d (%d)", bytes, map[uint32]int{256: 1, 512: 2, 1024: 3, 2048: 4, 4096: 5}[bytes])
		}
		for k, want := range map[string]string{
			"transport":                 "InfiniBand (0)",
			"fw_ver":                    d.FWVer,
			"node_guid":                 d.NodeGUID,
			"sys_image_guid":            d.SysImageGUID,
			"vendor_id":                 fmt.Sprintf("0x%04x", d.VendorID),
			"vendor_part_id":            dec(d.VendorPartID),
			"hw_ver":                    fmt.Sprintf("0x%X", d.HWVer),
			"phys_port_cnt":             dec(d.PhysPortCnt),
			"max_mr_size":               hex(d.MaxMRSize),
			"page_size_cap":             hex(d.PageSizeCap),
			"max_qp":                    dec(d.MaxQP),
			"max_qp_wr":                 dec(d.MaxQPWR),
			"max_sge":                   dec(d.MaxSGE),
			"max_cq":                    dec(d.MaxCQ),
			"max_cqe":                   dec(d.MaxCQE),
			"max_mr":                    dec(d.MaxMR),
			"max_pd":                    dec(d.MaxPD),
			"max_qp_rd_atom":            dec(d.MaxQPRdAtom),
			"max_qp_init_rd_atom":       dec(d.MaxQPInitRdAtom),
			"max_srq":                   dec(d.MaxSRQ),
			"max_srq_wr":                dec(d.MaxSRQWR),
			"max_srq_sge":               dec(d.MaxSRQSGE),
			"max_ah":                    dec(d.MaxAH),
			"max_mcast_grp":             dec(d.MaxMcastGrp),
			"max_mcast_qp_attach":       dec(d.MaxMcastQPAttach),
			"max_total_mcast_qp_attach": dec(d.MaxTotalMcastQPAttach),
			"atomic_cap":                d.AtomicCap + " (1)",
			"state":                     p.State + " (4)",
			"max_mtu":                   mtu(p.MaxMTU),
			"active_mtu":                mtu(p.ActiveMTU),
			"link_layer":                p.LinkLayer,
			"gid_tbl_len":               dec(p.GIDTblLen),
			"phys_state":                "LINK_UP (5)",
			"GID[  0]":                  p.GID.String() + ", RoCE v2",
		} {
			if b[k] != want {
				t.Errorf("%s: ibv_devinfo shows %s %q, the agent says %q", ad.Name(), k, b[k], want)
			}
		}
		// The limits are the agent's, not the defaults.
		if d.MaxQP != uint32(limits.MaxQP) || d.MaxCQ != uint32(limits.MaxCQ) || d.MaxMR != uint32(limits.MaxMR) ||
			d.MaxPD != uint32(limits.MaxPD) || d.MaxSRQ != uint32(limits.MaxQP) || d.MaxSRQWR != 4096 || d.MaxSRQSGE != 16 || d.MaxAH != 65536 ||
			d.MaxMcastGrp != 1024 || d.MaxMcastQPAttach != 64 || d.MaxTotalMcastQPAttach != 65536 {
			t.Errorf("%s: the agent reports %+v, started with %+v", ad.Name(), d, limits)
		}
		if d.MaxMRSize != 8<<20 || p.LinkLayer != "Ethernet" || p.State != "PORT_ACTIVE" || d.AtomicCap != "ATOMIC_HCA" {
			t.Errorf("%s: unexpected agent attributes %+v %+v", ad.Name(), d, p)
		}
	}
	if len(guids) != 2 {
		t.Errorf("the two adapters share node GUID %v", guids)
	}
}

// TestVerbsABINoDevices checks what a program sees when it cannot be a
// workload: no VM named, a VM that does not exist, no agent. The list is
// empty (not an error, as libibverbs without devices) and the library
// says why on stderr.
func TestVerbsABINoDevices(t *testing.T) {
	lib := Build(t)
	NeedProgram(t, "/usr/bin/ibv_devices", "ibverbs-utils")
	env := testenv.Start(t)
	for _, c := range []struct {
		name, socket, vm, why string
	}{
		{"no-vm", env.Socket, "", "VRDMA_VM is not set"},
		{"unknown-vm", env.Socket, "nosuch", "cannot attach VM nosuch"},
		{"no-agent", filepath.Join(t.TempDir(), "none.sock"), "vm1", "no host agent at"},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, stderr, err := run(t, lib, c.socket, c.vm, "/usr/bin/ibv_devices")
			if err != nil {
				t.Fatalf("ibv_devices: %v\n%s%s", err, out, stderr)
			}
			if strings.Contains(out, "vrdma") {
				t.Errorf("devices listed:\n%s", out)
			}
			if !strings.Contains(stderr, c.why) {
				t.Errorf("stderr %q lacks %q", stderr, c.why)
			}
		})
	}
}

// runC compiles guest/ibverbs/tests/NAME.c against the system header,
// links it with the drop-in, runs it as a workload of vm and returns its
// output; it fails t on a failed check ("FAIL ...") or exit status.
func runC(t *testing.T, lib, socket, vm, name string) (string, string) {
	t.Helper()
	return runCSource(t, lib, socket, vm, filepath.Join(SourceDir(), "tests", name+".c"), []string{"libibverbs.so.1"})
}

// compileC compiles the C test src with -Wall -Wextra -Werror against
// libs of the drop-in's build directory lib, and returns the program.
func compileC(t *testing.T, lib, src string, libs []string) string {
	t.Helper()
	name := strings.TrimSuffix(filepath.Base(src), ".c")
	bin := filepath.Join(t.TempDir(), name)
	os.ReadFile(src) // for go test's cache
	ccArgs := []string{"-Wall", "-Wextra", "-Werror", "-o", bin, src}
	for _, l := range libs {
		ccArgs = append(ccArgs, filepath.Join(lib, l))
	}
	if out, err := exec.Command("gcc", ccArgs...).CombinedOutput(); err != nil {
		t.Fatalf("gcc %s.c: %v\n%s", name, err, out)
	}
	return bin
}

// runCSource compiles the C test src against the system headers, links it
// with the drop-ins libs of lib, runs it as a workload of vm with args and
// returns its output; it fails t on a failed check ("FAIL ...") or exit
// status.
func runCSource(t *testing.T, lib, socket, vm, src string, libs []string, args ...string) (string, string) {
	t.Helper()
	bin := compileC(t, lib, src, libs)
	name := filepath.Base(bin)
	out, stderr, err := run(t, lib, socket, vm, bin, args...)
	t.Logf("%s", out)
	if err != nil || strings.Contains(out, "FAIL") {
		t.Fatalf("%s: %v\n%s%s", name, err, out, stderr)
	}
	return out, stderr
}

// TestVerbsABIBadArgs runs guest/ibverbs/tests/abi_check.c: the device
// verbs, their errnos on bad arguments, and the generated stubs.
func TestVerbsABIBadArgs(t *testing.T) {
	lib := Build(t)
	env := testenv.Start(t)
	env.Define(t, "vm1", testenv.VMOptions{})
	out, stderr := runC(t, lib, env.Socket, "vm1", "abi_check")
	if stderr != "" {
		t.Errorf("stderr: %s", stderr)
	}
	if n := strings.Count(out, "ok "); n < 30 {
		t.Errorf("only %d checks ran", n)
	}
}

// TestVerbsABIVerbs runs guest/ibverbs/tests/verbs_check.c: two QPs of one
// VM connected to each other; SEND with immediate and two SGEs, RDMA
// WRITE and READ to the peer's virtual addresses, both atomics, inline
// SEND; what post_send refuses; memory regions over the stack, heap
// neighbours, repeated, inner and partially overlapping ranges, a file's
// private copy and static data, memory that cannot be adopted, a buffer freed before dereg, fork; EBUSY on
// teardown in the wrong order. The refusals must say why on stderr.
func TestVerbsABIVerbs(t *testing.T) {
	lib := Build(t)
	env := testenv.Start(t)
	env.Define(t, "vm1", testenv.VMOptions{MemMB: 8})
	out, stderr := runC(t, lib, env.Socket, "vm1", "verbs_check")
	if n := strings.Count(out, "ok "); n < 50 {
		t.Errorf("only %d checks ran", n)
	}
	for _, why := range []string{"overlaps an earlier registration", "is shared", "is not mapped"} {
		if !strings.Contains(stderr, why) {
			t.Errorf("stderr lacks %q:\n%s", why, stderr)
		}
	}
}

// TestVerbsABIDeadAgent kills vrdmad under a program that holds a
// context, PD, CQ with a completion channel and a QP
// (guest/ibverbs/tests/dead_agent.c): every verb then fails with EIO,
// ibv_get_cq_event returns instead of blocking, teardown works.
func TestVerbsABIDeadAgent(t *testing.T) {
	lib := Build(t)
	env := testenv.StartProcess(t, testenv.ProcessOptions{})
	env.Define(t, "vm1", testenv.VMOptions{})
	bin := filepath.Join(t.TempDir(), "dead_agent")
	cc := exec.Command("gcc", "-Wall", "-Wextra", "-Werror", "-o", bin, filepath.Join(SourceDir(), "tests", "dead_agent.c"),
		filepath.Join(lib, "libibverbs.so.1"))
	if out, err := cc.CombinedOutput(); err != nil {
		t.Fatalf("gcc dead_agent.c: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin)
	cmd.Env = append(Env(lib, env.Socket, "vm1"), "VRDMA_QUIET=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	buf := make([]byte, 4096)
	for !strings.Contains(out.String(), "ready\n") {
		n, err := stdout.Read(buf)
		out.Write(buf[:n])
		if err != nil {
			t.Fatalf("dead_agent before ready: %v\n%s", err, out.String())
		}
	}
	env.Kill()
	if _, err := stdin.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	for {
		n, err := stdout.Read(buf)
		out.Write(buf[:n])
		if err != nil {
			break
		}
	}
	werr := cmd.Wait()
	t.Logf("%s", out.String())
	if werr != nil || strings.Contains(out.String(), "FAIL") || !strings.Contains(out.String(), "ok close-device") {
		t.Fatalf("dead_agent: %v\n%s", werr, out.String())
	}
}

// TestVerbsABIAsyncEvents runs guest/ibverbs/tests/async_check.c: a QP
// the program moves to ERR gives no event; an RDMA WRITE with a bad rkey,
// which the agent answers by moving both QPs to ERR, gives each
// IBV_EVENT_QP_FATAL naming that QP, through poll on async_fd and
// ibv_get_async_event; an empty non-blocking async_fd is EAGAIN.
func TestVerbsABIAsyncEvents(t *testing.T) {
	lib := Build(t)
	env := testenv.Start(t)
	env.Define(t, "vm1", testenv.VMOptions{MemMB: 8})
	out, _ := runC(t, lib, env.Socket, "vm1", "async_check")
	if n := strings.Count(out, "ok "); n < 12 {
		t.Errorf("only %d checks ran", n)
	}
}

// TestVerbsABIPortEvents runs guest/ibverbs/tests/port_events.c: two
// contexts on vm1's adapter, which the test disconnects when the program
// is ready and connects again when it has seen the port go down
// (vrdmactl vm disconnect and connect); each context gets
// IBV_EVENT_PORT_ERR, then IBV_EVENT_PORT_ACTIVE, through poll on its
// async_fd, and ibv_query_port follows.
func TestVerbsABIPortEvents(t *testing.T) {
	lib := Build(t)
	env := testenv.Start(t)
	env.Define(t, "vm1", testenv.VMOptions{MemMB: 8})
	bin := compileC(t, lib, filepath.Join(SourceDir(), "tests", "port_events.c"), []string{"libibverbs.so.1"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ag, err := vrdma.DialAgent(ctx, vrdma.WithSocket(env.Socket))
	if err != nil {
		t.Fatal(err)
	}
	defer ag.Close()
	cmd := exec.CommandContext(ctx, bin)
	cmd.Env = Env(lib, env.Socket, "vm1")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		line := sc.Text()
		out.WriteString(line + "\n")
		switch line {
		case "ready", "down":
			if _, err := ag.ConnectAdapter(ctx, "vm1", "vrdma0", line == "down"); err != nil {
				t.Errorf("after %q: %v", line, err)
			}
		}
	}
	err = cmd.Wait()
	t.Logf("%s", out.String())
	if err != nil || strings.Contains(out.String(), "FAIL") {
		t.Fatalf("port_events: %v\n%s%s", err, out.String(), stderr.String())
	}
	if n := strings.Count(out.String(), "ok "); n != 9 {
		t.Errorf("%d checks passed, want 9", n)
	}
}
