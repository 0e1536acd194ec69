// SPDX-License-Identifier: Apache-2.0

// Package guest holds the sources of the drop-in libibverbs.so.1 and
// librdmacm.so.1 (ibverbs/ and rdmacm/, C: docs/verbs-compat.md) so that
// commands find them where they run (vrdmactl exec): a copy the packages
// installed in InstalledDir when it was built from these same sources,
// else one built on first use. No Go runs in the libraries themselves.
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
	"strings"
)

// InstalledDir is where the vrdma-dropin package installs the libraries
// (packaging/build-deb): libibverbs.so.1, librdmacm.so.1 and
// SourceHashFile.
const InstalledDir = "/usr/lib/vrdma"

// SourceHashFile is the file beside installed libraries that holds the
// SourceHash of the sources they were built from.
const SourceHashFile = "source-hash"

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

// Installed checks that dir holds a libibverbs.so.1 built from the
// sources embedded here: its SourceHashFile says SourceHash(). A copy
// built from other sources may speak another version of the agent's
// interface, so it is not used; the error says why.
func Installed(dir string) error {
	if _, err := os.Stat(filepath.Join(dir, "libibverbs.so.1")); err != nil {
		return fmt.Errorf("no installed drop-in: %w", err)
	}
	b, err := os.ReadFile(filepath.Join(dir, SourceHashFile))
	if err != nil {
		return fmt.Errorf("the drop-in in %s does not say which sources it was built from: %w", dir, err)
	}
	if got, want := strings.TrimSpace(string(b)), SourceHash(); got != want {
		return fmt.Errorf("the drop-in in %s was built from other sources (%s, this program's are %s): install the vrdma-dropin package of the same build as vrdmactl", dir, got, want)
	}
	return nil
}

// FindIBVerbs returns the directory of the drop-in libibverbs.so.1 (and
// librdmacm.so.1): installed, the installed copy if it is this build's
// (Installed), else one built under cache (BuildIBVerbs). When the build
// fails, the error also says why the installed copy was not used.
func FindIBVerbs(installed, cache string) (string, error) {
	ierr := Installed(installed)
	if ierr == nil {
		return installed, nil
	}
	dir, err := BuildIBVerbs(cache)
	if err != nil {
		return "", fmt.Errorf("%w; and %v", err, ierr)
	}
	return dir, nil
}
