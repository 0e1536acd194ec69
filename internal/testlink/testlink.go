// SPDX-License-Identifier: Apache-2.0

// Package testlink is vrdma's test transport: an in-process link whose
// frames suffer faults — drop, duplicate, reorder, delay — chosen by a
// seeded generator, on a clock the test may own (package clock). The
// agent runs a path over it (testenv.Options.TestLink) so that the RC rules
// of its requesters and responders meet lost, repeated, late and
// out-of-order frames deterministically: the same seed gives every frame
// of a direction the same fate.
//
// A Pipe is two connected stream sockets (real socketpairs) with a shaper
// goroutine in each direction between them:
//
//	requester conn ⇄ socketpair ⇄ shaper (requests)  → socketpair ⇄ responder conn
//	                               shaper (responses) ←
//
// Each shaper reads whole frames (a header and the payload length it
// declares, Framing), draws each one's fate and forwards it. A shaper
// owns its direction; it ends when its reading side closes, and then
// closes its writing side, so closing either conn ends the pipe. Frames
// still delayed when a direction ends are lost, as on a link that goes
// down.
package testlink

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/internal/clock"
)

// Faults is how often each fault strikes a frame, as probabilities in
// [0, 1] whose sum is at most 1; a frame suffers at most one.
type Faults struct {
	Drop    float64 `json:"drop"`    // the frame is lost
	Dup     float64 `json:"dup"`     // the frame arrives twice
	Reorder float64 `json:"reorder"` // the frame arrives after the next one
	Delay   float64 `json:"delay"`   // the frame arrives DelayBy late
	// DelayBy is how late a delayed frame arrives; 0 means 1 ms.
	DelayBy time.Duration `json:"delay_by"`
	// Seed seeds the fates; pipe n of a link uses Seed+n.
	Seed uint64 `json:"seed"`
}

// Validate checks the probabilities.
func (f Faults) Validate() error {
	sum := 0.0
	for _, p := range []float64{f.Drop, f.Dup, f.Reorder, f.Delay} {
		if p < 0 || p > 1 {
			return fmt.Errorf("test link faults %+v: every probability must be in [0, 1]", f)
		}
		sum += p
	}
	if sum > 1 {
		return fmt.Errorf("test link faults %+v: the probabilities add up to %.3f, more than 1", f, sum)
	}
	if f.DelayBy < 0 {
		return fmt.Errorf("test link faults: delay_by %v is negative", f.DelayBy)
	}
	return nil
}

// Fate is what happens to one frame.
type Fate uint8

// The fates.
const (
	Deliver Fate = iota
	Drop
	Dup
	Reorder
	Delay
)

var fateNames = [...]string{"deliver", "drop", "dup", "reorder", "delay"}

func (f Fate) String() string {
	if int(f) < len(fateNames) {
		return fateNames[f]
	}
	return fmt.Sprintf("fate(%d)", f)
}

// Fates draws the fates of a direction's frames, in order.
type Fates struct {
	f   Faults
	rng *rand.Rand
}

// NewFates returns the fate sequence of seed.
func NewFates(f Faults, seed uint64) *Fates {
	return &Fates{f: f, rng: rand.New(rand.NewPCG(seed, 0x7672646d61))}
}

// Next returns the fate of the next frame.
func (s *Fates) Next() Fate {
	r := s.rng.Float64()
	for i, p := range [...]float64{s.f.Drop, s.f.Dup, s.f.Reorder, s.f.Delay} {
		if r < p {
			return Fate(i + 1)
		}
		r -= p
	}
	return Deliver
}

// Stats counts frames by fate; safe for concurrent use.
type Stats struct {
	Frames, Dropped, Duplicated, Reordered, Delayed atomic.Uint64
}

// Note counts a frame of fate f.
func (s *Stats) Note(f Fate) {
	s.Frames.Add(1)
	switch f {
	case Drop:
		s.Dropped.Add(1)
	case Dup:
		s.Duplicated.Add(1)
	case Reorder:
		s.Reordered.Add(1)
	case Delay:
		s.Delayed.Add(1)
	}
}

// String reports the counts.
func (s *Stats) String() string {
	return fmt.Sprintf("%d frames: %d dropped, %d duplicated, %d reordered, %d delayed",
		s.Frames.Load(), s.Dropped.Load(), s.Duplicated.Load(), s.Reordered.Load(), s.Delayed.Load())
}

// Framing says where a frame ends: HeaderLen bytes of header, then the
// payload length Len reads from it (an error ends the pipe).
type Framing struct {
	HeaderLen int
	Len       func(header []byte) (int, error)
}

// maxFrame bounds one frame's length: a bad length cannot make a shaper
// allocate without limit.
const maxFrame = 1<<31 + 4096

// reorderHold is how long a frame held for reordering waits for a next
// frame to overtake it before it goes out anyway.
const reorderHold = 2 * time.Millisecond

// Pipe returns the two ends of a faulty in-process link: what is written
// to req arrives at resp through the requests' fates (seed), and what is
// written to resp arrives at req through the responses' (seed+1<<32).
// Stats, if not nil, counts both directions' frames.
func Pipe(f Faults, seed uint64, fr Framing, clk clock.Clock, st *Stats) (req, resp net.Conn, err error) {
	if err := f.Validate(); err != nil {
		return nil, nil, err
	}
	if clk == nil {
		clk = clock.Real
	}
	if st == nil {
		st = new(Stats)
	}
	reqApp, reqShaper, err := socketpair()
	if err != nil {
		return nil, nil, err
	}
	respApp, respShaper, err := socketpair()
	if err != nil {
		reqApp.Close()
		reqShaper.Close()
		return nil, nil, err
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		shape(reqShaper, respShaper, NewFates(f, seed), f.DelayBy, fr, clk, st)
	}()
	go func() {
		defer wg.Done()
		shape(respShaper, reqShaper, NewFates(f, seed+1<<32), f.DelayBy, fr, clk, st)
	}()
	go func() {
		wg.Wait()
		reqShaper.Close()
		respShaper.Close()
	}()
	return reqApp, respApp, nil
}

// socketpair returns the two ends of a Unix stream socketpair.
func socketpair() (net.Conn, *net.UnixConn, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("test link: socketpair: %w", err)
	}
	conns := make([]net.Conn, 2)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "testlink")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			for _, c := range conns[:i] {
				c.Close()
			}
			if i == 0 {
				unix.Close(fds[1])
			}
			return nil, nil, fmt.Errorf("test link: %w", err)
		}
		conns[i] = c
	}
	return conns[0], conns[1].(*net.UnixConn), nil
}

// shape forwards the frames read from in to out, each after its fate.
func shape(in, out *net.UnixConn, fates *Fates, delayBy time.Duration, fr Framing, clk clock.Clock, st *Stats) {
	defer out.CloseWrite()
	if delayBy == 0 {
		delayBy = time.Millisecond
	}
	var (
		wmu sync.Mutex // one frame at a time on out
		// a frame waiting to be overtaken
		held []byte // +checklocks:wmu
		// out failed or the pipe ended
		closed bool // +checklocks:wmu
	)
	write := func(b []byte) {
		wmu.Lock()
		defer wmu.Unlock()
		if !closed {
			if _, err := out.Write(b); err != nil {
				closed = true
			}
		}
	}
	release := func() { // the held frame goes out
		wmu.Lock()
		b := held
		held = nil
		wmu.Unlock()
		if b != nil {
			write(b)
		}
	}
	hdr := make([]byte, fr.HeaderLen)
	for {
		if _, err := io.ReadFull(in, hdr); err != nil {
			break
		}
		n, err := fr.Len(hdr)
		if err != nil || n < 0 || n > maxFrame-fr.HeaderLen {
			break
		}
		frame := make([]byte, fr.HeaderLen+n)
		copy(frame, hdr)
		if _, err := io.ReadFull(in, frame[fr.HeaderLen:]); err != nil {
			break
		}
		fate := fates.Next()
		st.Note(fate)
		switch fate {
		case Drop:
			continue
		case Dup:
			write(frame)
			write(frame)
		case Reorder:
			release()
			wmu.Lock()
			held = frame
			wmu.Unlock()
			clk.AfterFunc(reorderHold, release)
			continue
		case Delay:
			clk.AfterFunc(delayBy, func() { write(frame) })
		default:
			write(frame)
		}
		release() // this frame overtook the held one
	}
	release()
	wmu.Lock()
	closed = true
	wmu.Unlock()
}
