// SPDX-License-Identifier: Apache-2.0

package vmnet

import (
	"fmt"
	"strconv"
	"strings"
)

// MaxPortGroupNumber is the largest N of a port group key dvportgroup-N
// that has a VNI: N takes the VNI's upper 12 bits.
const MaxPortGroupNumber = 4095

// portGroupPrefix starts every vSphere distributed port group key.
const portGroupPrefix = "dvportgroup-"

// VNI returns the VXLAN network identifier of port group key in VLAN
// vlan: for key dvportgroup-N, N<<12 | vlan (N 1..4095 in the upper 12
// bits, the VLAN 0..4094 in the lower 12), so that two port groups, or one
// port group's VLANs, never share a layer 2. A key of another form has no
// VNI: the error says what to do.
func VNI(key string, vlan int) (uint32, error) {
	if vlan < 0 || vlan > 4094 {
		return 0, fmt.Errorf("port group %q: VLAN %d is not 0..4094", key, vlan)
	}
	digits, ok := strings.CutPrefix(key, portGroupPrefix)
	n, err := strconv.Atoi(digits)
	if !ok || err != nil || n < 1 || n > MaxPortGroupNumber || digits != strconv.Itoa(n) {
		return 0, fmt.Errorf("port group %q has no VNI: a VM's layer 2 between hosts is a VXLAN whose VNI is derived from a key %sN (N 1..%d) and the VLAN; put the adapter on such a port group (ethernetN.dvs.portgroupId in the VMX), or run vrdmad without --vm-netns", key, portGroupPrefix, MaxPortGroupNumber)
	}
	return uint32(n)<<12 | uint32(vlan), nil
}
