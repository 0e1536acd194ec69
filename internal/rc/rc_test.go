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
	s.Start(PSNMask - 1) // wraps within the test
	if s.Check(PSNMask-1) != New || s.Check(PSNMask) != Ahead || s.Check(PSNMask-2) != Duplicate {
		t.Fatal("verdicts at the start")
	}
	s.Done(Response{NAK: NAKRNR}) // not final
	if s.Expected() != PSNMask-1 {
		t.Fatal("an RNR NAK moved the expected PSN")
	}
	s.Done(Response{Value: 41})
	s.Done(Response{NAK: NAKRemAccess})
	if s.Expected() != 0 || s.Check(0) != New {
		t.Fatalf("expected PSN %#x after two requests from 2^24-2, want 0", s.Expected())
	}
	if r, ok := s.Replay(PSNMask - 1); !ok || r.Value != 41 || r.NAK != NAKNone {
		t.Fatalf("replay of the first: %+v %v", r, ok)
	}
	if r, ok := s.Replay(PSNMask); !ok || r.NAK != NAKRemAccess {
		t.Fatalf("replay of the second: %+v %v", r, ok)
	}
	for range ReplayDepth {
		s.Done(Response{})
	}
	if _, ok := s.Replay(PSNMask - 1); ok {
		t.Fatal("a response older than ReplayDepth is still kept")
	}
}

// FuzzSeq drives a Seq with arbitrary PSNs and checks that each PSN's
// final response is recorded once, in order, and replayed as recorded.
func FuzzSeq(f *testing.F) {
	f.Add(uint32(0), []byte{0, 1, 2, 0, 3})
	f.Add(uint32(PSNMask), []byte{0, 0, 255, 1})
	f.Fuzz(func(t *testing.T, start uint32, ops []byte) {
		var s Seq
		s.Start(start)
		done := map[uint32]uint64{}
		for i, op := range ops {
			psn := (s.Expected() + uint32(int8(op))) & PSNMask
			switch s.Check(psn) {
			case New:
				if psn != s.Expected() {
					t.Fatal("New for a PSN that is not the expected one")
				}
				s.Done(Response{Value: uint64(i)})
				done[psn] = uint64(i)
			case Duplicate:
				if r, ok := s.Replay(psn); ok && done[psn] != r.Value {
					t.Fatalf("replay of %#x: %d, recorded %d", psn, r.Value, done[psn])
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
