// SPDX-License-Identifier: Apache-2.0

package hostlink

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/tcpwire"
)

// laneGroup makes a main connection with lanes on pipes, as accepted
// from one agent run of a peer: its group, its lanes attached as the
// acceptor attaches them.
func laneGroup(t *testing.T, lanes int) (*Peer, *Conn, []*Conn) {
	t.Helper()
	u := &Links{log: slog.New(slog.NewTextHandler(io.Discard, nil)), links: map[string]*Peer{}}
	l := &Peer{u: u, peerID: "peer", in: map[*Conn]struct{}{}}
	pipe := func() *Conn {
		a, b := net.Pipe()
		t.Cleanup(func() { a.Close(); b.Close() })
		c := newConn(l, a, false, tcpwire.Version)
		c.handshaking, c.peerBoot = false, "boot1"
		return c
	}
	m := pipe()
	m.group = newGroup()
	m.nlanes.Store(int32(lanes))
	l.in[m] = struct{}{}
	var ls []*Conn
	for i := 1; i < lanes; i++ {
		ln := pipe()
		if !l.attachLane(ln, m.group, i) {
			t.Fatalf("lane %d not attached", i)
		}
		ls = append(ls, ln)
	}
	return l, m, ls
}

// closedWithin reports whether c closes within a second.
func closedWithin(c *Conn) bool {
	select {
	case <-c.Closed():
		return true
	case <-time.After(time.Second):
		return false
	}
}

// TestLaneGroupCloses: a lane closing closes its main connection and
// the other lanes, and a main connection closing closes its lanes —
// once each, whoever closes first, with no deadlock.
func TestLaneGroupCloses(t *testing.T) {
	for _, first := range []int{0, 1, 2} {
		_, m, ls := laneGroup(t, 3)
		all := append([]*Conn{m}, ls...)
		done := make(chan struct{})
		go func() {
			all[first].Close(errors.New("test"))
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("closing connection %d of a group did not return: a deadlock", first)
		}
		for i, c := range all {
			if !closedWithin(c) {
				t.Errorf("closing connection %d left connection %d of its group open", first, i)
			}
		}
	}
	// Closing every connection of a group at once.
	_, m, ls := laneGroup(t, 4)
	all := append([]*Conn{m}, ls...)
	done := make(chan struct{}, len(all))
	for _, c := range all {
		go func() { c.Close(errors.New("test")); done <- struct{}{} }()
	}
	for range all {
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("closing a group from every side at once deadlocked")
		}
	}
}

// TestAttachLane: a lane joins only a main connection of its group from
// the same agent run, at an index the group agreed on and not taken.
func TestAttachLane(t *testing.T) {
	l, m, _ := laneGroup(t, 3)
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	mk := func(boot string) *Conn {
		c := newConn(l, a, false, tcpwire.Version)
		c.peerBoot = boot
		return c
	}
	for _, c := range []struct {
		name  string
		boot  string
		group string
		i     int
	}{
		{"other group", "boot1", newGroup(), 1},
		{"other boot", "boot2", m.group, 1},
		{"index beyond the agreed", "boot1", m.group, 3},
	} {
		if l.attachLane(mk(c.boot), c.group, c.i) {
			t.Errorf("%s: attached", c.name)
		}
	}
}

// TestAttachLaneAgain: a lane opened again (its first handshake ended
// without READY at the peer) takes the place of the first, which closes
// without closing its group.
func TestAttachLaneAgain(t *testing.T) {
	l, m, ls := laneGroup(t, 3)
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	c := newConn(l, a, false, tcpwire.Version)
	c.peerBoot = "boot1"
	if !l.attachLane(c, m.group, 2) {
		t.Fatal("lane 2 opened again: not attached")
	}
	if m.Lane(2) != c {
		t.Error("lane 2 opened again is not the group's lane 2")
	}
	if !closedWithin(ls[1]) {
		t.Error("the lane replaced is not closed")
	}
	for i, o := range []*Conn{m, ls[0], c} {
		select {
		case <-o.Closed():
			t.Errorf("replacing lane 2 closed connection %d of the group", i)
		default:
		}
	}
}

// TestStripedWrite: WriteStriped puts each lane's batch on its lane and
// the main connection's frames on it; a lane gone fails it and closes the
// group.
func TestStripedWrite(t *testing.T) {
	u := &Links{log: slog.New(slog.NewTextHandler(io.Discard, nil)), links: map[string]*Peer{}}
	l := &Peer{u: u, peerID: "peer", in: map[*Conn]struct{}{}}
	var far []net.Conn
	pipe := func() *Conn {
		a, b := net.Pipe()
		t.Cleanup(func() { a.Close(); b.Close() })
		far = append(far, b)
		c := newConn(l, a, true, tcpwire.Version)
		c.handshaking = false
		return c
	}
	m := pipe()
	m.nlanes.Store(3)
	for i := 1; i < 3; i++ {
		ln := pipe()
		ln.main = m
		m.lanes[i].Store(ln)
		if err := u.goLaneWriter(ln); err != nil {
			t.Fatal(err)
		}
	}
	got := make([]chan []byte, 3)
	for i, f := range far {
		got[i] = make(chan []byte, 1)
		go func() {
			b := make([]byte, 5)
			_, err := io.ReadFull(f, b)
			if err != nil {
				b = nil
			}
			got[i] <- b
		}()
	}
	b1, b2 := NewLaneBatch(), NewLaneBatch()
	b1.Iov, b1.N, b1.Frames = net.Buffers{[]byte("lane1")}, 5, 1
	b2.Iov, b2.N, b2.Frames = net.Buffers{[]byte("la"), []byte("ne2")}, 5, 1
	iov := net.Buffers{[]byte("main0")}
	if err := m.WriteStriped(&iov, 5, 1, []*LaneBatch{b1, b2}); err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"main0", "lane1", "lane2"} {
		if b := <-got[i]; string(b) != want {
			t.Errorf("connection %d carried %q, want %q", i, b, want)
		}
	}
	if l.striped.Load() != 1 {
		t.Errorf("%d striped batches counted, want 1", l.striped.Load())
	}
	// Lane 2's far end goes: the next striped write fails (its writer's
	// write does) and the group closes.
	far[2].Close()
	go io.Copy(io.Discard, far[0])
	go io.Copy(io.Discard, far[1])
	iov = net.Buffers{[]byte("main1")}
	b1.Iov, b2.Iov = net.Buffers{[]byte("lane1")}, net.Buffers{[]byte("lane2")}
	if err := m.WriteStriped(&iov, 5, 1, []*LaneBatch{b1, b2}); err == nil {
		t.Error("a striped write over a lane whose peer went succeeded")
	}
	if !closedWithin(m) {
		t.Error("the group stayed open after its lane failed")
	}
	u.wg.Wait() // the lanes' writers stopped
}

// laneJob is a LaneJob that reports each run.
type laneJob chan struct{}

func (j laneJob) RunLane() { j <- struct{}{} }

// TestLaneReader: an accepted lane's reader runs the jobs it is handed
// and ends when the lane closes — whether the lane or its main
// connection closes — and a job handed to a closed lane is refused at
// once rather than left waiting for a reader that is gone.
func TestLaneReader(t *testing.T) {
	for _, closeMain := range []bool{false, true} {
		_, m, ls := laneGroup(t, 3)
		ln := ls[0]
		ended := make(chan struct{})
		go func() {
			ln.serveLane()
			close(ended)
		}()
		j := make(laneJob, 1)
		for range 3 {
			if !ln.StartLane(j) {
				t.Fatal("an open lane refused a job")
			}
			select {
			case <-j:
			case <-time.After(5 * time.Second):
				t.Fatal("the lane's reader did not run its job")
			}
		}
		if closeMain {
			m.Close(errors.New("test"))
		} else {
			ln.Close(errors.New("test"))
		}
		select {
		case <-ended:
		case <-time.After(5 * time.Second):
			t.Fatalf("the lane's reader outlived its lane (main connection closed: %v)", closeMain)
		}
		done := make(chan bool)
		go func() { done <- ls[1].StartLane(j) }()
		select {
		case ok := <-done:
			if ok {
				t.Error("a closed lane took a job")
			}
		case <-time.After(5 * time.Second):
			t.Fatal("handing a job to a closed lane blocked")
		}
	}
}

// TestOpenLanes: a main connection's lanes join it one by one as they
// open; a lane whose dial fails is dialed again until it opens (the
// connection does not stay with fewer lanes), and the opener stops, its
// lanes closed, when the main connection closes.
func TestOpenLanes(t *testing.T) {
	u := &Links{log: slog.New(slog.NewTextHandler(io.Discard, nil)), links: map[string]*Peer{}, stop: make(chan struct{})}
	l := &Peer{u: u, peerID: "peer", in: map[*Conn]struct{}{}}
	pipe := func() *Conn {
		a, b := net.Pipe()
		t.Cleanup(func() { a.Close(); b.Close() })
		c := newConn(l, a, true, tcpwire.Version)
		c.handshaking = false
		return c
	}
	m := pipe()
	fails := map[int]int{2: 3} // lane 2's first three dials fail
	var dialed []int
	dial := func(ctx context.Context, lane int) (*Conn, error) {
		dialed = append(dialed, lane)
		if fails[lane] > 0 {
			fails[lane]--
			return nil, errors.New("a lost segment")
		}
		return pipe(), nil
	}
	l.openLanes(dial, m, 4)
	if got := m.Lanes(); got != 4 {
		t.Fatalf("%d connections after opening lanes, want 4 (dials %v)", got, dialed)
	}
	if want := []int{1, 2, 2, 2, 2, 3}; !slices.Equal(dialed, want) {
		t.Errorf("dials %v, want %v", dialed, want)
	}
	lanes := []*Conn{m.Lane(1), m.Lane(2), m.Lane(3)}
	m.Close(errors.New("test"))
	for i, ln := range lanes {
		if !closedWithin(ln) {
			t.Errorf("lane %d open after its main connection closed", i+1)
		}
	}
	u.wg.Wait() // the lanes' writers end with them

	// A main connection that closes while a lane cannot be opened: the
	// opener returns.
	m = pipe()
	done := make(chan struct{})
	go func() {
		l.openLanes(func(ctx context.Context, lane int) (*Conn, error) { return nil, errors.New("no route") }, m, 3)
		close(done)
	}()
	time.Sleep(100 * time.Millisecond)
	m.Close(errors.New("test"))
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the lane opener outlived its main connection")
	}
	if m.Lanes() != 1 {
		t.Errorf("%d connections, want 1: no lane opened", m.Lanes())
	}
}
