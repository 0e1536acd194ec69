// SPDX-License-Identifier: Apache-2.0

package vrdma_test

import (
	"context"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/testenv"
)

// TestLifecycleReopenAtOnce checks that a VM closed by its workload can be
// opened again at once (the agent waits for the detach rather than refuse
// it), that Close returns only once the VM is detached (a define right
// after it succeeds).
func TestLifecycleReopenAtOnce(t *testing.T) {
	env := testenv.Start(t)
	env.Define(t, "vm1", testenv.VMOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	agent, err := vrdma.DialAgent(ctx, vrdma.WithSocket(env.Socket))
	if err != nil {
		t.Fatal(err)
	}
	defer agent.Close()
	for i := range 50 {
		if i%2 == 1 {
			if err := agent.DefineVM(ctx, "vm1", []byte(testenv.VMX(testenv.VMOptions{MemMB: 4 + i%3}))); err != nil {
				t.Fatalf("define %d right after the previous close: %v", i, err)
			}
		}
		v, err := vrdma.Open(ctx, "vm1", vrdma.WithSocket(env.Socket))
		if err != nil {
			t.Fatalf("open %d right after the previous close: %v", i, err)
		}
		if _, err := v.Adapters()[0].AllocPD(ctx); err != nil {
			t.Fatal(err)
		}
		v.Close()
	}
}
