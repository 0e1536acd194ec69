// SPDX-License-Identifier: Apache-2.0

package hostkey

import (
	"crypto/ed25519"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// TestLoad: the first Load creates a key with mode 0600, the next ones
// return the same key; a damaged key file or one others may read is
// refused by rule host-key, not replaced.
func TestLoad(t *testing.T) {
	dir := t.TempDir()
	k1, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("host key file mode %o, want 600", fi.Mode().Perm())
	}
	k2, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !k1.Equal(k2) {
		t.Fatal("a second Load returned another key")
	}

	os.Chmod(filepath.Join(dir, KeyFile), 0o644)
	if _, err := Load(dir); err == nil || !strings.HasPrefix(err.Error(), "rule host-key: ") || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("a key file readable by others: %v; want a refusal naming chmod 600", err)
	}
	os.WriteFile(filepath.Join(dir, KeyFile), []byte("not a key\n"), 0o600)
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "does not hold a 32-byte ed25519 seed") {
		t.Errorf("a damaged key file: %v; want a refusal", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, KeyFile)); string(b) != "not a key\n" {
		t.Errorf("Load rewrote a damaged key file: %q", b)
	}
}

// TestLoadConcurrent: agents started at once on one state directory end
// up with one key.
func TestLoadConcurrent(t *testing.T) {
	dir := t.TempDir()
	keys := make([]ed25519.PrivateKey, 8)
	var wg sync.WaitGroup
	for i := range keys {
		wg.Go(func() {
			k, err := Load(dir)
			if err != nil {
				t.Error(err)
			}
			keys[i] = k
		})
	}
	wg.Wait()
	for _, k := range keys[1:] {
		if !k.Equal(keys[0]) {
			t.Fatal("concurrent Loads returned different keys")
		}
	}
}

func pub(t *testing.T) ed25519.PublicKey {
	t.Helper()
	p, _, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPins: a first sight pins the key, the same key passes, another key
// is refused with ErrChanged naming the command that accepts it; Forget
// lets the next key be pinned; a damaged pins file refuses every check.
func TestPins(t *testing.T) {
	dir := t.TempDir()
	const id, id2 = "0123456789abcdef0123456789abcdef", "fedcba9876543210fedcba9876543210"
	k1, k2 := pub(t), pub(t)
	p := NewPins(dir)
	if err := p.Check(id, "hostC", k1); err != nil {
		t.Fatalf("first sight: %v", err)
	}
	if err := p.Check(id2, "hostD", k2); err != nil {
		t.Fatalf("first sight of another host: %v", err)
	}
	if err := NewPins(dir).Check(id, "hostC", k1); err != nil {
		t.Fatalf("the pinned key, read again from the file: %v", err)
	}
	err := p.Check(id, "hostC", k2)
	if !errors.Is(err, ErrChanged) || !strings.HasPrefix(err.Error(), "rule host-key: ") ||
		!strings.Contains(err.Error(), "vrdmactl host forget-key "+id) || !strings.Contains(err.Error(), Encode(k2)[:16]) {
		t.Fatalf("a changed key: %v; want ErrChanged naming the new key and vrdmactl host forget-key", err)
	}
	if fi, err := os.Stat(p.Path()); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("pins file: %v, mode %o; want 600", err, fi.Mode().Perm())
	}
	if found, err := p.Forget(id); !found || err != nil {
		t.Fatalf("Forget: %v, %v", found, err)
	}
	if found, err := p.Forget(id); found || err != nil {
		t.Fatalf("Forget again: %v, %v; want nothing to forget", found, err)
	}
	if err := p.Check(id, "hostC", k2); err != nil {
		t.Fatalf("the new key after Forget: %v", err)
	}
	if err := p.Check(id2, "hostD", k2); err != nil {
		t.Fatalf("Forget of one host changed another's pin: %v", err)
	}
	if err := p.Check("nothex", "x", k1); err == nil {
		t.Error("a malformed host ID was pinned")
	}

	os.WriteFile(p.Path(), []byte(id+" zz\n"), 0o600)
	if err := p.Check(id2, "hostD", k2); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Errorf("a damaged pins file: %v; want a refusal naming the line", err)
	}
}
