// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/abi"
)

// TestPrivilegedQKey: a Q_Key with bit 31 set is refused (EPERM, as Linux
// does) to a process that is neither root nor holds CAP_NET_RAW, and
// taken from root; a Q_Key without the bit, or a modify that sets none,
// from anyone.
func TestPrivilegedQKey(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("starting a process of another uid needs root (CI runs as root)")
	}
	nobody := exec.Command("sleep", "30")
	nobody.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	if err := nobody.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nobody.Process.Kill(); nobody.Wait() })
	user := &session{cred: true, uid: 65534, pid: int32(nobody.Process.Pid)}
	root := &session{cred: true, uid: 0, pid: int32(os.Getpid())}
	priv := &abi.ModifyQP{Mask: abi.MaskState | abi.MaskQKey, Attr: abi.QPAttr{State: abi.QPSInit, QKey: abi.PrivilegedQKey | 1}}
	plain := &abi.ModifyQP{Mask: abi.MaskState | abi.MaskQKey, Attr: abi.QPAttr{State: abi.QPSInit, QKey: 0x11111111}}
	noKey := &abi.ModifyQP{Mask: abi.MaskState, Attr: abi.QPAttr{State: abi.QPSInit, QKey: abi.PrivilegedQKey}}
	if err := user.checkQKey(priv); !errors.Is(err, abi.ErrPermission) {
		t.Errorf("an unprivileged process setting Q_Key 0x%x: %v, want permission-denied", priv.Attr.QKey, err)
	}
	for _, c := range []struct {
		s    *session
		m    *abi.ModifyQP
		what string
	}{{root, priv, "root, the privileged Q_Key"}, {user, plain, "a user, Q_Key 0x11111111"}, {user, noKey, "a user, no Q_Key in the mask"}} {
		if err := c.s.checkQKey(c.m); err != nil {
			t.Errorf("%s: %v, want accepted", c.what, err)
		}
	}
	if (&session{}).privileged() {
		t.Error("a session without credentials is privileged")
	}
}

// TestAdmitLookupsBounded: at most admitLookups verdicts not in the cache
// are made a second; the next second allows as many again.
func TestAdmitLookupsBounded(t *testing.T) {
	var c admitCache
	n := 0
	for c.takeLookup() {
		n++
		if n > admitLookups {
			break
		}
	}
	if n != admitLookups {
		t.Fatalf("%d lookups allowed in a second, want %d", n, admitLookups)
	}
	c.mu.Lock()
	c.second = c.second.Add(-time.Second)
	c.mu.Unlock()
	if !c.takeLookup() {
		t.Fatal("no lookup allowed a second later")
	}
}

// TestAdmitSettled: an admission and a refusal by a rule are cached; a
// source the control plane does not know yet, or a lookup that failed,
// is not — caching it dropped every datagram of a VM that had just
// attached for admitTTL (mckey's receiver then got none of its 20).
func TestAdmitSettled(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{nil, true},
		{abi.Errorf(abi.CodeRefused, "sgid", "rule same-port-group: no"), true},
		{abi.Errorf(abi.CodeInvalid, "sgid", "bad"), true},
		{abi.Errorf(abi.CodeNotFound, "sgid", "vmB/vrdma0 is not attached on any host"), false},
		{abi.Errorf(abi.CodeUnavailable, "remote", "cannot decide the path: context deadline exceeded"), false},
	} {
		if got := settled(c.err); got != c.want {
			t.Errorf("settled(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
