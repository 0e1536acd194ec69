// SPDX-License-Identifier: Apache-2.0

package records

import "fmt"

// KindSwitchSecret is the kind of a switch's fabric secret.
const KindSwitchSecret Kind = "switch-secret"

// SwitchSecretPrefix is where switch secrets live.
const SwitchSecretPrefix = Prefix + "secrets/switches/"

// SwitchSecretKey returns the key of switch name's secret.
func SwitchSecretKey(name string) string { return SwitchSecretPrefix + name }

// SwitchSecretLen is the length of a switch secret, in bytes.
const SwitchSecretLen = 32

// SwitchSecret is the shared secret of the hosts of a distributed switch:
// the tcp path's handshake proves that both agents hold it (an HMAC over
// fresh nonces), so that only hosts with access to the control plane's
// secrets join the switch's data plane. The first agent on a switch
// creates it; whoever can read it from etcd is trusted, so etcd's access
// control (TLS client certificates, RBAC) guards it. See docs/SECURITY.md.
type SwitchSecret struct {
	Switch string `json:"switch"`
	Key    []byte `json:"key"` // SwitchSecretLen random bytes
}

// Kind returns KindSwitchSecret.
func (SwitchSecret) Kind() Kind { return KindSwitchSecret }

// Validate checks the secret's fields.
func (s SwitchSecret) Validate() error {
	c := checker{kind: KindSwitchSecret, name: s.Switch}
	c.name_("switch", s.Switch)
	if len(s.Key) != SwitchSecretLen {
		c.add("key", "%s", fmt.Sprintf("is %d bytes, want %d", len(s.Key), SwitchSecretLen))
	}
	return c.err()
}
