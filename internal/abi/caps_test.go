// SPDX-License-Identifier: Apache-2.0

package abi

import (
	"encoding/json"
	"testing"
)

// TestCaps checks the capability bits' names, the baseline of agents that
// send none, and that an old client's hello (no caps) decodes to none.
func TestCaps(t *testing.T) {
	for _, c := range []struct {
		caps Caps
		want string
	}{
		{0, "none"},
		{CapFence | CapCM, "fence|cm"},
		{CapsKnown, "async-mode|fence|path-memcpy|path-tcp|cm|qp-counters|vm-manage|mr-iova|async-events|srq|ud|uc|core-verbs|qp-events|mw|xrc|mcast|odp|atomic-write|cq-overrun|open-qp|memcpy-direct|direct-send"},
		{CapPathTCP | 1<<40, "path-tcp|0x10000000000"},
	} {
		if got := c.caps.String(); got != c.want {
			t.Errorf("Caps(%#x).String() = %q, want %q", uint64(c.caps), got, c.want)
		}
	}
	var named Caps
	for i, n := range capNames {
		if n != "" {
			named |= 1 << i
		}
	}
	if CapsKnown != named {
		t.Errorf("CapsKnown %#x does not match the named bits %#x", uint64(CapsKnown), uint64(named))
	}
	if Caps(0).Effective() != CapsBaseline || CapFence.Effective() != CapFence {
		t.Errorf("Effective: %s, %s", Caps(0).Effective(), CapFence.Effective())
	}
	if !CapsKnown.Has(CapsBaseline) || CapsBaseline.Has(CapFence) {
		t.Errorf("baseline %s", CapsBaseline)
	}
	var h Hello
	if err := json.Unmarshal([]byte(`{"client":"old"}`), &h); err != nil || h.Caps != 0 {
		t.Errorf("old hello: %+v, %v", h, err)
	}
	if err := json.Unmarshal([]byte(`{"client":"new","caps":9007199254740991}`), &h); err != nil || h.Caps != 1<<53-1 {
		t.Errorf("hello with every bit a double holds: %+v, %v", h, err)
	}
}
