// SPDX-License-Identifier: Apache-2.0

// Package contrib holds files to install vrdma with (the systemd unit);
// its tests check them.
package contrib

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/cli"
	"github.com/vrdma/vrdma/internal/locations"
	"github.com/vrdma/vrdma/internal/testenv"
	"github.com/vrdma/vrdma/internal/verbsabi"
)

const unitFile = "vrdmad.service"

// unit is a parsed systemd unit: section → key → values, in order.
type unit map[string]map[string][]string

func readUnit(t *testing.T, text string) unit {
	t.Helper()
	u, sec := unit{}, ""
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			sec = line[1 : len(line)-1]
			u[sec] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || sec == "" {
				t.Fatalf("%s:%d: not KEY=VALUE in a section: %q", unitFile, i+1, line)
			}
			u[sec][k] = append(u[sec][k], v)
		}
	}
	return u
}

// get returns the last value of key in [Service].
func (u unit) get(key string) string {
	vs := u["Service"][key]
	if len(vs) == 0 {
		return ""
	}
	return vs[len(vs)-1]
}

func loadUnit(t *testing.T) (string, unit) {
	t.Helper()
	b, err := os.ReadFile(unitFile)
	if err != nil {
		t.Fatal(err)
	}
	return string(b), readUnit(t, string(b))
}

// TestUnitSettings checks what the unit promises: the socket and state
// directories that vrdmad uses by default as root, no memory-lock limit,
// a restart on failure, hardening.
func TestUnitSettings(t *testing.T) {
	_, u := loadUnit(t)
	for k, want := range map[string]string{
		"Type": "notify", "NotifyAccess": "main", "RuntimeDirectory": "vrdma", "RuntimeDirectoryMode": "0755", "StateDirectory": "vrdma",
		"StateDirectoryMode": "0700", "LimitMEMLOCK": "infinity", "Restart": "on-failure", "NoNewPrivileges": "yes",
		"ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
	} {
		if got := u.get(k); got != want {
			t.Errorf("[Service] %s=%q, want %q", k, got, want)
		}
	}
	// RoCE v1 frames go through a packet socket: without AF_PACKET the
	// rocev2-soft uplink would run RoCE v2 only.
	if fams := strings.Fields(u.get("RestrictAddressFamilies")); !slices.Contains(fams, "AF_PACKET") || !slices.Contains(fams, "AF_UNIX") {
		t.Errorf("RestrictAddressFamilies=%v: want AF_PACKET (RoCE v1) and AF_UNIX among them", fams)
	}
	start := u.get("ExecStart")
	if !strings.Contains(start, "--socket-group vrdma") {
		t.Errorf("ExecStart=%s: want --socket-group vrdma (the socket for the group's members, not every user)", start)
	}
	// The unit names the root defaults explicitly, and they must be the
	// ones vrdmactl looks for (locations.Socket and locations.StateDir as root).
	if !strings.Contains(start, "--socket /run/vrdma/vrdmad.sock") || !strings.Contains(start, "--state-dir /var/lib/vrdma") {
		t.Errorf("ExecStart=%s: want --socket /run/vrdma/vrdmad.sock (in RuntimeDirectory) and --state-dir /var/lib/vrdma (StateDirectory)", start)
	}
	if os.Geteuid() == 0 && (locations.Socket() != "/run/vrdma/vrdmad.sock" && os.Getenv("VRDMA_SOCKET") == "" || locations.StateDir() != "/var/lib/vrdma") {
		t.Errorf("root's defaults are %s and %s; the unit uses /run/vrdma/vrdmad.sock and /var/lib/vrdma", locations.Socket(), locations.StateDir())
	}
	if got := u["Install"]["WantedBy"]; len(got) != 1 || got[0] != "multi-user.target" {
		t.Errorf("[Install] WantedBy=%v", got)
	}
}

// TestUnitVerifies runs systemd-analyze verify on the unit, with ExecStart
// pointing at a vrdmad built from this module (verify checks that the
// binary exists), and on a broken copy, which it must reject.
func TestUnitVerifies(t *testing.T) {
	tool, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed (apt-get install systemd): the unit is not verified")
	}
	text, _ := loadUnit(t)
	bin := testenv.AgentBinary(t)
	verify := func(text string) (string, error) {
		dir := t.TempDir()
		p := filepath.Join(dir, unitFile)
		if err := os.WriteFile(p, []byte(strings.ReplaceAll(text, "/usr/local/bin/vrdmad", bin)), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(tool, "verify", p).CombinedOutput()
		return string(out), err
	}
	out, err := verify(text)
	if err != nil || strings.Contains(out, unitFile) {
		t.Fatalf("systemd-analyze verify %s: %v\n%s", unitFile, err, out)
	}
	// A unit systemd would not run: verify must say so, or this test
	// proves nothing.
	broken := strings.Replace(text, "ExecStart=/usr/local/bin/vrdmad", "ExecStart=/nonexistent/vrdmad", 1)
	if out, err := verify(broken); err == nil && !strings.Contains(out, "nonexistent") {
		t.Fatalf("systemd-analyze verify accepts a unit whose binary does not exist:\n%s", out)
	}
	if out, err := exec.Command(tool, "security", "--offline=yes", filepath.Join(".", unitFile)).CombinedOutput(); err == nil {
		if i := strings.Index(string(out), "Overall exposure level"); i >= 0 {
			t.Logf("systemd-analyze security: %s", strings.TrimSpace(string(out[i:])))
		}
	}
}

// start starts cmd with its stderr in a buffer, and returns that buffer,
// a channel closed when cmd has exited and where Wait's error is then; the
// test's cleanup kills cmd.
func start(t *testing.T, cmd *exec.Cmd) (*bytes.Buffer, <-chan struct{}, *error) {
	t.Helper()
	stderr := new(bytes.Buffer)
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited, waitErr := make(chan struct{}), new(error)
	go func() { *waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	return stderr, exited, waitErr
}

// TestUnitSandbox runs vrdmad as the unit does, with the unit's ExecStart
// flags, its capability bounding set and no_new_privs (through setpriv):
// the embedded etcd, a PVRDMA address and a software RoCEv2 uplink on
// 127.0.0.215, and a VM that locks 16 MiB of guest memory, more than the
// memory-lock limit of this test, which the unit's CAP_IPC_LOCK allows.
// vrdmactl doctor must then find nothing to fail. systemd's own
// sandboxing (ProtectSystem, RestrictAddressFamilies, PrivateDevices, ...)
// needs systemd as PID 1 and is not exercised here.
func TestUnitSandbox(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the unit runs vrdmad as root with a reduced capability bounding set")
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("needs setpriv (util-linux) to apply the unit's capabilities and no_new_privs")
	}
	_, u := loadUnit(t)
	// The unit's group vrdma need not exist here: the test gives the
	// socket to a group by number, which the agent accepts too.
	const socketGroup = 65534
	caps := []string{"-all"}
	for _, c := range strings.Fields(u.get("CapabilityBoundingSet")) {
		caps = append(caps, "+"+strings.ToLower(strings.TrimPrefix(c, "CAP_")))
	}
	wrap := []string{setpriv, "--inh-caps=-all", "--bounding-set=" + strings.Join(caps, ",")}
	if u.get("NoNewPrivileges") == "yes" {
		wrap = append(wrap, "--no-new-privs")
	}
	// The agent gives its socket to its group without CAP_CHOWN, as a
	// member of it (SupplementaryGroups).
	if u.get("SupplementaryGroups") != "vrdma" {
		t.Errorf("SupplementaryGroups=%q, want vrdma, the --socket-group", u.get("SupplementaryGroups"))
	}
	wrap = append(wrap, "--groups="+strconv.Itoa(socketGroup))

	dir, err := os.MkdirTemp("", "vrdmaunit")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	run, state := filepath.Join(dir, "run"), filepath.Join(dir, "state")
	for _, d := range []string{run, state} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	socket := filepath.Join(run, "vrdmad.sock")
	execStart := strings.NewReplacer("/usr/local/bin/vrdmad", testenv.AgentBinary(t), "/run/vrdma", run, "/var/lib/vrdma", state,
		"--socket-group vrdma", "--socket-group "+strconv.Itoa(socketGroup),
		"$VRDMAD_OPTS", "--host unit215 --switch dvs1 --pvrdma-address 127.0.0.215:7471 --firewall-pvrdma --rdma-uplink rocev2-soft/127.0.0.215 --log-level warn").
		Replace(u.get("ExecStart"))
	args := append(wrap, "--")
	args = append(args, strings.Fields(execStart)...)
	cmd := exec.Command(args[0], args[1:]...)
	stderr, exited, waitErr := start(t, cmd)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		ag, err := vrdma.DialAgent(ctx, vrdma.WithSocket(socket))
		if err == nil {
			ag.Close()
			break
		}
		select {
		case <-exited:
			t.Fatalf("vrdmad under the unit's sandbox exited: %v\n%s", *waitErr, stderr.String())
		case <-ctx.Done():
			t.Fatalf("vrdmad under the unit's sandbox does not answer: %v\n%s", err, stderr.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
	if fi, err := os.Stat(socket); err != nil || fi.Mode().Perm() != 0o660 || fi.Sys().(*syscall.Stat_t).Gid != socketGroup {
		t.Errorf("socket %s: %v, want mode 0660 and group %d (--socket-group)", socket, fi.Mode(), socketGroup)
	}
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(st), "NoNewPrivs:\t1") || !strings.Contains(string(st), "CapEff:\t0000000000007000") {
		t.Errorf("vrdmad does not run with the unit's privileges (CAP_IPC_LOCK, CAP_NET_ADMIN, CAP_NET_RAW = 0x7000, no_new_privs):\n%s", st)
	}

	ag, err := vrdma.DialAgent(ctx, vrdma.WithSocket(socket))
	if err != nil {
		t.Fatal(err)
	}
	defer ag.Close()
	vmx := testenv.VMX(testenv.VMOptions{MemMB: 16, Locked: true})
	if err := ag.DefineVM(ctx, "locked16", []byte(vmx)); err != nil {
		t.Fatalf("define: %v", err)
	}
	v, err := vrdma.Open(ctx, "locked16", vrdma.WithSocket(socket))
	if err != nil {
		t.Fatalf("attach a VM that locks 16 MiB under the unit's capabilities: %v\n%s", err, stderr.String())
	}
	defer v.Close()
	if !v.MemoryLocked() {
		t.Error("the VM's memory is not locked")
	}

	var out, errb bytes.Buffer
	code := cli.Main([]string{"--socket", socket, "--state-dir", state, "doctor", "-o", "json"}, strings.NewReader(""), &out, &errb)
	var rep struct {
		Checks []struct{ Name, Status, Detail string }
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("doctor: exit %d, %v\n%s%s", code, err, out.String(), errb.String())
	}
	for _, c := range rep.Checks {
		if c.Status == "fail" {
			t.Errorf("doctor on the sandboxed agent: %s fails: %s", c.Name, c.Detail)
		}
	}
	if code != 0 {
		t.Errorf("doctor: exit %d\n%s", code, out.String())
	}
	t.Logf("doctor:\n%s", out.String())
}

// TestUnitNotify runs vrdmad as systemd does for Type=notify, with
// $NOTIFY_SOCKET naming a datagram socket the test listens on: the agent
// must send READY=1 once its socket answers, and STOPPING=1 on SIGTERM,
// then exit 0.
func TestUnitNotify(t *testing.T) {
	dir, err := os.MkdirTemp("", "vrdmanotify")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ns := filepath.Join(dir, "notify")
	ln, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: ns, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	socket := filepath.Join(dir, "vrdmad.sock")
	cmd := exec.Command(testenv.AgentBinary(t), "--socket", socket, "--state-dir", filepath.Join(dir, "state"), "--no-control-plane", "--log-level", "warn")
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+ns)
	stderr, exited, waitErr := start(t, cmd)
	read := func(want string) {
		t.Helper()
		ln.SetReadDeadline(time.Now().Add(30 * time.Second))
		buf := make([]byte, 4096)
		n, err := ln.Read(buf)
		if err != nil || string(buf[:n]) != want {
			t.Fatalf("on NOTIFY_SOCKET: %q, %v; want %q\n%s", buf[:n], err, want, stderr.String())
		}
	}
	read("READY=1")
	// Ready means served: the socket answers now, without retrying.
	ag, err := vrdma.DialAgent(context.Background(), vrdma.WithSocket(socket))
	if err != nil {
		t.Fatalf("READY=1 sent, but the socket does not answer: %v", err)
	}
	ag.Close()
	cmd.Process.Signal(syscall.SIGTERM)
	read("STOPPING=1")
	select {
	case <-exited:
		if *waitErr != nil {
			t.Errorf("vrdmad after SIGTERM: %v\n%s", *waitErr, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("vrdmad does not exit within 30 s of SIGTERM")
	}
}

// TestSystemSocketUnprivileged runs what the unit sets up, in a mount
// namespace of its own (a fresh /run, so that the machine's is not
// touched): vrdmad serving /run/vrdma/vrdmad.sock for a group, and an
// unmodified ibv_devinfo and vrdmactl run by a member of the group with
// no VRDMA_SOCKET and no agent of its own, which must find the system's
// socket; a user outside the group must be refused by the socket's mode.
func TestSystemSocketUnprivileged(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: it mounts a private /run and runs programs as other users")
	}
	for _, p := range []string{"unshare", "setpriv", "ibv_devinfo"} {
		if _, err := exec.LookPath(p); err != nil {
			t.Skipf("needs %s (util-linux, ibverbs-utils)", p)
		}
	}
	lib := verbsabi.Build(t)
	dir, err := os.MkdirTemp("", "vrdmasys")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// Copies the other users can read: the library, vrdmactl, the VMX.
	pub := filepath.Join(dir, "lib")
	os.Mkdir(pub, 0o755)
	libs, _ := filepath.Glob(filepath.Join(lib, "*.so*"))
	for _, l := range libs {
		b, err := os.ReadFile(l)
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(pub, filepath.Base(l)), b, 0o755)
	}
	ctl := filepath.Join(dir, "vrdmactl")
	b, err := os.ReadFile(testenv.Binary(t, "vrdmactl"))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(ctl, b, 0o755)
	vmx := filepath.Join(dir, "vmu.vmx")
	os.WriteFile(vmx, []byte(testenv.VMX(testenv.VMOptions{})), 0o644)

	const member, outsider = 65534, 65533
	script := `set -e
mount -t tmpfs -o mode=0755 tmpfs /run
mkdir -m 0755 /run/vrdma
"$AGENT" --socket /run/vrdma/vrdmad.sock --socket-group ` + strconv.Itoa(member) + ` --state-dir "$DIR/state" --no-control-plane --log-level warn &
agent=$!
trap 'kill $agent; wait $agent' EXIT
i=0; until [ -S /run/vrdma/vrdmad.sock ]; do i=$((i+1)); [ $i -lt 300 ] || exit 9; sleep 0.1; done
"$CTL" --socket /run/vrdma/vrdmad.sock vm define vmu "$DIR/vmu.vmx" --owner ` + strconv.Itoa(member) + `:` + strconv.Itoa(member) + `
stat -c 'socket %a %g' /run/vrdma/vrdmad.sock
as() { u=$1; shift; setpriv --reuid $u --regid $u --clear-groups env -i PATH=/usr/bin:/bin HOME=/ XDG_RUNTIME_DIR="$DIR/xdg-$u" VRDMA_VM=vmu LD_LIBRARY_PATH="$DIR/lib" "$@"; }
echo "== member ibv_devinfo"; as ` + strconv.Itoa(member) + ` ibv_devinfo 2>&1 || true
echo "== member vrdmactl"; as ` + strconv.Itoa(member) + ` "$CTL" status -o json 2>&1 || true
echo "== outsider ibv_devinfo"; as ` + strconv.Itoa(outsider) + ` ibv_devinfo 2>&1 || true
echo "== outsider vrdmactl"; as ` + strconv.Itoa(outsider) + ` "$CTL" status 2>&1 || true
`
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", script)
	cmd.Env = append(os.Environ(), "AGENT="+testenv.AgentBinary(t), "CTL="+ctl, "DIR="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the namespace's script: %v\n%s", err, out)
	}
	parts := strings.Split(string(out), "== ")
	if len(parts) != 5 {
		t.Fatalf("the script's output:\n%s", out)
	}
	if want := fmt.Sprintf("socket 660 %d", member); !strings.Contains(parts[0], want) {
		t.Errorf("the socket is not mode 0660 for group %d (--socket-group): %s", member, parts[0])
	}
	if !strings.Contains(parts[1], "hca_id:\tvrdma0") {
		t.Errorf("ibv_devinfo of a member of the group, with no VRDMA_SOCKET, finds no vrdma device:\n%s", parts[1])
	}
	if !strings.Contains(parts[2], `"socket": "/run/vrdma/vrdmad.sock"`) || !strings.Contains(parts[2], `"name": "vmu"`) {
		t.Errorf("vrdmactl status of a member of the group, with no VRDMA_SOCKET, does not reach the system's agent:\n%s", parts[2])
	}
	for _, p := range parts[3:] {
		if strings.Contains(p, "hca_id:\tvrdma0") || !strings.Contains(p, "/run/vrdma/vrdmad.sock") || !strings.Contains(p, "ermission denied") || !strings.Contains(p, "join the group") {
			t.Errorf("a user outside the group: want the system socket refused (permission denied), and told to join the group:\n%s", p)
		}
	}
	t.Logf("%s", out)
}
