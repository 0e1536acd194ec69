// SPDX-License-Identifier: Apache-2.0

package packaging

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestPackageInstall builds the packages with build-deb, installs vrdma and
// vrdma-dropin into a clean Debian root (debootstrap's minbase with
// ibverbs-utils, of the host's release, cached: see debianRoot) and, there
// (install.sh): the package made the vrdma group, the binaries and the
// drop-in and the man pages are in place, vrdmad starts with the installed unit's ExecStart,
// and user alice, a member of group vrdma and not root, runs vrdmactl
// version, ibv_devinfo through vrdmactl exec (the installed drop-in, in a
// root without a compiler), ibv_devices through LD_LIBRARY_PATH, and an
// ibv_rc_pingpong between two VMs.
func TestPackageInstall(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skipf("installing packages into a Debian root needs root (chroot, mounts, namespaces); euid %d", os.Geteuid())
	}
	for _, tool := range []string{"debootstrap", "dpkg-deb", "unshare", "chroot", "ip", "gcc", "make"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is missing: apt-get install -y debootstrap dpkg-dev util-linux coreutils iproute2 gcc make libibverbs-dev librdmacm-dev", tool)
		}
	}
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	// The Debian root is made (the first time) while the packages build.
	type rootResult struct {
		dir string
		err error
	}
	rootc := make(chan rootResult, 1)
	go func() {
		dir, err := debianRoot(t)
		rootc <- rootResult{dir, err}
	}()

	t0 := time.Now()
	debs := t.TempDir()
	build := exec.Command(filepath.Join(repo, "packaging", "build-deb"), "-o", debs, "--fast")
	build.Dir = repo
	out, err := build.CombinedOutput()
	r := <-rootc
	if err != nil {
		t.Fatalf("packaging/build-deb: %v\n%s", err, out)
	}
	t.Logf("build-deb: %v\n%s", time.Since(t0).Round(time.Second), out)
	if r.err != nil {
		t.Fatal(r.err)
	}
	root := r.dir
	names, _ := filepath.Glob(filepath.Join(debs, "*.deb"))
	if len(names) != 3 {
		t.Fatalf("build-deb made %d packages, want vrdma, vrdma-dropin and vrdma-etcd: %v", len(names), names)
	}

	t1 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "unshare", "--mount", "--pid", "--net", "--fork", "--propagation", "private",
		"--", "bash", filepath.Join(repo, "packaging", "install.sh"))
	cmd.Env = append(os.Environ(), "ROOTFS="+root, "WORK="+t.TempDir(), "DEBS="+debs)
	out, err = cmd.CombinedOutput()
	text := string(out)
	t.Logf("install.sh: %v\n%s", time.Since(t1).Round(time.Second), text)
	if err != nil {
		t.Fatalf("install.sh failed: %v (its output above)", err)
	}
	for _, want := range []string{
		"Status: install ok installed",
		"etcd Version: 3.",               // vrdma-etcd runs
		"vrdma:x:",                       // the group
		"groups=1000(alice),",            // alice is not root, and in group vrdma...
		"(vrdma)",                        //
		" vrdmactl, 1 vrdmad(8)",         // the man pages
		"hca_id:\tvrdma0",                // ibv_devinfo through vrdmactl exec
		"transport:\t\t\tInfiniBand (0)", // a device ibv_devinfo reads
		"vrdma0",                         // ibv_devices
		"200 iters in",                   // ibv_rc_pingpong, both sides
		"== all done",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("install.sh's output lacks %q", want)
		}
	}
	// The binaries carry the packages' version (packaging/version, which
	// build-deb stamps into them).
	if m := regexp.MustCompile(`(?m)^Version: (\S+)$`).FindStringSubmatch(text); m == nil || !strings.Contains(text, "\nvrdmactl "+m[1]+"\n") {
		t.Errorf("vrdmactl version does not say the package's version %v", m)
	}
	if n := strings.Count(text, "200 iters in"); n != 2 {
		t.Errorf("ibv_rc_pingpong: %d sides reported 200 iterations, want client and server", n)
	}
}

// debianRoot returns a clean Debian root of the host's release, made by
// debootstrap (variant minbase, with ibverbs-utils) from
// $VRDMA_DEBIAN_MIRROR (default deb.debian.org) the first time, and cached
// under $VRDMA_TEST_CACHE (default the user's cache directory,
// vrdma-test/): tests mount it read-only under an overlay. It logs to
// t and may run on any goroutine.
func debianRoot(t *testing.T) (string, error) {
	suite := osRelease("VERSION_CODENAME")
	if suite == "" {
		suite = "bookworm"
	}
	cache := os.Getenv("VRDMA_TEST_CACHE")
	if cache == "" {
		c, err := os.UserCacheDir()
		if err != nil {
			return "", fmt.Errorf("no cache directory for the Debian root (%v): set VRDMA_TEST_CACHE", err)
		}
		cache = filepath.Join(c, "vrdma-test")
	}
	dir := filepath.Join(cache, "debian-"+suite+"-minbase-ibverbs-utils")
	if _, err := os.Stat(filepath.Join(dir, "usr", "bin", "ibv_devinfo")); err == nil {
		return dir, nil
	}
	mirror := os.Getenv("VRDMA_DEBIAN_MIRROR")
	if mirror == "" {
		mirror = "http://deb.debian.org/debian"
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(cache, "debootstrap-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute) // cold: 2–4 minutes here
	defer cancel()
	out, err := exec.CommandContext(ctx, "debootstrap", "--variant=minbase", "--include=ibverbs-utils", suite, tmp, mirror).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("debootstrap %s from %s: %v\n%s(set VRDMA_DEBIAN_MIRROR to a reachable mirror)", suite, mirror, err, tail(out, 40))
	}
	if err := os.Rename(tmp, dir); err != nil {
		return "", fmt.Errorf("keep the Debian root in the cache: %v", err)
	}
	t.Logf("debootstrap %s (cold, now cached in %s): %v", suite, dir, time.Since(t0).Round(time.Second))
	return dir, nil
}

// osRelease returns field key of /etc/os-release, "" if absent.
func osRelease(key string) string {
	f, err := os.Open("/etc/os-release")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), key+"="); ok {
			return strings.Trim(v, `"`)
		}
	}
	return ""
}

// tail returns the last n lines of b.
func tail(b []byte, n int) string {
	lines := strings.Split(string(b), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
