// SPDX-License-Identifier: Apache-2.0
/*
 * Address handles and UD work requests (wire-local.md §4.15): ibv_create_ah
 * (a GRH required, as on RoCE), ibv_destroy_ah, ibv_init_ah_from_wc,
 * ibv_create_ah_from_wc, and the destination of a UD QP's SEND, which
 * post_send (verbs.c) writes through vrdma_ud_dest.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vrdma.h"
#include "wqe.h"

#define MAGIC_AH 0x76616831u

struct vrdma_ah {
	struct ibv_ah ibah;
	uint32_t magic;
};

static struct vrdma_ah *to_ah(struct ibv_ah *a)
{
	return vrdma_obj_has(a) && ((struct vrdma_ah *)a)->magic == MAGIC_AH ? (struct vrdma_ah *)a : NULL;
}

struct ibv_ah *ibv_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr)
{
	struct vrdma_vm *vm = vrdma_pd_ok(pd) ? vrdma_vm_get() : NULL;
	struct vrdma_reply r;
	struct vrdma_ah *ah;
	char body[256], gid[64];
	uint32_t h;
	int e;

	if (!vm || !attr) {
		errno = EINVAL;
		return NULL;
	}
	if (!(vm->s.caps & VRDMA_CAP_UD)) {
		errno = EOPNOTSUPP; /* an agent without UD */
		return NULL;
	}
	if (!attr->is_global) {
		/* RoCE has no LIDs: the address is the GRH's GID. */
		vrdma_warn("ibv_create_ah: an address without a GRH (is_global 0, LID 0x%x): vrdma adapters are RoCE "
			   "and need the destination's GID (ibv_ud_pingpong -g 0)",
			   attr->dlid);
		errno = EINVAL;
		return NULL;
	}
	if (attr->port_num > 1 || attr->grh.sgid_index != 0) {
		errno = EINVAL;
		return NULL;
	}
	vrdma_format_gid(&attr->grh.dgid, gid, sizeof(gid));
	/* The flow label is the GRH's 20 bits; the kernel passes the rest
	 * through and devices drop it: UCX sets all 32 (0xffffffff). */
	snprintf(body, sizeof(body),
		 "{\"pd\":%u,\"dgid\":\"%s\",\"sgid_index\":%u,\"hop_limit\":%u,\"traffic_class\":%u,\"flow_label\":%u,"
		 "\"port_num\":%u}",
		 pd->handle, gid, attr->grh.sgid_index, attr->grh.hop_limit, attr->grh.traffic_class,
		 attr->grh.flow_label & 0xfffff, attr->port_num);
	e = vrdma_cmd(vm, VRDMA_OP_CREATE_AH, body, &r);
	if (e) {
		errno = e;
		return NULL;
	}
	if (json_get_u32(&r.doc, 0, "handle", &h)) {
		vrdma_reply_free(&r);
		errno = EIO;
		return NULL;
	}
	vrdma_reply_free(&r);
	ah = calloc(1, sizeof(*ah));
	if (!ah || vrdma_obj_add(ah)) {
		char destroy[48];

		free(ah);
		snprintf(destroy, sizeof(destroy), "{\"handle\":%u}", h);
		if (!vrdma_cmd(vm, VRDMA_OP_DESTROY_AH, destroy, &r))
			vrdma_reply_free(&r);
		errno = ENOMEM;
		return NULL;
	}
	ah->magic = MAGIC_AH;
	ah->ibah.context = pd->context;
	ah->ibah.pd = pd;
	ah->ibah.handle = h;
	return &ah->ibah;
}

int ibv_destroy_ah(struct ibv_ah *ibah)
{
	struct vrdma_ah *ah = to_ah(ibah);
	struct vrdma_reply r;
	char body[48];
	int e;

	if (!ah)
		return EINVAL;
	snprintf(body, sizeof(body), "{\"handle\":%u}", ah->ibah.handle);
	e = vrdma_cmd(vrdma_vm_get(), VRDMA_OP_DESTROY_AH, body, &r);
	if (e && e != EIO)
		return e;
	if (!e)
		vrdma_reply_free(&r);
	vrdma_obj_take(ah);
	ah->magic = 0;
	free(ah);
	return 0;
}

/* ipv4_sum is the checksum of the 20-byte IPv4 header h, its checksum
 * field taken as zero. */
static uint16_t ipv4_sum(const uint8_t *h)
{
	uint32_t s = 0;

	for (int i = 0; i < 20; i += 2)
		if (i != 10)
			s += (uint32_t)h[i] << 8 | h[i + 1];
	while (s > 0xffff)
		s = (s & 0xffff) + (s >> 16);
	return (uint16_t)~s;
}

static void mapped_gid(union ibv_gid *g, const uint8_t *ip4)
{
	memset(g, 0, sizeof(*g));
	g->raw[10] = g->raw[11] = 0xff;
	memcpy(g->raw + 12, ip4, 4);
}

int ibv_init_ah_from_wc(struct ibv_context *context, uint8_t port_num, struct ibv_wc *wc, struct ibv_grh *grh,
			struct ibv_ah_attr *ah_attr)
{
	const uint8_t *b = (const uint8_t *)grh, *h4;
	union ibv_gid own, dst;

	if (!vrdma_ctx_ok(context) || !wc || !ah_attr || port_num != 1) {
		errno = EINVAL;
		return -1;
	}
	memset(ah_attr, 0, sizeof(*ah_attr));
	ah_attr->dlid = wc->slid;
	ah_attr->sl = wc->sl;
	ah_attr->src_path_bits = wc->dlid_path_bits;
	ah_attr->port_num = port_num;
	if (!(wc->wc_flags & IBV_WC_GRH))
		return 0; /* as rdma-core: no GRH, no global address (which create_ah then refuses) */
	if (!grh) {
		errno = EINVAL;
		return -1;
	}
	/* The GRH as a RoCE v2 device writes it: an IPv4 header in its last
	 * 20 bytes (checksum valid), else an IPv6 header. The reply goes
	 * back to the source: its address is the destination's. */
	h4 = b + 20;
	if (h4[0] == 0x45 && ipv4_sum(h4) == (uint16_t)(h4[10] << 8 | h4[11])) {
		mapped_gid(&ah_attr->grh.dgid, h4 + 12);
		mapped_gid(&dst, h4 + 16);
		ah_attr->grh.traffic_class = h4[1];
	} else if ((b[0] >> 4) == 6) {
		uint32_t vtf = ntohl(grh->version_tclass_flow);

		ah_attr->grh.dgid = grh->sgid;
		dst = grh->dgid;
		ah_attr->grh.traffic_class = (uint8_t)(vtf >> 20);
		ah_attr->grh.flow_label = vtf & 0xfffff;
	} else {
		errno = EINVAL; /* neither IPv4 nor IPv6: not a GRH this device wrote */
		return -1;
	}
	/* The datagram's destination must be this port's GID (index 0), or
	 * a multicast group's (ff00::/8, ::ffff:224.0.0.0/4): the reply goes
	 * from the port's GID either way. */
	if (ibv_query_gid(context, port_num, 0, &own) ||
	    (memcmp(&own, &dst, sizeof(own)) && dst.raw[0] != 0xff && !(dst.raw[10] == 0xff && (dst.raw[12] & 0xf0) == 0xe0))) {
		errno = EINVAL; /* as rdma-core when no GID index has the datagram's destination */
		return -1;
	}
	ah_attr->is_global = 1;
	ah_attr->grh.sgid_index = 0;
	ah_attr->grh.hop_limit = 0xff;
	return 0;
}

struct ibv_ah *ibv_create_ah_from_wc(struct ibv_pd *pd, struct ibv_wc *wc, struct ibv_grh *grh, uint8_t port_num)
{
	struct ibv_ah_attr a;

	if (!vrdma_pd_ok(pd)) {
		errno = EINVAL;
		return NULL;
	}
	if (ibv_init_ah_from_wc(pd->context, port_num, wc, grh, &a))
		return NULL;
	return ibv_create_ah(pd, &a);
}

int vrdma_ud_set_dest(void *slot, struct ibv_ah *ibah, uint32_t remote_qpn, uint32_t remote_qkey)
{
	struct vrdma_ah *ah = (struct vrdma_ah *)ibah;

	if (!ah || ah->magic != MAGIC_AH)
		return EINVAL;
	wqe_send_ud(slot, ah->ibah.handle, remote_qpn, remote_qkey);
	return 0;
}

int vrdma_ud_dest(void *slot, const struct ibv_send_wr *wr)
{
	if (wr->opcode != IBV_WR_SEND && wr->opcode != IBV_WR_SEND_WITH_IMM)
		return EINVAL; /* UD carries SENDs only */
	return vrdma_ud_set_dest(slot, wr->wr.ud.ah, wr->wr.ud.remote_qpn, wr->wr.ud.remote_qkey);
}
