// SPDX-License-Identifier: Apache-2.0
/*
 * coreverbs_check: ibv_req_notify_cq(cq, 1), ibv_resize_cq and
 * ibv_rereg_mr on the drop-in, in one process: two RC QPs of one VM (qa
 * sends, qb receives) connected to each other.
 * Checks: a receive CQ armed for solicited completions raises no event for
 * unsolicited SENDs and one for a SEND with IBV_SEND_SOLICITED (and for a
 * WRITE with immediate with it), a CQ armed for every completion one for
 * an unsolicited SEND; resize down and up (cqe read back), completions
 * waiting kept in order across a resize, a size below them EINVAL;
 * rereg's input errors (IBV_REREG_MR_ERR_INPUT, errno EINVAL), a new
 * translation onto a heap buffer (keys kept, a WRITE lands there, the
 * old buffer's contents kept by the program), a PD there and back, and
 * access without REMOTE_WRITE failing the next WRITE (REM_ACCESS_ERR);
 * a QP's flushed completions taken out of its CQ when it is reset;
 * IBV_EVENT_SQ_DRAINED on async_fd when a QP moves to SQD;
 * ibv_query_device_ex's capability flags.
 * Prints "ok NAME" or "FAIL NAME: why" (check.h); driven by
 * internal/verbsabi (TestVerbsABICoreVerbs).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
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

/* event_within reports whether ch has a CQ event within ms, and takes it. */
static int event_within(struct ibv_comp_channel *ch, int ms)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	struct ibv_cq *cq;
	void *cctx;

	if (poll(&p, 1, ms) != 1)
		return 0;
	if (ibv_get_cq_event(ch, &cq, &cctx))
		return 0;
	ibv_ack_cq_events(cq, 1);
	return 1;
}

/* post posts one signaled WR of op (flags added) from sge to qb's region
 * at raddr/rkey (for the WRITEs). */
static int post(struct ibv_qp *q, enum ibv_wr_opcode op, int flags, struct ibv_sge *sge, uint64_t id, uint64_t raddr,
		uint32_t rkey)
{
	struct ibv_send_wr wr, *bad;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = id;
	wr.opcode = op;
	wr.send_flags = IBV_SEND_SIGNALED | flags;
	wr.sg_list = sge;
	wr.num_sge = 1;
	wr.imm_data = htobe32((uint32_t)id);
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	return ibv_post_send(q, &wr, &bad);
}

static int post_recvs(struct ibv_qp *q, struct ibv_mr *m, int n)
{
	struct ibv_sge sge = { .addr = (uintptr_t)m->addr, .length = 64, .lkey = m->lkey };
	struct ibv_recv_wr wr = { .sg_list = &sge, .num_sge = 1 }, *bad;

	for (int i = 0; i < n; i++) {
		wr.wr_id = (uint64_t)i;
		if (ibv_post_recv(q, &wr, &bad))
			return -1;
	}
	return 0;
}

int main(void)
{
	struct ibv_context *ctx;
	struct ibv_comp_channel *ch;
	struct ibv_pd *pd, *pd2;
	struct ibv_cq *scq, *rcq;
	struct ibv_qp *qa, *qb;
	struct ibv_qp_init_attr init;
	struct ibv_mr *src, *dst, *win;
	union ibv_gid gid;
	struct ibv_wc wc;
	struct ibv_sge sge;
	char *sbuf, *rbuf, *wbuf, *wbuf2;
	uint32_t lkey, rkey;
	int n, ok, rc;

	ctx = open_first_device();
	if (!ctx)
		return 1;
	ch = ctx ? ibv_create_comp_channel(ctx) : NULL;
	pd = ch ? ibv_alloc_pd(ctx) : NULL;
	pd2 = pd ? ibv_alloc_pd(ctx) : NULL;
	scq = pd2 ? ibv_create_cq(ctx, 64, NULL, NULL, 0) : NULL;
	rcq = scq ? ibv_create_cq(ctx, 64, NULL, ch, 0) : NULL;
	memset(&init, 0, sizeof(init));
	init.send_cq = scq;
	init.recv_cq = rcq;
	init.cap.max_send_wr = 64;
	init.cap.max_recv_wr = 64;
	init.cap.max_send_sge = 1;
	init.cap.max_recv_sge = 1;
	init.qp_type = IBV_QPT_RC;
	qa = rcq ? ibv_create_qp(pd, &init) : NULL;
	qb = qa ? ibv_create_qp(pd, &init) : NULL;
	sbuf = calloc(1, 4096);
	rbuf = calloc(1, 4096);
	wbuf = calloc(1, 4096);
	wbuf2 = calloc(1, 8192);
	src = qb ? ibv_reg_mr(pd, sbuf, 4096, ACC) : NULL;
	dst = src ? ibv_reg_mr(pd, rbuf, 4096, ACC) : NULL;
	win = dst ? ibv_reg_mr(pd, wbuf, 4096, ACC) : NULL;
	ok = win && ibv_query_gid(ctx, 1, 0, &gid) == 0 && connect_rc(qa, qb->qp_num, &gid, ACC, 0, 0) == 0 &&
	     connect_rc(qb, qa->qp_num, &gid, ACC, 0, 0) == 0 && post_recvs(qb, dst, 32) == 0;
	CHECK("setup", ok, "errno %d", errno);
	if (!ok)
		return 1;
	sge = (struct ibv_sge){ .addr = (uintptr_t)sbuf, .length = 64, .lkey = src->lkey };
	{
		struct ibv_device_attr_ex dx;
		unsigned int want = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_SYS_IMAGE_GUID | IBV_DEVICE_PORT_ACTIVE_EVENT |
				    IBV_DEVICE_MEM_WINDOW | IBV_DEVICE_MEM_WINDOW_TYPE_2B | IBV_DEVICE_XRC;
		unsigned int lacks = IBV_DEVICE_SRQ_RESIZE | IBV_DEVICE_N_NOTIFY_CQ | IBV_DEVICE_MEM_MGT_EXTENSIONS |
				     IBV_DEVICE_RESIZE_MAX_WR | IBV_DEVICE_MEM_WINDOW_TYPE_2A;

		memset(&dx, 0, sizeof(dx));
		rc = ibv_query_device_ex(ctx, NULL, &dx);
		CHECK("query-device-ex-flags", rc == 0 && (dx.orig_attr.device_cap_flags & want) == want &&
						       !(dx.orig_attr.device_cap_flags & lacks) &&
						       dx.device_cap_flags_ex == (uint64_t)(unsigned int)dx.orig_attr.device_cap_flags &&
						       dx.orig_attr.max_mw > 0,
		      "rc %d flags 0x%x ex 0x%llx max_mw %d", rc, dx.orig_attr.device_cap_flags,
		      (unsigned long long)dx.device_cap_flags_ex, dx.orig_attr.max_mw);
	}

	/* Solicited-only events. */
	ok = ibv_req_notify_cq(rcq, 1) == 0;
	for (int i = 0; i < 3; i++)
		ok = ok && post(qa, IBV_WR_SEND, 0, &sge, 1, 0, 0) == 0 && poll_one(scq, &wc) && wc.status == IBV_WC_SUCCESS &&
		     poll_one(rcq, &wc) && wc.status == IBV_WC_SUCCESS;
	CHECK("solicited-unsolicited-no-event", ok && !event_within(ch, 100), "errno %d", errno);
	ok = post(qa, IBV_WR_SEND, IBV_SEND_SOLICITED, &sge, 2, 0, 0) == 0 && event_within(ch, 5000);
	CHECK("solicited-send-event", ok && poll_one(scq, &wc) && poll_one(rcq, &wc) && wc.wr_id < 32, "no event");
	ok = ibv_req_notify_cq(rcq, 1) == 0 &&
	     post(qa, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_SEND_SOLICITED, &sge, 3, (uintptr_t)rbuf + 1024, dst->rkey) == 0 &&
	     event_within(ch, 5000);
	CHECK("solicited-write-imm-event", ok && poll_one(scq, &wc) && poll_one(rcq, &wc) && wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM &&
						  be32toh(wc.imm_data) == 3,
	      "no event or opcode %d", wc.opcode);
	ok = ibv_req_notify_cq(rcq, 0) == 0 && post(qa, IBV_WR_SEND, 0, &sge, 4, 0, 0) == 0 && event_within(ch, 5000);
	CHECK("notify-all-event", ok && poll_one(scq, &wc) && poll_one(rcq, &wc), "no event");

	/* Resize. */
	rc = ibv_resize_cq(rcq, 1);
	CHECK("resize-down", rc == 0 && rcq->cqe >= 1, "rc %d cqe %d", rc, rcq->cqe);
	rc = ibv_resize_cq(rcq, 100);
	CHECK("resize-up", rc == 0 && rcq->cqe >= 100, "rc %d cqe %d", rc, rcq->cqe);
	ok = 1;
	for (uint64_t i = 10; i < 15; i++)
		ok = ok && post(qa, IBV_WR_SEND, 0, &sge, i, 0, 0) == 0 && poll_one(scq, &wc) && wc.status == IBV_WC_SUCCESS;
	rc = ibv_resize_cq(rcq, 2);
	CHECK("resize-below-waiting", ok && rc == EINVAL, "rc %d", rc);
	rc = ibv_resize_cq(rcq, 300);
	ok = rc == 0 && rcq->cqe >= 300;
	for (int i = 0; i < 5; i++) {
		uint64_t prev = wc.wr_id;

		ok = ok && poll_one(rcq, &wc) && wc.status == IBV_WC_SUCCESS && (i == 0 || wc.wr_id == prev + 1);
	}
	CHECK("resize-keeps-waiting", ok && ibv_poll_cq(rcq, 1, &wc) == 0, "rc %d cqe %d", rc, rcq->cqe);
	ok = ibv_req_notify_cq(rcq, 0) == 0 && post(qa, IBV_WR_SEND, 0, &sge, 20, 0, 0) == 0 && event_within(ch, 5000);
	CHECK("resize-events", ok && poll_one(scq, &wc) && poll_one(rcq, &wc), "no event after resize");

	/* SQD: IBV_EVENT_SQ_DRAINED for qa, nothing being in flight. */
	{
		struct ibv_qp_attr sa = { .qp_state = IBV_QPS_SQD };
		struct ibv_async_event ev;
		struct pollfd p = { .fd = ctx->async_fd, .events = POLLIN };

		rc = ibv_modify_qp(qa, &sa, IBV_QP_STATE);
		ok = rc == 0 && poll(&p, 1, 5000) == 1 && ibv_get_async_event(ctx, &ev) == 0;
		CHECK("sq-drained-event", ok && ev.event_type == IBV_EVENT_SQ_DRAINED && ev.element.qp == qa, "rc %d ok %d event %d",
		      rc, ok, ok ? (int)ev.event_type : -1);
		if (ok)
			ibv_ack_async_event(&ev);
		sa.qp_state = IBV_QPS_RTS;
		CHECK("sqd-to-rts", ibv_modify_qp(qa, &sa, IBV_QP_STATE) == 0, "errno %d", errno);
	}

	/* Rereg. */
	lkey = win->lkey;
	rkey = win->rkey;
	errno = 0;
	rc = ibv_rereg_mr(win, 0, NULL, NULL, 0, 0);
	CHECK("rereg-no-flags", rc == IBV_REREG_MR_ERR_INPUT && errno == EINVAL, "rc %d errno %d", rc, errno);
	errno = 0;
	rc = ibv_rereg_mr(win, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, NULL, 64, 0);
	CHECK("rereg-no-addr", rc == IBV_REREG_MR_ERR_INPUT && errno == EINVAL, "rc %d errno %d", rc, errno);
	errno = 0;
	rc = ibv_rereg_mr(win, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_REMOTE_WRITE);
	CHECK("rereg-bad-access", rc == IBV_REREG_MR_ERR_INPUT && errno == EINVAL, "rc %d errno %d", rc, errno);
	memset(sbuf, 0x5a, 64);
	memset(wbuf, 0x11, 64);
	rc = ibv_rereg_mr(win, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, wbuf2, 8192, 0);
	ok = rc == 0 && win->addr == wbuf2 && win->length == 8192 && win->lkey == lkey && win->rkey == rkey;
	CHECK("rereg-translation", ok, "rc %d errno %d addr %p keys 0x%x/0x%x", rc, errno, win->addr, win->lkey, win->rkey);
	ok = post(qa, IBV_WR_RDMA_WRITE, 0, &sge, 30, (uintptr_t)wbuf2 + 4096, rkey) == 0 && poll_one(scq, &wc) &&
	     wc.status == IBV_WC_SUCCESS;
	CHECK("rereg-write-lands", ok && memcmp(wbuf2 + 4096, sbuf, 64) == 0 && wbuf[0] == 0x11, "status %s",
	      ibv_wc_status_str(wc.status));
	rc = ibv_rereg_mr(win, IBV_REREG_MR_CHANGE_PD, pd2, NULL, 0, 0);
	ok = rc == 0 && win->pd == pd2 && ibv_dealloc_pd(pd2) == EBUSY;
	rc = ibv_rereg_mr(win, IBV_REREG_MR_CHANGE_PD, pd, NULL, 0, 0);
	CHECK("rereg-pd", ok && rc == 0 && win->pd == pd && ibv_dealloc_pd(pd2) == 0, "rc %d", rc);
	rc = ibv_rereg_mr(win, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_LOCAL_WRITE);
	ok = rc == 0 && post(qa, IBV_WR_RDMA_WRITE, 0, &sge, 31, (uintptr_t)wbuf2, rkey) == 0 && poll_one(scq, &wc);
	CHECK("rereg-access-refuses", ok && wc.status == IBV_WC_REM_ACCESS_ERR, "rc %d status %s", rc,
	      ibv_wc_status_str(wc.status));

	/* qb went to ERR with the refused WRITE: its receives were flushed
	 * into rcq. RESET takes them out again, and leaves another QP's. */
	{
		struct ibv_qp_attr ra = { .qp_state = IBV_QPS_RESET };
		struct ibv_qp_attr qattr;
		struct ibv_qp_init_attr qinit;

		for (int i = 0; i < 1000 && !(ibv_query_qp(qb, &qattr, IBV_QP_STATE, &qinit) == 0 && qattr.qp_state == IBV_QPS_ERR); i++)
			usleep(1000);
		usleep(50000); /* the flush follows the state */
		rc = ibv_modify_qp(qb, &ra, IBV_QP_STATE);
		n = ibv_poll_cq(rcq, 1, &wc);
		CHECK("reset-cleans-cq", rc == 0 && n == 0, "rc %d, %d completions left (qp 0x%x status %s)", rc, n,
		      n ? wc.qp_num : 0, ibv_wc_status_str(wc.status));
	}

	ibv_destroy_qp(qa);
	ibv_destroy_qp(qb);
	ibv_dereg_mr(win);
	ibv_dereg_mr(dst);
	ibv_dereg_mr(src);
	ibv_destroy_cq(rcq);
	ibv_destroy_cq(scq);
	ibv_destroy_comp_channel(ch);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	return failed;
}
