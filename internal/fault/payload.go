// SPDX-License-Identifier: Apache-2.0

package fault

import (
	"encoding/binary"
	"hash/fnv"
	"math/rand/v2"
)

// Fill fills b with the payload of WR id under seed: its first 8 bytes
// hold id (little endian) when b has room, so that a receiver can tell
// which WR a message is; the rest comes from a PRNG seeded by seed and
// id. The same arguments give the same bytes in every process.
func Fill(b []byte, seed, id uint64) {
	n := 0
	if len(b) >= 8 {
		binary.LittleEndian.PutUint64(b, id)
		n = 8
	}
	r := rand.NewPCG(seed, id^0x9e3779b97f4a7c15)
	for ; n+8 <= len(b); n += 8 {
		binary.LittleEndian.PutUint64(b[n:], r.Uint64())
	}
	if n < len(b) {
		var last [8]byte
		binary.LittleEndian.PutUint64(last[:], r.Uint64())
		copy(b[n:], last[:])
	}
}

// Sum is the checksum the ledger keeps of a payload: FNV-1a, 64 bits.
func Sum(b []byte) uint64 {
	h := fnv.New64a()
	h.Write(b)
	return h.Sum64()
}

// PayloadID returns the WR ID a message carries in its first 8 bytes (see
// Fill), and false if it is shorter.
func PayloadID(b []byte) (uint64, bool) {
	if len(b) < 8 {
		return 0, false
	}
	return binary.LittleEndian.Uint64(b), true
}
