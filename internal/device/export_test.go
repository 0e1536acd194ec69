// SPDX-License-Identifier: Apache-2.0

package device

// SetHarnessPath sets the maker of the path the ring harness binds its
// QPs to, given the device's targets.
func SetHarnessPath(f func(ts Targets) func(q Source) Path) { harnessPath = f }
