// SPDX-License-Identifier: Apache-2.0

package rocewire

// UC is the transport bits (001) of the unreliable connected opcodes:
// UC|op is UC's form of the RC SEND or RDMA WRITE opcode op (UC|SendOnly
// is UC's SEND_ONLY, 0x24), with the same headers and payload rules
// (ib_pack.h IB_OPCODE_UC_*). UC has no READ, atomics, ACKs or
// invalidate.
const UC Opcode = 0x20

// Transport returns op's transport bits: 0 for RC, UC, 0x60 for UD, XRC.
func (op Opcode) Transport() Opcode { return op & 0xe0 }

// Operation returns op's operation bits: for a UC or XRC opcode, the RC
// opcode of the same operation.
func (op Opcode) Operation() Opcode { return op & 0x1f }

func init() {
	for op := SendFirst; op <= RDMAWriteOnlyWithImmediate; op++ {
		i := ops[op]
		i.Name = "UC_" + i.Name
		ops[UC|op] = i
	}
}
