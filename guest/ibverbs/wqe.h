/* SPDX-License-Identifier: Apache-2.0 */
/*
 * wqe.h: the library's encoders of WQEs and decoder of CQEs (docs/wire-local.md
 * §5.2, §5.3), over the layouts of vrdma-abi.h. post_send, post_recv, the
 * ibv_wr_* API and poll_cq (verbs.c) write and read slots only through
 * these, and so does the golden-vector test (tests/abi_golden.c), which
 * runs internal/abi's vectors through them.
 *
 * A slot is a pointer into the ring mapping (stride-aligned, so the structs'
 * fields are naturally aligned). The caller owns the slot: it is not
 * published until ring_publish_sq/rq stores the tail past it (ring.h).
 */
#ifndef VRDMA_WQE_H
#define VRDMA_WQE_H

#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <infiniband/verbs.h>

#include "vrdma-abi.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the rings are little endian; this library writes them as native structs"
#endif

/* The ABI numbers these as rdma-core does; the library passes them through. */
_Static_assert(VRDMA_WR_RDMA_WRITE == IBV_WR_RDMA_WRITE && VRDMA_WR_RDMA_WRITE_WITH_IMM == IBV_WR_RDMA_WRITE_WITH_IMM &&
		       VRDMA_WR_SEND == IBV_WR_SEND && VRDMA_WR_SEND_WITH_IMM == IBV_WR_SEND_WITH_IMM &&
		       VRDMA_WR_RDMA_READ == IBV_WR_RDMA_READ && VRDMA_WR_ATOMIC_CMP_AND_SWP == IBV_WR_ATOMIC_CMP_AND_SWP &&
		       VRDMA_WR_ATOMIC_FETCH_AND_ADD == IBV_WR_ATOMIC_FETCH_AND_ADD && VRDMA_WR_LOCAL_INV == IBV_WR_LOCAL_INV &&
		       VRDMA_WR_BIND_MW == IBV_WR_BIND_MW && VRDMA_WR_SEND_WITH_INV == IBV_WR_SEND_WITH_INV &&
		       VRDMA_WR_ATOMIC_WRITE == IBV_WR_ATOMIC_WRITE,
	       "send opcodes are IBV_WR_*");
_Static_assert(VRDMA_WC_SEND == IBV_WC_SEND && VRDMA_WC_RDMA_WRITE == IBV_WC_RDMA_WRITE &&
		       VRDMA_WC_RDMA_READ == IBV_WC_RDMA_READ && VRDMA_WC_COMP_SWAP == IBV_WC_COMP_SWAP &&
		       VRDMA_WC_FETCH_ADD == IBV_WC_FETCH_ADD && VRDMA_WC_ATOMIC_WRITE == IBV_WC_ATOMIC_WRITE &&
		       VRDMA_WC_RECV == IBV_WC_RECV &&
		       VRDMA_WC_RECV_RDMA_WITH_IMM == IBV_WC_RECV_RDMA_WITH_IMM && VRDMA_WC_BIND_MW == IBV_WC_BIND_MW &&
		       VRDMA_WC_LOCAL_INV == IBV_WC_LOCAL_INV,
	       "completion opcodes are IBV_WC_*");
_Static_assert(VRDMA_WC_SUCCESS == IBV_WC_SUCCESS && VRDMA_WC_LOC_LEN_ERR == IBV_WC_LOC_LEN_ERR &&
		       VRDMA_WC_WR_FLUSH_ERR == IBV_WC_WR_FLUSH_ERR && VRDMA_WC_REM_ACCESS_ERR == IBV_WC_REM_ACCESS_ERR &&
		       VRDMA_WC_RNR_RETRY_EXC_ERR == IBV_WC_RNR_RETRY_EXC_ERR && VRDMA_WC_GENERAL_ERR == IBV_WC_GENERAL_ERR,
	       "completion statuses are IBV_WC_*");
_Static_assert(VRDMA_QPS_RESET == IBV_QPS_RESET && VRDMA_QPS_RTS == IBV_QPS_RTS && VRDMA_QPS_SQD == IBV_QPS_SQD &&
		       VRDMA_QPS_SQE == IBV_QPS_SQE && VRDMA_QPS_ERR == IBV_QPS_ERR,
	       "QP states are IBV_QPS_*");
_Static_assert(VRDMA_ACCESS_LOCAL_WRITE == IBV_ACCESS_LOCAL_WRITE && VRDMA_ACCESS_REMOTE_WRITE == IBV_ACCESS_REMOTE_WRITE &&
		       VRDMA_ACCESS_REMOTE_READ == IBV_ACCESS_REMOTE_READ &&
		       VRDMA_ACCESS_REMOTE_ATOMIC == IBV_ACCESS_REMOTE_ATOMIC && VRDMA_ACCESS_MW_BIND == IBV_ACCESS_MW_BIND,
	       "access flags are IBV_ACCESS_*");
_Static_assert(sizeof(struct ibv_sge) == sizeof(struct vrdma_sge), "ibv_sge and the ring's SGE");

/* WQE_SEND_FLAGS are the IBV_SEND_* flags a send WQE carries. */
#define WQE_SEND_FLAGS ((unsigned int)(IBV_SEND_FENCE | IBV_SEND_SIGNALED | IBV_SEND_SOLICITED | IBV_SEND_INLINE))

static inline struct vrdma_send_wqe *wqe_send(void *slot)
{
	return (struct vrdma_send_wqe *)slot;
}

static inline struct vrdma_sge *wqe_send_sge(void *slot)
{
	return (struct vrdma_sge *)((char *)slot + VRDMA_SEND_HDR);
}

/* wqe_send_begin starts a send WQE in slot: a zeroed header with wr_id,
 * opcode and the flags of send_flags (IBV_SEND_*) but INLINE, which
 * wqe_send_inline sets. */
static inline void wqe_send_begin(void *slot, uint64_t wr_id, int opcode, unsigned int send_flags)
{
	struct vrdma_send_wqe *w = wqe_send(slot);

	memset(w, 0, sizeof(*w));
	w->wr_id = wr_id;
	w->opcode = (uint8_t)opcode;
	if (send_flags & IBV_SEND_SIGNALED)
		w->flags |= VRDMA_WQE_SIGNALED;
	if (send_flags & IBV_SEND_SOLICITED)
		w->flags |= VRDMA_WQE_SOLICITED;
	if (send_flags & IBV_SEND_FENCE)
		w->flags |= VRDMA_WQE_FENCE;
}

/* wqe_send_imm sets the immediate: a number in the WQE, network order in
 * verbs (§5.3). */
static inline void wqe_send_imm(void *slot, __be32 imm)
{
	wqe_send(slot)->imm_data = be32toh(imm);
}

static inline void wqe_send_remote(void *slot, uint64_t remote_addr, uint32_t rkey)
{
	wqe_send(slot)->remote_addr = remote_addr;
	wqe_send(slot)->rkey = rkey;
}

static inline void wqe_send_atomic(void *slot, uint64_t compare_add, uint64_t swap)
{
	wqe_send(slot)->compare_add = compare_add;
	wqe_send(slot)->swap = swap;
}

/* wqe_send_sges makes the WQE's data its n SGEs (n checked by the caller). */
static inline void wqe_send_sges(void *slot, size_t n, const struct ibv_sge *sg)
{
	struct vrdma_sge *s = wqe_send_sge(slot);

	wqe_send(slot)->flags &= (uint8_t)~VRDMA_WQE_INLINE;
	wqe_send(slot)->num_sge = (uint8_t)n;
	wqe_send(slot)->inline_len = 0;
	for (size_t i = 0; i < n; i++) {
		s[i].addr = sg[i].addr;
		s[i].length = sg[i].length;
		s[i].lkey = sg[i].lkey;
	}
}

/* wqe_send_inline makes the WQE's data inline, empty so far. */
static inline void wqe_send_inline(void *slot)
{
	wqe_send(slot)->flags |= VRDMA_WQE_INLINE;
	wqe_send(slot)->num_sge = 0;
	wqe_send(slot)->inline_len = 0;
}

/* wqe_send_inline_add appends len bytes at p to the inline data; EINVAL if
 * they would pass max (the QP's max_inline_data). */
static inline int wqe_send_inline_add(void *slot, const void *p, size_t len, uint32_t max)
{
	struct vrdma_send_wqe *w = wqe_send(slot);

	if (len > max - w->inline_len)
		return EINVAL;
	memcpy((char *)slot + VRDMA_SEND_HDR + w->inline_len, p, len);
	w->inline_len += (uint32_t)len;
	return 0;
}

/* wqe_send_takes_inline reports whether opcode's data may be inline: READ
 * and the atomics need a destination, BIND_MW and LOCAL_INV carry none. */
static inline int wqe_send_takes_inline(int opcode)
{
	return opcode != IBV_WR_RDMA_READ && opcode != IBV_WR_ATOMIC_CMP_AND_SWP && opcode != IBV_WR_ATOMIC_FETCH_AND_ADD &&
	       opcode != IBV_WR_BIND_MW && opcode != IBV_WR_LOCAL_INV;
}

/* wqe_send_invalidate sets the rkey a LOCAL_INV or SEND_WITH_INV
 * invalidates: imm_data's place, a number (§5.2). */
static inline void wqe_send_invalidate(void *slot, uint32_t rkey)
{
	wqe_send(slot)->imm_data = rkey;
}

/* wqe_send_bind writes a BIND_MW's fields (§5.2): the window's handle in
 * imm_data, its new rkey in rkey, the range in remote_addr and
 * compare_add, the region's lkey and the access flags in swap's low and
 * high 32 bits. EINVAL for a zero-based window or a range without a
 * region. */
static inline int wqe_send_bind(void *slot, const struct ibv_mw *mw, uint32_t rkey, const struct ibv_mw_bind_info *b)
{
	struct vrdma_send_wqe *w = wqe_send(slot);

	if (!mw || (b->mw_access_flags & IBV_ACCESS_ZERO_BASED) || (!b->mr && b->length))
		return EINVAL;
	w->imm_data = mw->handle;
	w->rkey = rkey;
	w->remote_addr = b->addr;
	w->compare_add = b->length;
	w->swap = (uint64_t)b->mw_access_flags << 32 | (b->mr ? b->mr->lkey : 0);
	w->num_sge = 0;
	return 0;
}

/* wqe_send_from_wr writes wr (ibv_post_send's) into slot, checked against
 * the QP's caps: 0, or EINVAL for what §9 says the library refuses (the
 * slot then holds garbage, unpublished). */
static inline int wqe_send_from_wr(void *slot, const struct ibv_send_wr *wr, const struct ibv_qp_cap *caps)
{
	if ((unsigned)wr->opcode > IBV_WR_SEND_WITH_INV || wr->num_sge < 0 ||
	    (wr->send_flags & ~WQE_SEND_FLAGS) || (wr->num_sge > 0 && !wr->sg_list))
		return EINVAL;
	wqe_send_begin(slot, wr->wr_id, wr->opcode, wr->send_flags);
	wqe_send_imm(slot, wr->imm_data);
	switch (wr->opcode) {
	case IBV_WR_BIND_MW:
		return wqe_send_bind(slot, wr->bind_mw.mw, wr->bind_mw.rkey, &wr->bind_mw.bind_info);
	case IBV_WR_LOCAL_INV:
		wqe_send_invalidate(slot, wr->invalidate_rkey);
		return 0;
	case IBV_WR_SEND_WITH_INV:
		wqe_send_invalidate(slot, wr->invalidate_rkey);
		break;
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
	case IBV_WR_RDMA_READ:
		wqe_send_remote(slot, wr->wr.rdma.remote_addr, wr->wr.rdma.rkey);
		break;
	case IBV_WR_ATOMIC_CMP_AND_SWP:
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		wqe_send_remote(slot, wr->wr.atomic.remote_addr, wr->wr.atomic.rkey);
		wqe_send_atomic(slot, wr->wr.atomic.compare_add, wr->wr.atomic.swap);
		break;
	default:
		break;
	}
	if (wr->send_flags & IBV_SEND_INLINE) {
		if (!wqe_send_takes_inline(wr->opcode))
			return EINVAL;
		wqe_send_inline(slot);
		for (int i = 0; i < wr->num_sge; i++)
			if (wqe_send_inline_add(slot, (const void *)(uintptr_t)wr->sg_list[i].addr, wr->sg_list[i].length,
						caps->max_inline_data))
				return EINVAL;
		return 0;
	}
	if ((uint32_t)wr->num_sge > caps->max_send_sge)
		return EINVAL;
	wqe_send_sges(slot, (size_t)wr->num_sge, wr->sg_list);
	return 0;
}

/* wqe_send_ud writes a UD send WQE's destination (wire-local.md §4.15):
 * the address handle in the rkey, the remote QPN and Q_Key in the remote
 * address. */
static inline void wqe_send_ud(void *slot, uint32_t ah, uint32_t qpn, uint32_t qkey)
{
	wqe_send(slot)->rkey = ah;
	wqe_send(slot)->remote_addr = (uint64_t)(qpn & 0xffffff) | (uint64_t)qkey << 32;
}

/* wqe_recv_from_wr writes wr (ibv_post_recv's, its SGE count checked by
 * the caller) into slot. */
static inline void wqe_recv_from_wr(void *slot, const struct ibv_recv_wr *wr)
{
	struct vrdma_recv_wqe *w = (struct vrdma_recv_wqe *)slot;
	struct vrdma_sge *s = (struct vrdma_sge *)((char *)slot + VRDMA_RECV_HDR);

	memset(w, 0, sizeof(*w));
	w->wr_id = wr->wr_id;
	w->num_sge = (uint8_t)wr->num_sge;
	for (int i = 0; i < wr->num_sge; i++) {
		s[i].addr = wr->sg_list[i].addr;
		s[i].length = wr->sg_list[i].length;
		s[i].lkey = wr->sg_list[i].lkey;
	}
}

/* cqe_to_wc reads the completion in slot into w (§5.3). */
static inline void cqe_to_wc(const void *slot, struct ibv_wc *w)
{
	const struct vrdma_cqe *e = (const struct vrdma_cqe *)slot;

	memset(w, 0, sizeof(*w));
	w->wr_id = e->wr_id;
	w->qp_num = e->qp_num;
	w->opcode = (enum ibv_wc_opcode)e->opcode;
	w->status = (enum ibv_wc_status)e->status;
	if (e->flags & VRDMA_CQE_WITH_IMM)
		w->wc_flags |= IBV_WC_WITH_IMM;
	if (e->flags & VRDMA_CQE_GRH)
		w->wc_flags |= IBV_WC_GRH;
	w->byte_len = e->byte_len;
	w->imm_data = htobe32(e->imm_data);
	if (e->flags & VRDMA_CQE_WITH_INV) {
		w->wc_flags |= IBV_WC_WITH_INV;
		w->invalidated_rkey = e->imm_data; /* a number, where imm_data is network order */
	}
	w->src_qp = e->src_qp;
	w->sl = e->sl; /* a UD receive: the packet type, as mlx5 (wire-local.md §5.3) */
	w->vendor_err = e->vendor_err;
}

#endif
