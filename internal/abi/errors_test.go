// SPDX-License-Identifier: Apache-2.0

package abi

import (
	"errors"
	"fmt"
	"testing"
)

// TestErrorIs checks that an *Error of each code, bare or wrapped,
// matches its code's sentinel under errors.Is and no other, and that an
// error of an unknown code matches none.
func TestErrorIs(t *testing.T) {
	codes := []struct {
		code string
		err  error
	}{
		{CodeInvalid, ErrInvalid},
		{CodeNotFound, ErrNotFound},
		{CodeLimit, ErrLimit},
		{CodeState, ErrState},
		{CodeExists, ErrExists},
		{CodePermission, ErrPermission},
		{CodeUnavailable, ErrUnavailable},
		{CodeRefused, ErrRefused},
		{CodeInternal, ErrInternal},
	}
	for _, c := range append(codes, struct {
		code string
		err  error
	}{"no-such-code", nil}) {
		e := Errorf(c.code, "f", "it failed")
		for _, err := range []error{e, fmt.Errorf("op: %w", e), fmt.Errorf("outer: %w", fmt.Errorf("op: %w", e))} {
			for _, s := range codes {
				if got, want := errors.Is(err, s.err), s.err == c.err; got != want {
					t.Errorf("code %s: errors.Is(%v, %v) = %v, want %v", c.code, err, s.err, got, want)
				}
			}
		}
		if got := CodeError(c.code); got != c.err {
			t.Errorf("CodeError(%q) = %v, want %v", c.code, got, c.err)
		}
		if e.Error() != "it failed (field f): "+c.code {
			t.Errorf("message changed: %q", e.Error())
		}
	}
}
