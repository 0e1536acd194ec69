// SPDX-License-Identifier: Apache-2.0

package vmconfig

import (
	"errors"
	"testing"

	"github.com/vrdma/vrdma/internal/vmx"
)

// FuzzConfig checks that Parse never panics and that a Config it returns
// keeps the documented limits.
func FuzzConfig(f *testing.F) {
	f.Add([]byte(example))
	f.Add([]byte("memSize = \"1\"\n" + adapterLines(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10)))
	f.Add([]byte("memSize = 4096\nethernet3.virtualDev = VRDMA\nethernet3.generatedAddress = 00:50:56:aa:bb:cc\n"))
	f.Add([]byte("memSize = \"x\"\nsched.mem.pin = \"maybe\"\nethernet01.virtualDev = \"vrdma\"\n"))
	f.Add([]byte("memSize = 4\nvrdma.directPeers = \"vmB,vmC  .bad\"\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err != nil {
			var e *Error
			var pe *vmx.ParseError
			if !errors.As(err, &e) && !errors.As(err, &pe) {
				t.Fatalf("error is neither a *Error nor a *vmx.ParseError: %v", err)
			}
			if c != nil {
				t.Fatalf("Parse returned a Config with an error")
			}
			_ = err.Error()
			return
		}
		if c.MemSizeMB < MinMemSizeMB || c.MemSizeMB > MaxMemSizeMB {
			t.Fatalf("MemSizeMB = %d", c.MemSizeMB)
		}
		if c.MemMinMB < 0 || c.MemMinMB > MaxMemSizeMB || c.HWVersion < 0 || c.HWVersion > MaxHWVersion {
			t.Fatalf("MemMinMB = %d, HWVersion = %d", c.MemMinMB, c.HWVersion)
		}
		if len(c.Adapters) > MaxAdapters {
			t.Fatalf("%d adapters", len(c.Adapters))
		}
		for i, a := range c.Adapters {
			if a.Index < 0 || a.Index > MaxAdapterIndex || i > 0 && a.Index <= c.Adapters[i-1].Index {
				t.Fatalf("adapter indexes out of order or range: %+v", c.Adapters)
			}
			if a.MAC != nil && len(a.MAC) != 6 {
				t.Fatalf("MAC %v", a.MAC)
			}
			_ = a.Name()
		}
		_ = c.MemoryLocked()
	})
}
