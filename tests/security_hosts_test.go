// SPDX-License-Identifier: Apache-2.0

package vrdma_test

// Hosts (docs/SECURITY.md): a flood of handshakes that never start, from
// an address that is no host's or from another host's address, does not
// keep a member host out; a member host that holds the switch secret, or
// that can rewrite the control plane, cannot present another host's ID
// without that host's key.

import (
	"context"
	"crypto/ed25519"
	"errors"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
	"github.com/vrdma/vrdma/internal/hostkey"
	"github.com/vrdma/vrdma/internal/tcpwire"
	"github.com/vrdma/vrdma/internal/testenv"
)

// handshakeFlood opens connections from address from to to without ever
// sending a frame, with workers connections at a time: each worker opens
// one, waits until the agent closes or resets it, and opens the next. It
// runs until the test's cleanup, and counts the connections opened and
// those the agent ended at once (within 100 ms: reset at accept).
type handshakeFlood struct {
	opened, resetAtOnce atomic.Int64
	stop                chan struct{}
	wg                  sync.WaitGroup
}

func startHandshakeFlood(t *testing.T, from netip.Addr, to netip.AddrPort, workers int) *handshakeFlood {
	t.Helper()
	f := &handshakeFlood{stop: make(chan struct{})}
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: from.AsSlice()}, Timeout: time.Second}
	for range workers {
		f.wg.Go(func() {
			for {
				select {
				case <-f.stop:
					return
				default:
				}
				c, err := d.Dial("tcp", to.String())
				if errors.Is(err, syscall.ECONNRESET) {
					// Reset by the agent before the dial returned.
					f.opened.Add(1)
					f.resetAtOnce.Add(1)
					time.Sleep(100 * time.Millisecond)
					continue
				}
				if err != nil {
					time.Sleep(20 * time.Millisecond)
					continue
				}
				f.opened.Add(1)
				t0 := time.Now()
				var b [64]byte
				for {
					c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
					_, err := c.Read(b[:])
					if err == nil {
						continue // a REFUSE: the agent closes next
					}
					if !isTimeout(err) {
						break // closed or reset by the agent
					}
					select {
					case <-f.stop:
						c.Close()
						return
					default:
					}
				}
				if time.Since(t0) < 100*time.Millisecond {
					f.resetAtOnce.Add(1)
					time.Sleep(100 * time.Millisecond) // a reset flood, not a busy loop
				}
				c.Close()
			}
		})
	}
	t.Cleanup(f.end)
	return f
}

// end stops the flood and waits for its workers.
func (f *handshakeFlood) end() {
	select {
	case <-f.stop:
	default:
		close(f.stop)
	}
	f.wg.Wait()
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TestSecurityHandshakeFlood floods a host's PVRDMA address with
// connections that never send HELLO — more than the agent's 64 handshake
// slots, kept up for the whole test — first from an address of no host of
// the switch (non-member), then from another member host's address
// (member-address, as any local user of that host could): a member host
// still connects and traffic flows between the two. Before admission at
// accept, either flood held every slot and the member's connection was
// reset at accept.
func TestSecurityHandshakeFlood(t *testing.T) {
	c := testenv.StartCluster(t, testenv.ClusterOptions{Hosts: 4, Netns: testenv.NetnsOff})
	ha, hb, hc, hd := c.Hosts[0], c.Hosts[1], c.Hosts[2], c.Hosts[3]
	env := &tcpEnv{c: c, prefix: "hf"}
	s := &suite{env: env, how: connCM}
	vm := func(t *testing.T, h *testenv.Host, name string) *vrdma.VM {
		return h.Open(t, name, testenv.VMOptions{MemMB: 64})
	}

	t.Run("non-member", func(t *testing.T) {
		// An address beside the hosts' (127.x.y.2..5), of no host.
		b := hb.Addr().As4()
		b[3] = 200
		stranger := netip.AddrFrom4(b)
		w := watchAgentLog(hb)
		f := startHandshakeFlood(t, stranger, hb.PVRDMAAddress, 80)
		time.Sleep(300 * time.Millisecond) // the flood is on
		// Host A's first connection to host B, during the flood.
		hostileTraffic(t, s, vm(t, ha, "hf-a"), vm(t, hb, "hf-b"))
		// Logged at most once a second: the flood goes on until it is.
		w.expect(t, `msg="tcp path: connection reset at accept: its source is not the PVRDMA address of a host of this switch"`,
			"rule=host-on-switch", "from="+stranger.String())
		f.end()
		t.Logf("non-member flood: %d connections opened, %d reset at once", f.opened.Load(), f.resetAtOnce.Load())
		st := pvrdmaStatus(t, hb)
		if st.AcceptRefused == 0 || st.AcceptRefused > uint64(f.opened.Load()) {
			t.Errorf("host B counted %d connections refused at accept; the flood opened %d", st.AcceptRefused, f.opened.Load())
		}
		if f.resetAtOnce.Load() < f.opened.Load()/2 {
			t.Errorf("only %d of the %d connections of a non-member were reset at accept", f.resetAtOnce.Load(), f.opened.Load())
		}
	})

	t.Run("member-address", func(t *testing.T) {
		w := watchAgentLog(hb)
		f := startHandshakeFlood(t, hc.Addr(), hb.PVRDMAAddress, 80)
		time.Sleep(300 * time.Millisecond)
		// Host D's first connection to host B, while host C's address
		// holds its slots.
		hostileTraffic(t, s, vm(t, hd, "hf-d"), vm(t, hb, "hf-b2"))
		w.expect(t, `msg="tcp path: connection reset at accept: its source address has every handshake slot it may hold"`,
			"from="+hc.Addr().String(), "limit=4")
		f.end()
		t.Logf("member-address flood: %d connections opened, %d reset at once", f.opened.Load(), f.resetAtOnce.Load())
		if st := pvrdmaStatus(t, hb); st.SourceSlotsFull == 0 || st.HandshakeSlotsFull != 0 {
			t.Errorf("host B's counters %+v: want connections over the per-source slots, none over the agent's", st)
		}
	})
}

// TestSecurityHostImpersonation: host A, a member that holds the switch
// secret and can connect from host C's PVRDMA address, presents host C's
// ID to host B; it signs with its own key, or with none, and is refused by
// rule host-key. A member that also rewrites host C's record in the
// control plane to publish its own key is refused too: host B pinned host
// C's key at first sight. The genuine host C gets in, and, after a
// reinstall that changes its key, again once an operator of host B runs
// vrdmactl host forget-key.
func TestSecurityHostImpersonation(t *testing.T) {
	ctl := testenv.Binary(t, "vrdmactl")
	c := testenv.StartCluster(t, testenv.ClusterOptions{Hosts: 3, Netns: testenv.NetnsOff})
	ha, hb, hc := c.Hosts[0], c.Hosts[1], c.Hosts[2]
	env := &tcpEnv{c: c, prefix: "hi"}
	s := &suite{env: env, how: connCM}
	vms := env.OpenVMs(t, 2)
	hostileTraffic(t, s, vms[0], vms[1]) // creates the switch secret
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	sec, _, err := store.Get[records.SwitchSecret](ctx, c.Store(), records.SwitchSecretKey(c.Switch.Name))
	if err != nil {
		t.Fatal(err)
	}
	asA := rawHostIdentity(t, ha, sec.Key)
	asC := rawHostIdentity(t, hc, sec.Key)
	// Host A as host C: C's ID, name and address; A's secret and key.
	aAsC := asC
	aAsC.key = asA.key
	aPub := asA.key.Public().(ed25519.PublicKey)

	// handshake runs a handshake as id with host B up to its answer to
	// AUTH, and returns the REFUSE's reason, or "" for READY.
	handshake := func(t *testing.T, id rawIdentity, auth func(hello tcpwire.HelloMsg, ch tcpwire.ChallengeMsg) tcpwire.AuthMsg) string {
		t.Helper()
		p := dialRaw(t, id.from, hb.PVRDMAAddress)
		hello := p.hello(id, hb.ID())
		h, payload := p.read()
		if h.Type == tcpwire.Refuse {
			var r tcpwire.RefuseMsg
			if err := tcpwire.DecodeJSON(payload, &r); err != nil {
				t.Fatal(err)
			}
			p.expectClosed()
			return r.Reason
		}
		var ch tcpwire.ChallengeMsg
		if h.Type != tcpwire.Challenge || tcpwire.DecodeJSON(payload, &ch) != nil || ch.Validate() != nil {
			t.Fatalf("a %s frame (%s) answering HELLO, want CHALLENGE", h.Type, payload)
		}
		p.sendJSON(tcpwire.Auth, 0, auth(hello, ch))
		h, payload = p.read()
		switch h.Type {
		case tcpwire.Ready:
			return ""
		case tcpwire.Refuse:
			var r tcpwire.RefuseMsg
			if err := tcpwire.DecodeJSON(payload, &r); err != nil {
				t.Fatal(err)
			}
			p.expectClosed()
			return r.Reason
		}
		t.Fatalf("a %s frame (%s) answering AUTH, want READY or REFUSE", h.Type, payload)
		return ""
	}
	signedBy := func(id rawIdentity) func(tcpwire.HelloMsg, tcpwire.ChallengeMsg) tcpwire.AuthMsg {
		return func(hello tcpwire.HelloMsg, ch tcpwire.ChallengeMsg) tcpwire.AuthMsg { return rawAuth(id, hello, ch) }
	}
	expectRefused := func(t *testing.T, reason string, subs ...string) {
		t.Helper()
		if !strings.HasPrefix(reason, "rule host-key: ") {
			t.Fatalf("host B answered %q, want a refusal by rule host-key", reason)
		}
		for _, s := range subs {
			if !strings.Contains(reason, s) {
				t.Errorf("REFUSE reason %q does not say %q", reason, s)
			}
		}
	}

	// The genuine host C first: host B pins its key.
	if r := handshake(t, asC, signedBy(asC)); r != "" {
		t.Fatalf("host C's own handshake refused: %s", r)
	}

	t.Run("other-key", func(t *testing.T) {
		w := watchAgentLog(hb)
		expectRefused(t, handshake(t, aAsC, signedBy(aAsC)), "presents the ID of host "+hc.Name, "did not sign the handshake with that host's key")
		w.expect(t, `msg="tcp path: refused a connection"`, "rule host-key:", hc.ID())
	})
	t.Run("no-signature", func(t *testing.T) {
		noSig := aAsC
		noSig.key = nil
		expectRefused(t, handshake(t, noSig, signedBy(noSig)), "did not sign the handshake")
	})
	t.Run("signature-of-another-handshake", func(t *testing.T) {
		// Host C's own signature, made for another host's nonce.
		expectRefused(t, handshake(t, aAsC, func(hello tcpwire.HelloMsg, ch tcpwire.ChallengeMsg) tcpwire.AuthMsg {
			m := rawAuth(aAsC, hello, ch)
			m.Sig = tcpwire.Sign(asC.key, "initiator", ch.Version, asC.id, ch.HostID, hello.Nonce, rawRandHex(tcpwire.NonceLen))
			return m
		}), "did not sign")
	})

	// Host A rewrites host C's record to publish its own key: host B has
	// C's key pinned and refuses, naming the command that would accept it.
	t.Run("record-rewritten", func(t *testing.T) {
		configureHost(t, c, hc, func(h *records.Host) { h.HostKey = hostkey.Encode(aPub) })
		var reason string
		for deadline := time.Now().Add(waitTimeout); ; {
			reason = handshake(t, aAsC, signedBy(aAsC))
			if strings.Contains(reason, "but this host pinned") || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond) // until host B's cache has the new record
		}
		expectRefused(t, reason, "publishes host key", "but this host pinned", "vrdmactl host forget-key "+hc.ID())
	})

	// Host C reinstalled with a new key: refused until host B's operator
	// forgets the old one, then pinned anew.
	t.Run("forget-key", func(t *testing.T) {
		_, newKey, _ := ed25519.GenerateKey(nil)
		reinstalled := asC
		reinstalled.key = newKey
		configureHost(t, c, hc, func(h *records.Host) { h.HostKey = hostkey.Encode(newKey.Public().(ed25519.PublicKey)) })
		var reason string
		for deadline := time.Now().Add(waitTimeout); ; {
			reason = handshake(t, reinstalled, signedBy(reinstalled))
			if strings.Contains(reason, hostkey.Encode(newKey.Public().(ed25519.PublicKey))[:16]) || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		expectRefused(t, reason, "but this host pinned")
		out, err := exec.Command(ctl, "--state-dir", hb.StateDir, "host", "forget-key", hc.ID()).CombinedOutput()
		if err != nil {
			t.Fatalf("vrdmactl host forget-key: %v: %s", err, out)
		}
		if !strings.Contains(string(out), "forgot the key pinned for host "+hc.ID()) {
			t.Errorf("vrdmactl host forget-key said %q", out)
		}
		if r := handshake(t, reinstalled, signedBy(reinstalled)); r != "" {
			t.Fatalf("host C's new key refused after forget-key: %s", r)
		}
		// Pinned anew: host A's key is refused again.
		expectRefused(t, handshake(t, aAsC, signedBy(aAsC)), "did not sign")
	})
}
