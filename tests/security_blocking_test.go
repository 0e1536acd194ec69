// SPDX-License-Identifier: Apache-2.0

package vrdma_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/testenv"
)

// TestSecurityBlockingCap checks the cap on blocking commands in flight
// on one session (vrdmad --max-blocking-per-session, here 2): with two
// accepts waiting at the agent, a third is refused at once, naming the
// flag; once a listener closes and its accept ends, the slot is free
// again.
func TestSecurityBlockingCap(t *testing.T) {
	env := testenv.StartWith(t, testenv.Options{MaxBlocking: 2})
	v := env.Open(t, "blocking", testenv.VMOptions{MemMB: 8})
	ad := v.Adapters()[0]
	ctx := t.Context()
	var ls []interface {
		Close(context.Context) error
	}
	accept := make([]func(time.Duration) error, 3)
	for i := range accept {
		l, err := ad.Listen(ctx, uint16(7100+i))
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		accept[i] = func(d time.Duration) error {
			c, cancel := context.WithTimeout(ctx, d)
			defer cancel()
			_, err := l.Accept(c)
			return err
		}
	}
	// Two accepts in flight at the agent: each call returns at its
	// deadline, its request still waiting there.
	for i := range 2 {
		if err := accept[i](50 * time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("accept %d with no dialer: %v, want its deadline", i, err)
		}
	}
	err := accept[2](5 * time.Second)
	if err == nil || !strings.Contains(err.Error(), "--max-blocking-per-session") {
		t.Fatalf("a third blocking command with 2 in flight and a cap of 2: %v, want a refusal naming --max-blocking-per-session", err)
	}
	if err := ls[0].Close(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := accept[2](100 * time.Millisecond)
		if errors.Is(err, context.DeadlineExceeded) {
			break // admitted: it waits for a dialer
		}
		if time.Now().After(deadline) {
			t.Fatalf("a blocking command after one of the two ended: %v, want it admitted", err)
		}
	}
}
