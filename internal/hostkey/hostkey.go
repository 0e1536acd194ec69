// SPDX-License-Identifier: Apache-2.0

// Package hostkey is a host's own credential on the tcp path and its
// memory of the other hosts' (docs/SECURITY.md, "Between hosts").
//
// Each agent holds an ed25519 key pair in its state directory (host-key,
// mode 0600, created at its first start) and publishes the public half in
// its host record (records.Host.HostKey). In every handshake each side
// signs the transcript with its key, and the other verifies the signature
// against the key the signer's host record publishes, pinned at first
// sight: Pins remembers, in the state directory (known-host-keys), the key
// each host ID had the first time this host saw it, and a key that changes
// afterwards is refused until an operator forgets the old one (vrdmactl
// host forget-key). So a member host that holds the switch secret, or that
// can write the control plane, still cannot present another host's ID.
//
// The files are small text files: host-key holds the 32-byte seed in hex;
// known-host-keys one line per host, "<host ID> <public key in hex>".
// Every change of known-host-keys takes an exclusive flock on the file
// beside it (known-host-keys.lock) and replaces the file by rename, so the
// agent and vrdmactl may change it at once.
package hostkey

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
)

// File names in the state directory.
const (
	KeyFile  = "host-key"        // this host's private key seed, hex
	PinsFile = "known-host-keys" // the pinned keys of other hosts
)

// Load returns the host key kept in dir, creating it (mode 0600) if dir
// holds none. A file that is not a key is an error naming it: the host's
// identity must not change silently.
func Load(dir string) (ed25519.PrivateKey, error) {
	p := filepath.Join(dir, KeyFile)
	b, err := os.ReadFile(p)
	if err == nil {
		seed, herr := hex.DecodeString(strings.TrimSpace(string(b)))
		if herr != nil || len(seed) != ed25519.SeedSize {
			return nil, fmt.Errorf("rule host-key: %s does not hold a %d-byte ed25519 seed in hex: restore it from a backup, or remove it "+
				"(the host gets a new key, which every other host then refuses until it forgets the old one: vrdmactl host forget-key)", p, ed25519.SeedSize)
		}
		if fi, err := os.Stat(p); err == nil && fi.Mode().Perm()&0o077 != 0 {
			return nil, fmt.Errorf("rule host-key: %s has mode %o: other users could read this host's key; chmod 600 it (and consider the key leaked)", p, fi.Mode().Perm())
		}
		return ed25519.NewKeyFromSeed(seed), nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("rule host-key: read this host's key: %w", err)
	}
	seed := make([]byte, ed25519.SeedSize)
	rand.Read(seed)
	// Written whole to a file of its own, then linked into place: two
	// agents started at once on one state directory must not each keep a
	// different key, nor read the other's half-written one.
	f, err := os.CreateTemp(dir, KeyFile+".*")
	if err != nil {
		return nil, fmt.Errorf("rule host-key: create this host's key: %w", err)
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	_, err = f.WriteString(hex.EncodeToString(seed) + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Link(tmp, p)
	}
	if errors.Is(err, os.ErrExist) {
		return Load(dir)
	}
	if err != nil {
		return nil, fmt.Errorf("rule host-key: write this host's key %s: %w", p, err)
	}
	return ed25519.NewKeyFromSeed(seed), nil
}

// Encode returns the hex form of a public key, as host records publish it.
func Encode(pub ed25519.PublicKey) string { return hex.EncodeToString(pub) }

// Parse decodes a public key in hex, as host records publish it.
func Parse(s string) (ed25519.PublicKey, error) {
	if len(s) != 2*ed25519.PublicKeySize {
		return nil, fmt.Errorf("host key %.80q is not %d hex digits", s, 2*ed25519.PublicKeySize)
	}
	b, err := hex.DecodeString(s)
	if err != nil || strings.ToLower(s) != s {
		return nil, fmt.Errorf("host key %.80q is not lowercase hex", s)
	}
	return ed25519.PublicKey(b), nil
}

// Pins are the host keys this host has seen, by host ID, in a file.
type Pins struct {
	path string
}

// NewPins returns the pins kept in dir (the file is created at the first
// pin).
func NewPins(dir string) *Pins { return &Pins{path: filepath.Join(dir, PinsFile)} }

// Path returns the pins' file.
func (p *Pins) Path() string { return p.path }

var hostIDRE = regexp.MustCompile(`^[0-9a-f]{32}$`)

// ErrChanged is wrapped by Check's error when a host's published key is
// not the one pinned for it.
var ErrChanged = errors.New("host key changed")

// Check compares key, the one host id's record publishes, with the key
// pinned for id; when none is, it pins key (first sight). It fails with
// ErrChanged, naming the rule and the command that accepts the new key,
// when another key is pinned.
func (p *Pins) Check(id, name string, key ed25519.PublicKey) error {
	if !hostIDRE.MatchString(id) {
		return fmt.Errorf("rule host-key: %q is not a host ID", id)
	}
	return p.change(func(m map[string]string) (bool, error) {
		k := Encode(key)
		old, ok := m[id]
		switch {
		case !ok:
			m[id] = k
			return true, nil
		case old == k:
			return false, nil
		}
		return false, fmt.Errorf("rule host-key: %w: host %s (%s) publishes host key %s…, but this host pinned %s… for it at first sight "+
			"(in %s): another host may be posing as it, or its control-plane record was rewritten. If host %s was reinstalled and "+
			"its key really changed, accept the new key on this host: vrdmactl host forget-key %s", ErrChanged, name, id, k[:16], old[:16], p.path, name, id)
	})
}

// Forget removes the key pinned for host id; it reports whether one was.
func (p *Pins) Forget(id string) (bool, error) {
	found := false
	err := p.change(func(m map[string]string) (bool, error) {
		_, found = m[id]
		delete(m, id)
		return found, nil
	})
	return found, err
}

// change runs f on the pins under the file's lock and writes them back if
// f says they changed.
func (p *Pins) change(f func(m map[string]string) (bool, error)) error {
	lk, err := os.OpenFile(p.path+".lock", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("rule host-key: lock the pinned host keys: %w", err)
	}
	defer lk.Close()
	if err := syscall.Flock(int(lk.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("rule host-key: lock the pinned host keys: %w", err)
	}
	m, err := p.read()
	if err != nil {
		return err
	}
	changed, err := f(m)
	if err != nil || !changed {
		return err
	}
	ids := make([]string, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var b bytes.Buffer
	for _, id := range ids {
		fmt.Fprintf(&b, "%s %s\n", id, m[id])
	}
	tmp := p.path + ".tmp"
	if err := os.WriteFile(tmp, b.Bytes(), 0o600); err != nil {
		return fmt.Errorf("rule host-key: write the pinned host keys: %w", err)
	}
	if err := os.Rename(tmp, p.path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("rule host-key: write the pinned host keys: %w", err)
	}
	return nil
}

// read reads the pins; a missing file is no pins. A line that is not
// "<host ID> <key>" makes the whole file an error: a damaged file must not
// let a host be pinned anew.
func (p *Pins) read() (map[string]string, error) {
	m := map[string]string{}
	b, err := os.ReadFile(p.path)
	if errors.Is(err, os.ErrNotExist) {
		return m, nil
	}
	if err != nil {
		return nil, fmt.Errorf("rule host-key: read the pinned host keys: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		id, k, ok := strings.Cut(strings.TrimSpace(sc.Text()), " ")
		if !ok || !hostIDRE.MatchString(id) {
			return nil, fmt.Errorf("rule host-key: %s line %d is not \"<host ID> <key>\": fix or remove the line", p.path, n)
		}
		if _, err := Parse(k); err != nil {
			return nil, fmt.Errorf("rule host-key: %s line %d: %v: fix or remove the line", p.path, n, err)
		}
		m[id] = k
	}
	return m, nil
}
