// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"reflect"
	"testing"

	"github.com/vrdma/vrdma/internal/abi"
)

// TestHandlersCoverOps: the agent serves exactly the ops of abi's table of
// operations, one handler each, and each handler takes the request body
// the table decodes for its op.
func TestHandlersCoverOps(t *testing.T) {
	ops := map[abi.Op]bool{}
	for _, in := range abi.Ops() {
		ops[in.Op] = true
		hd, ok := handlers[in.Op]
		if !ok {
			t.Errorf("op %d (%s) has no handler", in.Op, in.Name)
			continue
		}
		req := abi.NewRequest(in.Op) // package mgmt is linked: External ops decode too
		if got := reflect.TypeOf(req); got != hd.req {
			t.Errorf("%s: the table decodes %v, the handler takes %v", in.Name, got, hd.req)
		}
	}
	for op := range handlers {
		if !ops[op] {
			t.Errorf("handler for op %d, which is not in abi's table", uint16(op))
		}
	}
}
