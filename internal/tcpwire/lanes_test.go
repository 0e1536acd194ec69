// SPDX-License-Identifier: Apache-2.0

package tcpwire_test

import (
	"strings"
	"testing"

	"github.com/vrdma/vrdma/internal/tcpwire"
)

// TestStripeSize: messages split evenly over the lanes, in stripes of at
// least the least stripe rounded to MinStripe; small ones not at all.
func TestStripeSize(t *testing.T) {
	for _, c := range []struct {
		total        uint64
		lanes        int
		least, want  uint64
		wantStripes  int
		wantLastSize uint64
	}{
		{1 << 20, 2, 128 << 10, 512 << 10, 2, 512 << 10},
		{1 << 20, 4, 128 << 10, 256 << 10, 4, 256 << 10},
		{1 << 20, 8, 256 << 10, 256 << 10, 4, 256 << 10},   // at most total/least stripes
		{1 << 20, 1, 4096, 1 << 20, 1, 1 << 20},            // one lane
		{255 << 10, 4, 128 << 10, 255 << 10, 1, 255 << 10}, // under twice the least: one connection
		{1000001, 3, 512, 333824, 3, 1000001 - 2*333824},   // rounded up to 512
		{2048, 4, 512, 512, 4, 512},
		{1536, 4, 512, 512, 3, 512},
		{1100, 4, 512, 1024, 2, 76}, // 2 stripes: 550 rounded up to 1024, the last shorter
		{1023, 4, 512, 1023, 1, 1023},
		{tcpwire.MaxData, 8, 128 << 10, tcpwire.MaxData / 8, 8, tcpwire.MaxData / 8},
	} {
		s := tcpwire.StripeSize(c.total, c.lanes, c.least)
		if s != c.want {
			t.Errorf("StripeSize(%d, %d, %d) = %d, want %d", c.total, c.lanes, c.least, s, c.want)
			continue
		}
		if s == c.total {
			continue
		}
		h := tcpwire.Header{Version: tcpwire.Version, Type: tcpwire.Write, Flags: tcpwire.FlagStriped, Compare: c.total, PayloadLen: uint32(s)}
		if n := h.StripeCount(); n != c.wantStripes || n > c.lanes {
			t.Errorf("%d bytes in %d-byte stripes: %d stripes, want %d (lanes %d)", c.total, s, n, c.wantStripes, c.lanes)
		}
		// The stripes tile the message exactly.
		var next uint64
		for i := range h.StripeCount() {
			off, n := h.StripeAt(i)
			if off != next || n == 0 {
				t.Fatalf("%d bytes: stripe %d at %d (%d bytes), want it at %d", c.total, i, off, n, next)
			}
			next = off + n
			if i == h.StripeCount()-1 && n != c.wantLastSize {
				t.Errorf("%d bytes: last stripe %d bytes, want %d", c.total, n, c.wantLastSize)
			}
		}
		if next != c.total || h.MessageLen() != c.total {
			t.Errorf("%d bytes: stripes end at %d, MessageLen %d", c.total, next, h.MessageLen())
		}
		var b [tcpwire.HeaderLen]byte
		h.Put(b[:])
		var d tcpwire.Header
		if err := tcpwire.Decode(b[:], tcpwire.Version, &d); err != nil {
			t.Errorf("%d bytes striped: %v", c.total, err)
		}
	}
}

// TestStripedRules: the decoder's rules for the striped flag and STRIPE
// frames.
func TestStripedRules(t *testing.T) {
	ok := tcpwire.Header{Version: tcpwire.Version, Type: tcpwire.Write, Flags: tcpwire.FlagStriped, Tag: 7, DstQPN: 1, SrcQPN: 2, PSN: 3,
		Compare: 1 << 20, PayloadLen: 512 << 10}
	for _, c := range []struct {
		name string
		edit func(h *tcpwire.Header)
		err  string // "" when valid
	}{
		{"write", func(*tcpwire.Header) {}, ""},
		{"send-inv-solicited", func(h *tcpwire.Header) { h.Type, h.Flags = tcpwire.SendInv, h.Flags|tcpwire.FlagSolicited }, ""},
		{"write-imm-xrc", func(h *tcpwire.Header) { h.Type = tcpwire.WriteImm; h.SetXRC(9) }, ""},
		{"read", func(h *tcpwire.Header) { h.Type, h.PayloadLen, h.ImmOrLen = tcpwire.Read, 0, 10 }, "only WRITE"},
		{"uc-write", func(h *tcpwire.Header) { h.Type = tcpwire.UCWrite }, "only WRITE"},
		{"ack", func(h *tcpwire.Header) { h.Type, h.PayloadLen = tcpwire.Ack, 0 }, "only WRITE"},
		{"stripe-striped", func(h *tcpwire.Header) { h.Type = tcpwire.Stripe }, "only WRITE"},
		{"small-first-stripe", func(h *tcpwire.Header) { h.PayloadLen, h.Compare = 511, 1000 }, "least"},
		{"message-not-longer", func(h *tcpwire.Header) { h.Compare = 512 << 10 }, "want more"},
		{"message-over-2gib", func(h *tcpwire.Header) { h.Compare, h.PayloadLen = tcpwire.MaxData+1, 1<<30 }, "want more"},
		{"nine-stripes", func(h *tcpwire.Header) { h.Compare, h.PayloadLen = 9*4096, 4096 }, "9 lanes"},
		{"eight-stripes", func(h *tcpwire.Header) { h.Compare, h.PayloadLen = 8*4096, 4096 }, ""},
		{"flag-8", func(h *tcpwire.Header) { h.Flags |= 8 }, "no other bit"},
		{"stripe", func(h *tcpwire.Header) { h.Type, h.Flags, h.Compare, h.RemoteAddr = tcpwire.Stripe, 0, 0, 512<<10 }, ""},
		{"stripe-solicited", func(h *tcpwire.Header) { h.Type, h.Flags, h.Compare = tcpwire.Stripe, tcpwire.FlagSolicited, 0 }, "solicited"},
		{"stripe-status", func(h *tcpwire.Header) { h.Type, h.Flags, h.Compare, h.Status = tcpwire.Stripe, 0, 0, tcpwire.RNR }, "status"},
		{"stripe-over-2gib", func(h *tcpwire.Header) {
			h.Type, h.Flags, h.Compare, h.PayloadLen = tcpwire.Stripe, 0, 0, tcpwire.MaxData+1
		}, "2 GiB"},
	} {
		h := ok
		c.edit(&h)
		var b [tcpwire.HeaderLen]byte
		h.Put(b[:])
		var d tcpwire.Header
		err := tcpwire.Decode(b[:], tcpwire.Version, &d)
		switch {
		case c.err == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%s: error %v, want one with %q", c.name, err, c.err)
		case err == nil && d != h:
			t.Errorf("%s: decoded %+v, want %+v", c.name, d, h)
		}
	}
}

// TestCheckStripe: a lane's frame must be the stripe due, else the lanes
// lost their order.
func TestCheckStripe(t *testing.T) {
	r := tcpwire.Header{Type: tcpwire.Send, Flags: tcpwire.FlagStriped, Tag: 7, DstQPN: 1, SrcQPN: 2, PSN: 3, Compare: 3000, PayloadLen: 1024}
	good := tcpwire.Header{Type: tcpwire.Stripe, Tag: 7, DstQPN: 1, SrcQPN: 2, PSN: 3, RemoteAddr: 2048, PayloadLen: 952}
	if err := tcpwire.CheckStripe(&r, &good, 2); err != nil {
		t.Fatal(err)
	}
	for name, edit := range map[string]func(h *tcpwire.Header){
		"type":   func(h *tcpwire.Header) { h.Type = tcpwire.Write },
		"tag":    func(h *tcpwire.Header) { h.Tag++ },
		"qp":     func(h *tcpwire.Header) { h.DstQPN++ },
		"src":    func(h *tcpwire.Header) { h.SrcQPN++ },
		"psn":    func(h *tcpwire.Header) { h.PSN++ },
		"offset": func(h *tcpwire.Header) { h.RemoteAddr = 1024 },
		"length": func(h *tcpwire.Header) { h.PayloadLen = 1024 },
	} {
		h := good
		edit(&h)
		if err := tcpwire.CheckStripe(&r, &h, 2); err == nil || !strings.Contains(err.Error(), "lost their order") {
			t.Errorf("%s: %v, want an error", name, err)
		}
	}
}

// TestHelloLanes: the lane keys of HELLO and CHALLENGE.
func TestHelloLanes(t *testing.T) {
	group := strings.Repeat("0f", 16)
	for _, c := range []struct {
		name  string
		lanes uint8
		group string
		lane  uint8
		ok    bool
	}{
		{"none", 0, "", 0, true},
		{"offer", 4, group, 0, true},
		{"offer-8", 8, group, 0, true},
		{"lane", 0, group, 3, true},
		{"offer-1", 1, group, 0, false},
		{"offer-9", 9, group, 0, false},
		{"offer-no-group", 2, "", 0, false},
		{"lane-no-group", 0, "", 1, false},
		{"group-alone", 0, group, 0, false},
		{"both", 2, group, 1, false},
		{"lane-8", 0, group, 8, false},
		{"group-upper", 2, strings.ToUpper(group), 0, false},
	} {
		m := validHello()
		m.Lanes, m.Group, m.Lane = c.lanes, c.group, c.lane
		if err := m.Validate(); (err == nil) != c.ok {
			t.Errorf("%s: %v, want ok %v", c.name, err, c.ok)
		}
	}
	ch := validChallenge()
	ch.Lanes = 9
	if ch.Validate() == nil {
		t.Error("CHALLENGE with 9 lanes passed")
	}
	ch.Lanes = 8
	if err := ch.Validate(); err != nil {
		t.Error(err)
	}
}
