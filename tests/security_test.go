// SPDX-License-Identifier: Apache-2.0

package vrdma_test

// Tenants and quotas (docs/SECURITY.md, "Tenants and quotas"): what an
// unprivileged local user can make the agent hold. The clients run as
// uids other than root, in a copy of this test binary (securityClient),
// against an agent process whose memory and descriptors the test reads
// from /proc.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/agent"
	"github.com/vrdma/vrdma/internal/control/etcdtest"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
	"github.com/vrdma/vrdma/internal/testenv"
)

// Unprivileged uids the clients run as (their gid is the same number).
const (
	tenantUID  = 65534 // nobody
	tenant2UID = 65533
)

// secAction is one step of a client's script.
type secAction struct {
	Op    string `json:"op"` // define, open, dial, cq, create, edit
	Name  string `json:"name,omitempty"`
	VMX   string `json:"vmx,omitempty"`
	CQE   int    `json:"cqe,omitempty"`
	Value string `json:"value,omitempty"`
}

// secResult is the outcome of one action: "" when it succeeded.
type secResult struct {
	Err string `json:"err"`
}

func init() {
	// A copy of this binary run by runAs is a client, not a test run.
	if os.Getenv("VRDMA_SECURITY_CLIENT") != "" {
		os.Exit(securityClient())
	}
}

// securityClient runs the script in file VRDMA_SECURITY_SCRIPT against the
// agent at VRDMA_SECURITY_SOCKET, keeping everything it made, prints one
// secResult a line, then "READY", and holds on until its stdin closes.
func securityClient() int {
	var script []secAction
	js, err := os.ReadFile(os.Getenv("VRDMA_SECURITY_SCRIPT"))
	if err == nil {
		err = json.Unmarshal(js, &script)
	}
	if err != nil {
		fmt.Println("bad script:", err)
		return 2
	}
	sock := vrdma.WithSocket(os.Getenv("VRDMA_SECURITY_SOCKET"))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	vms := map[string]*vrdma.VM{}
	var keep []io.Closer
	mgr, err := vrdma.DialAgent(ctx, sock)
	if err != nil {
		fmt.Println("dial:", err)
		return 2
	}
	enc := json.NewEncoder(os.Stdout)
	for _, a := range script {
		var err error
		switch a.Op {
		case "define":
			err = mgr.DefineVM(ctx, a.Name, []byte(a.VMX))
		case "open":
			var v *vrdma.VM
			if v, err = vrdma.Open(ctx, a.Name, sock); err == nil {
				vms[a.Name] = v
			}
		case "dial":
			var m *vrdma.Agent
			if m, err = vrdma.DialAgent(ctx, sock); err == nil {
				keep = append(keep, m)
			}
		case "cq":
			v := vms[a.Name]
			if v == nil {
				err = fmt.Errorf("VM %s is not open", a.Name)
				break
			}
			_, err = v.Adapters()[0].CreateCQ(ctx, a.CQE) // kept until the VM closes
		case "create":
			_, err = mgr.CreateVM(ctx, vrdma.VMSpec{Name: a.Name, VMX: a.VMX})
		case "edit":
			_, err = mgr.EditVM(ctx, a.Name, vrdma.VMEdit{Set: []vrdma.KeyValue{{Key: "guestinfo.edit", Value: a.Value}}})
		default:
			err = fmt.Errorf("unknown op %q", a.Op)
		}
		r := secResult{}
		if err != nil {
			r.Err = err.Error()
		}
		enc.Encode(r)
	}
	fmt.Println("READY")
	io.Copy(io.Discard, os.Stdin)
	for _, c := range keep {
		c.Close()
	}
	for _, v := range vms {
		v.Close()
	}
	mgr.Close()
	return 0
}

// secClient is a running client.
type secClient struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	// Results are the script's outcomes, one per action.
	Results []secResult
}

// Close ends the client (it releases what it holds) and waits for it,
// and a moment more for the agent to end its sessions: the next client's
// caps start from nothing.
func (c *secClient) Close() {
	if c.stdin != nil {
		c.stdin.Close()
		c.stdin = nil
		c.cmd.Wait()
		time.Sleep(300 * time.Millisecond)
	}
}

// clientBinary returns a copy of this test binary that other users can
// run (go test's work directory is root's alone), removed at the test's
// end.
func clientBinary(t *testing.T) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "client")
	if err := os.WriteFile(p, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// runAs runs script as uid (and gid uid) against the agent at sock and
// returns once every action has an outcome; the client holds what it
// made until Close, which the test's end calls too.
func runAs(t *testing.T, uid uint32, sock string, script []secAction) *secClient {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("needs root: runs clients as uid %d (CI runs as root)", uid)
	}
	// The agent's socket must be reachable by other users.
	os.Chmod(filepath.Dir(sock), 0o755)
	js, _ := json.Marshal(script)
	bin := clientBinary(t)
	sf := filepath.Join(filepath.Dir(bin), "script.json")
	if err := os.WriteFile(sf, js, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "VRDMA_SECURITY_CLIENT=1", "VRDMA_SECURITY_SOCKET="+sock, "VRDMA_SECURITY_SCRIPT="+sf)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}, Pdeathsig: syscall.SIGKILL}
	cmd.Dir = "/"
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start a client as uid %d: %v", uid, err)
	}
	c := &secClient{cmd: cmd, stdin: stdin}
	t.Cleanup(c.Close)
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "READY" {
			if len(c.Results) != len(script) {
				t.Fatalf("client: %d results for %d actions", len(c.Results), len(script))
			}
			return c
		}
		var r secResult
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("client as uid %d: %s (stderr: %s)", uid, line, stderr.String())
		}
		c.Results = append(c.Results, r)
	}
	c.stdin.Close()
	c.stdin = nil
	cmd.Wait()
	t.Fatalf("client as uid %d ended before READY after %d results (stderr: %s)", uid, len(c.Results), stderr.String())
	return nil
}

// firstRefused returns the index of the first action that failed and its
// error; -1 when all succeeded. Every action after it must fail too.
func firstRefused(t *testing.T, what string, rs []secResult) (int, string) {
	t.Helper()
	for i, r := range rs {
		if r.Err != "" {
			for j := i + 1; j < len(rs); j++ {
				if rs[j].Err == "" {
					t.Errorf("%s: action %d succeeded after action %d was refused (%s)", what, j, i, r.Err)
				}
			}
			return i, r.Err
		}
	}
	return -1, ""
}

// fdCount returns how many descriptors process pid has open.
func fdCount(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

func repeat(n int, f func(i int) secAction) []secAction {
	out := make([]secAction, n)
	for i := range out {
		out[i] = f(i)
	}
	return out
}

// TestSecurityPinnedMemory: a VM that reserves and locks its guest memory
// runs only if its owner may pin (root, or a uid the administrator
// listed), and only within the host's pinned-memory budget; what the
// agent locks stays within the budget.
func TestSecurityPinnedMemory(t *testing.T) {
	const budgetMiB = 96
	env := testenv.StartProcess(t, testenv.ProcessOptions{Args: []string{
		"--pinned-memory-budget", fmt.Sprintf("%dMiB", budgetMiB), "--pin-allowed-uids", strconv.Itoa(tenant2UID)}})
	pinned := func(mb int) string { return testenv.VMX(testenv.VMOptions{MemMB: mb, Locked: true}) }

	// nobody may not pin at all.
	c := runAs(t, tenantUID, env.Socket, []secAction{{Op: "define", Name: "pin-nobody", VMX: pinned(8)}})
	if e := c.Results[0].Err; !strings.Contains(e, "pin-allowed-uids") || !strings.Contains(e, "permission") {
		t.Errorf("a pinned VM of uid %d (not allowed to pin): %q; want a refusal naming --pin-allowed-uids", tenantUID, e)
	}
	c.Close()

	// The allowed uid pins within the budget, and no further.
	before := env.ProcStatus(t, "VmLck")
	c = runAs(t, tenant2UID, env.Socket, []secAction{
		{Op: "define", Name: "pin1", VMX: pinned(64)}, {Op: "open", Name: "pin1"},
		{Op: "define", Name: "pin2", VMX: pinned(64)}, {Op: "open", Name: "pin2"},
	})
	for i, r := range c.Results[:3] {
		if r.Err != "" {
			t.Fatalf("action %d of uid %d (allowed to pin): %s", i, tenant2UID, r.Err)
		}
	}
	if e := c.Results[3].Err; !strings.Contains(e, "limit pinned-memory-budget") || !strings.Contains(e, "--pinned-memory-budget") {
		t.Errorf("a second 64 MiB pinned VM with a %d MiB budget: %q; want a refusal naming the budget", budgetMiB, e)
	}
	if lck := env.ProcStatus(t, "VmLck") - before; lck > (budgetMiB+8)<<10 {
		t.Errorf("the agent locked %d kB more, over the %d MiB budget", lck, budgetMiB)
	}
	c.Close()
}

// TestSecurityUserCaps: one unprivileged uid cannot own more VMs, open
// more sessions, attach more workloads or have more ring memory than its
// caps, and the agent's descriptors and memory stay bounded meanwhile.
func TestSecurityUserCaps(t *testing.T) {
	env := testenv.StartProcess(t, testenv.ProcessOptions{Args: []string{
		"--max-vms-per-user", "4", "--max-sessions-per-user", "8", "--max-processes-per-user", "3",
		"--max-ring-memory-per-user", "16MiB"}})
	pid := env.Cmd.Process.Pid
	vmx := testenv.VMX(testenv.VMOptions{})

	t.Run("vms", func(t *testing.T) {
		c := runAs(t, tenantUID, env.Socket, repeat(10, func(i int) secAction { return secAction{Op: "define", Name: fmt.Sprintf("q%d", i), VMX: vmx} }))
		defer c.Close()
		if i, e := firstRefused(t, "define", c.Results); i != 4 || !strings.Contains(e, "limit vms-per-user: uid 65534 owns 4 VMs") || !strings.Contains(e, "--max-vms-per-user") {
			t.Errorf("defines of 10 VMs: the first refused is %d (%q); want the fifth, naming vms-per-user", i, e)
		}
		files, _ := filepath.Glob(filepath.Join(env.StateDir, "vms", "*.vmx"))
		if len(files) != 4 {
			t.Errorf("the state directory holds %d VMs, want 4", len(files))
		}
	})

	t.Run("sessions", func(t *testing.T) {
		fds := fdCount(t, pid)
		c := runAs(t, tenantUID, env.Socket, repeat(40, func(int) secAction { return secAction{Op: "dial"} }))
		defer c.Close()
		// The client's own management connection is one of the 8.
		if i, e := firstRefused(t, "dial", c.Results); i != 7 || !strings.Contains(e, "limit sessions-per-user") || !strings.Contains(e, "--max-sessions-per-user") {
			t.Errorf("41 sessions: the first refused is %d (%q); want the eighth, naming sessions-per-user", i, e)
		}
		time.Sleep(100 * time.Millisecond) // refused sessions end
		if n := fdCount(t, pid) - fds; n > 8*2+4 {
			t.Errorf("the agent holds %d more descriptors with the uid's sessions open, want at most %d", n, 8*2+4)
		}
	})

	t.Run("processes", func(t *testing.T) {
		c := runAs(t, tenantUID, env.Socket, repeat(4, func(i int) secAction { return secAction{Op: "open", Name: fmt.Sprintf("q%d", i)} }))
		defer c.Close()
		if i, e := firstRefused(t, "open", c.Results); i != 3 || !strings.Contains(e, "limit processes-per-user") {
			t.Errorf("4 workloads: the first refused is %d (%q); want the fourth, naming processes-per-user", i, e)
		}
	})

	t.Run("rings", func(t *testing.T) {
		rss, fds := env.ProcStatus(t, "VmRSS"), fdCount(t, pid)
		// Each CQ of 65536 entries is 4 MiB of ring, populated and locked.
		script := append([]secAction{{Op: "open", Name: "q0"}}, repeat(12, func(int) secAction { return secAction{Op: "cq", Name: "q0", CQE: 65536} })...)
		c := runAs(t, tenantUID, env.Socket, script)
		defer c.Close()
		if c.Results[0].Err != "" {
			t.Fatalf("open: %s", c.Results[0].Err)
		}
		i, e := firstRefused(t, "create-cq", c.Results[1:])
		if i < 1 || i > 4 || !strings.Contains(e, "limit ring-memory-per-user") || !strings.Contains(e, "--max-ring-memory-per-user") {
			t.Errorf("12 CQs of 4 MiB with 16 MiB of ring memory per user: the first refused is %d (%q); want one of the first 4, naming ring-memory-per-user", i, e)
		}
		if d := env.ProcStatus(t, "VmRSS") - rss; d > 40<<10 {
			t.Errorf("the agent's RSS grew by %d kB with the uid's rings, want at most 40 MiB", d)
		}
		if n := fdCount(t, pid) - fds; n > 4*3+8 {
			t.Errorf("the agent holds %d more descriptors, want at most %d", n, 4*3+8)
		}
	})
}

// TestSecurityControlPlane: one unprivileged uid cannot fill etcd: it
// creates at most its VMs' worth of managed VMs, and its edits stop at
// its hourly write quota, long before etcd's.
func TestSecurityControlPlane(t *testing.T) {
	ep := etcdtest.Start(t).ClientURL()
	st := etcdtest.Open(t, ep)
	ctl := agent.ControlConfig{Endpoints: []string{ep}, LookupTimeout: 2 * time.Second, LeaseTTL: 2 * time.Second, UnsafeNoFsync: true}
	env := testenv.StartWith(t, testenv.Options{Host: "cp1", Control: &ctl,
		Quotas: agent.Quotas{VMsPerUser: 3, VMWriteBytesPerHour: 1 << 20}})

	// A VMX of about 200 KiB (a comment the VMX keeps).
	big := testenv.VMX(testenv.VMOptions{}) + "# " + strings.Repeat("x", 200<<10) + "\n"
	script := repeat(8, func(i int) secAction { return secAction{Op: "create", Name: fmt.Sprintf("m%d", i), VMX: big} })
	script = append(script, repeat(20, func(i int) secAction { return secAction{Op: "edit", Name: "m0", Value: strconv.Itoa(i)} })...)
	c := runAs(t, tenantUID, env.Socket, script)
	defer c.Close()

	i, e := firstRefused(t, "create", c.Results[:8])
	if i != 3 || !strings.Contains(e, "limit vms-per-user") {
		t.Errorf("8 managed VMs with 3 VMs per user: the first refused is %d (%q); want the fourth, naming vms-per-user", i, e)
	}
	// 3 creates of ~200 KiB are already charged: 1 MiB an hour leaves
	// room for two edits at most.
	edits := c.Results[8:]
	j, e := firstRefused(t, "edit", edits)
	if j < 0 || j > 2 || !strings.Contains(e, "limit vm-write-bytes-per-hour") || !strings.Contains(e, "--max-vm-write-bytes-per-hour") {
		t.Errorf("20 edits of a 200 KiB VM: the first refused is %d (%q); want one of the first 3, naming vm-write-bytes-per-hour", j, e)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	items, _, _, err := store.List[records.VM](ctx, st, records.VMPrefix)
	if err != nil {
		t.Fatal(err)
	}
	owned := 0
	for _, it := range items {
		if it.Value.Owner.UID == tenantUID {
			owned++
		}
	}
	if owned != 3 {
		t.Errorf("etcd holds %d VM records of uid %d, want 3", owned, tenantUID)
	}
}

// TestSecurityGroupAttach: a VM's owner group attaches only when the
// owner granted it (vrdma.groupAttach in the VMX); its owner uid always
// may.
func TestSecurityGroupAttach(t *testing.T) {
	env := testenv.StartProcess(t, testenv.ProcessOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	root, err := vrdma.DialAgent(ctx, vrdma.WithSocket(env.Socket))
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	owner := vrdma.Owner{UID: tenantUID, GID: tenant2UID}
	vmx := testenv.VMX(testenv.VMOptions{})
	if err := root.DefineVMFor(ctx, "private", []byte(vmx), owner); err != nil {
		t.Fatal(err)
	}
	if err := root.DefineVMFor(ctx, "shared", []byte(vmx+"vrdma.groupAttach = \"TRUE\"\n"), owner); err != nil {
		t.Fatal(err)
	}
	// tenant2UID runs with primary group tenant2UID: the owner's group.
	c := runAs(t, tenant2UID, env.Socket, []secAction{{Op: "open", Name: "private"}, {Op: "open", Name: "shared"}})
	defer c.Close()
	if e := c.Results[0].Err; !strings.Contains(e, "permission") || !strings.Contains(e, "vrdma.groupAttach") {
		t.Errorf("the owner's group attaching a VM that did not grant it: %q; want permission denied naming vrdma.groupAttach", e)
	}
	if e := c.Results[1].Err; e != "" {
		t.Errorf("the owner's group attaching a VM that granted it: %s", e)
	}
	o := runAs(t, tenantUID, env.Socket, []secAction{{Op: "open", Name: "private"}})
	defer o.Close()
	if e := o.Results[0].Err; e != "" {
		t.Errorf("the owner attaching its VM: %s", e)
	}
}
