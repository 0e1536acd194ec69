// SPDX-License-Identifier: Apache-2.0

package abi

// MaskRCOnly are the attributes of an RC QP that a UC QP does not take
// (IBTA 10.3.1's UC column, the kernel's qp_state_table): RC's timeout,
// retry, RNR and READ/atomic attributes. ModifyQP with one of them for a
// UC QP fails (CodeInvalid, EINVAL), as on rxe; connection management
// leaves them out for a UC QP.
const MaskRCOnly = MaskTimeout | MaskRetryCnt | MaskRNRRetry | MaskMaxRdAtomic | MaskMinRNRTimer | MaskMaxDestRdAtomic
