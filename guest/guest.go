// Package guest holds the sources of the drop-in libibverbs.so.1 and
// librdmacm.so.1 (ibverbs/ and rdmacm/, C: docs/verbs-compat.md) so that
// commands can build them where they run (vrdmactl exec). No Go runs in
// the libraries themselves.
package guest

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
)

// IBVerbs is the libraries' source tree: guest/ibverbs and guest/rdmacm
// without their tests and build output.
//
//go:embed ibverbs/*.c ibverbs/*.h ibverbs/*.sh ibverbs/Makefile rdmacm/*.c rdmacm/*.h
var IBVerbs embed.FS

// SourceHash returns a digest of the embedded sources: builds of the same
// sources share a directory.
func SourceHash() string {
	h := sha256.New()
	var names []string
	fs.WalkDir(IBVerbs, ".", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			names = append(names, p)
		}
		return nil
	})
	sort.Strings(names)
	for _, n := range names {
		b, _ := IBVerbs.ReadFile(n)
		fmt.Fprintf(h, "%s %d\n", n, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// BuildIBVerbs returns a directory holding libibverbs.so.1 (and, where
// librdmacm-dev is installed, librdmacm.so.1) built from the
// embedded sources under root (root/libibverbs-HASH), building it first if
// it is not there: the sources are written out and built with make, gcc
// and the system's libibverbs-dev, in a fresh directory renamed into place
// when done, so that concurrent builds do not see each other's halves.
func BuildIBVerbs(root string) (string, error) {
	dir := filepath.Join(root, "libibverbs-"+SourceHash())
	if _, err := os.Stat(filepath.Join(dir, "libibverbs.so.1")); err == nil {
		return dir, nil
	}
	for _, tool := range []string{"make", "gcc", "objdump", "nm"} {
		if _, err := exec.LookPath(tool); err != nil {
			return "", fmt.Errorf("building the drop-in libibverbs needs %s: apt-get install -y gcc make binutils libibverbs-dev", tool)
		}
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(root, "build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	src := filepath.Join(tmp, "src")
	err = fs.WalkDir(IBVerbs, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := IBVerbs.ReadFile(p)
		if err != nil {
			return err
		}
		out := filepath.Join(src, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			return err
		}
		return os.WriteFile(out, b, 0o644)
	})
	if err != nil {
		return "", err
	}
	out := filepath.Join(tmp, "out")
	var log bytes.Buffer
	cmd := exec.Command("make", "-s", "-C", filepath.Join(src, "ibverbs"), "OUT="+out)
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("building the drop-in libibverbs (make -C guest/ibverbs): %v\n%s(it needs gcc, make and libibverbs-dev)", err, log.String())
	}
	if err := os.Rename(out, dir); err != nil {
		if _, serr := os.Stat(filepath.Join(dir, "libibverbs.so.1")); serr == nil {
			return dir, nil // another build won the race
		}
		return "", err
	}
	return dir, nil
}
