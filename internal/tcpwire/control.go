// SPDX-License-Identifier: Apache-2.0

package tcpwire

import (
	"bytes"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"regexp"

	"github.com/vrdma/vrdma/internal/abi"
)

// NonceLen is the length of a handshake nonce, in bytes.
const NonceLen = 32

// HelloMsg opens a connection: the initiator's versions, identity and
// nonce. Versions lists every version it speaks.
type HelloMsg struct {
	Versions []uint8 `json:"versions"`
	HostID   string  `json:"host_id"`
	Host     string  `json:"host"`
	Switch   string  `json:"switch"`
	Boot     string  `json:"boot"`  // the agent process's boot ID (hex), new at every start
	Nonce    string  `json:"nonce"` // NonceLen random bytes, hex
	Target   string  `json:"target"`
	// Lanes is how many connections the initiator would carry its
	// requests on (lanes.go), this one included, 2..MaxLanes; 0: one.
	// Group names the main connection's lanes: 32 random hex digits.
	// A lane's own HELLO carries Group and Lane, its index (1..), instead.
	Lanes uint8  `json:"lanes,omitempty"`
	Group string `json:"group,omitempty"`
	Lane  uint8  `json:"lane,omitempty"`
}

// ChallengeMsg is the acceptor's answer: the version chosen, its identity
// and nonce, and its proof of the switch secret.
type ChallengeMsg struct {
	Version uint8  `json:"version"`
	HostID  string `json:"host_id"`
	Host    string `json:"host"`
	Boot    string `json:"boot"`
	Nonce   string `json:"nonce"`
	Proof   string `json:"proof"` // Proof(secret, "acceptor", …), hex
	// Sig is the acceptor's ed25519 signature of SignInput("acceptor", …)
	// under its host key (protocol version 2), hex.
	Sig string `json:"sig"`
	// Lanes answers HELLO's: the lanes the acceptor takes, 1..HELLO's
	// (omitted: one). Only sent when HELLO offered lanes: an initiator
	// that offered none refuses unknown keys.
	Lanes uint8 `json:"lanes,omitempty"`
}

// AuthMsg is the initiator's proof of the switch secret and its signature
// under its host key.
type AuthMsg struct {
	Proof string `json:"proof"`
	// Sig is the initiator's ed25519 signature of SignInput("initiator",
	// …) under its host key, hex.
	Sig string `json:"sig"`
}

// RefuseMsg says why a handshake failed (or a connection is closed): the
// rule that refused it and what to do.
type RefuseMsg struct {
	Reason string `json:"reason"`
}

// ConnReqMsg asks the acceptor's host to connect QP FromQPN (adapter
// FromVM/FromAdapter, GID FromGID) to whoever listens on Target ("vm/vrdmaN")
// port Port.
type ConnReqMsg struct {
	Target      string     `json:"target"`
	Port        uint16     `json:"port"`
	FromVM      string     `json:"from_vm"`
	FromAdapter string     `json:"from_adapter"`
	FromGID     netip.Addr `json:"from_gid"`
	FromQPN     uint32     `json:"from_qpn"`
	TimeoutMS   uint32     `json:"timeout_ms"`
	MTU         uint32     `json:"mtu,omitempty"` // the dialer's active MTU (0: not said, an older agent)
	// External: the dialer's workload moves its QP itself (rdma_cm's
	// external QP); the acceptor's ESTABLISHED waits for its CM_RTU.
	External bool `json:"external,omitempty"`
	// UD: a service ID resolution (rdma_cm's RDMA_PS_UDP, a SIDR REQ)
	// from UD QP FromQPN to a listener of the UDP port space; the answer
	// is the listener's UD QP and its Q_Key, and nothing is connected.
	UD bool `json:"ud,omitempty"`
	// ToIP and FromIP, for a connect by a host's address (the target's
	// host port): the address the dialer dialed, and its own host's
	// address; the acceptor's request reports them as its local and peer
	// addresses. Omitted otherwise.
	ToIP   netip.Addr `json:"to_ip,omitzero"`
	FromIP netip.Addr `json:"from_ip,omitzero"`
	// PrivateData is the REQ's private data (at most 56 bytes; a SIDR
	// REQ's, at most 180); omitted when empty.
	PrivateData []byte `json:"private_data,omitempty"`
}

// ConnRespMsg answers a ConnReqMsg: the accepting QP and the PSNs, or an
// error (Code as in the local ABI's errors, and a message).
type ConnRespMsg struct {
	QPN     uint32     `json:"qpn,omitempty"`
	GID     netip.Addr `json:"gid,omitzero"`
	SQPSN   uint32     `json:"sq_psn,omitempty"` // the dialer's send PSN = the acceptor's receive PSN
	RQPSN   uint32     `json:"rq_psn,omitempty"` // the dialer's receive PSN = the acceptor's send PSN
	MTU     uint32     `json:"mtu,omitempty"`    // the path MTU the acceptor's QP took (0: not said)
	Code    string     `json:"code,omitempty"`
	Message string     `json:"message,omitempty"`
	// PrivateData is the REP's (at most 196 bytes) or, with Code
	// "refused", the REJ's (at most 148); omitted when empty.
	PrivateData []byte `json:"private_data,omitempty"`
	// RejectReason, with Code "refused", is the IBTA reject reason (8: no
	// listener, 28: the listener rejected); 0 when not said.
	RejectReason uint16 `json:"reject_reason,omitempty"`
	// QKey answers a UD request: the accepting UD QP's Q_Key.
	QKey uint32 `json:"qkey,omitempty"`
	// VM and Adapters answer a CM_WHO: the VM that holds the port, and
	// the adapters it listens on; both omitted when no VM holds it.
	VM       string   `json:"vm,omitempty"`
	Adapters []string `json:"adapters,omitempty"`
}

// HostPortMsg is a CM_WHO: which VM holds port Port (of rdma_cm's UDP
// port space with UD) of the receiving host's addresses.
type HostPortMsg struct {
	Port uint16 `json:"port"`
	UD   bool   `json:"ud,omitempty"`
}

// Validate checks a CM_WHO.
func (m *HostPortMsg) Validate() error {
	if m.Port == 0 {
		return fmt.Errorf("CM_WHO: port 0")
	}
	return nil
}

// ValidateWho checks a CM_RESP that answers a CM_WHO.
func (m *ConnRespMsg) ValidateWho() error {
	if m.Code != "" {
		return m.Validate()
	}
	switch {
	case m.VM == "" && len(m.Adapters) == 0:
		return nil
	case !nameRE.MatchString(m.VM) || len(m.VM) > 64:
		return fmt.Errorf("CM_RESP: vm %q is not a VM name", m.VM)
	case len(m.Adapters) == 0 || len(m.Adapters) > 10:
		return fmt.Errorf("CM_RESP: %d adapters (want 1..10)", len(m.Adapters))
	}
	for _, a := range m.Adapters {
		if !adaptRE.MatchString(a) {
			return fmt.Errorf("CM_RESP: adapter %q is not an adapter name", a)
		}
	}
	return nil
}

// ConnDiscMsg names the two ends of an rdma_cm connection across hosts: QP
// FromQPN (GID FromGID) of the sending host and QP QPN of the receiving
// one. In a CM_DISC, FromQPN disconnected; in a CM_RTU, FromQPN's workload,
// which moves its QP itself, established the connection (rdma_establish).
type ConnDiscMsg struct {
	QPN     uint32     `json:"qpn"`
	FromQPN uint32     `json:"from_qpn"`
	FromGID netip.Addr `json:"from_gid"`
}

// Validate checks a CM_DISC or CM_RTU.
func (m *ConnDiscMsg) Validate() error {
	switch {
	case m.QPN == 0 || m.QPN > 0xffffff:
		return fmt.Errorf("qpn 0x%x out of range 1..0xffffff", m.QPN)
	case m.FromQPN == 0 || m.FromQPN > 0xffffff:
		return fmt.Errorf("from_qpn 0x%x out of range 1..0xffffff", m.FromQPN)
	case !m.FromGID.Is6():
		return fmt.Errorf("from_gid %v is not a 16-byte GID", m.FromGID)
	}
	return nil
}

var (
	hexID   = regexp.MustCompile(`^[0-9a-f]{32}$`)
	hexNon  = regexp.MustCompile(`^[0-9a-f]{64}$`)
	hexSig  = regexp.MustCompile(`^[0-9a-f]{128}$`)
	nameRE  = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,252}$`)
	endRE   = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}/vrdma[0-9]{1,2}$`)
	adaptRE = regexp.MustCompile(`^vrdma[0-9]{1,2}$`)
)

// Validate checks every field of a HELLO.
func (m *HelloMsg) Validate() error {
	switch {
	case len(m.Versions) == 0 || len(m.Versions) > 16:
		return fmt.Errorf("HELLO: %d versions offered (want 1..16)", len(m.Versions))
	case !hexID.MatchString(m.HostID):
		return fmt.Errorf("HELLO: host_id %q is not a 32-digit lowercase hex host ID", m.HostID)
	case !nameRE.MatchString(m.Host):
		return fmt.Errorf("HELLO: host %q is not a host name", m.Host)
	case m.Switch != "" && !nameRE.MatchString(m.Switch):
		return fmt.Errorf("HELLO: switch %q is not a switch name", m.Switch)
	case !hexID.MatchString(m.Boot):
		return fmt.Errorf("HELLO: boot %q is not a 32-digit hex boot ID", m.Boot)
	case !hexNon.MatchString(m.Nonce):
		return fmt.Errorf("HELLO: nonce is not %d hex-encoded bytes", NonceLen)
	case !hexID.MatchString(m.Target):
		return fmt.Errorf("HELLO: target %q is not a 32-digit hex host ID", m.Target)
	case m.Lanes == 1 || m.Lanes > MaxLanes:
		return fmt.Errorf("HELLO: lanes %d (want 2..%d, or omitted for one)", m.Lanes, MaxLanes)
	case m.Lane >= MaxLanes:
		return fmt.Errorf("HELLO: lane %d (want 1..%d)", m.Lane, MaxLanes-1)
	case m.Lanes > 0 && m.Lane > 0:
		return fmt.Errorf("HELLO: both lanes (a main connection's offer) and lane (a lane's index)")
	case (m.Lanes > 0 || m.Lane > 0) != (m.Group != ""):
		return fmt.Errorf("HELLO: group is given with lanes or lane, and only then")
	case m.Group != "" && !hexID.MatchString(m.Group):
		return fmt.Errorf("HELLO: group %q is not 32 lowercase hex digits", m.Group)
	}
	return nil
}

// Validate checks every field of a CHALLENGE.
func (m *ChallengeMsg) Validate() error {
	switch {
	case m.Version == 0:
		return fmt.Errorf("CHALLENGE: version 0")
	case !hexID.MatchString(m.HostID):
		return fmt.Errorf("CHALLENGE: host_id %q is not a 32-digit hex host ID", m.HostID)
	case !nameRE.MatchString(m.Host):
		return fmt.Errorf("CHALLENGE: host %q is not a host name", m.Host)
	case !hexID.MatchString(m.Boot):
		return fmt.Errorf("CHALLENGE: boot %q is not a 32-digit hex boot ID", m.Boot)
	case !hexNon.MatchString(m.Nonce):
		return fmt.Errorf("CHALLENGE: nonce is not %d hex-encoded bytes", NonceLen)
	case len(m.Proof) != 2*sha256.Size:
		return fmt.Errorf("CHALLENGE: proof is not a hex SHA-256 HMAC")
	case !hexSig.MatchString(m.Sig):
		return fmt.Errorf("CHALLENGE: sig is not a %d-byte ed25519 signature in lowercase hex", ed25519.SignatureSize)
	case m.Lanes > MaxLanes:
		return fmt.Errorf("CHALLENGE: lanes %d (want 1..%d)", m.Lanes, MaxLanes)
	}
	return nil
}

// Validate checks a CM_REQ.
func (m *ConnReqMsg) Validate() error {
	switch {
	case !endRE.MatchString(m.Target):
		return fmt.Errorf("CM_REQ: target %q is not \"vm/vrdmaN\"", m.Target)
	case !nameRE.MatchString(m.FromVM) || len(m.FromVM) > 64:
		return fmt.Errorf("CM_REQ: from_vm %q is not a VM name", m.FromVM)
	case !adaptRE.MatchString(m.FromAdapter):
		return fmt.Errorf("CM_REQ: from_adapter %q is not an adapter name", m.FromAdapter)
	case !m.FromGID.Is6():
		return fmt.Errorf("CM_REQ: from_gid %v is not a 16-byte GID", m.FromGID)
	case m.FromQPN == 0 || m.FromQPN > 0xffffff:
		return fmt.Errorf("CM_REQ: from_qpn 0x%x out of range 1..0xffffff", m.FromQPN)
	case !optionalMTU(m.MTU):
		return fmt.Errorf("CM_REQ: mtu %d is not 256, 512, 1024, 2048 or 4096", m.MTU)
	case !m.UD && len(m.PrivateData) > abi.MaxPrivateDataREQ:
		return fmt.Errorf("CM_REQ: %d bytes of private data, more than a REQ's %d", len(m.PrivateData), abi.MaxPrivateDataREQ)
	case m.UD && len(m.PrivateData) > abi.MaxPrivateDataSIDRREQ:
		return fmt.Errorf("CM_REQ: %d bytes of private data, more than a SIDR REQ's %d", len(m.PrivateData), abi.MaxPrivateDataSIDRREQ)
	case m.UD && m.External:
		return fmt.Errorf("CM_REQ: a UD request (SIDR) has no external QP to establish")
	case m.ToIP.IsValid() != m.FromIP.IsValid():
		return fmt.Errorf("CM_REQ: to_ip %v and from_ip %v: a connect by a host's address has both, another neither", m.ToIP, m.FromIP)
	case m.ToIP.Zone() != "" || m.FromIP.Zone() != "":
		return fmt.Errorf("CM_REQ: to_ip %v, from_ip %v: no zones", m.ToIP, m.FromIP)
	}
	return nil
}

// Validate checks a CM_RESP.
func (m *ConnRespMsg) Validate() error {
	if m.Code != "" {
		if len(m.Message) > 4096 {
			return fmt.Errorf("CM_RESP: %d-byte message", len(m.Message))
		}
		if len(m.PrivateData) > 148 {
			return fmt.Errorf("CM_RESP: %d bytes of reject private data, more than a REJ's 148", len(m.PrivateData))
		}
		return nil
	}
	switch {
	case m.QPN == 0 || m.QPN > 0xffffff:
		return fmt.Errorf("CM_RESP: qpn 0x%x out of range 1..0xffffff", m.QPN)
	case !m.GID.Is6():
		return fmt.Errorf("CM_RESP: gid %v is not a 16-byte GID", m.GID)
	case m.SQPSN > PSNMask || m.RQPSN > PSNMask:
		return fmt.Errorf("CM_RESP: PSN wider than 24 bits")
	case !optionalMTU(m.MTU):
		return fmt.Errorf("CM_RESP: mtu %d is not 256, 512, 1024, 2048 or 4096", m.MTU)
	case len(m.PrivateData) > 196:
		return fmt.Errorf("CM_RESP: %d bytes of private data, more than a REP's 196", len(m.PrivateData))
	}
	return nil
}

// optionalMTU reports whether m is 0 (not said) or a RoCE MTU.
func optionalMTU(m uint32) bool { return m == 0 || m >= 256 && m <= 4096 && m&(m-1) == 0 }

// DecodeJSON decodes a control payload into v: one JSON object and
// nothing after it. Unknown fields are refused, except in a HELLO: an
// agent of a later version may add fields there, before the two agree on
// a version.
func DecodeJSON(payload []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(payload))
	if _, hello := v.(*HelloMsg); !hello {
		d.DisallowUnknownFields()
	}
	if err := d.Decode(v); err != nil {
		return fmt.Errorf("control payload: %v", err)
	}
	if _, err := d.Token(); err != io.EOF {
		return fmt.Errorf("control payload: data after the JSON object")
	}
	return nil
}

// Proof is the HMAC-SHA-256, under the switch secret, that a side of a
// handshake holds the secret: it covers the role ("initiator" or
// "acceptor"), the version, both host IDs and both nonces, so that no
// proof can be replayed on another connection or by the other side.
func Proof(secret []byte, role string, version uint8, initiatorID, acceptorID, initiatorNonce, acceptorNonce string) string {
	m := hmac.New(sha256.New, secret)
	fmt.Fprintf(m, "vrdma-tcp-handshake\x00%s\x00%d\x00%s\x00%s\x00%s\x00%s", role, version, initiatorID, acceptorID, initiatorNonce, acceptorNonce)
	return hex.EncodeToString(m.Sum(nil))
}

// SignInput is what a side of a handshake signs with its host key
// (protocol version 2): the same fields as the proof's — the role, the
// version, both host IDs and both nonces — under another label, so that a
// signature is bound to one connection, one direction and one pair of
// hosts, and is never mistaken for a proof's input.
func SignInput(role string, version uint8, initiatorID, acceptorID, initiatorNonce, acceptorNonce string) []byte {
	return fmt.Appendf(nil, "vrdma-tcp-hostkey\x00%s\x00%d\x00%s\x00%s\x00%s\x00%s", role, version, initiatorID, acceptorID, initiatorNonce, acceptorNonce)
}

// Sign signs SignInput(…) with key and returns the signature in hex.
func Sign(key ed25519.PrivateKey, role string, version uint8, initiatorID, acceptorID, initiatorNonce, acceptorNonce string) string {
	return hex.EncodeToString(ed25519.Sign(key, SignInput(role, version, initiatorID, acceptorID, initiatorNonce, acceptorNonce)))
}

// SigOK reports whether sig (hex) is pub's signature of SignInput(…).
func SigOK(pub ed25519.PublicKey, sig string, role string, version uint8, initiatorID, acceptorID, initiatorNonce, acceptorNonce string) bool {
	if !hexSig.MatchString(sig) || len(pub) != ed25519.PublicKeySize {
		return false
	}
	b, _ := hex.DecodeString(sig)
	return ed25519.Verify(pub, SignInput(role, version, initiatorID, acceptorID, initiatorNonce, acceptorNonce), b)
}

// ProofOK compares a received proof with the expected one in constant
// time.
func ProofOK(got, want string) bool { return hmac.Equal([]byte(got), []byte(want)) }
