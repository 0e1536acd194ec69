// SPDX-License-Identifier: Apache-2.0

package store_test

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vrdma/vrdma/internal/control/etcdtest"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
)

// listeningTCPSockets returns the inodes of this process's listening TCP
// sockets (IPv4 and IPv6), read from /proc.
func listeningTCPSockets(t *testing.T) map[string]bool {
	t.Helper()
	listening := map[string]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		fh, err := os.Open(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) > 9 && fields[3] == "0A" { // TCP_LISTEN
				listening[fields[9]] = true
			}
		}
		fh.Close()
	}
	ours := map[string]bool{}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		link, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name()))
		if err != nil || !strings.HasPrefix(link, "socket:[") {
			continue
		}
		if inode := strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]"); listening[inode] {
			ours[inode] = true
		}
	}
	return ours
}

// TestSecurityEmbeddedEtcdPrivate starts a member alone whose data
// directory is too deep for a Unix socket path: it must listen on no TCP
// port (neither for clients nor for peers), its sockets must be in a
// directory of mode 0700, it must serve, and a socket directory that
// another user could enter or replace must be refused.
func TestSecurityEmbeddedEtcdPrivate(t *testing.T) {
	deep := filepath.Join(t.TempDir(), strings.Repeat("d", 60), strings.Repeat("e", 60))
	before := listeningTCPSockets(t)
	m := etcdtest.StartConfig(t, etcdtest.Config(deep))
	for inode := range listeningTCPSockets(t) {
		if !before[inode] {
			t.Errorf("the member listens on TCP (socket inode %s)", inode)
		}
	}
	for what, u := range map[string]string{"client": m.ClientURL(), "peer": m.PeerURL()} {
		if !strings.HasPrefix(u, "unix://") {
			t.Errorf("%s URL %s: want a Unix socket", what, u)
			continue
		}
		dir := filepath.Dir(strings.TrimPrefix(u, "unix://"))
		fi, err := os.Lstat(dir)
		if err != nil {
			t.Fatal(err)
		}
		if !fi.IsDir() || fi.Mode().Perm() != 0o700 {
			t.Errorf("%s socket directory %s: mode %v, want a directory of mode 0700", what, dir, fi.Mode())
		}
	}
	st := etcdtest.Open(t, m.ClientURL())
	if _, err := st.Create(ctxT(t), records.SwitchKey("dvs1"), sw("dvs1", 9000)); err != nil {
		t.Fatalf("the member does not serve on %s: %v", m.ClientURL(), err)
	}

	// A socket directory another user could enter, or a symbolic link,
	// is refused.
	deep2 := filepath.Join(t.TempDir(), strings.Repeat("f", 60), strings.Repeat("g", 60))
	dir, err := store.PrivateSocketDir(deep2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := store.PrivateSocketDir(deep2); err == nil {
		t.Errorf("a socket directory of mode 0755 was accepted")
	}
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(t.TempDir(), dir); err != nil {
		t.Fatal(err)
	}
	if _, err := store.PrivateSocketDir(deep2); err == nil {
		t.Errorf("a symbolic link as socket directory was accepted")
	}

	// A member of a cluster with a plaintext TCP peer URL is refused
	// unless InsecurePeer says so.
	cfg := etcdtest.Config(t.TempDir())
	cfg.PeerURL = "http://127.0.0.1:1"
	cfg.InitialCluster = "vrdma=" + cfg.PeerURL
	if m, err := store.StartEmbedded(ctxT(t), cfg); err == nil || !strings.Contains(err.Error(), "plaintext TCP") {
		if m != nil {
			m.Close()
		}
		t.Errorf("a plaintext TCP peer URL without InsecurePeer: got %v, want a refusal", err)
	}
}
