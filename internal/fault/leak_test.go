// SPDX-License-Identifier: Apache-2.0

package fault

import (
	"context"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/sys"
)

// TestFaultLeaksCaught: a descriptor, a mapping of vrdma shared memory
// and a goroutine held beyond a baseline each show in Leaks, and Settle
// fails naming them while they are held and passes once they are gone:
// the leak check is able to fail.
func TestFaultLeaksCaught(t *testing.T) {
	snap := func() (Resources, error) {
		return Snapshot(0, func() (int, error) { return runtime.NumGoroutine(), nil })
	}
	base, err := snap()
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	mfd, err := sys.Memfd("vrdma-leak-test", 4096)
	if err != nil {
		t.Fatal(err)
	}
	m, err := sys.Map(mfd.Int(), 4096, false)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { // the leaked goroutine, until the test ends it
		defer close(done)
		<-stop
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	err = Settle(ctx, "this process", base, snap)
	if err == nil {
		t.Fatal("Settle passed with a descriptor, a mapping and a goroutine held")
	}
	for _, want := range []string{"descriptors of " + os.DevNull, "descriptors of /memfd:vrdma-leak-test", "mappings of vrdma shared memory", "goroutines"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Settle: %v\nwant it to name %q", err, want)
		}
	}
	f.Close()
	m.Unmap()
	mfd.Close()
	close(stop)
	<-done
	ctx2, cancel2 := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel2()
	if err := Settle(ctx2, "this process", base, snap); err != nil {
		t.Fatalf("once released: %v", err)
	}
}

// leakedParker is a function of its own so that its frame names the
// goroutines TestStackDiffNamesLeak leaks.
func leakedParker(stop <-chan struct{}) { <-stop }

// TestStackDiffNamesLeak: three goroutines started after a baseline
// profile show in StackDiff as "3 more" at the function they wait in, and
// nothing shows once they are gone.
func TestStackDiffNamesLeak(t *testing.T) {
	profile := func() string {
		var b strings.Builder
		if err := pprof.Lookup("goroutine").WriteTo(&b, 1); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	base := profile()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() { leakedParker(stop) })
	}
	for runtime.NumGoroutine() < 4 { // this one and the three, at least
		runtime.Gosched()
	}
	time.Sleep(10 * time.Millisecond) // parked in leakedParker
	now := profile()
	if n, all := CountGoroutines(now, "github.com/vrdma/vrdma/internal/fault.leakedParker"), CountGoroutines(now); n != all-3 {
		t.Errorf("CountGoroutines leaving out leakedParker = %d, want %d (all %d, less the 3 parked)", n, all-3, all)
	}
	d := StackDiff(base, now)
	if !strings.Contains(d, "3 more goroutines at:") || !strings.Contains(d, "fault.leakedParker") {
		t.Errorf("StackDiff after 3 goroutines parked in leakedParker:\n%s", d)
	}
	close(stop)
	wg.Wait()
	if d := StackDiff(base, profile()); strings.Contains(d, "leakedParker") {
		t.Errorf("StackDiff names leakedParker after its goroutines ended:\n%s", d)
	}
	if d := StackDiff("not a profile", "goroutine profile: total 1\n\nx @ y\n"); d != "" {
		t.Errorf("StackDiff of unparsable profiles = %q, want empty", d)
	}
}
