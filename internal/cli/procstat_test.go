// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"
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
	// Each sleep of this thread is a wake-up of the process.
	wBefore, err := procWakeups(pid)
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		time.Sleep(time.Millisecond)
	}
	wAfter, err := procWakeups(pid)
	if err != nil {
		t.Fatal(err)
	}
	if wAfter.Total < wBefore.Total+20 {
		t.Errorf("wake-ups %d after 20 sleeps, %d before: want at least 20 more", wAfter.Total, wBefore.Total)
	}
	if wAfter.Monitor == 0 || wAfter.Monitor > wAfter.Total {
		t.Errorf("the runtime monitor's wake-ups: %d of %d; it sleeps between its rounds", wAfter.Monitor, wAfter.Total)
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
	if _, err := procWakeups(gone); err == nil || !strings.Contains(err.Error(), "1073741824") {
		t.Errorf("procWakeups of no process: %v", err)
	}
	if _, err := procRSS(gone); err == nil || !strings.Contains(err.Error(), "1073741824") {
		t.Errorf("procRSS of no process: %v", err)
	}
}

// FuzzProcFields feeds the /proc parsers of procWakeups anything: an
// error or a number, never a panic.
func FuzzProcFields(f *testing.F) {
	f.Add([]byte("Name:\tvrdmad\nvoluntary_ctxt_switches:\t42\nnonvoluntary_ctxt_switches:\t7\n"))
	f.Add([]byte("1234 (vrdma d)) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 777 0 0\n"))
	f.Add([]byte("voluntary_ctxt_switches: -1\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if n, err := statusField(b, "voluntary_ctxt_switches:"); err == nil && !bytes.Contains(b, []byte("voluntary_ctxt_switches:")) {
			t.Errorf("statusField found %d in a file without the key", n)
		}
		if _, err := threadStart(b); err == nil && !bytes.Contains(b, []byte(")")) {
			t.Errorf("threadStart found a start time in a file without a command name")
		}
	})
}
