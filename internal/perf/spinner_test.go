// SPDX-License-Identifier: Apache-2.0

package perf

import (
	"context"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/testenv"
)

// TestSpinnerGosched: a side alone in its process (an Endpoint, as vrdmactl
// perf's server and client make) spins without runtime.Gosched, which woke
// a thread at every yield; a Pair's sides, both in this process, keep it so
// that each lets the other run.
func TestSpinnerGosched(t *testing.T) {
	env := testenv.Start(t)
	v1 := env.Open(t, "vm1", testenv.VMOptions{})
	v2 := env.Open(t, "vm2", testenv.VMOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	e, err := NewEndpoint(ctx, v1.Adapters()[0], PairConfig{}, true)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(context.Background())
	if sp := e.Side.spinner(ctx); sp.gosched {
		t.Error("an endpoint's spinner calls Gosched: alone in its process, it should only yield the CPU")
	}

	p, err := Connect(ctx, v1.Adapters()[0], v2.Adapters()[0], PairConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	for _, s := range []*Side{p.A, p.B} {
		if sp := s.spinner(ctx); !sp.gosched {
			t.Errorf("%s's spinner does not call Gosched: the pair's other side runs in this process", s.Name())
		}
	}
}
