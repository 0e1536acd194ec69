// SPDX-License-Identifier: Apache-2.0

package rc

// Resume makes the PSN after psn the expected one: a UC responder takes a
// packet at any PSN that is not behind the expected one (a gap is packets
// lost, never asked for again), and expects the next after it.
func (s *Seq) Resume(psn uint32) { s.epsn = PSNNext(psn & PSNMask) }
