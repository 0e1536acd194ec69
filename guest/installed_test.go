// SPDX-License-Identifier: Apache-2.0

package guest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPackageInstalledDropin: an installed drop-in is used only when its
// source-hash file names the sources embedded in this build; FindIBVerbs
// returns it without building (the cache stays empty), and a stale or
// unstamped copy is refused with the reason.
func TestPackageInstalledDropin(t *testing.T) {
	inst, cache := t.TempDir(), filepath.Join(t.TempDir(), "cache")
	if err := Installed(inst); err == nil || !strings.Contains(err.Error(), "no installed drop-in") {
		t.Fatalf("empty directory: Installed = %v, want no installed drop-in", err)
	}
	if err := os.WriteFile(filepath.Join(inst, "libibverbs.so.1"), []byte("not built here"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Installed(inst); err == nil || !strings.Contains(err.Error(), "does not say which sources") {
		t.Fatalf("no %s: Installed = %v", SourceHashFile, err)
	}
	stamp := filepath.Join(inst, SourceHashFile)
	if err := os.WriteFile(stamp, []byte("0123456789abcdef\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Installed(inst); err == nil || !strings.Contains(err.Error(), "built from other sources") {
		t.Fatalf("stale %s: Installed = %v", SourceHashFile, err)
	}
	if err := os.WriteFile(stamp, []byte(SourceHash()+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir, err := FindIBVerbs(inst, cache)
	if err != nil || dir != inst {
		t.Fatalf("FindIBVerbs = %q, %v; want the installed %s", dir, err, inst)
	}
	if _, err := os.Stat(cache); !os.IsNotExist(err) {
		t.Fatalf("FindIBVerbs with an installed copy touched the cache %s (%v): it built", cache, err)
	}
}
