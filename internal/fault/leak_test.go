// SPDX-License-Identifier: Apache-2.0

package fault

import (
	"context"
	"os"
	"runtime"
	"strings"
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
