// SPDX-License-Identifier: Apache-2.0

package perf

import (
	"reflect"
	"testing"
	"time"
)

// TestHelloRoundTrip encodes requests of every test and reads them back,
// and checks what ParseHello refuses.
func TestHelloRoundTrip(t *testing.T) {
	for _, tt := range Tests {
		h := Hello{Test: tt, Atomic: CmpAndSwap, Size: 4096, Iters: 1234, CQMod: 100, TxDepth: 128, QPs: 1, Peer: Peer{Addr: 0x7f0012345000, RKey: 0x203}}
		if tt.Atomic() {
			h.Size = 8
		}
		if !tt.Latency() {
			h.QPs = 16
		}
		h.Bidirectional = tt == WriteBW || tt == ReadBW || tt == AtomicBW
		b := h.Encode()
		if len(b) != HelloLen || len(b) > 56 {
			t.Fatalf("%s: %d bytes", tt, len(b))
		}
		got, err := ParseHello(b)
		if err != nil {
			t.Fatalf("%s: %v", tt, err)
		}
		got.Peer.Name = ""
		if got != h {
			t.Errorf("%s: %+v, want %+v", tt, got, h)
		}
	}
	good := Hello{Test: WriteBW, Size: 64, Iters: 10, CQMod: 1, TxDepth: 1}.Encode()
	if h, err := ParseHello(good); err != nil || h.QPs != 1 {
		t.Errorf("a Hello without QPs: %+v, %v; want 1 QP", h, err)
	}
	for name, mod := range map[string]func(b []byte){
		"short":       func(b []byte) {},
		"magic":       func(b []byte) { b[0] = 'x' },
		"test":        func(b []byte) { b[3] = byte(len(Tests)) },
		"atomic":      func(b []byte) { b[4] = 2 },
		"size 0":      func(b []byte) { b[6], b[7], b[8], b[9] = 0, 0, 0, 0 },
		"size huge":   func(b []byte) { b[9] = 0xff },
		"iters 0":     func(b []byte) { b[10], b[11], b[12], b[13] = 0, 0, 0, 0 },
		"tx depth 0":  func(b []byte) { b[16], b[17] = 0, 0 },
		"atomic size": func(b []byte) { b[3] = 3 },           // atomic_bw of 64 bytes
		"lat QPs":     func(b []byte) { b[3], b[30] = 4, 2 }, // write_lat on 2 QPs
		"QPs huge":    func(b []byte) { b[30], b[31] = 0xff, 0xff },
		"flags":       func(b []byte) { b[5] = 2 },
		"send_bw -b":  func(b []byte) { b[3], b[5] = 2, helloBidir },
	} {
		b := append([]byte(nil), good...)
		mod(b)
		if name == "short" {
			b = b[:HelloLen-1]
		}
		if _, err := ParseHello(b); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestResultRoundTrip checks the figures the client hands the server.
func TestResultRoundTrip(t *testing.T) {
	r := Result{Iters: 500, Elapsed: 3 * time.Millisecond, PeakSeen: true, BWPeak: 1.5, BWAvg: 1.25, MsgRate: 0.5,
		TMin: 1, TMax: 9, TTypical: 2, TAvg: 3, TStdev: 0.5, P99: 8, P999: 9}
	got, err := ParseResult(EncodeResult(r))
	if err != nil || !reflect.DeepEqual(got, r) {
		t.Fatalf("%+v, %v; want %+v", got, err, r)
	}
	if _, err := ParseResult(make([]byte, ResultLen)); err == nil {
		t.Error("a zeroed buffer parsed as results")
	}
	p, err := ParsePeer(EncodePeer(Peer{Addr: 42, RKey: 7}), "server")
	if err != nil || p != (Peer{Addr: 42, RKey: 7, Name: "server"}) {
		t.Errorf("peer %+v, %v", p, err)
	}
}

// FuzzParseHello: a hostile client's request never panics the server, and
// what it accepts encodes back to the same request.
func FuzzParseHello(f *testing.F) {
	f.Add(Hello{Test: WriteBW, Size: 65536, Iters: 5000, CQMod: 100, TxDepth: 128}.Encode())
	f.Add(Hello{Test: AtomicLat, Atomic: CmpAndSwap, Size: 8, Iters: 1, CQMod: 1, TxDepth: 1}.Encode())
	f.Add([]byte("vp\x01"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseHello(b)
		if err != nil {
			return
		}
		again, err := ParseHello(h.Encode())
		if err != nil || again != h {
			t.Fatalf("%+v re-encoded as %+v, %v", h, again, err)
		}
		ParsePeer(b, "x")
		ParseResult(b)
	})
}
