// SPDX-License-Identifier: Apache-2.0

package vrdma_test

// Hostile peers on the tcp path (bad input): a raw TCP client
// speaking docs/wire-tcp.md by hand against real vrdmad processes. A
// client that is not a member of the switch is refused with a REFUSE frame
// naming the rule, and the agent logs it; a client that is a member (it
// holds the switch secret and connects from a host's PVRDMA address) and
// sends garbage has its connection closed with a logged reason, or its
// request answered with the right status. In every case the agents stay
// up, nothing panics, and a real pair between the two hosts keeps
// working.

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"regexp"
	"strings"
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

// rawPeer is one TCP connection to an agent's PVRDMA address, driven
// frame by frame.
type rawPeer struct {
	t  *testing.T
	nc *net.TCPConn
}

// dialRaw connects from address from (any port) to an agent at to.
func dialRaw(t *testing.T, from netip.Addr, to netip.AddrPort) *rawPeer {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: from.AsSlice()}, Timeout: 5 * time.Second}
	nc, err := d.Dial("tcp", to.String())
	if err != nil {
		t.Fatalf("connect from %s to %s: %v", from, to, err)
	}
	t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(waitTimeout))
	return &rawPeer{t: t, nc: nc.(*net.TCPConn)}
}

// rawHandshakeVersion is the header version of handshake frames, whatever
// the protocol version agreed (docs/wire-tcp.md).
const rawHandshakeVersion = 1

// rawFrameVersion is the header version a frame of type ty carries: 1 for
// the handshake's frames, then the protocol's.
func rawFrameVersion(ty tcpwire.Type) uint8 {
	if ty >= tcpwire.Hello && ty <= tcpwire.Refuse {
		return rawHandshakeVersion
	}
	return tcpwire.Version
}

// rawFrame encodes h (version rawFrameVersion unless h says otherwise)
// and its payload.
func rawFrame(h tcpwire.Header, payload []byte) []byte {
	if h.Version == 0 {
		h.Version = rawFrameVersion(h.Type)
	}
	if h.PayloadLen == 0 {
		h.PayloadLen = uint32(len(payload))
	}
	b := make([]byte, tcpwire.HeaderLen, tcpwire.HeaderLen+len(payload))
	h.Put(b)
	return append(b, payload...)
}

// write writes b; the agent may have closed the connection already when
// the test expects it to, so the error is returned, not fatal.
func (p *rawPeer) write(b []byte) error {
	_, err := p.nc.Write(b)
	return err
}

func (p *rawPeer) mustWrite(b []byte) {
	p.t.Helper()
	if err := p.write(b); err != nil {
		p.t.Fatalf("write %d bytes: %v", len(b), err)
	}
}

// sendJSON writes a control frame of type ty whose payload is v's JSON.
func (p *rawPeer) sendJSON(ty tcpwire.Type, tag uint64, v any) {
	p.t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		p.t.Fatal(err)
	}
	p.mustWrite(rawFrame(tcpwire.Header{Type: ty, Tag: tag}, b))
}

// read reads the next frame, which must be valid, and its payload.
func (p *rawPeer) read() (tcpwire.Header, []byte) {
	p.t.Helper()
	var hb [tcpwire.HeaderLen]byte
	if _, err := io.ReadFull(p.nc, hb[:]); err != nil {
		p.t.Fatalf("read a frame header: %v", err)
	}
	var h tcpwire.Header
	if err := tcpwire.Decode(hb[:], rawFrameVersion(tcpwire.Type(hb[3])), &h); err != nil {
		p.t.Fatalf("the agent sent a bad frame: %v", err)
	}
	payload := make([]byte, h.PayloadLen)
	if _, err := io.ReadFull(p.nc, payload); err != nil {
		p.t.Fatalf("read the %d-byte payload of a %s: %v", h.PayloadLen, h.Type, err)
	}
	return h, payload
}

// readJSON reads the next frame, which must be of type ty, into v.
func (p *rawPeer) readJSON(ty tcpwire.Type, v any) tcpwire.Header {
	p.t.Helper()
	h, payload := p.read()
	if h.Type != ty {
		p.t.Fatalf("got a %s frame (%s), want %s", h.Type, payload, ty)
	}
	if err := tcpwire.DecodeJSON(payload, v); err != nil {
		p.t.Fatalf("%s: %v", ty, err)
	}
	return h
}

// expectClosed checks that the agent closes the connection without
// sending anything more.
func (p *rawPeer) expectClosed() {
	p.t.Helper()
	p.nc.SetReadDeadline(time.Now().Add(waitTimeout))
	var buf [256]byte
	n, err := p.nc.Read(buf[:])
	switch {
	case n > 0:
		p.t.Fatalf("the agent sent %d bytes where it should close the connection: %x", n, buf[:n])
	case errors.Is(err, io.EOF), errors.Is(err, syscall.ECONNRESET):
	default:
		p.t.Fatalf("the agent did not close the connection: %v", err)
	}
}

// expectRefused reads a REFUSE, checks it names rule, and that the
// connection is then closed; it returns the reason.
func (p *rawPeer) expectRefused(rule string) string {
	p.t.Helper()
	var r tcpwire.RefuseMsg
	h := p.readJSON(tcpwire.Refuse, &r)
	if !strings.HasPrefix(r.Reason, "rule "+rule+": ") {
		p.t.Errorf("REFUSE reason %q does not name rule %s", r.Reason, rule)
	}
	if h.Tag != 0 {
		p.t.Errorf("REFUSE with tag %d, want 0", h.Tag)
	}
	p.expectClosed()
	return r.Reason
}

// rawIdentity is who a raw client claims to be.
type rawIdentity struct {
	id, name, boot string
	from           netip.Addr         // where it connects from
	secret         []byte             // the switch secret it believes in
	key            ed25519.PrivateKey // the host key it signs with (nil: none)
}

// rawRandHex returns n random bytes in hex.
func rawRandHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// hello sends a HELLO from id to host target and returns it.
func (p *rawPeer) hello(id rawIdentity, target string, versions ...uint8) tcpwire.HelloMsg {
	p.t.Helper()
	if versions == nil {
		versions = []uint8{tcpwire.Version}
	}
	m := tcpwire.HelloMsg{Versions: versions, HostID: id.id, Host: id.name, Switch: "dvs1", Boot: id.boot, Nonce: rawRandHex(tcpwire.NonceLen), Target: target}
	p.sendJSON(tcpwire.Hello, 0, m)
	return m
}

// challenge reads the CHALLENGE answering hello and checks it: from host
// target, this version, with a proof of the secret bound to both nonces.
func (p *rawPeer) challenge(id rawIdentity, hello tcpwire.HelloMsg) tcpwire.ChallengeMsg {
	p.t.Helper()
	var ch tcpwire.ChallengeMsg
	p.readJSON(tcpwire.Challenge, &ch)
	if err := ch.Validate(); err != nil {
		p.t.Fatal(err)
	}
	if ch.HostID != hello.Target || ch.Version != tcpwire.Version || ch.Nonce == hello.Nonce {
		p.t.Fatalf("CHALLENGE %+v answering HELLO %+v", ch, hello)
	}
	want := tcpwire.Proof(id.secret, "acceptor", ch.Version, id.id, ch.HostID, hello.Nonce, ch.Nonce)
	if id.secret != nil && !tcpwire.ProofOK(ch.Proof, want) {
		p.t.Fatalf("the agent's CHALLENGE proof %s is not the switch secret's %s", ch.Proof, want)
	}
	return ch
}

// rawAuthProof is the initiator's proof for hello and ch under id's secret.
func rawAuthProof(id rawIdentity, hello tcpwire.HelloMsg, ch tcpwire.ChallengeMsg) string {
	return tcpwire.Proof(id.secret, "initiator", ch.Version, id.id, ch.HostID, hello.Nonce, ch.Nonce)
}

// rawAuth is the whole AUTH of id for hello and ch: the proof under its
// secret and the signature under its host key.
func rawAuth(id rawIdentity, hello tcpwire.HelloMsg, ch tcpwire.ChallengeMsg) tcpwire.AuthMsg {
	m := tcpwire.AuthMsg{Proof: rawAuthProof(id, hello, ch)}
	if id.key != nil {
		m.Sig = tcpwire.Sign(id.key, "initiator", ch.Version, id.id, ch.HostID, hello.Nonce, ch.Nonce)
	}
	return m
}

// rawJoin runs a whole handshake as id with host to, which must accept it.
func rawJoin(t *testing.T, id rawIdentity, to *testenv.Host) *rawPeer {
	t.Helper()
	p := dialRaw(t, id.from, to.PVRDMAAddress)
	hello := p.hello(id, to.ID())
	ch := p.challenge(id, hello)
	p.sendJSON(tcpwire.Auth, 0, rawAuth(id, hello, ch))
	h, payload := p.read()
	if h.Type != tcpwire.Ready || len(payload) != 0 {
		t.Fatalf("after AUTH: a %s frame (%s), want an empty READY", h.Type, payload)
	}
	p.nc.SetDeadline(time.Now().Add(waitTimeout))
	return p
}

// agentLogWatch finds what an agent logged after a point.
type agentLogWatch struct {
	h    *testenv.Host
	from int
}

func watchAgentLog(h *testenv.Host) agentLogWatch { return agentLogWatch{h: h, from: len(h.Stderr())} }

// expect waits until the agent logged a line holding every one of subs
// since the watch began, and fails the test otherwise.
func (w agentLogWatch) expect(t *testing.T, subs ...string) string {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		for _, l := range strings.Split(w.h.Stderr()[w.from:], "\n") {
			all := true
			for _, s := range subs {
				all = all && strings.Contains(l, s)
			}
			if all {
				return l
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not log a line with %q; it logged:\n%s", w.h.Name, subs, w.h.Stderr()[w.from:])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

var uplinkBootRE = regexp.MustCompile(`msg="tcp path listening".* boot=([0-9a-f]{32})`)

// rawHostIdentity is h as a raw client would claim it: its host ID, name,
// boot ID (from its log), PVRDMA address and host key (from its state
// directory), with secret.
func rawHostIdentity(t *testing.T, h *testenv.Host, secret []byte) rawIdentity {
	t.Helper()
	m := uplinkBootRE.FindStringSubmatch(h.Stderr())
	if m == nil {
		t.Fatalf("%s did not log its tcp path's boot ID:\n%s", h.Name, h.Stderr())
	}
	key, err := hostkey.Load(h.StateDir)
	if err != nil {
		t.Fatalf("%s's host key: %v", h.Name, err)
	}
	return rawIdentity{id: h.ID(), name: h.Name, boot: m[1], from: h.Addr(), secret: secret, key: key}
}

// hostileTraffic connects a fresh QP of va (on one host) to one of vb (on
// the other) through the connection manager and checks a SEND, an RDMA
// WRITE and an RDMA READ between them.
func hostileTraffic(t *testing.T, s *suite, va, vb *vrdma.VM) (a, b *end) {
	t.Helper()
	a, b = newEnd(t, va, qpConfig{}), newEnd(t, vb, qpConfig{})
	s.connect(t, a, b, connCM)
	src, dst := a.mr(t, 8192, vrdma.AccessAll), b.mr(t, 8192, vrdma.AccessAll)
	fill(src.Bytes(), 11)
	fill(dst.Bytes(), 12)
	sb, db := src.Bytes(), dst.Bytes()
	postRecv(t, b.qp, vrdma.RecvWR{ID: 1, SGL: sgl(dst.SGE(0, 512))})
	postSend(t, a.qp, vrdma.SendWR{ID: 1, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: sgl(src.SGE(0, 300))})
	expectWC(t, waitWC(t, a.scq, 1)[0], a.qp, 1, vrdma.WCSuccess, vrdma.WCSend)
	expectRecv(t, waitWC(t, b.rcq, 1)[0], b.qp, 1, vrdma.WCRecv, 300, 0, false)
	expectBytes(t, "SEND", db[:300], sb[:300])
	postSend(t, a.qp, vrdma.SendWR{ID: 2, Opcode: vrdma.OpRDMAWrite, Flags: vrdma.SendSignaled, SGL: sgl(src.SGE(1024, 2048)),
		RemoteAddr: off(dst, 4096), RKey: dst.RKey()})
	expectWC(t, waitWC(t, a.scq, 1)[0], a.qp, 2, vrdma.WCSuccess, vrdma.WCRDMAWrite)
	expectBytes(t, "RDMA WRITE", db[4096:6144], sb[1024:3072])
	fill(db[7000:7100], 13)
	postSend(t, a.qp, vrdma.SendWR{ID: 3, Opcode: vrdma.OpRDMARead, Flags: vrdma.SendSignaled, SGL: sgl(src.SGE(7000, 100)),
		RemoteAddr: off(dst, 7000), RKey: dst.RKey()})
	expectWC(t, waitWC(t, a.scq, 1)[0], a.qp, 3, vrdma.WCSuccess, vrdma.WCRDMARead)
	expectBytes(t, "RDMA READ", sb[7000:7100], db[7000:7100])
	return a, b
}

// rawNoQPN is a QPN no agent allocates in a test (they count up from
// 0x100..0x100ff).
const rawNoQPN = 0xfffffe

// rawProbe checks that p's connection still carries requests: a WRITE to a
// QPN that does not exist is answered with NO_QP.
func rawProbe(t *testing.T, p *rawPeer, tag uint64) {
	t.Helper()
	p.mustWrite(rawFrame(tcpwire.Header{Type: tcpwire.Write, Tag: tag, DstQPN: rawNoQPN, SrcQPN: 0x1234, PSN: 1}, []byte("probe")))
	h, _ := p.read()
	if h.Type != tcpwire.Ack || h.Tag != tag || h.Status != tcpwire.NoQP {
		t.Fatalf("probe: %+v, want an ACK with tag %d, status NO_QP", h, tag)
	}
}

// TestTCPHostile drives a raw client against two real agents on loopback
// addresses: refusals by rule (refused), garbage from a member (garbage),
// deadlines (timing), requests to a real bound QP (bound-qp), then checks
// that the agents are up and a real pair still works (after).
func TestTCPHostile(t *testing.T) {
	c := testenv.StartCluster(t, testenv.ClusterOptions{Hosts: 2, Netns: testenv.NetnsOff})
	ha, hb := c.Hosts[0], c.Hosts[1]
	env := &tcpEnv{c: c, prefix: "th"}
	s := &suite{env: env, how: connCM}
	vms := env.OpenVMs(t, 2)
	va, vb := vms[0], vms[1]
	if va.Host() != ha.Name || vb.Host() != hb.Name {
		t.Fatalf("VMs on %s and %s, want %s and %s", va.Host(), vb.Host(), ha.Name, hb.Name)
	}

	// A real pair first: it works, and the first dial creates the
	// switch's secret, which the member clients below use.
	hostileTraffic(t, s, va, vb)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	sec, _, err := store.Get[records.SwitchSecret](ctx, c.Store(), records.SwitchSecretKey(c.Switch.Name))
	if err != nil {
		t.Fatalf("the switch secret after a tcp connection: %v", err)
	}
	asA := rawHostIdentity(t, ha, sec.Key) // a member: host A's identity, address and secret
	stranger := rawIdentity{id: rawRandHex(16), name: "stranger", boot: rawRandHex(16), from: ha.Addr(), secret: sec.Key}

	// Hosts the control plane knows but that may not join: each fails one
	// rule of checkPeerHost, or (ghost-member) none, but does not hold the
	// secret.
	ghostAddr := netip.MustParseAddr("127.0.0.9")
	ghosts := map[string]records.Host{}
	for _, g := range []struct {
		name  string
		alive bool
		f     func(h *records.Host)
	}{
		{"ghost-down", false, func(*records.Host) {}},
		{"ghost-other-switch", true, func(h *records.Host) { h.Switch = "dvs-other" }},
		{"ghost-no-address", true, func(h *records.Host) { h.PVRDMAAddress = netip.AddrPort{} }},
		{"ghost-no-firewall", true, func(h *records.Host) { h.FirewallPVRDMA = false }},
		{"ghost-member", true, func(*records.Host) {}},
	} {
		pub, _, _ := ed25519.GenerateKey(nil)
		h := records.Host{ID: rawRandHex(16), Name: g.name, PVRDMAAddress: netip.AddrPortFrom(ghostAddr, 4791), FirewallPVRDMA: true,
			Switch: c.Switch.Name, AgentVersion: "ghost", State: records.HostUp, HostKey: hostkey.Encode(pub)}
		g.f(&h)
		if _, err := c.Store().Create(ctx, records.HostKey(h.ID), h); err != nil {
			t.Fatal(err)
		}
		if g.alive {
			if _, err := c.Store().Create(ctx, records.AliveKey(h.ID), records.Alive{HostID: h.ID, Lease: 1, TTL: 10, AgentVersion: "ghost"}); err != nil {
				t.Fatal(err)
			}
		}
		ghosts[g.name] = h
	}
	ghost := func(name string) rawIdentity {
		h := ghosts[name]
		return rawIdentity{id: h.ID, name: name, boot: rawRandHex(16), from: ghostAddr, secret: []byte("not the switch secret")}
	}

	t.Run("refused", func(t *testing.T) {
		cases := []struct {
			name string
			id   rawIdentity
			// hello sends the first frames; nil: a HELLO to host B.
			hello func(p *rawPeer, id rawIdentity)
			rule  string
			log   []string
		}{
			{name: "host-known", id: stranger, rule: "host-known", log: []string{"is not in the control plane"}},
			{name: "host-up", id: ghost("ghost-down"), rule: "host-up", log: []string{"holds no live lease"}},
			{name: "host-on-switch", id: ghost("ghost-other-switch"), rule: "host-on-switch", log: []string{`on switch \"dvs-other\"`}},
			{name: "host-rdma-configured/no-address", id: ghost("ghost-no-address"), rule: "host-rdma-configured", log: []string{"no tagged PVRDMA address"}},
			{name: "host-rdma-configured/firewall", id: ghost("ghost-no-firewall"), rule: "host-rdma-configured", log: []string{"firewall rule is off"}},
			// (From an address that is no host's, the connection is reset
			// at accept: TestSecurityHandshakeFlood.)
			{name: "pvrdma-address/other-host", id: rawIdentity{id: asA.id, name: asA.name, boot: rawRandHex(16), from: ghostAddr, secret: sec.Key},
				rule: "pvrdma-address", log: []string{"the connection comes from 127.0.0.9", "PVRDMA address is " + ha.Addr().String()}},
			{name: "host-identity", id: asA, rule: "host-identity", hello: func(p *rawPeer, id rawIdentity) { p.hello(id, rawRandHex(16)) },
				log: []string{"the connection is for host"}},
			{name: "host-identity/itself", id: asA, rule: "host-identity", hello: func(p *rawPeer, id rawIdentity) { p.hello(id, id.id) },
				log: []string{"the connection is for host " + asA.id}},
			// Version 1 (a handshake without host keys) among them.
			{name: "version", id: asA, rule: "version", hello: func(p *rawPeer, id rawIdentity) { p.hello(id, hb.ID(), 1, 3, 200) },
				log: []string{"offers versions [1 3 200]"}},
			{name: "handshake/first-frame", id: asA, rule: "handshake", log: []string{"first frame is AUTH, not HELLO"},
				hello: func(p *rawPeer, id rawIdentity) { p.sendJSON(tcpwire.Auth, 0, tcpwire.AuthMsg{Proof: rawRandHex(32)}) }},
			{name: "handshake/request-first", id: asA, rule: "handshake", log: []string{"first frame is WRITE, not HELLO"},
				hello: func(p *rawPeer, id rawIdentity) {
					p.mustWrite(rawFrame(tcpwire.Header{Version: rawHandshakeVersion, Type: tcpwire.Write, DstQPN: rawNoQPN}, []byte("data")))
				}},
			{name: "handshake/json", id: asA, rule: "handshake", log: []string{"control payload"},
				hello: func(p *rawPeer, id rawIdentity) {
					p.mustWrite(rawFrame(tcpwire.Header{Type: tcpwire.Hello}, []byte(`{"versions":`)))
				}},
			{name: "handshake/invalid-hello", id: asA, rule: "handshake", log: []string{"HELLO: nonce is not 32 hex-encoded bytes"},
				hello: func(p *rawPeer, id rawIdentity) {
					p.sendJSON(tcpwire.Hello, 0, tcpwire.HelloMsg{Versions: []uint8{1}, HostID: id.id, Host: id.name, Boot: id.boot, Nonce: "00", Target: hb.ID()})
				}},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				w := watchAgentLog(hb)
				p := dialRaw(t, tc.id.from, hb.PVRDMAAddress)
				if tc.hello != nil {
					tc.hello(p, tc.id)
				} else {
					p.hello(tc.id, hb.ID())
				}
				reason := p.expectRefused(tc.rule)
				for _, l := range tc.log {
					if !strings.Contains(reason, strings.ReplaceAll(l, `\"`, `"`)) {
						t.Errorf("REFUSE reason %q does not say %q", reason, l)
					}
				}
				w.expect(t, append([]string{`msg="tcp path: refused a connection"`, "rule " + tc.rule + ":"}, tc.log...)...)
			})
		}

		// Past HELLO: the agent answers with its CHALLENGE, and the client
		// cannot prove it holds the secret.
		secretCases := []struct {
			name  string
			id    rawIdentity
			proof func(id rawIdentity, hello tcpwire.HelloMsg, ch tcpwire.ChallengeMsg) string
		}{
			{"no-proof", asA, func(rawIdentity, tcpwire.HelloMsg, tcpwire.ChallengeMsg) string { return "" }},
			{"garbage-proof", asA, func(rawIdentity, tcpwire.HelloMsg, tcpwire.ChallengeMsg) string { return "not hex at all" }},
			{"wrong-secret", rawIdentity{id: asA.id, name: asA.name, boot: asA.boot, from: asA.from, secret: []byte("guess")},
				func(id rawIdentity, hello tcpwire.HelloMsg, ch tcpwire.ChallengeMsg) string {
					return rawAuthProof(id, hello, ch)
				}},
			{"ghost-member", ghost("ghost-member"),
				func(id rawIdentity, hello tcpwire.HelloMsg, ch tcpwire.ChallengeMsg) string {
					return rawAuthProof(id, hello, ch)
				}},
			// The agent's own proof, reflected: the role is in the HMAC.
			{"reflected", asA, func(_ rawIdentity, _ tcpwire.HelloMsg, ch tcpwire.ChallengeMsg) string { return ch.Proof }},
			// The right secret bound to the wrong nonce or version.
			{"wrong-nonce", asA, func(id rawIdentity, hello tcpwire.HelloMsg, ch tcpwire.ChallengeMsg) string {
				return tcpwire.Proof(id.secret, "initiator", ch.Version, id.id, ch.HostID, hello.Nonce, hello.Nonce)
			}},
			{"wrong-version", asA, func(id rawIdentity, hello tcpwire.HelloMsg, ch tcpwire.ChallengeMsg) string {
				return tcpwire.Proof(id.secret, "initiator", 1, id.id, ch.HostID, hello.Nonce, ch.Nonce)
			}},
		}
		for _, tc := range secretCases {
			t.Run("switch-secret/"+tc.name, func(t *testing.T) {
				w := watchAgentLog(hb)
				p := dialRaw(t, tc.id.from, hb.PVRDMAAddress)
				hello := p.hello(tc.id, hb.ID())
				var ch tcpwire.ChallengeMsg
				if tc.id.id == asA.id && bytes.Equal(tc.id.secret, sec.Key) {
					ch = p.challenge(tc.id, hello) // checks the agent's proof too
				} else {
					p.readJSON(tcpwire.Challenge, &ch)
				}
				p.sendJSON(tcpwire.Auth, 0, tcpwire.AuthMsg{Proof: tc.proof(tc.id, hello, ch)})
				reason := p.expectRefused("switch-secret")
				if !strings.Contains(reason, "does not hold switch "+c.Switch.Name+"'s secret") {
					t.Errorf("REFUSE reason %q", reason)
				}
				w.expect(t, `msg="tcp path: refused a connection"`, "rule switch-secret:", tc.id.id)
			})
		}

		// A whole handshake replayed: the HELLO and AUTH of a connection
		// that was accepted do not open another.
		t.Run("switch-secret/replayed", func(t *testing.T) {
			p := dialRaw(t, asA.from, hb.PVRDMAAddress)
			hello := p.hello(asA, hb.ID())
			ch := p.challenge(asA, hello)
			auth := rawAuth(asA, hello, ch)
			p.sendJSON(tcpwire.Auth, 0, auth)
			if h, _ := p.read(); h.Type != tcpwire.Ready {
				t.Fatalf("%s, want READY", h.Type)
			}
			w := watchAgentLog(hb)
			q := dialRaw(t, asA.from, hb.PVRDMAAddress)
			q.sendJSON(tcpwire.Hello, 0, hello)
			var ch2 tcpwire.ChallengeMsg
			q.readJSON(tcpwire.Challenge, &ch2)
			if ch2.Nonce == ch.Nonce {
				t.Fatalf("the agent reused its nonce %s", ch.Nonce)
			}
			q.sendJSON(tcpwire.Auth, 0, auth)
			q.expectRefused("switch-secret")
			w.expect(t, "rule switch-secret:")
			rawProbe(t, p, 1) // the first connection is unharmed
		})

		// A lane of a group no connection of this peer has: refused
		// after AUTH (rule lane). (A second lane 1 of a group of its own
		// replaces the first: TestAttachLaneAgain.)
		t.Run("lane", func(t *testing.T) {
			w := watchAgentLog(hb)
			p := dialRaw(t, asA.from, hb.PVRDMAAddress)
			hello := tcpwire.HelloMsg{Versions: []uint8{tcpwire.Version}, HostID: asA.id, Host: asA.name, Switch: "dvs1", Boot: asA.boot,
				Nonce: rawRandHex(tcpwire.NonceLen), Target: hb.ID(), Group: rawRandHex(16), Lane: 1}
			p.sendJSON(tcpwire.Hello, 0, hello)
			ch := p.challenge(asA, hello)
			if ch.Lanes != 0 {
				t.Errorf("CHALLENGE to a lane's HELLO takes %d lanes", ch.Lanes)
			}
			p.sendJSON(tcpwire.Auth, 0, rawAuth(asA, hello, ch))
			p.expectRefused("lane")
			w.expect(t, "rule lane:", "lane 1 of group "+hello.Group)
		})

		// Not a frame at all: closed without a REFUSE, logged.
		t.Run("not-a-frame", func(t *testing.T) {
			w := watchAgentLog(hb)
			p := dialRaw(t, asA.from, hb.PVRDMAAddress)
			p.mustWrite([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n" + strings.Repeat(" ", 64)))
			p.expectClosed()
			w.expect(t, `msg="tcp path: bad first frame"`, "bad magic")
		})
		t.Run("silent", func(t *testing.T) {
			if testing.Short() {
				t.Skip("waits for the handshake timeout")
			}
			w := watchAgentLog(hb)
			p := dialRaw(t, asA.from, hb.PVRDMAAddress)
			t0 := time.Now()
			p.expectClosed()
			if d := time.Since(t0); d < 4*time.Second || d > 8*time.Second {
				t.Errorf("a silent client was dropped after %v, want the 5 s handshake timeout", d)
			}
			w.expect(t, `msg="tcp path: bad first frame"`, "i/o timeout")
		})
	})

	// The status's refused counter ("handshakes refused, either side")
	// counts what host B refused of connections that claimed host A, a
	// host it knows: on the accepting side, none of its own dials.
	t.Run("refused-counter", func(t *testing.T) {
		if u := uplinkTo(t, hb, ha); u.Refused == 0 || u.AcceptsRefused != u.Refused || u.DialsRefused != 0 {
			t.Errorf("%s's uplink to %s reports %d refused handshakes (%d accepts, %d dials) after the refusals above of connections claiming %s: %+v",
				hb.Name, ha.Name, u.Refused, u.AcceptsRefused, u.DialsRefused, ha.Name, u)
		}
	})

	// A member (host A's identity, from its address, with the secret)
	// that sends garbage once the connection is up.
	t.Run("garbage", func(t *testing.T) {
		closedCases := []struct {
			name string
			b    func() []byte
			log  []string // what host B logs
		}{
			{"truncated-header", func() []byte { return rawFrame(tcpwire.Header{Type: tcpwire.Write, DstQPN: rawNoQPN}, nil)[:40] },
				[]string{`msg="tcp path connection closed"`, `why="unexpected EOF"`}},
			{"truncated-payload", func() []byte {
				return rawFrame(tcpwire.Header{Type: tcpwire.Write, DstQPN: rawNoQPN, PayloadLen: 1000}, []byte("ten bytes!"))
			}, []string{`msg="tcp path connection closed"`, `why="unexpected EOF"`}},
			{"bad-magic", func() []byte { b := rawFrame(tcpwire.Header{Type: tcpwire.Ack}, nil); b[0], b[1] = 'X', 'X'; return b },
				[]string{`msg="tcp path: bad frame from a peer; connection closed"`, "bad magic 0x5858"}},
			{"oversized-control", func() []byte {
				return rawFrame(tcpwire.Header{Type: tcpwire.CMReq, PayloadLen: tcpwire.MaxControl + 1}, []byte("{"))
			}, []string{"bad frame from a peer", "CM_REQ: 65537-byte payload exceeds the 65536-byte limit of control frames"}},
			{"oversized-write", func() []byte {
				return rawFrame(tcpwire.Header{Type: tcpwire.Write, DstQPN: rawNoQPN, PayloadLen: tcpwire.MaxData + 1}, make([]byte, 4096))
			}, []string{"bad frame from a peer", "WRITE: 2147483649-byte payload exceeds the 2 GiB message limit"}},
			{"oversized-read", func() []byte {
				return rawFrame(tcpwire.Header{Type: tcpwire.Read, DstQPN: rawNoQPN, ImmOrLen: 0xffffffff}, nil)
			}, []string{"bad frame from a peer", "READ of 4294967295 bytes exceeds the 2 GiB message limit"}},
			{"unknown-type", func() []byte { return rawFrame(tcpwire.Header{Type: 99}, nil) },
				[]string{"bad frame from a peer", "unknown frame type 99"}},
			// Version 1's frames on a connection that agreed on version 2.
			{"wrong-version", func() []byte { return rawFrame(tcpwire.Header{Version: 1, Type: tcpwire.Write, DstQPN: rawNoQPN}, nil) },
				[]string{"bad frame from a peer", "version 1 on a connection that agreed on version 2"}},
			{"psn-25-bits", func() []byte {
				return rawFrame(tcpwire.Header{Type: tcpwire.Send, DstQPN: rawNoQPN, PSN: 1 << 24}, nil)
			},
				[]string{"bad frame from a peer", "PSN 0x1000000 wider than 24 bits"}},
			{"request-with-status", func() []byte {
				return rawFrame(tcpwire.Header{Type: tcpwire.FetchAdd, DstQPN: rawNoQPN, Status: tcpwire.RemAccessErr}, nil)
			}, []string{"bad frame from a peer", "request FETCH_ADD carries status REM_ACCESS_ERR"}},
			{"reserved-byte", func() []byte {
				b := rawFrame(tcpwire.Header{Type: tcpwire.Write, DstQPN: rawNoQPN}, nil)
				b[63] = 1
				return b
			},
				[]string{"bad frame from a peer", "reserved byte 0x01 is not zero"}},
			{"read-resp-on-request-connection", func() []byte {
				return rawFrame(tcpwire.Header{Type: tcpwire.ReadResp, Tag: 1, PayloadLen: 8}, make([]byte, 8))
			}, []string{`msg="tcp path connection closed"`, "READ_RESP frame on a connection that carries requests"}},
			{"ack-on-request-connection", func() []byte { return rawFrame(tcpwire.Header{Type: tcpwire.Ack, Tag: 1}, nil) },
				[]string{`msg="tcp path connection closed"`, "ACK frame on a connection that carries requests"}},
			{"hello-after-ready", func() []byte {
				return rawFrame(tcpwire.Header{Version: tcpwire.Version, Type: tcpwire.Hello}, []byte("{}"))
			},
				[]string{`msg="tcp path connection closed"`, "HELLO frame on a connection that carries requests"}},
			{"cm-req-bad-json", func() []byte { return rawFrame(tcpwire.Header{Type: tcpwire.CMReq, Tag: 5}, []byte(`{"target":`)) },
				[]string{`msg="tcp path connection closed"`, "control payload"}},
			// Lanes: a striped request on a connection that agreed on
			// none, a stripe on the main connection, a bad stripe layout.
			{"striped-without-lanes", func() []byte {
				return rawFrame(tcpwire.Header{Type: tcpwire.Write, DstQPN: rawNoQPN, Flags: tcpwire.FlagStriped, Compare: 8192, PayloadLen: 4096}, make([]byte, 4096))
			}, []string{`msg="tcp path connection closed"`, "striped a WRITE over 2 connections; the handshake agreed on 1"}},
			{"stripe-on-main-connection", func() []byte {
				return rawFrame(tcpwire.Header{Type: tcpwire.Stripe, DstQPN: rawNoQPN, PayloadLen: 8}, make([]byte, 8))
			}, []string{`msg="tcp path connection closed"`, "STRIPE frame on a connection that carries requests"}},
			{"striped-read", func() []byte {
				return rawFrame(tcpwire.Header{Type: tcpwire.Read, DstQPN: rawNoQPN, Flags: tcpwire.FlagStriped, Compare: 8192, ImmOrLen: 8192}, nil)
			}, []string{"bad frame from a peer", "READ carries the striped flag"}},
		}
		for _, tc := range closedCases {
			t.Run(tc.name, func(t *testing.T) {
				p := rawJoin(t, asA, hb)
				rawProbe(t, p, 1)
				w := watchAgentLog(hb)
				p.write(tc.b()) // the agent may close before it has all
				if tc.name == "truncated-header" || tc.name == "truncated-payload" {
					p.nc.CloseWrite()
				}
				p.expectClosed()
				w.expect(t, append(tc.log, "peer="+asA.id)...)
				if !hb.Running() {
					t.Fatalf("%s's agent exited", hb.Name)
				}
			})
		}

		t.Run("no-qp", func(t *testing.T) {
			p := rawJoin(t, asA, hb)
			// Each request to a QPN that does not exist, with and without
			// a payload, is answered NO_QP (its payload read and dropped),
			// and the connection carries on.
			for i, h := range []tcpwire.Header{
				{Type: tcpwire.Write, PayloadLen: 100000},
				{Type: tcpwire.WriteImm, PayloadLen: 1, ImmOrLen: 7},
				{Type: tcpwire.Send, PayloadLen: 0},
				{Type: tcpwire.SendImm, PayloadLen: 70000},
				{Type: tcpwire.Read, ImmOrLen: tcpwire.MaxData},
				{Type: tcpwire.CmpSwap, Compare: 1, Swap: 2},
				{Type: tcpwire.FetchAdd, Compare: 1},
			} {
				tag := uint64(100 + i)
				h.Tag, h.DstQPN, h.SrcQPN, h.PSN, h.RKey, h.RemoteAddr = tag, rawNoQPN, 0x4321, uint32(i), 0x101, 0x1000
				payload := make([]byte, h.PayloadLen)
				fill(payload, uint64(i))
				p.mustWrite(rawFrame(h, payload))
				r, data := p.read()
				want := tcpwire.Ack
				if h.Type == tcpwire.Read {
					want = tcpwire.ReadResp
				}
				if r.Type != want || r.Tag != tag || r.Status != tcpwire.NoQP || r.SrcQPN != rawNoQPN || r.PSN != h.PSN || len(data) != 0 {
					t.Errorf("%s to QPN 0x%x: answered %+v with %d bytes, want a %s NO_QP with tag %d", h.Type, rawNoQPN, r, len(data), want, tag)
				}
			}
			// CM_CANCEL of a CM_REQ that does not exist: ignored.
			p.mustWrite(rawFrame(tcpwire.Header{Type: tcpwire.CMCancel, Tag: 999}, nil))
			rawProbe(t, p, 200)
		})

		t.Run("cm", func(t *testing.T) {
			p := rawJoin(t, asA, hb)
			gidA := netip.AddrFrom16(hostileGID0(t, va))
			cases := []struct {
				name string
				m    tcpwire.ConnReqMsg
				code string
				msg  string
			}{
				{"invalid", tcpwire.ConnReqMsg{Target: "nonsense", FromVM: "x", FromAdapter: "vrdma0", FromGID: gidA, FromQPN: 1},
					"invalid-argument", `CM_REQ: target "nonsense" is not "vm/vrdmaN"`},
				{"unknown-target", tcpwire.ConnReqMsg{Target: "novm/vrdma0", Port: 1, FromVM: va.Name(), FromAdapter: "vrdma0", FromGID: gidA, FromQPN: 1},
					"", ""},
				{"adapter-of-another-host", tcpwire.ConnReqMsg{Target: vb.Name() + "/vrdma0", Port: 1, FromVM: vb.Name(), FromAdapter: "vrdma0",
					FromGID: netip.AddrFrom16(hostileGID0(t, vb)), FromQPN: 1}, "refused", "the control plane does not place that adapter on that host"},
				{"unknown-gid", tcpwire.ConnReqMsg{Target: vb.Name() + "/vrdma0", Port: 1, FromVM: va.Name(), FromAdapter: "vrdma0",
					FromGID: netip.MustParseAddr("fe80::dead:beef"), FromQPN: 1}, "refused", "the control plane does not place that adapter on that host"},
				{"nothing-listens", tcpwire.ConnReqMsg{Target: vb.Name() + "/vrdma0", Port: 1, FromVM: va.Name(), FromAdapter: "vrdma0",
					FromGID: gidA, FromQPN: 1, TimeoutMS: 1000}, "refused", "nothing listens"},
			}
			for i, tc := range cases {
				tag := uint64(10 + i)
				p.sendJSON(tcpwire.CMReq, tag, tc.m)
				var r tcpwire.ConnRespMsg
				h := p.readJSON(tcpwire.CMResp, &r)
				if h.Tag != tag || r.Code == "" || r.QPN != 0 || tc.code != "" && r.Code != tc.code || !strings.Contains(r.Message, tc.msg) {
					t.Errorf("%s: CM_RESP tag %d %+v; want tag %d, code %q, message with %q", tc.name, h.Tag, r, tag, tc.code, tc.msg)
				}
			}
			rawProbe(t, p, 1)
		})

		// waitingCMReqs joins host B as host A and sends n CM_REQs (tags 1
		// to n, 30 s timeouts) to a listener of B that does not accept.
		waitingCMReqs := func(t *testing.T, n int) *rawPeer {
			ctx := opCtx(t)
			port := uint16(nextPort.Add(1))
			l, err := hostileAdapter0(t, vb).Listen(ctx, port)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Close(context.Background()) })
			p := rawJoin(t, asA, hb)
			gidA := netip.AddrFrom16(hostileGID0(t, va))
			for i := 1; i <= n; i++ {
				p.sendJSON(tcpwire.CMReq, uint64(i), tcpwire.ConnReqMsg{Target: vb.Name() + "/vrdma0", Port: port, FromVM: va.Name(),
					FromAdapter: "vrdma0", FromGID: gidA, FromQPN: uint32(0x100 + i), TimeoutMS: 30000})
			}
			return p
		}

		// Connection requests waiting for a listener that does not accept:
		// at most 256 per connection, the next is refused at once.
		t.Run("cm-pending-limit", func(t *testing.T) {
			const limit = 256
			p := waitingCMReqs(t, limit+1)
			var r tcpwire.ConnRespMsg
			h := p.readJSON(tcpwire.CMResp, &r)
			if h.Tag != limit+1 || r.Code != "limit-exceeded" {
				t.Errorf("CM_RESP tag %d %+v; want tag %d refused with limit-exceeded", h.Tag, r, limit+1)
			}
			rawProbe(t, p, 1000)
			p.nc.Close() // the waiting requests end with the connection
		})

		// Connections from a member's address that never start their
		// handshake: at most 4 (one source's slots) are held, each until
		// the 5 s handshake timeout; the others are dropped at accept, and
		// a real member still gets in once they are gone.
		t.Run("handshake-flood", func(t *testing.T) {
			const n, limit = 80, 4
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: asA.from.AsSlice()}, Timeout: 5 * time.Second}
			var conns []net.Conn
			dropped := 0
			for range n {
				c, err := d.Dial("tcp", hb.PVRDMAAddress.String())
				switch {
				case errors.Is(err, syscall.ECONNRESET):
					dropped++ // reset before connect returned
				case err != nil:
					t.Fatal(err)
				default:
					conns = append(conns, c)
				}
			}
			// All at once, with one deadline well inside the 5 s handshake
			// timeout that ends the held ones (a read after its deadline
			// would not see a reset).
			deadline := time.Now().Add(time.Second)
			results := make(chan bool, len(conns))
			for _, c := range conns {
				c.SetReadDeadline(deadline)
				go func() {
					var b [1]byte
					_, err := c.Read(b[:])
					results <- !errors.Is(err, os.ErrDeadlineExceeded)
				}()
			}
			for range conns {
				if <-results {
					dropped++
				}
			}
			t.Logf("%d of %d connections dropped at accept", dropped, n)
			if dropped < n-limit || dropped == n {
				t.Errorf("%d of %d connections that never start a handshake dropped at once; want at least %d, and not all", dropped, n, n-limit)
			}
			for _, c := range conns {
				c.Close()
			}
			// The agent frees the slots as it reads their ends: wait for a
			// connection that is held, then join.
			for t0 := time.Now(); ; {
				c, err := d.Dial("tcp", hb.PVRDMAAddress.String())
				if err == nil {
					c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
					var b [1]byte
					_, err = c.Read(b[:])
					c.Close()
					if errors.Is(err, os.ErrDeadlineExceeded) {
						break
					}
				}
				if time.Since(t0) > waitTimeout {
					t.Fatalf("the agent drops every new connection %v after the flood ended: %v", waitTimeout, err)
				}
			}
			p := rawJoin(t, asA, hb)
			rawProbe(t, p, 1)
		})

		// A CM_REQ that its dialer cancels (CM_CANCEL) while it waits for
		// the listener is answered at once, not when its 30 s run out: it
		// holds no goroutine or pending slot for the rest of its timeout.
		t.Run("cm-cancel", func(t *testing.T) {
			p := waitingCMReqs(t, 2)
			time.Sleep(quiet) // both wait for the listener
			t0 := time.Now()
			p.mustWrite(rawFrame(tcpwire.Header{Type: tcpwire.CMCancel, Tag: 2}, nil))
			p.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
			var r tcpwire.ConnRespMsg
			h := p.readJSON(tcpwire.CMResp, &r)
			if h.Tag != 2 || r.QPN != 0 || !strings.Contains(r.Message, "canceled") {
				t.Errorf("CM_RESP tag %d %+v; want tag 2 answered as canceled", h.Tag, r)
			}
			t.Logf("canceled CM_REQ answered after %v", time.Since(t0).Round(time.Millisecond))
			p.nc.SetReadDeadline(time.Time{})
			rawProbe(t, p, 1000)
		})

		// A member that says it is host A restarted (a new boot ID): host
		// B drops every connection of host A's previous run, and host A's
		// agent reconnects when it next has traffic.
		t.Run("new-boot", func(t *testing.T) {
			w := watchAgentLog(hb)
			old := rawJoin(t, asA, hb)
			fresh := asA
			fresh.boot = rawRandHex(16)
			p := rawJoin(t, fresh, hb)
			w.expect(t, "peer agent restarted; dropping its stale connections")
			old.expectClosed()
			rawProbe(t, p, 1)
			hostileTraffic(t, s, va, vb)
		})
	})

	// Deadlines: a peer that stops mid-handshake is dropped at the
	// handshake timeout; a frame that begins is read whatever deadline a
	// previous frame left.
	t.Run("timing", func(t *testing.T) {
		if testing.Short() {
			t.Skip("waits for the handshake timeout and a read deadline")
		}
		// A client that passes the host checks (it connects from host A's
		// address with host A's ID: any process on host A can) but never
		// answers the CHALLENGE. The acceptor must drop it at the 5 s
		// handshake timeout; otherwise every such connection holds a
		// goroutine and a socket for as long as the client likes.
		// The same with a HELLO that arrives in two parts (header, then
		// payload 200 ms later): the handshake's deadline must survive the
		// reads of a frame's parts.
		for _, parts := range []bool{false, true} {
			name := "silent-after-hello"
			if parts {
				name = "silent-after-hello-in-parts"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				p := dialRaw(t, asA.from, hb.PVRDMAAddress)
				t0 := time.Now()
				var hello tcpwire.HelloMsg
				if parts {
					hello = tcpwire.HelloMsg{Versions: []uint8{tcpwire.Version}, HostID: asA.id, Host: asA.name, Switch: "dvs1",
						Boot: asA.boot, Nonce: rawRandHex(tcpwire.NonceLen), Target: hb.ID()}
					b, _ := json.Marshal(hello)
					f := rawFrame(tcpwire.Header{Type: tcpwire.Hello}, b)
					p.mustWrite(f[:tcpwire.HeaderLen])
					time.Sleep(200 * time.Millisecond)
					p.mustWrite(f[tcpwire.HeaderLen:])
				} else {
					hello = p.hello(asA, hb.ID())
				}
				p.challenge(asA, hello)
				p.nc.SetReadDeadline(time.Now().Add(15 * time.Second))
				var buf [64]byte
				n, err := p.nc.Read(buf[:])
				d := time.Since(t0)
				switch {
				case n > 0:
					t.Fatalf("the agent sent %d bytes where it should drop the connection: %x", n, buf[:n])
				case errors.Is(err, os.ErrDeadlineExceeded):
					t.Fatalf("the agent kept a connection that stopped after HELLO open for %v (still open): "+
						"the handshake timeout is 5 s", d.Round(time.Millisecond))
				case d > 8*time.Second:
					t.Errorf("the agent dropped a connection that stopped after HELLO after %v, want the 5 s handshake timeout", d.Round(time.Millisecond))
				}
			})
		}
		// A header that arrives in two parts (a TCP segment boundary in the
		// header, and the second segment retransmitted 1 s later), the
		// second part after the read deadline that the previous frame's
		// payload left, must still be read: the frame has begun.
		t.Run("header-across-payload-deadline", func(t *testing.T) {
			t.Parallel()
			p := rawJoin(t, asA, hb)
			p.nc.SetDeadline(time.Time{})
			t0 := time.Now()
			// The payload's read arms a deadline of writeStall (10 s).
			p.mustWrite(rawFrame(tcpwire.Header{Type: tcpwire.Write, Tag: 1, DstQPN: rawNoQPN, PSN: 1}, []byte("12345")))
			p.nc.SetReadDeadline(time.Now().Add(waitTimeout))
			if h, _ := p.read(); h.Type != tcpwire.Ack || h.Status != tcpwire.NoQP {
				t.Fatalf("%+v, want ACK NO_QP", h)
			}
			next := rawFrame(tcpwire.Header{Type: tcpwire.Write, Tag: 2, DstQPN: rawNoQPN, PSN: 2}, nil)
			time.Sleep(time.Until(t0.Add(9500 * time.Millisecond)))
			p.mustWrite(next[:32])
			time.Sleep(time.Until(t0.Add(10600 * time.Millisecond)))
			if err := p.write(next[32:]); err != nil {
				t.Fatalf("the agent closed the connection while a frame header arrived in two parts, "+
					"1.1 s apart, across the read deadline left by the previous frame's payload: %v", err)
			}
			p.nc.SetReadDeadline(time.Now().Add(waitTimeout))
			var hb [tcpwire.HeaderLen]byte
			if _, err := io.ReadFull(p.nc, hb[:]); err != nil {
				t.Fatalf("the agent closed the connection while a frame header arrived in two parts, "+
					"1.1 s apart, across the read deadline left by the previous frame's payload: %v", err)
			}
			var h tcpwire.Header
			if err := tcpwire.Decode(hb[:], tcpwire.Version, &h); err != nil || h.Type != tcpwire.Ack || h.Tag != 2 || h.Status != tcpwire.NoQP {
				t.Fatalf("%+v, %v; want ACK NO_QP with tag 2", h, err)
			}
		})
	})

	// Requests to a real QP on host B, connected to a QP on host A, sent
	// by a member client as host A: the responder's PSN and access rules.
	t.Run("bound-qp", func(t *testing.T) {
		// pair connects a fresh QP pair (not used by the workloads) and
		// returns the responder b with an MR, and b's expected PSN.
		pair := func(t *testing.T) (a, b *end, mr *vrdma.MR, epsn uint32) {
			a, b = newEnd(t, va, qpConfig{}), newEnd(t, vb, qpConfig{})
			s.connect(t, a, b, connCM)
			mr = b.mr(t, 4096, vrdma.AccessAll)
			fill(mr.Bytes(), 21)
			info, err := b.qp.Query(opCtx(t))
			if err != nil {
				t.Fatal(err)
			}
			return a, b, mr, info.Attr.RQPSN & tcpwire.PSNMask
		}
		ask := func(t *testing.T, p *rawPeer, h tcpwire.Header, payload []byte) (tcpwire.Header, []byte) {
			t.Helper()
			p.mustWrite(rawFrame(h, payload))
			r, data := p.read()
			if r.Tag != h.Tag || r.SrcQPN != h.DstQPN || r.PSN != h.PSN {
				t.Fatalf("%s answered with %+v: tag, QPN or PSN do not match the request %+v", h.Type, r, h)
			}
			return r, data
		}
		t.Run("psn-and-binding", func(t *testing.T) {
			a, b, mr, e := pair(t)
			p := rawJoin(t, asA, hb)
			before := bytes.Clone(mr.Bytes())
			data := bytes.Repeat([]byte{0x5a}, 64)
			w := tcpwire.Header{Type: tcpwire.Write, Tag: 1, DstQPN: b.qp.QPN(), SrcQPN: a.qp.QPN(), PSN: e, RKey: mr.RKey(), RemoteAddr: off(mr, 100)}
			// Another source QP than the one b is connected to: dropped.
			h := w
			h.SrcQPN++
			if r, _ := ask(t, p, h, data); r.Status != tcpwire.NoQP {
				t.Errorf("WRITE from an unbound QP: %s, want NO_QP", r.Status)
			}
			// Ahead of the expected PSN: a sequence error, nothing written.
			h = w
			h.Tag, h.PSN = 2, (e+1)&tcpwire.PSNMask
			if r, _ := ask(t, p, h, data); r.Status != tcpwire.SeqErr {
				t.Errorf("WRITE with PSN e+1: %s, want SEQ_ERR", r.Status)
			}
			// Behind it: a duplicate, answered OK, not executed.
			h = w
			h.Tag, h.PSN = 3, (e-1)&tcpwire.PSNMask
			if r, _ := ask(t, p, h, data); r.Status != tcpwire.OK {
				t.Errorf("WRITE with PSN e-1: %s, want OK (a duplicate)", r.Status)
			}
			expectBytes(t, "memory after refused and duplicate WRITEs", mr.Bytes(), before)
			// The expected PSN: executed once; its retry is not.
			h = w
			h.Tag = 4
			if r, _ := ask(t, p, h, data); r.Status != tcpwire.OK {
				t.Fatalf("WRITE with PSN e: %s, want OK", r.Status)
			}
			want := bytes.Clone(before)
			copy(want[100:], data)
			expectBytes(t, "memory after the WRITE", mr.Bytes(), want)
			fill(mr.Bytes()[100:164], 22) // the workload overwrites it
			want = bytes.Clone(mr.Bytes())
			h.Tag = 5
			if r, _ := ask(t, p, h, data); r.Status != tcpwire.OK {
				t.Errorf("retried WRITE: %s, want OK", r.Status)
			}
			expectBytes(t, "memory after a retried WRITE", mr.Bytes(), want)
			// An atomic, then its retry: the retry returns the first
			// original value and does not add again.
			fa := tcpwire.Header{Type: tcpwire.FetchAdd, Tag: 6, DstQPN: b.qp.QPN(), SrcQPN: a.qp.QPN(), PSN: (e + 1) & tcpwire.PSNMask,
				RKey: mr.RKey(), RemoteAddr: off(mr, 1024), Compare: 5}
			word := mr.Bytes()[1024:1032]
			orig := binary.LittleEndian.Uint64(word)
			for i := range 2 {
				fa.Tag += uint64(i)
				r, _ := ask(t, p, fa, nil)
				if r.Status != tcpwire.OK || r.Compare != orig {
					t.Errorf("FETCH_ADD (try %d): %s, original %#x; want OK, %#x", i+1, r.Status, r.Compare, orig)
				}
			}
			if got := binary.LittleEndian.Uint64(word); got != orig+5 {
				t.Errorf("word after a FETCH_ADD of 5 and its retry: %#x, want %#x", got, orig+5)
			}
			expectState(t, b.qp, vrdma.QPSRTS)
		})
		// An atomic whose response was lost, retried after 300 later
		// requests: its original value comes back from the responder
		// resources (no number of WRITEs evicts it) and it does not add
		// again. Retried after max_dest_rd_atomic later atomics, its
		// result is no longer held: REM_INV_REQ_ERR (rc.NAKUnheld), never
		// executed again, never a wrong value, and the responder stays in
		// RTS (the retry may be a stale copy).
		t.Run("atomic-replay", func(t *testing.T) {
			a, b, mr, e := pair(t)
			p := rawJoin(t, asA, hb)
			fa := tcpwire.Header{Type: tcpwire.FetchAdd, Tag: 1, DstQPN: b.qp.QPN(), SrcQPN: a.qp.QPN(), PSN: e,
				RKey: mr.RKey(), RemoteAddr: off(mr, 1024), Compare: 5}
			word := mr.Bytes()[1024:1032]
			orig := binary.LittleEndian.Uint64(word)
			if r, _ := ask(t, p, fa, nil); r.Status != tcpwire.OK || r.Compare != orig {
				t.Fatalf("FETCH_ADD: %s, original %#x; want OK, %#x", r.Status, r.Compare, orig)
			}
			psn := e
			next := func() uint32 { psn = (psn + 1) & tcpwire.PSNMask; return psn }
			w := tcpwire.Header{Type: tcpwire.Write, DstQPN: b.qp.QPN(), SrcQPN: a.qp.QPN(), RKey: mr.RKey(), RemoteAddr: off(mr, 2048)}
			for i := range 300 {
				w.Tag, w.PSN = uint64(100+i), next()
				if r, _ := ask(t, p, w, []byte{byte(i)}); r.Status != tcpwire.OK {
					t.Fatalf("WRITE %d: %s, want OK", i, r.Status)
				}
			}
			fa.Tag = 2
			if r, _ := ask(t, p, fa, nil); r.Status != tcpwire.OK || r.Compare != orig {
				t.Fatalf("FETCH_ADD retried after 300 WRITEs: %s, original %#x; want OK, %#x (its first result)", r.Status, r.Compare, orig)
			}
			if got := binary.LittleEndian.Uint64(word); got != orig+5 {
				t.Fatalf("word after a FETCH_ADD of 5 and its retry: %#x, want %#x", got, orig+5)
			}
			info, err := b.qp.Query(opCtx(t))
			if err != nil {
				t.Fatal(err)
			}
			depth := int(info.Attr.MaxDestRdAtomic)
			other := fa
			other.RemoteAddr = off(mr, 3072)
			for i := range depth {
				other.Tag, other.PSN = uint64(400+i), next()
				if r, _ := ask(t, p, other, nil); r.Status != tcpwire.OK {
					t.Fatalf("FETCH_ADD %d to another word: %s, want OK", i, r.Status)
				}
			}
			fa.Tag = 3
			if r, _ := ask(t, p, fa, nil); r.Status != tcpwire.RemInvReqErr {
				t.Fatalf("FETCH_ADD retried after %d later atomics (max_dest_rd_atomic): %s (original %#x), want REM_INV_REQ_ERR: its result is no longer held", depth, r.Status, r.Compare)
			}
			if got := binary.LittleEndian.Uint64(word); got != orig+5 {
				t.Fatalf("word after the unheld retry: %#x, want %#x (not added again)", got, orig+5)
			}
			expectState(t, b.qp, vrdma.QPSRTS)
		})
		accessCases := []struct {
			name string
			h    func(t *testing.T, b *end, mr *vrdma.MR, h *tcpwire.Header) []byte
			want tcpwire.Status
		}{
			{"write-bad-rkey", func(_ *testing.T, _ *end, mr *vrdma.MR, h *tcpwire.Header) []byte {
				h.Type, h.RKey = tcpwire.Write, mr.RKey()^0xff00
				return make([]byte, 16)
			}, tcpwire.RemAccessErr},
			{"write-past-the-end", func(_ *testing.T, _ *end, mr *vrdma.MR, h *tcpwire.Header) []byte {
				h.Type, h.RemoteAddr = tcpwire.Write, off(mr, 4096-10)
				return make([]byte, 11)
			}, tcpwire.RemAccessErr},
			{"write-below", func(_ *testing.T, _ *end, mr *vrdma.MR, h *tcpwire.Header) []byte {
				h.Type, h.RemoteAddr = tcpwire.Write, mr.Addr()-1
				return make([]byte, 2)
			}, tcpwire.RemAccessErr},
			{"write-wrapping", func(_ *testing.T, _ *end, mr *vrdma.MR, h *tcpwire.Header) []byte {
				h.Type, h.RemoteAddr = tcpwire.Write, ^uint64(0)-3
				return make([]byte, 16)
			}, tcpwire.RemAccessErr},
			{"read-past-the-end", func(_ *testing.T, _ *end, mr *vrdma.MR, h *tcpwire.Header) []byte {
				h.Type, h.ImmOrLen = tcpwire.Read, 4097
				return nil
			}, tcpwire.RemAccessErr},
			{"read-2gib", func(_ *testing.T, _ *end, mr *vrdma.MR, h *tcpwire.Header) []byte {
				h.Type, h.ImmOrLen = tcpwire.Read, tcpwire.MaxData
				return nil
			}, tcpwire.RemAccessErr},
			{"atomic-misaligned", func(_ *testing.T, _ *end, mr *vrdma.MR, h *tcpwire.Header) []byte {
				h.Type, h.RemoteAddr = tcpwire.CmpSwap, off(mr, 4)
				return nil
			}, tcpwire.RemInvReqErr},
			{"atomic-past-the-end", func(_ *testing.T, _ *end, mr *vrdma.MR, h *tcpwire.Header) []byte {
				h.Type, h.RemoteAddr = tcpwire.FetchAdd, off(mr, 4096)
				return nil
			}, tcpwire.RemAccessErr},
			{"send-too-long", func(t *testing.T, b *end, mr *vrdma.MR, h *tcpwire.Header) []byte {
				postRecv(t, b.qp, vrdma.RecvWR{ID: 9, SGL: sgl(mr.SGE(0, 16))})
				h.Type = tcpwire.Send
				return make([]byte, 17)
			}, tcpwire.RemInvReqErr},
		}
		for _, tc := range accessCases {
			t.Run(tc.name, func(t *testing.T) {
				a, b, mr, e := pair(t)
				p := rawJoin(t, asA, hb)
				before := bytes.Clone(mr.Bytes())
				h := tcpwire.Header{Tag: 1, DstQPN: b.qp.QPN(), SrcQPN: a.qp.QPN(), PSN: e, RKey: mr.RKey(), RemoteAddr: mr.Addr()}
				payload := tc.h(t, b, mr, &h)
				r, data := ask(t, p, h, payload)
				if r.Status != tc.want || len(data) != 0 {
					t.Errorf("%s: %s with %d bytes, want %s without data", h.Type, r.Status, len(data), tc.want)
				}
				expectBytes(t, "the responder's memory region", mr.Bytes(), before)
				// The responder's QP is in error, as on every path; the
				// connection carries on.
				deadline := time.Now().Add(waitTimeout)
				for b.qp.State() != vrdma.QPSErr && time.Now().Before(deadline) {
					time.Sleep(time.Millisecond)
				}
				expectState(t, b.qp, vrdma.QPSErr)
				h.Tag, h.PSN = 2, (e+1)&tcpwire.PSNMask
				if r, _ := ask(t, p, h, payload); r.Status != tcpwire.NoQP {
					t.Errorf("%s to a QP in ERR: %s, want NO_QP", h.Type, r.Status)
				}
				rawProbe(t, p, 3)
			})
		}
	})

	t.Run("after", func(t *testing.T) {
		for _, h := range c.Hosts {
			if !h.Running() {
				t.Fatalf("%s's agent is not running", h.Name)
			}
			if strings.Contains(h.Stderr(), "panic") {
				t.Errorf("%s's agent logged a panic:\n%s", h.Name, h.Stderr())
			}
		}
		// A real pair still works, and a pair connected before everything.
		hostileTraffic(t, s, va, vb)
		hostileTraffic(t, s, vb, va)
	})
}

// hostileAdapter0 returns v's adapter vrdma0.
func hostileAdapter0(t *testing.T, v *vrdma.VM) *vrdma.Adapter {
	t.Helper()
	ad, err := v.Adapter("vrdma0")
	if err != nil {
		t.Fatal(err)
	}
	return ad
}

// hostileGID0 returns the GID of v's adapter vrdma0.
func hostileGID0(t *testing.T, v *vrdma.VM) [16]byte {
	t.Helper()
	return hostileAdapter0(t, v).GID()
}
