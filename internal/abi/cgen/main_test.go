// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// header is the committed output, relative to this package.
var header = filepath.Join("..", "..", "..", "guest", "ibverbs", "vrdma-abi.h")

// TestHeaderCurrent regenerates the header in memory and compares it with
// the committed file: a change to package abi without go generate fails
// here (and so in CI).
func TestHeaderCurrent(t *testing.T) {
	want, err := generate()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(header)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is stale: run go generate ./internal/abi and commit it", header)
	}
}

// TestHeaderCompiles compiles the header alone with the C compiler: its
// _Static_asserts hold for the C layout of every struct.
func TestHeaderCompiles(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("no gcc: apt-get install -y gcc")
	}
	b, err := generate()
	if err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(t.TempDir(), "abi.c")
	if err := os.WriteFile(src, append(b, "\nint main(void) { return 0; }\n"...), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, std := range []string{"-std=gnu11", "-std=c11"} {
		out, err := exec.Command("gcc", std, "-Wall", "-Wextra", "-Werror", "-pedantic", "-fsyntax-only", src).CombinedOutput()
		if err != nil {
			t.Fatalf("gcc %s: %v\n%s", std, err, out)
		}
	}
}
