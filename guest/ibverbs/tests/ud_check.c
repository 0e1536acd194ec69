// SPDX-License-Identifier: Apache-2.0
/*
 * ud_check: UD QPs and address handles on the drop-in, in one process:
 * two UD QPs of one adapter (ua, ub). Checks: ibv_create_ah's refusals
 * (no GRH, GID index 1, a PD not ours) and ibv_destroy_ah of what is no
 * AH; the UD attributes through ibv_modify_qp/ibv_query_qp (qp_type, Q_Key);
 * ibv_post_send's UD refusals (RDMA WRITE, no AH) with bad_wr; a SEND and
 * a SEND with immediate from ua to ub with the GRH in front of the
 * payload (IBV_WC_GRH, src_qp, slid 0, byte_len, the GRH's IPv4 header
 * naming the adapter's address); ibv_init_ah_from_wc from that
 * completion (the source as destination, GID index 0) and the reply
 * through ibv_create_ah_from_wc; the same through ibv_wr_set_ud_addr
 * (a QP made with send ops); a message beyond the active MTU failing
 * LOC_LEN_ERR; ibv_query_device's max_ah.
 * Prints "ok NAME" or "FAIL NAME: why" (check.h); driven by
 * internal/verbsabi (TestMiddlewareUDVerbs).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

#include "check.h"
#include "device.h"
#include "poll.h"

#define QKEY 0x11111111u
#define SLOT (40 + 4096)

/* poll_pair waits for a send's and a receive's completions, in whichever
 * order they come (on one host the receive completes first); 0 if not. */
static int poll_pair(struct ibv_cq *cq, struct ibv_wc *snd, struct ibv_wc *rcv)
{
	struct ibv_wc w[2];

	if (!poll_one(cq, &w[0]) || !poll_one(cq, &w[1]))
		return 0;
	if (w[0].opcode & IBV_WC_RECV) {
		*rcv = w[0];
		*snd = w[1];
	} else {
		*snd = w[0];
		*rcv = w[1];
	}
	return 1;
}

/* ud_qp makes a UD QP in RTS (ex: with send ops, for ibv_wr_*). */
static struct ibv_qp *ud_qp(struct ibv_context *ctx, struct ibv_pd *pd, struct ibv_cq *cq, int ex)
{
	struct ibv_qp_attr a;
	struct ibv_qp *qp;

	if (ex) {
		struct ibv_qp_init_attr_ex x = { .qp_type = IBV_QPT_UD, .send_cq = cq, .recv_cq = cq, .pd = pd,
						 .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
						 .send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM,
						 .cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 } };

		qp = ibv_create_qp_ex(ctx, &x);
	} else {
		struct ibv_qp_init_attr init = { .qp_type = IBV_QPT_UD, .send_cq = cq, .recv_cq = cq,
						 .cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 } };

		qp = ibv_create_qp(pd, &init);
	}
	if (!qp)
		return NULL;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qkey = QKEY;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
		return NULL;
	a.qp_state = IBV_QPS_RTR;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE))
		return NULL;
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 7;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN))
		return NULL;
	return qp;
}

static int post_recv(struct ibv_qp *qp, struct ibv_mr *m, char *buf, uint64_t id)
{
	struct ibv_sge sge = { .addr = (uintptr_t)(buf + id * SLOT), .length = SLOT, .lkey = m->lkey };
	struct ibv_recv_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1 }, *bad;

	return ibv_post_recv(qp, &wr, &bad);
}

static int send_ud(struct ibv_qp *qp, struct ibv_ah *ah, uint32_t qpn, struct ibv_mr *m, char *src, uint32_t len, int opcode,
		   uint32_t imm, struct ibv_send_wr **bad)
{
	struct ibv_sge sge = { .addr = (uintptr_t)src, .length = len, .lkey = m->lkey };
	struct ibv_send_wr wr = { .wr_id = 100 + len, .sg_list = &sge, .num_sge = 1, .opcode = opcode,
				  .send_flags = IBV_SEND_SIGNALED, .imm_data = htonl(imm) };

	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = qpn;
	wr.wr.ud.remote_qkey = QKEY;
	return ibv_post_send(qp, &wr, bad);
}

int main(void)
{
	struct ibv_context *ctx;
	struct ibv_device_attr dattr;
	struct ibv_port_attr pattr;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *ua, *ub, *ux;
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	struct ibv_ah_attr aa, from;
	struct ibv_ah *ah, *back;
	struct ibv_send_wr *bad;
	struct ibv_mr *m;
	struct ibv_wc wc, sw;
	union ibv_gid gid;
	char *buf, *src;
	const uint8_t *g;
	int n, ok;

	ctx = open_first_device();
	if (!ctx)
		return 1;
	pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	cq = pd ? ibv_create_cq(ctx, 64, NULL, NULL, 0) : NULL;
	buf = aligned_alloc(4096, 16 * SLOT);
	m = cq && buf ? ibv_reg_mr(pd, buf, 16 * SLOT, IBV_ACCESS_LOCAL_WRITE) : NULL;
	CHECK("setup", m && ibv_query_gid(ctx, 1, 0, &gid) == 0 && ibv_query_port(ctx, 1, &pattr) == 0, "errno %d", errno);
	if (!m)
		return 1;
	src = buf + 15 * SLOT;
	CHECK("max-ah", ibv_query_device(ctx, &dattr) == 0 && dattr.max_ah == 65536, "max_ah %d", dattr.max_ah);

	memset(&aa, 0, sizeof(aa));
	aa.port_num = 1;
	errno = 0;
	CHECK("create-ah-no-grh", !ibv_create_ah(pd, &aa) && errno == EINVAL, "errno %d", errno);
	aa.is_global = 1;
	aa.grh.dgid = gid;
	aa.grh.hop_limit = 1;
	aa.grh.sgid_index = 1;
	errno = 0;
	CHECK("create-ah-gid-index", !ibv_create_ah(pd, &aa) && errno == EINVAL, "errno %d", errno);
	aa.grh.sgid_index = 0;
	errno = 0;
	CHECK("create-ah-bad-pd", !ibv_create_ah((struct ibv_pd *)cq, &aa) && errno == EINVAL, "errno %d", errno);
	ah = ibv_create_ah(pd, &aa);
	CHECK("create-ah", ah && ah->pd == pd && ah->context == ctx, "errno %d", errno);
	CHECK("destroy-ah-not-ah", ibv_destroy_ah((struct ibv_ah *)pd) == EINVAL, "%s", "refused nothing");
	if (!ah)
		return 1;

	ua = ud_qp(ctx, pd, cq, 0);
	ub = ud_qp(ctx, pd, cq, 0);
	CHECK("ud-qps", ua && ub, "errno %d", errno);
	if (!ua || !ub)
		return 1;
	memset(&qa, 0, sizeof(qa));
	CHECK("query-ud", ibv_query_qp(ub, &qa, IBV_QP_QKEY | IBV_QP_STATE, &qi) == 0 && qi.qp_type == IBV_QPT_UD &&
				  qa.qkey == QKEY && qa.qp_state == IBV_QPS_RTS,
	      "type %d qkey 0x%x state %d", qi.qp_type, qa.qkey, qa.qp_state);

	for (int i = 0; i < 4; i++)
		post_recv(ub, m, buf, (uint64_t)i);
	bad = NULL;
	CHECK("post-ud-write", send_ud(ua, ah, ub->qp_num, m, src, 8, IBV_WR_RDMA_WRITE, 0, &bad) == EINVAL && bad, "%s", "refused nothing");
	bad = NULL;
	CHECK("post-ud-no-ah", send_ud(ua, NULL, ub->qp_num, m, src, 8, IBV_WR_SEND, 0, &bad) == EINVAL && bad, "%s", "refused nothing");

	/* A SEND, then a SEND with immediate, from ua to ub. */
	for (int k = 0; k < 2; k++) {
		uint32_t len = k ? 1 : 777;

		for (uint32_t i = 0; i < len; i++)
			src[i] = (char)(i * 7 + k);
		n = send_ud(ua, ah, ub->qp_num, m, src, len, k ? IBV_WR_SEND_WITH_IMM : IBV_WR_SEND, 0xabcd0000u + (uint32_t)k,
			    &bad);
		ok = n == 0 && poll_pair(cq, &sw, &wc) && sw.status == IBV_WC_SUCCESS && sw.opcode == IBV_WC_SEND &&
		     sw.qp_num == ua->qp_num;
		CHECK(k ? "send-imm-completes" : "send-completes", ok, "post %d status %d opcode %d", n, sw.status, sw.opcode);
		ok = wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV && wc.qp_num == ub->qp_num &&
		     wc.src_qp == ua->qp_num && wc.slid == 0 && (wc.wc_flags & IBV_WC_GRH) && wc.byte_len == 40 + len &&
		     (!k || ((wc.wc_flags & IBV_WC_WITH_IMM) && ntohl(wc.imm_data) == 0xabcd0001u));
		CHECK(k ? "recv-imm" : "recv", ok, "status %d opcode %d qp 0x%x src 0x%x flags %d len %u", wc.status, wc.opcode,
		      wc.qp_num, wc.src_qp, wc.wc_flags, wc.byte_len);
		ok = 1;
		for (uint32_t i = 0; i < len; i++)
			ok &= buf[wc.wr_id * SLOT + 40 + i] == (char)(i * 7 + k);
		CHECK(k ? "recv-imm-bytes" : "recv-bytes", ok, "payload differs");
	}
	/* The GRH (RoCE v2, IPv4-mapped GIDs): an IPv4 header in bytes 20..39. */
	g = (const uint8_t *)buf + wc.wr_id * SLOT;
	if (gid.raw[10] == 0xff && gid.raw[11] == 0xff)
		CHECK("grh-ipv4", g[20] == 0x45 && g[29] == 17 && !memcmp(g + 32, gid.raw + 12, 4) && !memcmp(g + 36, gid.raw + 12, 4),
		      "header %02x proto %d", g[20], g[29]);
	else
		CHECK("grh-ipv6", (g[0] >> 4) == 6 && !memcmp(g + 8, gid.raw, 16) && !memcmp(g + 24, gid.raw, 16), "version %d",
		      g[0] >> 4);

	CHECK("init-ah-from-wc",
	      ibv_init_ah_from_wc(ctx, 1, &wc, (struct ibv_grh *)g, &from) == 0 && from.is_global &&
		      !memcmp(&from.grh.dgid, &gid, sizeof(gid)) && from.grh.sgid_index == 0 && from.port_num == 1,
	      "errno %d", errno);
	wc.wc_flags &= ~(unsigned int)IBV_WC_GRH;
	CHECK("init-ah-from-wc-no-grh", ibv_init_ah_from_wc(ctx, 1, &wc, (struct ibv_grh *)g, &from) == 0 && !from.is_global, "%s", "refused nothing");
	wc.wc_flags |= IBV_WC_GRH;
	back = ibv_create_ah_from_wc(pd, &wc, (struct ibv_grh *)g, 1);
	CHECK("create-ah-from-wc", back != NULL, "errno %d", errno);
	post_recv(ua, m, buf, 8);
	n = back ? send_ud(ub, back, wc.src_qp, m, src, 16, IBV_WR_SEND, 0, &bad) : -1;
	ok = n == 0 && poll_pair(cq, &sw, &wc) && sw.status == IBV_WC_SUCCESS && sw.qp_num == ub->qp_num &&
	     wc.status == IBV_WC_SUCCESS && wc.qp_num == ua->qp_num && wc.src_qp == ub->qp_num && wc.byte_len == 56;
	CHECK("reply", ok, "post %d status %d qp 0x%x", n, wc.status, wc.qp_num);

	/* ibv_wr_* on a UD QP made with send ops. */
	ux = ud_qp(ctx, pd, cq, 1);
	CHECK("ud-qp-ex", ux && ibv_qp_to_qp_ex(ux), "errno %d", errno);
	if (ux) {
		struct ibv_qp_ex *x = ibv_qp_to_qp_ex(ux);

		post_recv(ub, m, buf, 9);
		ibv_wr_start(x);
		x->wr_id = 77;
		x->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_send_imm(x, htonl(0x5151));
		ibv_wr_set_ud_addr(x, ah, ub->qp_num, QKEY);
		ibv_wr_set_sge(x, m->lkey, (uintptr_t)src, 32);
		n = ibv_wr_complete(x);
		ok = n == 0 && poll_pair(cq, &sw, &wc) && sw.wr_id == 77 && sw.status == IBV_WC_SUCCESS &&
		     wc.qp_num == ub->qp_num && wc.src_qp == ux->qp_num && wc.byte_len == 72 && ntohl(wc.imm_data) == 0x5151;
		CHECK("wr-set-ud-addr", ok, "complete %d status %d qp 0x%x len %u", n, wc.status, wc.qp_num, wc.byte_len);
		ibv_wr_start(x);
		ibv_wr_rdma_write(x, 1, 0);
		CHECK("wr-ud-write", ibv_wr_complete(x) == EINVAL, "%s", "refused nothing");
	}

	/* Beyond the active MTU: LOC_LEN_ERR. */
	n = send_ud(ua, ah, ub->qp_num, m, buf, (128u << pattr.active_mtu) + 1, IBV_WR_SEND, 0, &bad);
	ok = n == 0 && poll_one(cq, &wc) && wc.status == IBV_WC_LOC_LEN_ERR && wc.qp_num == ua->qp_num;
	CHECK("send-beyond-mtu", ok, "post %d status %d", n, wc.status);

	CHECK("destroy-ah", ibv_destroy_ah(ah) == 0 && (!back || ibv_destroy_ah(back) == 0), "%s", "refused nothing");
	CHECK("destroy-ah-twice", ibv_destroy_ah(ah) == EINVAL, "%s", "refused nothing");
	return failed;
}
