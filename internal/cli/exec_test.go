// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
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

	lib := emptyLib(t)
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
	lib := emptyLib(t)
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
	if b, _ := os.ReadFile("/proc/self/mounts"); strings.Contains(string(b), "vrdma-view") {
		t.Errorf("the view's tmpfs is mounted on the host after exec --sysfs")
	}
}

// viewCheck is the shell a TestExecView program runs: what UCX and
// rdma-core's tests look for, and that the host's /dev and /sys/class
// are still there around it.
const viewCheck = `set -e
test -c /dev/infiniband/uverbs0 && test -r /dev/infiniband/uverbs0 && test -w /dev/infiniband/uverbs0 && echo uverbs0-rw
test -c /dev/infiniband/uverbs1 && echo uverbs1
echo x > /dev/infiniband/uverbs0
cd /sys/class/infiniband/vrdma0
echo "type=$(cat ports/1/gid_attrs/types/0) ndev=$(cat ports/1/gid_attrs/ndevs/0) gid=$(cat ports/1/gids/0) node=$(cat node_type) ll=$(cat ports/1/link_layer)"
echo "ibdev=$(cat /sys/class/infiniband_verbs/uverbs1/ibdev) abi=$(cat /sys/class/infiniband_verbs/abi_version)"
ls -d device/net/vrdma0 /sys/class/net/lo /dev/pts /dev/shm
echo data > /dev/null
id -u
`

// TestExecView runs a shell through vrdmactl exec (without --sysfs) and
// checks the device view a workload finds — /dev/infiniband/uverbsN, a
// character device it may open read-write, and
// /sys/class/infiniband/vrdmaN and /sys/class/infiniband_verbs/uverbsN
// with the files UCX reads — beside the host's own /dev and /sys/class,
// and that nothing of it is left on the host. As root in a mount
// namespace; as uid 65534 (the built vrdmactl) in a user and mount
// namespace, where the program keeps its uid and has no capability; and
// where the kernel refuses a user namespace (a process in one that does
// not map its uid), exec says what the program lacks and runs it anyway.
func TestExecView(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: it checks the view as root and as another user (run as root; CI does)")
	}
	tmp := isolate(t)
	env := testenv.Start(t)
	env.Define(t, "vm1", testenv.VMOptions{Adapters: 2, IPv4: []string{"10.88.0.7"}})
	lib := emptyLib(t)
	check := func(t *testing.T, out, uid string) {
		t.Helper()
		for _, want := range []string{"uverbs0-rw\n", "uverbs1\n",
			"type=RoCE v2 ndev=vrdma0 gid=0000:0000:0000:0000:0000:ffff:0a58:0007 node=1: CA ll=Ethernet\n",
			"ibdev=vrdma1 abi=6\n", "device/net/vrdma0\n", "/sys/class/net/lo\n", "\n" + uid + "\n"} {
			if !strings.Contains(out, want) {
				t.Errorf("the view lacks %q:\n%s", want, out)
			}
		}
		if b, _ := os.ReadFile("/proc/self/mounts"); strings.Contains(string(b), "vrdma-view") {
			t.Errorf("the view's tmpfs is mounted on the host after exec")
		}
		if _, err := os.Stat("/sys/class/infiniband_verbs/uverbs1"); err == nil {
			t.Errorf("the view's uverbs1 is on the host after exec")
		}
	}
	t.Run("root", func(t *testing.T) {
		out := runOK(t, "--socket", env.Socket, "exec", "--vm", "vm1", "--lib", lib, "--", "/bin/sh", "-c", viewCheck)
		check(t, out, "0")
		out = runOK(t, "--socket", env.Socket, "exec", "--no-view", "--vm", "vm1", "--lib", lib, "--", "/bin/sh", "-c", "test -e /sys/class/infiniband_verbs/uverbs1 || echo no-view")
		if out != "no-view\n" {
			t.Errorf("exec --no-view: %q, want the host's /sys/class", out)
		}
	})
	t.Run("refused", func(t *testing.T) {
		// In a user namespace that does not map its uid, a process may
		// not make another: exec must say what the program lacks and run
		// it without the view.
		if _, err := exec.LookPath("unshare"); err != nil {
			t.Skip("no unshare: install util-linux")
		}
		bin := testenv.Binary(t, "vrdmactl")
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "unshare", "--user", bin, "--socket", env.Socket, "exec", "--vm", "vm1", "--lib", lib, "--",
			"/bin/sh", "-c", "test -e /dev/infiniband/uverbs0 || echo ran-without-view")
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("exec in an unmapped user namespace: %v\n%s%s", err, stdout.String(), stderr.String())
		}
		if stdout.String() != "ran-without-view\n" {
			t.Errorf("the program's output %q, want it run without the view", stdout.String())
		}
		for _, want := range []string{"no namespace for the device view", "refuses uid 65534 a user namespace", "UCX", "find no device"} {
			if !strings.Contains(stderr.String(), want) {
				t.Errorf("exec's message lacks %q:\n%s", want, stderr.String())
			}
		}
	})
	t.Run("user", func(t *testing.T) {
		const nobody = 65534
		bin := testenv.Binary(t, "vrdmactl")
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		ag, err := vrdma.DialAgent(ctx, vrdma.WithSocket(env.Socket))
		if err != nil {
			t.Fatal(err)
		}
		defer ag.Close()
		vmx := testenv.VMX(testenv.VMOptions{Adapters: 2, IPv4: []string{"10.88.0.7"}})
		if err := ag.DefineVMFor(ctx, "vm-nobody", []byte(vmx), vrdma.Owner{UID: nobody, GID: nobody}); err != nil {
			t.Fatal(err)
		}
		// vrdmactl and the library where uid 65534 can reach them.
		dir, err := os.MkdirTemp("/tmp", "vrdma-view")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(dir)
		for _, d := range []string{dir, tmp, filepath.Dir(env.Socket)} {
			if err := os.Chmod(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		ctl := filepath.Join(dir, "vrdmactl")
		b, err := os.ReadFile(bin)
		if err == nil {
			err = os.WriteFile(ctl, b, 0o755)
		}
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, "libibverbs.so.1"), nil, 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.CommandContext(ctx, ctl, "--socket", env.Socket, "exec", "--vm", "vm-nobody", "--lib", dir, "--", "/bin/sh", "-c",
			viewCheck+"grep -E '^Cap(Inh|Prm|Eff|Amb)' /proc/self/status\n")
		cmd.Env = []string{"HOME=" + dir, "PATH=/usr/bin:/bin"}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
		outb, err := cmd.CombinedOutput()
		out := string(outb)
		if err != nil {
			t.Fatalf("exec as uid %d: %v\n%s", nobody, err, out)
		}
		check(t, out, fmt.Sprint(nobody))
		if n := strings.Count(out, ":\t0000000000000000\n"); n != 4 {
			t.Errorf("the program has capabilities (want none in any set):\n%s", out)
		}
	})
}

// TestNetnsExecRefused: exec --netns on a host whose agent makes no VM
// namespaces is refused, saying how to get them, and runs nothing.
func TestNetnsExecRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("exec --netns needs root (its refusal for a user has a test of its own)")
	}
	isolate(t)
	env := testenv.Start(t)
	env.Define(t, "vm1", testenv.VMOptions{IPv4: []string{"10.88.0.7"}})
	lib := emptyLib(t)
	out, errs, code := run(t, "", "--socket", env.Socket, "exec", "--netns", "--vm", "vm1", "--lib", lib, "--", "/bin/echo", "ran")
	if code == 0 || strings.Contains(out, "ran") || !strings.Contains(errs, "start vrdmad with --vm-netns") {
		t.Errorf("exec --netns without VM namespaces: exit %d, stdout %q, stderr %q", code, out, errs)
	}
}

// emptyLib returns a directory holding an empty libibverbs.so.1: exec
// takes it as --lib, for programs that do not load it.
func emptyLib(t *testing.T) string {
	t.Helper()
	lib := t.TempDir()
	if err := os.WriteFile(filepath.Join(lib, "libibverbs.so.1"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return lib
}
