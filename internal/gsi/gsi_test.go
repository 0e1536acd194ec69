// SPDX-License-Identifier: Apache-2.0

package gsi

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/rocewire"
)

// fabric joins Managers by address; drop, when set, loses the MADs it
// says true of. Each MAD is delivered by a goroutine of its own.
type fabric struct {
	mu   sync.Mutex
	ends map[netip.Addr]*Manager
	sent []rocewire.CMAttr // every MAD sent, in order
	done []rocewire.CMAttr // every MAD its receiver has served, in that order
	drop func(from netip.Addr, attr rocewire.CMAttr) bool
}

func (f *fabric) send(from netip.Addr) func(netip.Addr, []byte) {
	return func(to netip.Addr, mad []byte) {
		b := append([]byte(nil), mad...)
		f.mu.Lock()
		attr := rocewire.MAD(b).Attr()
		f.sent = append(f.sent, attr)
		m, drop := f.ends[to], f.drop != nil && f.drop(from, attr)
		f.mu.Unlock()
		if m != nil && !drop {
			go func() {
				m.Receive(from, rocewire.GSIQPN, b)
				f.mu.Lock()
				f.done = append(f.done, attr)
				f.mu.Unlock()
			}()
		}
	}
}

// count is how many MADs of attribute a were sent.
func (f *fabric) count(a rocewire.CMAttr) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return countOf(f.sent, a)
}

// served is how many MADs of attribute a their receivers have served.
func (f *fabric) served(a rocewire.CMAttr) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return countOf(f.done, a)
}

func countOf(l []rocewire.CMAttr, a rocewire.CMAttr) int {
	n := 0
	for _, s := range l {
		if s == a {
			n++
		}
	}
	return n
}

type events struct {
	mu          sync.Mutex
	established []uint32
	gone        []uint32
	failed      []uint16 // the reasons
}

func (e *events) fail(_, _ uint32, _ abi.GID, reason uint16) {
	e.mu.Lock()
	e.failed = append(e.failed, reason)
	e.mu.Unlock()
}

func (e *events) failures() []uint16 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]uint16(nil), e.failed...)
}

func (e *events) add(l *[]uint32) func(qpn, peerQPN uint32, gid abi.GID) {
	return func(qpn, _ uint32, _ abi.GID) { e.mu.Lock(); *l = append(*l, qpn); e.mu.Unlock() }
}

func (e *events) get() ([]uint32, []uint32) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]uint32(nil), e.established...), append([]uint32(nil), e.gone...)
}

var (
	addrA = netip.MustParseAddr("10.0.0.1")
	addrB = netip.MustParseAddr("10.0.0.2")
)

// pair makes a dialer at A and a listener at B whose Serve is serve.
func pair(t *testing.T, serve func(*Request) (Accepted, error), timeout, retries uint8) (*fabric, *Manager, *Manager, *events) {
	f := &fabric{ends: map[netip.Addr]*Manager{}}
	ev := &events{}
	a := New(Config{Send: f.send(addrA), Local: addrA, Serve: func(*Request) (Accepted, error) { return Accepted{}, errors.New("A does not listen") },
		Established: ev.add(&ev.established), Gone: ev.add(&ev.gone), Failed: ev.fail, ResponseTimeout: timeout, MaxRetries: retries})
	b := New(Config{Send: f.send(addrB), Local: addrB, Serve: serve, Established: ev.add(&ev.established), Gone: ev.add(&ev.gone),
		Failed: ev.fail, ResponseTimeout: timeout, MaxRetries: retries})
	f.ends[addrA], f.ends[addrB] = a, b
	return f, a, b, ev
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestConnectDisconnect: REQ, REP, RTU, then DREQ and DREP; the listener
// sees the request's fields and the dialer the REP's.
func TestConnectDisconnect(t *testing.T) {
	var got *Request
	f, a, b, ev := pair(t, func(r *Request) (Accepted, error) {
		got = r
		return Accepted{QPN: 0x22, PSN: 0x777, PrivateData: []byte("rep")}, nil
	}, 14, 3)
	rep, err := a.Dial(context.Background(), DialParams{Peer: addrB, Port: 7471, SrcPort: 40000, QPN: 0x11, PSN: 0x555, MTU: 1024, PrivateData: []byte("req")})
	if err != nil {
		t.Fatal(err)
	}
	if rep.QPN != 0x22 || rep.PSN != 0x777 || string(rep.PrivateData[:3]) != "rep" {
		t.Errorf("reply %+v", rep)
	}
	if got.Port != 7471 || got.QPN != 0x11 || got.PSN != 0x555 || got.MTU != 1024 || string(got.PrivateData[:3]) != "req" ||
		got.Header.Src != addrA || got.Header.Dst != addrB || got.Header.SrcPort != 40000 || got.Peer != addrA {
		t.Errorf("request %+v", got)
	}
	if err := a.Ready(0x11); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the RTU", func() bool { e, _ := ev.get(); return len(e) == 1 && e[0] == 0x22 })
	if !a.Disconnect(0x11) {
		t.Fatal("Disconnect: no connection")
	}
	eventually(t, "the DREQ", func() bool { _, g := ev.get(); return len(g) == 1 && g[0] == 0x22 })
	// Served, not only sent: the dialer closes its side when it has
	// read the DREP.
	eventually(t, "the DREP", func() bool { return f.served(rocewire.AttrDREP) == 1 })
	if a.Disconnect(0x11) || b.Disconnect(0x22) {
		t.Error("a closed connection disconnects again")
	}
	if f.count(rocewire.AttrMRA) != 0 || a.Counters().Dropped.Load()+b.Counters().Dropped.Load() != 0 {
		t.Errorf("an MRA or drops in a quick exchange: %v", f.sent)
	}
}

// TestRejectNoListener: Serve's refusal is a REJ with its reason, the
// dialer's error a refusal with that reason.
func TestRejectNoListener(t *testing.T) {
	_, a, _, _ := pair(t, func(r *Request) (Accepted, error) {
		e := abi.Errorf(abi.CodeRefused, "", "nothing listens")
		e.Reject = &abi.RejectInfo{Reason: abi.RejectInvalidServiceID}
		return Accepted{}, e
	}, 14, 3)
	_, err := a.Dial(context.Background(), DialParams{Peer: addrB, Port: 1, QPN: 0x11, MTU: 4096})
	var ae *abi.Error
	if !errors.As(err, &ae) || ae.Code != abi.CodeRefused || ae.Reject == nil || ae.Reject.Reason != rocewire.RejInvalidServerID {
		t.Fatalf("dial to no listener: %v", err)
	}
}

// TestREQRetriesThenTimeout: a REQ nobody answers is sent 1 + MaxRetries
// times, then the dial fails as unreachable.
func TestREQRetriesThenTimeout(t *testing.T) {
	f, a, _, _ := pair(t, nil, 12, 3) // 16.8 ms
	f.drop = func(netip.Addr, rocewire.CMAttr) bool { return true }
	t0 := time.Now()
	_, err := a.Dial(context.Background(), DialParams{Peer: addrB, Port: 1, QPN: 0x11, MTU: 4096})
	var ae *abi.Error
	if !errors.As(err, &ae) || ae.Code != abi.CodeUnavailable {
		t.Fatalf("dial into the void: %v", err)
	}
	if n := f.count(rocewire.AttrREQ); n != 4 {
		t.Errorf("%d REQs sent, want 4 (1 + 3 retries)", n)
	}
	if d := time.Since(t0); d < 4*Duration(12) {
		t.Errorf("gave up after %v, before 4 timeouts of %v", d, Duration(12))
	}
	if a.Counters().Resent.Load() != 3 || a.Counters().TimedOut.Load() != 1 {
		t.Errorf("resent %d timed out %d, want 3 and 1", a.Counters().Resent.Load(), a.Counters().TimedOut.Load())
	}
}

// TestREPRetriesThenReject: a REP whose RTU never comes is resent, then
// the listener gives up with a REJ (Timeout) and the connection is gone.
func TestREPRetriesThenReject(t *testing.T) {
	f, a, _, ev := pair(t, func(*Request) (Accepted, error) { return Accepted{QPN: 0x22}, nil }, 12, 2)
	if _, err := a.Dial(context.Background(), DialParams{Peer: addrB, Port: 1, QPN: 0x11, MTU: 4096}); err != nil {
		t.Fatal(err)
	}
	// The dialer never calls Ready: no RTU.
	eventually(t, "the listener's REJ", func() bool { return f.count(rocewire.AttrREJ) == 1 })
	if n := f.count(rocewire.AttrREP); n != 3 {
		t.Errorf("%d REPs sent, want 3 (1 + 2 retries)", n)
	}
	if f := ev.failures(); len(f) != 1 || f[0] != 0 {
		t.Errorf("the listener's connection did not fail for want of the RTU: %v", f)
	}
}

// TestMRAWhenSlow: an accept slower than half the dialer's response
// timeout sends an MRA, and the dialer waits for it without resending.
func TestMRAWhenSlow(t *testing.T) {
	f, a, _, _ := pair(t, func(*Request) (Accepted, error) {
		time.Sleep(3 * Duration(14)) // three of the dialer's response timeouts
		return Accepted{QPN: 0x22}, nil
	}, 14, 1)
	if _, err := a.Dial(context.Background(), DialParams{Peer: addrB, Port: 1, QPN: 0x11, MTU: 4096}); err != nil {
		t.Fatalf("a slow accept with an MRA: %v", err)
	}
	if f.count(rocewire.AttrMRA) != 1 {
		t.Errorf("MADs %v, want one MRA", f.sent)
	}
}

// TestHostileMADs: malformed MADs, unknown attributes, messages for no
// connection, spoofed senders and duplicates are dropped or answered as
// the first, never a panic, and the connection goes on.
func TestHostileMADs(t *testing.T) {
	_, a, b, ev := pair(t, func(*Request) (Accepted, error) { return Accepted{QPN: 0x22}, nil }, 14, 3)
	for _, bad := range [][]byte{nil, make([]byte, 255), make([]byte, 257), make([]byte, 256)} {
		b.Receive(addrA, 1, bad)
	}
	var m [rocewire.MADLen]byte
	mad := rocewire.MAD(m[:])
	mad.EncodeCM(1, 0x0019) // a LAP
	b.Receive(addrA, 1, m[:])
	mad.EncodeCM(1, rocewire.AttrRTU)
	(&rocewire.RTU{CommIDs: rocewire.CommIDs{Local: 5, Remote: 6}}).Put(mad)
	b.Receive(addrA, 1, m[:])
	if d := b.Counters().Dropped.Load(); d != 6 {
		t.Errorf("dropped %d of 6 hostile MADs", d)
	}
	if _, err := a.Dial(context.Background(), DialParams{Peer: addrB, Port: 1, QPN: 0x11, MTU: 4096}); err != nil {
		t.Fatal(err)
	}
	// A spoofed RTU: the right comm IDs from another address.
	b.mu.Lock()
	var c *conn
	for _, x := range b.byID {
		c = x
	}
	ids := rocewire.CommIDs{Local: c.remoteID, Remote: c.localID}
	b.mu.Unlock()
	mad.EncodeCM(1, rocewire.AttrRTU)
	(&rocewire.RTU{CommIDs: ids}).Put(mad)
	before := b.Counters().Dropped.Load()
	b.Receive(netip.MustParseAddr("10.0.0.66"), 1, m[:])
	if b.Counters().Dropped.Load() != before+1 {
		t.Error("a spoofed RTU was not dropped")
	}
	if e, _ := ev.get(); len(e) != 0 {
		t.Fatal("a spoofed RTU established the connection")
	}
	if err := a.Ready(0x11); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the RTU", func() bool { e, _ := ev.get(); return len(e) == 1 })
	b.Receive(addrA, 1, m[:]) // the RTU again, now from the peer: a duplicate
	if b.Counters().Duplicates.Load() != 1 {
		t.Errorf("duplicates %d, want 1", b.Counters().Duplicates.Load())
	}
}

// TestDialerRejectsREP: a dialer that cannot take the REP (Fail) sends a
// REJ of the REP; the listener's connection fails with its reason.
func TestDialerRejectsREP(t *testing.T) {
	_, a, _, ev := pair(t, func(*Request) (Accepted, error) { return Accepted{QPN: 0x22}, nil }, 14, 3)
	if _, err := a.Dial(context.Background(), DialParams{Peer: addrB, Port: 1, QPN: 0x11, MTU: 4096}); err != nil {
		t.Fatal(err)
	}
	a.Fail(0x11)
	eventually(t, "the listener's failure", func() bool { f := ev.failures(); return len(f) == 1 && f[0] == rocewire.RejConsumer })
	if e, g := ev.get(); len(e) != 0 || len(g) != 0 {
		t.Errorf("established %v gone %v after a rejected REP", e, g)
	}
}

// TestResentREQGetsREJAgain: a REQ resent after its REJ (which the dialer
// may have lost) gets the same REJ again, without a second Serve.
func TestResentREQGetsREJAgain(t *testing.T) {
	served := 0
	f, a, b, _ := pair(t, func(*Request) (Accepted, error) {
		served++
		return Accepted{}, errors.New("refused")
	}, 14, 3)
	var req [rocewire.MADLen]byte
	orig := a.cfg.Send
	a.cfg.Send = func(to netip.Addr, mad []byte) {
		if rocewire.MAD(mad).Attr() == rocewire.AttrREQ {
			copy(req[:], mad)
		}
		orig(to, mad)
	}
	if _, err := a.Dial(context.Background(), DialParams{Peer: addrB, Port: 1, QPN: 0x11, MTU: 4096}); err == nil {
		t.Fatal("a refused dial succeeded")
	}
	b.Receive(addrA, 1, req[:])
	eventually(t, "the second REJ", func() bool { return f.count(rocewire.AttrREJ) == 2 })
	if served != 1 || b.Counters().Duplicates.Load() != 1 {
		t.Errorf("served %d times, %d duplicates; want 1 and 1", served, b.Counters().Duplicates.Load())
	}
}
