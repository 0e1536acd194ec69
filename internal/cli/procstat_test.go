// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"os"
	"strings"
	"testing"
)

func TestProcCPUAndRSS(t *testing.T) {
	pid := os.Getpid()
	before, err := procCPU(pid)
	if err != nil {
		t.Fatal(err)
	}
	x := 0
	for i := range 50_000_000 { // some CPU time on this thread
		x += i ^ x>>3
	}
	after, err := procCPU(pid)
	if err != nil {
		t.Fatal(err)
	}
	if after <= before {
		t.Errorf("CPU time %v after a busy loop (%d), %v before: it did not grow", after, x, before)
	}
	rss, err := procRSS(pid, pid)
	if err != nil {
		t.Fatal(err)
	}
	if rss < 1024 {
		t.Errorf("RSS of this process twice: %d KiB", rss)
	}
	// A process that does not exist is an error naming it.
	const gone = 1 << 30
	if _, err := procCPU(gone); err == nil || !strings.Contains(err.Error(), "1073741824") {
		t.Errorf("procCPU of no process: %v", err)
	}
	if _, err := procRSS(gone); err == nil || !strings.Contains(err.Error(), "1073741824") {
		t.Errorf("procRSS of no process: %v", err)
	}
}
