// SPDX-License-Identifier: Apache-2.0

package tcpwire

// UC requests: the frames of a UC QP's SEND and RDMA WRITE (with and
// without immediate), laid out as Write, WriteImm, Send and SendImm. No
// response answers them and their tag is 0; the responder drops one whose
// PSN is behind the one it expects (a frame that came twice) and takes
// any other, expecting the next PSN after it (frames lost on the lossy
// test link are messages lost).
const (
	UCWrite    Type = 40 // payload: the data
	UCWriteImm Type = 41 // payload: the data; Imm
	UCSend     Type = 42 // payload: the message
	UCSendImm  Type = 43 // payload: the message; Imm
)

func init() {
	for t, n := range map[Type]string{UCWrite: "UC_WRITE", UCWriteImm: "UC_WRITE_IMM", UCSend: "UC_SEND", UCSendImm: "UC_SEND_IMM"} {
		typeNames[t] = n
	}
}

// IsUC reports whether t is a UC request.
func (t Type) IsUC() bool { return t >= UCWrite && t <= UCSendImm }
