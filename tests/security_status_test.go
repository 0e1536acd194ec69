// SPDX-License-Identifier: Apache-2.0

package vrdma_test

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/perf"
	"github.com/vrdma/vrdma/internal/testenv"
)

// TestSecurityStatusPrivate checks who sees which objects in the agent's
// status report: a user who owns no VM (uid 65534, through vrdmactl)
// sees root's VM without its processes and QPs, and sees its own VM's
// QPs; root sees every VM's.
func TestSecurityStatusPrivate(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the test runs vrdmactl as another user")
	}
	const nobody = 65534
	bin := testenv.Binary(t, "vrdmactl") // built before the operations' timeouts start
	env := testenv.Start(t)
	ctx := opCtx(t)
	ag, err := vrdma.DialAgent(ctx, vrdma.WithSocket(env.Socket))
	if err != nil {
		t.Fatal(err)
	}
	defer ag.Close()
	if err := ag.DefineVMFor(ctx, "st-nobody", []byte(testenv.VMX(testenv.VMOptions{})), vrdma.Owner{UID: nobody, GID: nobody}); err != nil {
		t.Fatal(err)
	}
	rootVM := env.Open(t, "st-root", testenv.VMOptions{})
	nobodyVM, err := vrdma.Open(ctx, "st-nobody", vrdma.WithSocket(env.Socket)) // root may attach any VM
	if err != nil {
		t.Fatal(err)
	}
	defer nobodyVM.Close()
	p, err := perf.Connect(ctx, rootVM.Adapters()[0], nobodyVM.Adapters()[0], perf.PairConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(ctx)

	// vrdmactl, where uid 65534 can run it and reach the socket.
	dir, err := os.MkdirTemp("", "vrdma-status")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	for _, d := range []string{dir, filepath.Dir(env.Socket)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ctl := filepath.Join(dir, "vrdmactl")
	copyFile(t, bin, ctl)
	cmd := exec.CommandContext(opCtx(t), ctl, "--socket", env.Socket, "-o", "json", "status")
	cmd.Env = []string{"HOME=" + dir, "PATH=/usr/bin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("vrdmactl status as uid %d: %v\n%s", nobody, err, ee.Stderr)
		}
		t.Fatalf("vrdmactl status as uid %d: %v", nobody, err)
	}
	var rep vrdma.Status
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("vrdmactl status: %v\n%s", err, out)
	}
	asRoot, err := ag.Status(opCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		who    string
		st     vrdma.Status
		vm     string
		hidden bool
	}{
		{"uid 65534", rep, "st-root", true},
		{"uid 65534", rep, "st-nobody", false},
		{"root", asRoot, "st-root", false},
		{"root", asRoot, "st-nobody", false},
	} {
		vs, ok := findVM(c.st, c.vm)
		switch {
		case !ok:
			t.Errorf("%s: status has no VM %s", c.who, c.vm)
		case c.hidden && (len(vs.QPs) > 0 || len(vs.Processes) > 0 || len(vs.AdapterCounters) > 0 || len(vs.Resources) > 0 || !vs.ObjectsHidden):
			t.Errorf("%s sees %s's objects (QPs %v, processes %v, resources %v), or the report does not say they are hidden (%v): only its owner and root may", c.who, c.vm, vs.QPs, vs.Processes, vs.Resources, vs.ObjectsHidden)
		case !c.hidden && (len(vs.QPs) != 1 || len(vs.Resources) != 1 || vs.Resources[0].QPs != 1 || vs.ObjectsHidden):
			t.Errorf("%s sees %d QPs of %s, resources %+v (hidden %v), want its 1 QP", c.who, len(vs.QPs), c.vm, vs.Resources, vs.ObjectsHidden)
		}
	}
}

// findVM returns VM name's entry of status st.
func findVM(st vrdma.Status, name string) (vrdma.VMStatus, bool) {
	for _, v := range st.VMs {
		if v.Name == name {
			return v, true
		}
	}
	return vrdma.VMStatus{}, false
}

// copyFile copies executable src to dst, mode 0755.
func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
