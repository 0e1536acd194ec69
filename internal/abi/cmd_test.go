// SPDX-License-Identifier: Apache-2.0

package abi

import (
	"errors"
	"testing"
)

// TestAckTimeoutBounds checks the ACK timeout of connect, cm-connect and
// accept-request: 0..31 (ibv_qp_attr.timeout's 5 bits), absent the
// default; 32 is refused naming the field.
func TestAckTimeoutBounds(t *testing.T) {
	u8 := func(v uint8) *uint8 { return &v }
	for _, tc := range []struct {
		t  *uint8
		ok bool
	}{{nil, true}, {u8(0), true}, {u8(31), true}, {u8(32), false}, {u8(255), false}} {
		for name, err := range map[string]error{
			"connect":        (&Connect{Remote: "vm/vrdma0", Port: 1, AckTimeout: tc.t}).Validate(),
			"cm-connect":     (&CMConnect{Remote: "vm/vrdma0", Port: 1, AckTimeout: tc.t}).Validate(),
			"accept-request": (&AcceptRequest{AckTimeout: tc.t}).Validate(),
		} {
			var e *Error
			switch {
			case tc.ok && err != nil:
				t.Errorf("%s with ack_timeout %v: %v", name, tc.t, err)
			case !tc.ok && (!errors.As(err, &e) || e.Field != "ack_timeout"):
				t.Errorf("%s with ack_timeout %d: %v, want invalid-argument naming ack_timeout", name, *tc.t, err)
			}
		}
	}
	if AckTimeoutOr(nil) != DefaultTimeout || AckTimeoutOr(u8(21)) != 21 {
		t.Errorf("AckTimeoutOr: nil %d, 21 %d", AckTimeoutOr(nil), AckTimeoutOr(u8(21)))
	}
}

// TestConnectionQP checks how cm-connect and accept-request name their QP:
// by handle, or by a 24-bit number for a QP the workload moves itself, not
// both at once.
func TestConnectionQP(t *testing.T) {
	for _, tc := range []struct {
		handle, qpn uint32
		ok          bool
	}{{1, 0, true}, {0, 0x12, true}, {0, 0xffffff, true}, {1, 0x12, false}, {0, 0x1000000, false}} {
		for name, err := range map[string]error{
			"cm-connect":     (&CMConnect{Remote: "vm/vrdma0", Port: 1, QP: tc.handle, QPN: tc.qpn}).Validate(),
			"accept-request": (&AcceptRequest{QP: tc.handle, QPN: tc.qpn}).Validate(),
		} {
			var e *Error
			switch {
			case tc.ok && err != nil:
				t.Errorf("%s with qp %d, qpn 0x%x: %v", name, tc.handle, tc.qpn, err)
			case !tc.ok && (!errors.As(err, &e) || e.Field != "qpn"):
				t.Errorf("%s with qp %d, qpn 0x%x: %v, want invalid-argument naming qpn", name, tc.handle, tc.qpn, err)
			}
		}
	}
}
