// SPDX-License-Identifier: Apache-2.0
/*
 * xrc_check: the XRC verbs of the drop-in and their errors, in one
 * process: IBV_DEVICE_XRC; ibv_open_xrcd with a file (O_CREAT, then the
 * same file found again, O_EXCL refused) and without one (fd -1), its
 * comp_mask and oflags checked (EINVAL); an XRC SRQ (its domain and CQ
 * needed: EINVAL), ibv_get_srq_num (an XRC SRQ's number; EINVAL for a
 * basic SRQ); an XRC target QP (no PD, no send queue: ibv_post_send and
 * ibv_post_recv EINVAL; its domain needed: EINVAL), an XRC initiator QP
 * made through ibv_create_qp_ex's inline (ibv_post_recv EINVAL), both
 * taken to RTS facing each other, a SEND routed to the SRQ it names and
 * completed in the SRQ's CQ with the target QP's number; ibv_close_xrcd
 * EBUSY while an SRQ or a QP uses it.
 * Prints "ok NAME" or "FAIL NAME: why" (check.h); driven by
 * internal/verbsabi (TestMiddlewareXRCVerbs).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "check.h"
#include "device.h"
#include "poll.h"
#include "qp.h"

#define ACC (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

int main(int argc, char **argv)
{
	struct ibv_context *ctx;
	struct ibv_device_attr dattr;
	struct ibv_xrcd_init_attr xa;
	struct ibv_xrcd *x, *x2, *xp;
	struct ibv_pd *pd;
	struct ibv_cq *scq, *rcq;
	struct ibv_srq *srq, *basic;
	struct ibv_srq_init_attr_ex sx;
	struct ibv_srq_init_attr bs = { .attr = { .max_wr = 4, .max_sge = 1 } };
	struct ibv_qp_init_attr_ex qx;
	struct ibv_qp *tgt, *ini;
	struct ibv_mr *m;
	union ibv_gid gid;
	struct ibv_wc wc;
	uint32_t srqn = 0, num;
	char *buf;
	int fd, ok;

	if (argc != 2) {
		printf("FAIL setup: usage: xrc_check FILE\n");
		return 1;
	}
	ctx = open_first_device();
	if (!ctx)
		return 1;
	pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	scq = pd ? ibv_create_cq(ctx, 16, NULL, NULL, 0) : NULL;
	rcq = scq ? ibv_create_cq(ctx, 16, NULL, NULL, 0) : NULL;
	buf = calloc(1, 4096);
	m = rcq ? ibv_reg_mr(pd, buf, 4096, ACC) : NULL;
	fd = open(argv[1], O_RDONLY | O_CREAT, 0600);
	CHECK("setup", m && fd >= 0 && ibv_query_gid(ctx, 1, 0, &gid) == 0, "errno %d", errno);
	if (!m || fd < 0)
		return 1;
	CHECK("device-xrc", ibv_query_device(ctx, &dattr) == 0 && (dattr.device_cap_flags & IBV_DEVICE_XRC), "flags 0x%x",
	      dattr.device_cap_flags);

	memset(&xa, 0, sizeof(xa));
	xa.fd = fd;
	xa.oflags = O_CREAT;
	xa.comp_mask = IBV_XRCD_INIT_ATTR_FD;
	errno = 0;
	CHECK("open-xrcd-no-oflags", !ibv_open_xrcd(ctx, &xa) && errno == EINVAL, "errno %d", errno);
	xa.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
	xa.oflags = O_APPEND;
	errno = 0;
	CHECK("open-xrcd-bad-oflags", !ibv_open_xrcd(ctx, &xa) && errno == EINVAL, "errno %d", errno);
	xa.oflags = 0;
	errno = 0;
	CHECK("open-xrcd-none-yet", !ibv_open_xrcd(ctx, &xa) && errno == EINVAL, "errno %d", errno);
	xa.oflags = O_CREAT;
	x = ibv_open_xrcd(ctx, &xa);
	CHECK("open-xrcd-create", x && x->context == ctx, "errno %d", errno);
	xa.oflags = 0;
	x2 = ibv_open_xrcd(ctx, &xa);
	CHECK("open-xrcd-again", x2 != NULL, "errno %d", errno);
	xa.oflags = O_CREAT | O_EXCL;
	errno = 0;
	CHECK("open-xrcd-excl", !ibv_open_xrcd(ctx, &xa) && errno == EINVAL, "errno %d", errno);
	xa.fd = -1;
	xa.oflags = 0;
	xp = ibv_open_xrcd(ctx, &xa);
	CHECK("open-xrcd-private", xp != NULL, "errno %d", errno);
	if (!x || !x2 || !xp)
		return 1;

	memset(&sx, 0, sizeof(sx));
	sx.attr.max_wr = 8;
	sx.attr.max_sge = 1;
	sx.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD;
	sx.srq_type = IBV_SRQT_XRC;
	sx.pd = pd;
	sx.xrcd = x;
	errno = 0;
	CHECK("create-xrc-srq-no-cq", !ibv_create_srq_ex(ctx, &sx) && errno == EINVAL, "errno %d", errno);
	sx.comp_mask |= IBV_SRQ_INIT_ATTR_CQ;
	sx.cq = rcq;
	srq = ibv_create_srq_ex(ctx, &sx);
	CHECK("create-xrc-srq", srq && ibv_get_srq_num(srq, &srqn) == 0 && srqn != 0 && srqn <= 0xffffff, "errno %d srqn 0x%x",
	      errno, srqn);
	basic = ibv_create_srq(pd, &bs);
	CHECK("srq-num-basic", basic && ibv_get_srq_num(basic, &num) == EINVAL, " ");
	if (!srq || !basic)
		return 1;

	memset(&qx, 0, sizeof(qx));
	qx.qp_type = IBV_QPT_XRC_RECV;
	errno = 0;
	CHECK("create-tgt-no-xrcd", !ibv_create_qp_ex(ctx, &qx) && errno == EINVAL, "errno %d", errno);
	qx.comp_mask = IBV_QP_INIT_ATTR_XRCD;
	qx.xrcd = x2; /* the same domain, through the other handle */
	tgt = ibv_create_qp_ex(ctx, &qx);
	CHECK("create-tgt", tgt && tgt->qp_type == IBV_QPT_XRC_RECV && !tgt->pd && !tgt->send_cq, "errno %d", errno);
	memset(&qx, 0, sizeof(qx));
	qx.qp_type = IBV_QPT_XRC_SEND;
	qx.comp_mask = IBV_QP_INIT_ATTR_PD; /* the inline's ibv_create_qp path, as ibv_xsrq_pingpong */
	qx.pd = pd;
	qx.send_cq = scq;
	qx.cap.max_send_wr = 8;
	qx.cap.max_send_sge = 1;
	ini = ibv_create_qp_ex(ctx, &qx);
	CHECK("create-ini", ini && ini->qp_type == IBV_QPT_XRC_SEND, "errno %d", errno);
	if (!tgt || !ini)
		return 1;
	{
		struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 16, .lkey = m->lkey };
		struct ibv_recv_wr rwr = { .wr_id = 7, .sg_list = &sge, .num_sge = 1 }, *rbad;
		struct ibv_send_wr swr = { .wr_id = 8, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND }, *sbad;

		CHECK("tgt-post-send", ibv_post_send(tgt, &swr, &sbad) == EINVAL && sbad == &swr, " ");
		CHECK("tgt-post-recv", ibv_post_recv(tgt, &rwr, &rbad) == EINVAL && rbad == &rwr, " ");
		CHECK("ini-post-recv", ibv_post_recv(ini, &rwr, &rbad) == EINVAL && rbad == &rwr, " ");
	}
	ok = connect_rc(ini, tgt->qp_num, &gid, 0, 0, 0) == 0 && connect_rc(tgt, ini->qp_num, &gid, ACC, 0, 0) == 0;
	CHECK("connect", ok, "errno %d", errno);
	if (!ok)
		return 1;
	{
		struct ibv_sge rs = { .addr = (uintptr_t)buf + 1024, .length = 64, .lkey = m->lkey };
		struct ibv_sge ss = { .addr = (uintptr_t)buf, .length = 24, .lkey = m->lkey };
		struct ibv_recv_wr rwr = { .wr_id = 5, .sg_list = &rs, .num_sge = 1 }, *rbad;
		struct ibv_send_wr swr = { .wr_id = 6, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND,
					   .send_flags = IBV_SEND_SIGNALED },
				   *sbad;

		memcpy(buf, "a message for the XRC SRQ", 24);
		swr.qp_type.xrc.remote_srqn = srqn;
		ok = ibv_post_srq_recv(srq, &rwr, &rbad) == 0 && ibv_post_send(ini, &swr, &sbad) == 0;
		CHECK("post", ok, "errno %d", errno);
		ok = ok && poll_one(scq, &wc) && wc.status == IBV_WC_SUCCESS && wc.wr_id == 6;
		CHECK("send-completes", ok, "status %d wr_id %llu", wc.status, (unsigned long long)wc.wr_id);
		ok = poll_one(rcq, &wc) && wc.status == IBV_WC_SUCCESS && wc.wr_id == 5 && wc.qp_num == tgt->qp_num &&
		     wc.opcode == IBV_WC_RECV && wc.byte_len == 24 && !memcmp(buf + 1024, buf, 24);
		CHECK("recv-in-srq-cq", ok, "status %d wr_id %llu qp_num 0x%x (tgt 0x%x) byte_len %u", wc.status,
		      (unsigned long long)wc.wr_id, wc.qp_num, tgt->qp_num, wc.byte_len);
	}
	CHECK("close-xrcd-busy", ibv_close_xrcd(x) == EBUSY && ibv_close_xrcd(x2) == EBUSY, " ");
	CHECK("destroy", ibv_destroy_qp(ini) == 0 && ibv_destroy_qp(tgt) == 0 && ibv_destroy_srq(srq) == 0 &&
				 ibv_destroy_srq(basic) == 0,
	      "errno %d", errno);
	CHECK("close-xrcd", ibv_close_xrcd(x) == 0 && ibv_close_xrcd(x2) == 0 && ibv_close_xrcd(xp) == 0, " ");
	xa.fd = fd;
	xa.oflags = 0;
	errno = 0;
	CHECK("closed-domain-gone", !ibv_open_xrcd(ctx, &xa) && errno == EINVAL, "errno %d", errno);
	close(fd);
	ibv_dereg_mr(m);
	ibv_destroy_cq(rcq);
	ibv_destroy_cq(scq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	return failed;
}
