// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/device"
)

// openXRCD serves open-xrcd: a domain named by the file whose descriptor
// the request carried (its device and inode, as the kernel names an XRC
// domain by the inode), or a private one.
func (s *session) openXRCD(v *device.Context, r *abi.OpenXRCD) (any, []int, error) {
	var file *device.FileID
	if r.FD {
		if s.reqFD < 0 {
			return nil, nil, abi.Errorf(abi.CodeInvalid, "fd", "open-xrcd with a file carried no descriptor: send the file's descriptor with the request (SCM_RIGHTS)")
		}
		var st unix.Stat_t
		if err := unix.Fstat(s.reqFD, &st); err != nil {
			return nil, nil, abi.Errorf(abi.CodeInvalid, "fd", "the descriptor open-xrcd carried cannot be examined: %v", err)
		}
		file = &device.FileID{Dev: uint64(st.Dev), Ino: st.Ino}
	}
	h, err := v.OpenXRCD(r.Adapter, file, r.OFlags&abi.XRCDCreate != 0, r.OFlags&abi.XRCDExcl != 0)
	if err != nil {
		return nil, nil, err
	}
	return abi.Handle{Handle: h}, nil, nil
}
