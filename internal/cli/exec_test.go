package cli

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vrdma/vrdma/internal/testenv"
)

// TestExec runs programs through vrdmactl exec against an agent: the
// environment a workload gets, the exit status passed through, the drop-in
// libibverbs built from the sources inside vrdmactl on first use (into a
// fresh cache directory), and ibv_devices as VM vm1's workload with it.
func TestExec(t *testing.T) {
	isolate(t)
	env := testenv.Start(t)
	env.Define(t, "vm1", testenv.VMOptions{Adapters: 2})

	lib := t.TempDir()
	if err := os.WriteFile(filepath.Join(lib, "libibverbs.so.1"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	out := runOK(t, "--socket", env.Socket, "exec", "--vm", "vm1", "--lib", lib, "--", "/bin/sh", "-c", `echo "$VRDMA_VM $VRDMA_SOCKET $LD_LIBRARY_PATH"`)
	if want := "vm1 " + env.Socket + " " + lib; !strings.HasPrefix(strings.TrimSpace(out), want) {
		t.Errorf("the program's environment: %q, want %q first", out, want)
	}
	if _, _, code := run(t, "", "--socket", env.Socket, "exec", "--vm", "vm1", "--lib", lib, "/bin/sh", "-c", "exit 7"); code != 7 {
		t.Errorf("exit status %d, want the program's 7", code)
	}
	if _, errs, code := run(t, "", "exec", "--lib", lib, "--", "true"); code != exitUsage || !strings.Contains(errs, "--vm NAME is required") {
		t.Errorf("exec without --vm: exit %d, %q", code, errs)
	}
	if _, errs, code := run(t, "", "exec", "--vm", "vm1", "--lib", t.TempDir(), "--", "true"); code == 0 || !strings.Contains(errs, "no libibverbs.so.1 in") {
		t.Errorf("exec with an empty --lib: exit %d, %q", code, errs)
	}

	for _, tool := range []string{"gcc", "make", "objdump"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s: install gcc make libibverbs-dev ibverbs-utils", tool)
		}
	}
	if _, err := os.Stat("/usr/include/infiniband/verbs.h"); err != nil {
		t.Skip("no <infiniband/verbs.h>: install libibverbs-dev")
	}
	if _, err := os.Stat("/usr/bin/ibv_devices"); err != nil {
		t.Skip("no ibv_devices: install ibverbs-utils")
	}
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	t.Setenv(libEnv, "")
	out = runOK(t, "--socket", env.Socket, "exec", "--vm", "vm1", "--", "ibv_devices")
	if !strings.Contains(out, "vrdma0") || !strings.Contains(out, "vrdma1") {
		t.Errorf("ibv_devices under exec:\n%s", out)
	}
	built, _ := filepath.Glob(filepath.Join(os.Getenv("XDG_CACHE_HOME"), "vrdma", "libibverbs-*", "libibverbs.so.1"))
	if len(built) != 1 {
		t.Errorf("built libraries in the cache: %v", built)
	}
}

// TestExecSysfs runs a shell through vrdmactl exec --sysfs as root: it
// must find /sys/class/infiniband/vrdma0/device/net/vrdma0, the first GID
// (the IPv4-mapped address) and an interface vrdma0 whose address `ip`
// reports as the VMX's, as rdma-core's tests look for them; and none of
// it may be left on the host afterwards.
func TestExecSysfs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("exec --sysfs needs root (mount and network namespaces)")
	}
	for _, tool := range []string{"ip", "mount"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s: install iproute2 util-linux", tool)
		}
	}
	isolate(t)
	env := testenv.Start(t)
	env.Define(t, "vm1", testenv.VMOptions{IPv4: []string{"10.88.0.7"}})
	lib := t.TempDir()
	if err := os.WriteFile(filepath.Join(lib, "libibverbs.so.1"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	out := runOK(t, "--socket", env.Socket, "exec", "--sysfs", "--vm", "vm1", "--lib", lib, "--", "/bin/sh", "-c",
		`ls /sys/class/infiniband/vrdma0/device/net/; cat /sys/class/infiniband/vrdma0/ports/1/gids/0; ip -o -4 addr show vrdma0`)
	for _, want := range []string{"vrdma0\n", "0000:0000:0000:0000:0000:ffff:0a58:0007", "inet 10.88.0.7/32"} {
		if !strings.Contains(out, want) {
			t.Errorf("the view lacks %q:\n%s", want, out)
		}
	}
	if b, err := exec.Command("ip", "link", "show", "vrdma0").CombinedOutput(); err == nil {
		t.Errorf("vrdma0 is on the host after exec --sysfs:\n%s", b)
	}
	if b, _ := os.ReadFile("/proc/self/mounts"); strings.Contains(string(b), "vrdma-sysfs") {
		t.Errorf("the view's tmpfs is mounted on the host after exec --sysfs")
	}
}
