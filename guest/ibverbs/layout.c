// SPDX-License-Identifier: Apache-2.0
/*
 * The ring layouts of create-cq and create-qp replies (docs/wire-local.md
 * §4.7, §4.8), read and checked before the library maps a ring: no slot
 * may lie outside the mapping (CQLayout.Check, QPLayout.Check in
 * internal/abi).
 */
#include "vrdma.h"

static int is_pow2(uint64_t x)
{
	return x && !(x & (x - 1));
}

int vrdma_get_caps(const struct json_doc *d, int tok, struct ibv_qp_cap *c)
{
	return json_get_u32(d, tok, "max_send_wr", &c->max_send_wr) ||
	       json_get_u32(d, tok, "max_recv_wr", &c->max_recv_wr) ||
	       json_get_u32(d, tok, "max_send_sge", &c->max_send_sge) ||
	       json_get_u32(d, tok, "max_recv_sge", &c->max_recv_sge) ||
	       json_get_u32(d, tok, "max_inline_data", &c->max_inline_data);
}

int vrdma_cq_layout(const struct json_doc *d, int root, struct vrdma_cq_layout *l)
{
	int lay = json_get(d, root, "layout");

	if (json_get_u32(d, lay, "entries", &l->entries) || json_get_u32(d, lay, "offset", &l->offset) ||
	    json_get_u32(d, lay, "size", &l->size))
		return -1;
	if (!is_pow2(l->entries) || l->entries > VRDMA_MAX_CQE || l->offset < VRDMA_RING_HEADER_SIZE ||
	    (uint64_t)l->offset + (uint64_t)l->entries * VRDMA_CQE_SIZE > l->size)
		return -1;
	return 0;
}

int vrdma_qp_layout(const struct json_doc *d, int root, struct vrdma_qp_layout *l, struct ibv_qp_cap *caps)
{
	int lay = json_get(d, root, "layout");

	if (vrdma_get_caps(d, json_get(d, root, "caps"), caps) || json_get_u32(d, lay, "sq_entries", &l->sq_entries) ||
	    json_get_u32(d, lay, "sq_stride", &l->sq_stride) || json_get_u32(d, lay, "rq_entries", &l->rq_entries) ||
	    json_get_u32(d, lay, "rq_stride", &l->rq_stride) || json_get_u32(d, lay, "sq_offset", &l->sq_offset) ||
	    json_get_u32(d, lay, "rq_offset", &l->rq_offset) || json_get_u32(d, lay, "size", &l->size))
		return -1;
	if (!is_pow2(l->sq_entries) || l->sq_entries > VRDMA_MAX_QP_WR || !is_pow2(l->rq_entries) ||
	    l->rq_entries > VRDMA_MAX_QP_WR || l->sq_stride < VRDMA_SEND_HDR + VRDMA_SGE_SIZE ||
	    l->sq_stride > VRDMA_MAX_STRIDE || l->rq_stride < VRDMA_RECV_HDR + VRDMA_SGE_SIZE ||
	    l->rq_stride > VRDMA_MAX_STRIDE || l->sq_offset < VRDMA_RING_HEADER_SIZE ||
	    (uint64_t)l->rq_offset < (uint64_t)l->sq_offset + (uint64_t)l->sq_entries * l->sq_stride ||
	    (uint64_t)l->rq_offset + (uint64_t)l->rq_entries * l->rq_stride > l->size ||
	    caps->max_send_sge > (l->sq_stride - VRDMA_SEND_HDR) / VRDMA_SGE_SIZE ||
	    caps->max_recv_sge > (l->rq_stride - VRDMA_RECV_HDR) / VRDMA_SGE_SIZE ||
	    caps->max_inline_data > l->sq_stride - VRDMA_SEND_HDR)
		return -1;
	return 0;
}

int vrdma_srq_layout(const struct json_doc *d, int root, struct vrdma_srq_layout *l, struct ibv_srq_attr *attr)
{
	int lay = json_get(d, root, "layout"), a = json_get(d, root, "attr");

	if (json_get_u32(d, lay, "entries", &l->entries) || json_get_u32(d, lay, "stride", &l->stride) ||
	    json_get_u32(d, lay, "offset", &l->offset) || json_get_u32(d, lay, "size", &l->size) ||
	    json_get_u32(d, a, "max_wr", &attr->max_wr) || json_get_u32(d, a, "max_sge", &attr->max_sge) ||
	    json_get_u32(d, a, "srq_limit", &attr->srq_limit))
		return -1;
	if (!is_pow2(l->entries) || l->entries > VRDMA_MAX_SRQ_WR || l->stride < VRDMA_RECV_HDR + VRDMA_SGE_SIZE ||
	    l->stride > VRDMA_MAX_STRIDE || l->offset < VRDMA_RING_HEADER_SIZE ||
	    (uint64_t)l->offset + (uint64_t)l->entries * l->stride > l->size ||
	    attr->max_sge > (l->stride - VRDMA_RECV_HDR) / VRDMA_SGE_SIZE || attr->max_sge > VRDMA_MAX_SRQ_SGE)
		return -1;
	return 0;
}
