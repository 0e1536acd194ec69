// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/control/etcdtest"
	"github.com/vrdma/vrdma/internal/testenv"
)

// Tests of vrdmactl doctor: each plants a real problem on this host (no
// agent at the socket, a stale socket, an unreachable etcd, an address no
// interface has, a UDP socket holding 4791, an agent whose memory-lock
// limit is lower than its VMs need) and checks that doctor reports it.
// They use loopback addresses 127.0.0.213 and 127.0.0.214 for UDP 4791,
// which no other test binds.

// doctorRun runs doctor and decodes its JSON report; it returns the exit
// code and the checks by name.
func doctorRun(t *testing.T, args ...string) (int, doctorReport, map[string]doctorCheck) {
	t.Helper()
	start := time.Now()
	out, errs, code := run(t, "", append(args, "doctor", "-o", "json")...)
	t.Logf("doctor %s: exit %d in %v", strings.Join(args, " "), code, time.Since(start))
	var rep doctorReport
	if err := unmarshalPrinted([]byte(out), &rep); err != nil {
		t.Fatalf("doctor -o json: exit %d, not JSON: %v\n%s\nstderr: %s", code, err, out, errs)
	}
	byName := map[string]doctorCheck{}
	for _, c := range rep.Checks {
		byName[c.Name] = c
	}
	for _, n := range []string{"agent", "memlock", "control-plane", "uplinks", "port-4791", "clock"} {
		if _, ok := byName[n]; !ok {
			t.Fatalf("doctor reports no check %q: %+v", n, rep.Checks)
		}
	}
	return code, rep, byName
}

// wantCheck fails the test unless check name has status and its detail
// says every one of says.
func wantCheck(t *testing.T, checks map[string]doctorCheck, name, status string, says ...string) {
	t.Helper()
	c := checks[name]
	if c.Status != status {
		t.Errorf("check %s: %s, want %s: %s (fix: %s)", name, c.Status, status, c.Detail, c.Fix)
		return
	}
	for _, s := range says {
		if !strings.Contains(c.Detail, s) {
			t.Errorf("check %s: %q does not say %q", name, c.Detail, s)
		}
	}
	if status == checkFail && c.Fix == "" {
		t.Errorf("check %s fails without saying what to do: %s", name, c.Detail)
	}
}

func TestDoctorHealthyHost(t *testing.T) {
	isolate(t)
	ep := etcdtest.Start(t).ClientURL()
	env := testenv.StartControl(t, "esx213", hostCfg(ep, "127.0.0.213", true))

	code, rep, checks := doctorRun(t, "--socket", env.Socket, "--etcd-endpoints", ep)
	me := os.Getpid() // the agent runs in this process
	wantCheck(t, checks, "agent", checkPass, "host esx213", fmt.Sprintf("pid %d", me), env.Socket)
	wantCheck(t, checks, "memlock", checkPass, fmt.Sprintf("the agent (pid %d) may lock", me))
	wantCheck(t, checks, "control-plane", checkPass, ep, "etcd 3.")
	wantCheck(t, checks, "uplinks", checkPass, "PVRDMA address 127.0.0.213:4791 on lo", "RDMA uplink 127.0.0.213:4791 on lo")
	// Other processes on this machine may hold UDP 4791 on other
	// addresses (a warning, not a failure); 127.0.0.213 is the agent's.
	if c := checks["port-4791"]; c.Status == checkFail || !strings.Contains(c.Detail, fmt.Sprintf("RDMA uplink 127.0.0.213:4791: held by vrdmad (pid %d)", me)) {
		t.Errorf("port-4791: %+v", c)
	}
	if c := checks["clock"]; c.Status == checkFail {
		t.Errorf("clock: %+v", c)
	}
	if code != exitOK || !rep.OK || rep.Failed != 0 {
		t.Errorf("doctor on a healthy host: exit %d, %+v", code, rep)
	}

	// The text form: one line per check, and the tally.
	out, _, code := run(t, "", "--socket", env.Socket, "--etcd-endpoints", ep, "doctor")
	t.Logf("doctor:\n%s", out)
	for _, want := range []string{"PASS  agent ", "PASS  control-plane ", "PASS  uplinks ", "6 checks: 0 failed"} {
		if !strings.Contains(out, want) {
			t.Errorf("doctor (text, exit %d) lacks %q:\n%s", code, want, out)
		}
	}
}

func TestDoctorPlantedProblems(t *testing.T) {
	tmp := isolate(t)
	// UDP 4791 on 127.0.0.214 held by this process, which is no vrdmad.
	pc, err := net.ListenPacket("udp", "127.0.0.214:4791")
	if err != nil {
		t.Fatalf("hold UDP 4791 on 127.0.0.214: %v", err)
	}
	defer pc.Close()

	noAgent := filepath.Join(tmp, "nosuch", "vrdmad.sock")
	code, rep, checks := doctorRun(t, "--socket", noAgent, "--etcd-endpoints", "http://127.0.0.1:1",
		"--rdma-uplink", "127.0.0.214", "--rdma-uplink", "192.0.2.77")
	if code != exitFailure || rep.OK {
		t.Errorf("doctor with problems: exit %d, ok %v; want exit 1", code, rep.OK)
	}
	wantCheck(t, checks, "agent", checkFail, "no agent", noAgent, "does not exist")
	wantCheck(t, checks, "memlock", checkWarn, "no agent to read the limit of")
	wantCheck(t, checks, "control-plane", checkFail, "http://127.0.0.1:1")
	wantCheck(t, checks, "uplinks", checkFail, "--rdma-uplink 192.0.2.77: 192.0.2.77 is not an address of this host", "bound: --rdma-uplink 127.0.0.214 on lo")
	wantCheck(t, checks, "port-4791", checkFail,
		fmt.Sprintf("--rdma-uplink 127.0.0.214: UDP 4791 on 127.0.0.214 is held by pid %d (", os.Getpid()), "not by vrdmad")

	// The text form says what to fix.
	out, _, code := run(t, "", "--socket", noAgent, "--rdma-uplink", "127.0.0.214", "doctor")
	if code != exitFailure || !strings.Contains(out, "FAIL  agent ") || !strings.Contains(out, "FAIL  port-4791 ") || !strings.Contains(out, "fix: start the agent") {
		t.Errorf("doctor (text): exit %d\n%s", code, out)
	}

	// Released, the port is free again, and the uplink address passes.
	pc.Close()
	_, _, checks = doctorRun(t, "--socket", noAgent, "--rdma-uplink", "127.0.0.214")
	if c := checks["port-4791"]; c.Status == checkFail || !strings.Contains(c.Detail, "--rdma-uplink 127.0.0.214: UDP 4791 free") {
		t.Errorf("port-4791 after the socket closed: %+v", c)
	}

	// A stale socket: the file is there, nobody listens.
	stale := filepath.Join(tmp, "stale.sock")
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: stale, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	_, _, checks = doctorRun(t, "--socket", stale)
	wantCheck(t, checks, "agent", checkFail, stale, "no process listens")

	if _, errs, code := run(t, "", "doctor", "--rdma-uplink", "not-an-ip"); code != exitUsage || !strings.Contains(errs, "not-an-ip") {
		t.Errorf("doctor --rdma-uplink not-an-ip: exit %d, %q", code, errs)
	}
}

// TestDoctorStandaloneAgent: an agent without a control plane is a
// warning, not a failure.
func TestDoctorStandaloneAgent(t *testing.T) {
	isolate(t)
	env := testenv.Start(t)
	code, _, checks := doctorRun(t, "--socket", env.Socket)
	wantCheck(t, checks, "agent", checkPass, "host hostA")
	wantCheck(t, checks, "control-plane", checkWarn, "--no-control-plane")
	if checks["uplinks"].Status != checkPass {
		t.Errorf("uplinks: %+v", checks["uplinks"])
	}
	if checks["port-4791"].Status == checkFail || checks["clock"].Status == checkFail {
		t.Errorf("port-4791 %+v, clock %+v", checks["port-4791"], checks["clock"])
	}
	if code != exitOK {
		t.Errorf("doctor: exit %d, want 0 (warnings only)", code)
	}
}

// TestDoctorMemlock runs a vrdmad process whose RLIMIT_MEMLOCK is set to
// 64 KiB (prlimit on its pid, soft limit) without CAP_IPC_LOCK (as root, setpriv
// drops it), defines a VM that reserves and locks 4 MiB, and checks that
// doctor's verdict is what attaching the VM does: fail and refused; then,
// the limit raised, pass and attached.
func TestDoctorMemlock(t *testing.T) {
	isolate(t)
	var wrap []string
	if os.Geteuid() == 0 {
		p, err := exec.LookPath("setpriv")
		if err != nil {
			t.Skip("as root the agent needs setpriv (util-linux) to run without CAP_IPC_LOCK, which lifts the memory-lock limit")
		}
		wrap = []string{p, "--inh-caps=-ipc_lock", "--bounding-set=-ipc_lock", "--"}
	}
	env := testenv.StartProcess(t, testenv.ProcessOptions{Wrap: wrap})
	pid := env.PID(t)
	// The soft limit only: raising a hard limit takes CAP_SYS_RESOURCE,
	// which a test may not have.
	var lim unix.Rlimit
	if err := unix.Prlimit(pid, unix.RLIMIT_MEMLOCK, nil, &lim); err != nil {
		t.Fatalf("prlimit(%d, RLIMIT_MEMLOCK): %v", pid, err)
	}
	setMemlock := func(n uint64) {
		t.Helper()
		t.Logf("agent pid %d: RLIMIT_MEMLOCK soft %d, hard %d", pid, n, lim.Max)
		if err := unix.Prlimit(pid, unix.RLIMIT_MEMLOCK, &unix.Rlimit{Cur: n, Max: lim.Max}, nil); err != nil {
			t.Fatalf("prlimit(%d, RLIMIT_MEMLOCK, %d): %v", pid, n, err)
		}
	}
	setMemlock(64 << 10)
	env.Define(t, "big", testenv.VMOptions{MemMB: 4, Locked: true})
	env.Define(t, "small", testenv.VMOptions{MemMB: 4})

	code, _, checks := doctorRun(t, "--socket", env.Socket)
	wantCheck(t, checks, "memlock", checkFail, fmt.Sprintf("the agent (pid %d) may lock 64 KiB", pid), "lacks CAP_IPC_LOCK", "lock 4 MiB (big 4 MiB)")
	if code != exitFailure {
		t.Errorf("doctor: exit %d, want 1", code)
	}
	if strings.Contains(checks["memlock"].Detail, "small") {
		t.Errorf("memlock counts a VM that does not lock its memory: %s", checks["memlock"].Detail)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if v, err := vrdma.Open(ctx, "big", vrdma.WithSocket(env.Socket)); err == nil {
		v.Close()
		t.Fatal("doctor says the limit is too low, but the VM attached with its memory locked")
	} else if !strings.Contains(err.Error(), "RLIMIT_MEMLOCK") {
		t.Fatalf("attach big: %v; want the memory-lock limit's refusal", err)
	}

	if lim.Max < 8<<20 {
		t.Skipf("the hard memory-lock limit is %d bytes: too low to raise the agent's to 8 MiB", lim.Max)
	}
	setMemlock(8 << 20)
	_, _, checks = doctorRun(t, "--socket", env.Socket)
	wantCheck(t, checks, "memlock", checkPass, "may lock 8 MiB", "big 4 MiB")
	v, err := vrdma.Open(ctx, "big", vrdma.WithSocket(env.Socket))
	if err != nil {
		t.Fatalf("doctor says the limit suffices, but attach fails: %v", err)
	}
	defer v.Close()
	if !v.MemoryLocked() {
		t.Error("big attached without its memory locked")
	}
	_, _, checks = doctorRun(t, "--socket", env.Socket)
	wantCheck(t, checks, "memlock", checkPass, "big 4 MiB")
}

func TestProcAddr(t *testing.T) {
	for _, c := range []struct{ hex, want string }{
		{"D50000 7F", ""},
		{"D500007F", "127.0.0.213"},
		{"00000000", "0.0.0.0"},
		{"0000000000000000FFFF0000D600007F", "127.0.0.214"},
		{"00000000000000000000000001000000", "::1"},
		{"00000000000000000000000000000000", "::"},
	} {
		a, err := procAddr(c.hex)
		if c.want == "" {
			if err == nil {
				t.Errorf("procAddr(%q) = %v, want an error", c.hex, a)
			}
			continue
		}
		if err != nil || a != netip.MustParseAddr(c.want) {
			t.Errorf("procAddr(%q) = %v, %v; want %s", c.hex, a, err, c.want)
		}
	}
}
