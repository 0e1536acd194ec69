// SPDX-License-Identifier: Apache-2.0

package store_test

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/vrdma/vrdma/internal/control/etcdtest"
)

// TestMain fails the run if a goroutine of the store (an embedded
// member's monitor) outlives the tests.
func TestMain(m *testing.M) {
	code := m.Run()
	if leaked := etcdtest.LeakedGoroutines(); code == 0 && len(leaked) > 0 {
		fmt.Fprintf(os.Stderr, "leaked goroutines:\n%s\n", strings.Join(leaked, "\n\n"))
		code = 1
	}
	os.Exit(code)
}
