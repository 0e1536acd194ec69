// SPDX-License-Identifier: Apache-2.0

package verbsabi

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/vrdma/vrdma/internal/testenv"
)

// hugePagesFree is where Linux counts the free 2 MiB huge pages.
const hugePagesFree = "/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages"

// hugePages makes sure at least n 2 MiB huge pages are free for the test:
// as root it raises /proc/sys/vm/nr_hugepages by what is missing, and
// puts it back when the test ends. It fails the test when the kernel
// cannot give them (memory too fragmented).
func hugePages(t *testing.T, n int) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("allocating huge pages (/proc/sys/vm/nr_hugepages) needs root (CI runs as root)")
	}
	read := func(p string) int {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Skipf("this kernel has no 2 MiB huge pages: %v", err)
		}
		v, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		return v
	}
	free := read(hugePagesFree)
	if free >= n {
		return
	}
	const nr = "/proc/sys/vm/nr_hugepages"
	was := read(nr)
	if err := os.WriteFile(nr, []byte(strconv.Itoa(was+n-free)), 0); err != nil {
		t.Fatalf("allocating %d huge pages: %v", n-free, err)
	}
	t.Cleanup(func() { os.WriteFile(nr, []byte(strconv.Itoa(was)), 0) })
	if got := read(hugePagesFree); got < n {
		t.Fatalf("asked Linux for %d more 2 MiB huge pages, %d are free: memory too fragmented", n-free, got)
	}
}

// TestVerbsABIHugePages runs guest/ibverbs/tests/hugetlb_check.c: regions
// over huge pages (MAP_HUGETLB), one over part of a page and one with
// IBV_ACCESS_HUGETLB; an RDMA WRITE lands in the program's huge-page
// memory; the contents survive registration and deregistration, and the
// mapping unmaps whole.
func TestVerbsABIHugePages(t *testing.T) {
	hugePages(t, 4)
	lib := Build(t)
	env := testenv.Start(t)
	env.Define(t, "vm1", testenv.VMOptions{MemMB: 16})
	out, _ := runC(t, lib, env.Socket, "vm1", "hugetlb_check")
	if n := strings.Count(out, "ok "); n < 9 {
		t.Errorf("only %d checks ran:\n%s", n, out)
	}
}
