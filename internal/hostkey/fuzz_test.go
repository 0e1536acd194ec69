// SPDX-License-Identifier: Apache-2.0

package hostkey

import (
	"crypto/ed25519"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzPins feeds the pinned-keys file (known-host-keys, which an
// operator may edit) to the reader: it never panics, a file it accepts
// holds only well-formed lines, and a pin added to an accepted file
// reads back beside the others.
func FuzzPins(f *testing.F) {
	key := Encode(ed25519.PublicKey(make([]byte, ed25519.PublicKeySize)))
	for _, s := range []string{
		"",
		"0123456789abcdef0123456789abcdef " + key + "\n",
		"0123456789abcdef0123456789abcdef " + key,
		"host " + key + "\n",
		"0123456789abcdef0123456789abcdef " + strings.ToUpper(key) + "\n",
		"0123456789abcdef0123456789abcdef\n",
		"\n\n",
		"0123456789abcdef0123456789abcdef " + key + " trailing\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, PinsFile), b, 0o600); err != nil {
			t.Fatal(err)
		}
		p := NewPins(dir)
		m, err := p.read()
		if err != nil {
			if !strings.HasPrefix(err.Error(), "rule host-key: ") {
				t.Fatalf("error %q does not name the rule", err)
			}
			return
		}
		for id, k := range m {
			if !hostIDRE.MatchString(id) {
				t.Fatalf("accepted host ID %q", id)
			}
			if _, err := Parse(k); err != nil {
				t.Fatalf("accepted key %q: %v", k, err)
			}
		}
		const id = "ffffffffffffffffffffffffffffffff"
		if _, taken := m[id]; taken {
			return
		}
		pub, _, err := ed25519.GenerateKey(nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Check(id, "fuzz", pub); err != nil {
			t.Fatalf("pin a new host in an accepted file: %v", err)
		}
		m2, err := p.read()
		if err != nil {
			t.Fatalf("the file after a pin: %v", err)
		}
		if m2[id] != Encode(pub) || len(m2) != len(m)+1 {
			t.Fatalf("after a pin: %d pins (want %d), the new one %q", len(m2), len(m)+1, m2[id])
		}
	})
}
