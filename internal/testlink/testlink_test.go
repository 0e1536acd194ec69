// SPDX-License-Identifier: Apache-2.0

package testlink

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/clock"
)

// lenFraming is a 4-byte big-endian payload length, then the payload.
var lenFraming = Framing{HeaderLen: 4, Len: func(h []byte) (int, error) { return int(binary.BigEndian.Uint32(h)), nil }}

func frame(i int) []byte {
	p := fmt.Appendf(nil, "frame %d", i)
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(p))), p...)
}

func TestFatesDeterministic(t *testing.T) {
	f := Faults{Drop: 0.05, Dup: 0.04, Reorder: 0.03, Delay: 0.02}
	a, b, c := NewFates(f, 7), NewFates(f, 7), NewFates(f, 8)
	var counts [5]int
	same := true
	for range 100000 {
		x := a.Next()
		if x != b.Next() {
			t.Fatal("two sequences of seed 7 differ")
		}
		if x != c.Next() {
			same = false
		}
		counts[x]++
	}
	if same {
		t.Error("seeds 7 and 8 gave the same sequence")
	}
	for fate, want := range map[Fate]float64{Drop: 0.05, Dup: 0.04, Reorder: 0.03, Delay: 0.02} {
		got := float64(counts[fate]) / 100000
		if got < want*0.8 || got > want*1.2 {
			t.Errorf("%s: %.4f of frames, want about %.2f", fate, got, want)
		}
	}
}

func TestValidate(t *testing.T) {
	for _, f := range []Faults{{Drop: -0.1}, {Dup: 1.5}, {Drop: 0.6, Delay: 0.6}, {DelayBy: -time.Second}} {
		if f.Validate() == nil {
			t.Errorf("%+v: valid, want an error", f)
		}
	}
	if err := (Faults{Drop: 0.25, Dup: 0.25, Reorder: 0.25, Delay: 0.25}).Validate(); err != nil {
		t.Error(err)
	}
}

// readFrames reads frames from c until no more come within quiet.
func readFrames(t *testing.T, c net.Conn, quiet time.Duration) []string {
	t.Helper()
	var got []string
	hdr := make([]byte, 4)
	for {
		c.SetReadDeadline(time.Now().Add(quiet))
		if _, err := io.ReadFull(c, hdr); err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				return got
			}
			t.Fatal(err)
		}
		p := make([]byte, binary.BigEndian.Uint32(hdr))
		if _, err := io.ReadFull(c, p); err != nil {
			t.Fatal(err)
		}
		got = append(got, string(p))
	}
}

// TestPipeFates sends frames through a pipe on a fake clock and checks
// that each arrives as the seed's fate says: dropped frames never,
// duplicated ones twice, reordered ones after the next frame, delayed ones
// only once the clock has moved.
func TestPipeFates(t *testing.T) {
	f := Faults{Drop: 0.1, Dup: 0.1, Reorder: 0.1, Delay: 0.1, DelayBy: 5 * time.Millisecond}
	clk := clock.NewFake(time.Unix(0, 0))
	var st Stats
	req, resp, err := Pipe(f, 42, lenFraming, clk, &st)
	if err != nil {
		t.Fatal(err)
	}
	defer req.Close()
	defer resp.Close()
	const n = 400
	// The expected arrivals before the clock moves, from the same fates.
	fates := NewFates(f, 42)
	var want, late []string
	held := ""
	for i := range n {
		name := fmt.Sprintf("frame %d", i)
		switch fates.Next() {
		case Drop:
			continue
		case Dup:
			want = append(want, name, name)
		case Reorder:
			if held != "" {
				want = append(want, held)
			}
			held = name
			continue
		case Delay:
			late = append(late, name)
		default:
			want = append(want, name)
		}
		if held != "" {
			want, held = append(want, held), ""
		}
	}
	go func() {
		for i := range n {
			if _, err := req.Write(frame(i)); err != nil {
				return
			}
		}
	}()
	got := readFrames(t, resp, 200*time.Millisecond)
	if held != "" {
		// The last frame held for reordering goes out when its hold
		// expires on the clock.
		late = append([]string{held}, late...)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("before the clock moved, got %d frames, want %d:\ngot  %q\nwant %q", len(got), len(want), got, want)
	}
	clk.Advance(10 * time.Millisecond)
	got = readFrames(t, resp, 200*time.Millisecond)
	slices.Sort(got)
	slices.Sort(late)
	if !slices.Equal(got, late) {
		t.Fatalf("after the clock moved, got %q, want the delayed frames %q", got, late)
	}
	if st.Frames.Load() != n || st.Dropped.Load() == 0 || st.Duplicated.Load() == 0 || st.Reordered.Load() == 0 || st.Delayed.Load() == 0 {
		t.Errorf("stats %s: want %d frames and every fault", &st, n)
	}
}

// TestPipeBothWays: responses go back through their own fates, and closing
// one end ends the pipe at the other.
func TestPipeBothWays(t *testing.T) {
	req, resp, err := Pipe(Faults{}, 1, lenFraming, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Close()
	go resp.Write(frame(9))
	if got := readFrames(t, req, 100*time.Millisecond); !slices.Equal(got, []string{"frame 9"}) {
		t.Fatalf("got %q", got)
	}
	req.Close()
	resp.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := resp.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("read after the other end closed: %v, want EOF", err)
	}
}

// TestPipeBadLength: a length beyond any frame ends the pipe instead of
// allocating it.
func TestPipeBadLength(t *testing.T) {
	req, resp, err := Pipe(Faults{}, 1, lenFraming, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer req.Close()
	defer resp.Close()
	req.Write([]byte{0xff, 0xff, 0xff, 0xff})
	resp.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := resp.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("read: %v, want EOF (the shaper gave up)", err)
	}
}
