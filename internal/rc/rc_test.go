// SPDX-License-Identifier: Apache-2.0

package rc

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/abi"
)

func TestPSNNext(t *testing.T) {
	if PSNNext(5) != 6 || PSNNext(PSNMask) != 0 {
		t.Error("PSNNext does not count in 24 bits")
	}
}

func TestTimers(t *testing.T) {
	if got := LocalACKTimeout(14); got != 67108864*time.Nanosecond {
		t.Errorf("timeout 14: %v", got)
	}
	if LocalACKTimeout(0) != LocalACKTimeout(14) {
		t.Error("timeout 0 is not read as 14")
	}
	if LocalACKTimeout(1) != 8192*time.Nanosecond || LocalACKTimeout(31) != time.Duration(4096<<31) {
		t.Error("4.096 µs × 2^timeout does not hold at the ends")
	}
	if RNRDelay(0) != 655360*time.Microsecond || RNRDelay(1) != 10*time.Microsecond || RNRDelay(31) != 491520*time.Microsecond || RNRDelay(32+14) != RNRDelay(14) {
		t.Error("RNR timer table")
	}
}

func TestBudget(t *testing.T) {
	var b Budget
	b.Arm(2, 1)
	b.Arm(7, 7) // same episode: no reload
	for i := range 2 {
		if _, ok := b.Transport(); !ok {
			t.Fatalf("transport retry %d refused with retry_cnt 2", i+1)
		}
	}
	if st, ok := b.Transport(); ok || st != abi.WCRetryExcErr {
		t.Fatalf("third transport retry: %v %s", ok, st)
	}
	if _, ok := b.RNR(); !ok {
		t.Fatal("RNR retry refused with rnr_retry 1")
	}
	if st, ok := b.RNR(); ok || st != abi.WCRNRRetryExcErr {
		t.Fatalf("second RNR retry: %v %s", ok, st)
	}
	b.Reset()
	b.Arm(0, 7)
	for range 1000 {
		if _, ok := b.RNR(); !ok {
			t.Fatal("rnr_retry 7 is not infinite")
		}
	}
}

func TestNAK(t *testing.T) {
	for _, st := range []abi.WCStatus{abi.WCSuccess, abi.WCRemAccessErr, abi.WCRemOpErr, abi.WCRemInvReqErr} {
		if got := NAKOf(st).Status(); got != st {
			t.Errorf("%s → %s → %s", st, NAKOf(st), got)
		}
	}
	if NAKOf(abi.WCLocLenErr) != NAKInvReq {
		t.Error("a local length error at the responder is not an invalid request")
	}
}

func TestSeq(t *testing.T) {
	var s Seq
	if s.Started() {
		t.Fatal("zero Seq started")
	}
	s.Start(PSNMask-1, 4) // wraps within the test
	if s.Check(PSNMask-1) != New || s.Check(PSNMask) != Ahead || s.Check(PSNMask-2) != Duplicate {
		t.Fatal("verdicts at the start")
	}
	s.Done(NAKRNR) // not final
	if s.Expected() != PSNMask-1 {
		t.Fatal("an RNR NAK moved the expected PSN")
	}
	s.Executed(Resource{Atomic: true, Value: 41})
	s.Done(NAKRemAccess)
	if s.Expected() != 0 || s.Check(0) != New {
		t.Fatalf("expected PSN %#x after two requests from 2^24-2, want 0", s.Expected())
	}
	if v, ok := s.Atomic(PSNMask - 1); !ok || v != 41 {
		t.Fatalf("replay of the atomic: %d %v", v, ok)
	}
	if nak, ok := s.Refused(PSNMask); !ok || nak != NAKRemAccess {
		t.Fatalf("replay of the refusal: %s %v", nak, ok)
	}
	if _, ok := s.Refused(PSNMask - 1); ok {
		t.Fatal("the atomic reads as refused")
	}
	// A READ of three response packets, at 0, 1 and 2.
	s.Executed(Resource{N: 3, RKey: 7, VA: 0x1000, Len: 2500})
	if s.Expected() != 3 {
		t.Fatalf("expected PSN %#x after a READ of 3 packets at 0, want 3", s.Expected())
	}
	for psn := uint32(0); psn < 3; psn++ {
		if r, ok := s.Read(psn); !ok || r.PSN != 0 || r.N != 3 || r.RKey != 7 || r.VA != 0x1000 || r.Len != 2500 {
			t.Fatalf("READ resource for PSN %d: %+v %v", psn, r, ok)
		}
	}
	if _, ok := s.Atomic(1); ok {
		t.Fatal("a READ's PSN reads as an atomic")
	}
	if _, ok := s.Read(PSNMask - 1); ok {
		t.Fatal("an atomic's PSN reads as a READ")
	}
	if _, ok := s.Refused(PSNMask); ok {
		t.Fatal("a refusal is still reported after a request executed")
	}
}

// TestSeqAtomicAfterManyPackets checks that no number of SEND and WRITE
// packets evicts an atomic's result: a duplicate of the atomic 300 packets
// later (more than the requester's window, more than 64) is answered with
// its original value. The replay cache it replaced kept one response per
// PSN modulo 64, and lost it.
func TestSeqAtomicAfterManyPackets(t *testing.T) {
	var s Seq
	s.Start(PSNMask-10, 1) // one resource, and the PSNs wrap
	at := s.Expected()
	s.Executed(Resource{Atomic: true, Value: 0xfeed})
	for range 300 {
		s.Done(NAKNone)
	}
	if s.Check(at) != Duplicate {
		t.Fatal("the atomic's PSN is not a duplicate")
	}
	if v, ok := s.Atomic(at); !ok || v != 0xfeed {
		t.Fatalf("duplicate atomic after 300 packets: %#x %v, want its original value 0xfeed", v, ok)
	}
}

// TestSeqUnheldAtomic checks the responder resources' depth: an atomic is
// held while it is among the last max_dest_rd_atomic READs and atomics,
// and a duplicate of one older is reported not held, to be answered with
// NAKUnheld (an invalid request), never executed again nor ignored.
func TestSeqUnheldAtomic(t *testing.T) {
	for _, depth := range []uint8{1, 2, 4, MaxResources, 255} {
		var s Seq
		s.Start(1000, depth)
		n := min(int(depth), MaxResources)
		first := s.Expected()
		s.Executed(Resource{Atomic: true, Value: 1})
		for i := range n - 1 { // READs and atomics, with SENDs between
			s.Done(NAKNone)
			if i%2 == 0 {
				s.Executed(Resource{N: 2, Len: 2048})
			} else {
				s.Executed(Resource{Atomic: true, Value: uint64(i + 2)})
			}
		}
		if v, ok := s.Atomic(first); !ok || v != 1 {
			t.Fatalf("max_dest_rd_atomic %d: the oldest of %d atomics and READs is not held: %d %v", depth, n, v, ok)
		}
		s.Executed(Resource{Atomic: true, Value: 99})
		if v, ok := s.Atomic(first); ok {
			t.Fatalf("max_dest_rd_atomic %d: an atomic older than the last %d READs and atomics is still held (%d)", depth, n, v)
		}
		if _, ok := s.Refused(first); ok {
			t.Fatalf("max_dest_rd_atomic %d: the unheld atomic reads as refused", depth)
		}
		if v, ok := s.Atomic(s.Expected() - 1); !ok || v != 99 {
			t.Fatalf("max_dest_rd_atomic %d: the newest atomic is not held: %d %v", depth, v, ok)
		}
	}
	if NAKUnheld != NAKInvReq || NAKUnheld.Status() != abi.WCRemInvReqErr {
		t.Fatalf("an unheld duplicate atomic is answered %s (%s), want INV_REQ (REM_INV_REQ_ERR)", NAKUnheld, NAKUnheld.Status())
	}
	var s Seq
	s.Start(0, 0) // no resources: nothing held, the PSNs still move
	s.Executed(Resource{Atomic: true, Value: 5})
	if _, ok := s.Atomic(0); ok || s.Expected() != 1 {
		t.Fatalf("max_dest_rd_atomic 0: held, or the expected PSN is %d, want 1", s.Expected())
	}
}

// FuzzSeq drives a Seq with arbitrary PSNs and checks that each PSN's
// final response is recorded once, in order, and replayed as recorded:
// an atomic's value while it is among the last max_dest_rd_atomic READs
// and atomics, whatever else came after it.
func FuzzSeq(f *testing.F) {
	f.Add(uint32(0), uint8(1), []byte{0, 1, 2, 0, 3})
	f.Add(uint32(PSNMask), uint8(16), []byte{0, 0, 255, 1})
	f.Fuzz(func(t *testing.T, start uint32, depth uint8, ops []byte) {
		var s Seq
		s.Start(start, depth)
		n := min(int(depth), MaxResources)
		type rec struct {
			atomic bool
			value  uint64
			order  int // among the READs and atomics
		}
		done := map[uint32]rec{}
		rdAtomics := 0
		for i, op := range ops {
			psn := (s.Expected() + uint32(int8(op>>2))) & PSNMask
			switch s.Check(psn) {
			case New:
				if psn != s.Expected() {
					t.Fatal("New for a PSN that is not the expected one")
				}
				switch op & 3 {
				case 0:
					s.Done(NAKNone)
					done[psn] = rec{}
				case 1, 2:
					s.Executed(Resource{Atomic: true, Value: uint64(i)})
					done[psn] = rec{atomic: true, value: uint64(i), order: rdAtomics}
					rdAtomics++
				case 3:
					s.Executed(Resource{N: 2})
					delete(done, psn)
					delete(done, PSNNext(psn))
					rdAtomics++
				}
			case Duplicate:
				r, known := done[psn]
				v, ok := s.Atomic(psn)
				if ok && (!known || !r.atomic || r.value != v) {
					t.Fatalf("replay of %#x: %d, recorded %+v", psn, v, r)
				}
				if known && r.atomic && !ok && rdAtomics-r.order <= n {
					t.Fatalf("atomic at %#x lost: %d READs and atomics since, max_dest_rd_atomic %d", psn, rdAtomics-r.order-1, depth)
				}
			case Ahead:
				if PSNDiff(psn, s.Expected()) <= 0 {
					t.Fatal("Ahead for a PSN not ahead")
				}
			}
		}
	})
}

func TestPSNDiff(t *testing.T) {
	cases := []struct {
		a, b uint32
		want int32
	}{
		{0, 0, 0},
		{1, 0, 1},
		{0, 1, -1},
		{0, 0xffffff, 1},  // the wrap: 0 follows 0xffffff
		{0xffffff, 0, -1}, // and 0xffffff precedes 0
		{5, 0xfffffe, 7},
		{0xfffffe, 5, -7},
		{0x7fffff, 0, 0x7fffff},    // the farthest ahead
		{0x800000, 0, -0x800000},   // half the space away counts as behind
		{0, 0x800000, -0x800000},   // from either side
		{0x123456, 0x123456, 0},    // equal
		{0x1000000, 0, 0},          // bits above 24 are ignored
		{0xff000001, 0x2000000, 1}, // in both operands
	}
	for _, c := range cases {
		if got := PSNDiff(c.a, c.b); got != c.want {
			t.Errorf("PSNDiff(0x%x, 0x%x) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		a := r.Uint32() & PSNMask
		d := int32(r.IntN(1<<24)) - 1<<23 // [-2^23, 2^23)
		b := (a + uint32(d)) & PSNMask
		if got := PSNDiff(b, a); got != d {
			t.Fatalf("PSNDiff(0x%x, 0x%x) = %d, want %d", b, a, got, d)
		}
		if got := PSNDiff(a, b); d != -1<<23 && got != -d {
			t.Fatalf("PSNDiff(0x%x, 0x%x) = %d, want %d", a, b, got, -d)
		}
	}
}
