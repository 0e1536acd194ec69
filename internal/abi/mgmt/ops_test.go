// SPDX-License-Identifier: Apache-2.0

package mgmt_test

import (
	"os"
	"reflect"
	"regexp"
	"testing"

	"github.com/vrdma/vrdma/internal/abi"
	_ "github.com/vrdma/vrdma/internal/abi/mgmt"
)

// TestEveryOpDecodes: with package mgmt linked, as in the agent and
// vrdmactl, every op of abi's table has a request body — the External ones
// registered by this package — and each External op's body is the type
// docs/wire-local.md §4 names.
func TestEveryOpDecodes(t *testing.T) {
	b, err := os.ReadFile("../../../docs/wire-local.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range abi.Ops() {
		req := abi.NewRequest(in.Op)
		if req == nil {
			t.Errorf("%s: no request body", in.Name)
			continue
		}
		if !in.External {
			continue
		}
		name := reflect.TypeOf(req).Elem().Name()
		row := regexp.MustCompile(`(?m)^\| \d+ \| ` + in.Name + ` \| ` + name + ` → `)
		if !row.Match(b) {
			t.Errorf("%s: body %s, but wire-local.md §4 names another", in.Name, name)
		}
	}
}
