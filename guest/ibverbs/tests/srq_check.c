// SPDX-License-Identifier: Apache-2.0
/*
 * srq_check: shared receive queues on the drop-in, in one process: an
 * SRQ made with ibv_create_srq_ex (a basic SRQ with a CQ in its init
 * attributes, the verbs_context op), two QPs taking receives from it
 * (qa0, qa1), each connected to a sender (qb0, qb1) of the same VM.
 * Checks: the real sizes in the attributes, ibv_query_srq, a resize
 * refused (EINVAL), ibv_post_recv on a QP on an SRQ refused (EINVAL),
 * ibv_post_srq_recv's SGE check, completions in the receive CQ naming the
 * QP each message came to, the limit event through ibv_get_async_event
 * (element.srq; one-shot: the limit reads 0 after it), the last-WQE event
 * of a QP on the SRQ moved to ERR (element.qp) with the SRQ's WQEs left
 * to the other QP, ibv_destroy_srq EBUSY while QPs use it.
 * Prints "ok NAME" or "FAIL NAME: why" (check.h); driven by
 * internal/verbsabi (TestMiddlewareSRQVerbs).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

#include "check.h"
#include "device.h"
#include "poll.h"
#include "qp.h"

#define ACC (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)
#define SLOT 128

/* readable waits up to ms for fd to be readable. */
static int readable(int fd, int ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	return poll(&p, 1, ms) == 1 && (p.revents & POLLIN);
}

/* next_event reads the next async event of ctx within ms; 0 if none. */
static int next_event(struct ibv_context *ctx, struct ibv_async_event *ev, int ms)
{
	return readable(ctx->async_fd, ms) && ibv_get_async_event(ctx, ev) == 0;
}

static int post_srq(struct ibv_srq *srq, struct ibv_mr *m, char *buf, uint64_t id)
{
	struct ibv_sge sge = { .addr = (uintptr_t)(buf + id * SLOT), .length = SLOT, .lkey = m->lkey };
	struct ibv_recv_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1 }, *bad;

	return ibv_post_srq_recv(srq, &wr, &bad);
}

static int send_from(struct ibv_qp *q, struct ibv_mr *m, char *buf, uint64_t id)
{
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 32, .lkey = m->lkey };
	struct ibv_send_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED },
			   *bad;

	return ibv_post_send(q, &wr, &bad);
}

int main(void)
{
	struct ibv_context *ctx;
	struct ibv_device_attr dattr;
	struct ibv_pd *pd;
	struct ibv_cq *scq, *rcq;
	struct ibv_srq *srq;
	struct ibv_srq_init_attr_ex sx;
	struct ibv_srq_attr sa;
	struct ibv_qp *qa[2], *qb[2];
	struct ibv_qp_init_attr init;
	struct ibv_async_event ev;
	struct ibv_mr *m;
	union ibv_gid gid;
	struct ibv_wc wc;
	char *buf;
	int ok;

	ctx = open_first_device();
	if (!ctx)
		return 1;
	pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	scq = pd ? ibv_create_cq(ctx, 64, NULL, NULL, 0) : NULL;
	rcq = scq ? ibv_create_cq(ctx, 64, NULL, NULL, 0) : NULL;
	CHECK("setup", ctx && pd && scq && rcq && ibv_query_gid(ctx, 1, 0, &gid) == 0, "errno %d", errno);
	if (!rcq)
		return 1;
	CHECK("device-attr", ibv_query_device(ctx, &dattr) == 0 && dattr.max_srq > 0 && dattr.max_srq_wr == 4096 &&
				     dattr.max_srq_sge == 16 && !(dattr.device_cap_flags & IBV_DEVICE_SRQ_RESIZE),
	      "max_srq %d max_srq_wr %d max_srq_sge %d flags 0x%x", dattr.max_srq, dattr.max_srq_wr, dattr.max_srq_sge,
	      dattr.device_cap_flags);

	memset(&sx, 0, sizeof(sx));
	sx.attr.max_wr = 10;
	sx.attr.max_sge = 1;
	sx.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_CQ;
	sx.srq_type = IBV_SRQT_BASIC;
	sx.pd = pd;
	sx.cq = rcq;
	srq = ibv_create_srq_ex(ctx, &sx);
	CHECK("create-srq-ex", srq && sx.attr.max_wr >= 10 && sx.attr.max_sge >= 1, "errno %d, max_wr %u", errno,
	      sx.attr.max_wr);
	if (!srq)
		return 1;
	sx.srq_type = IBV_SRQT_XRC;
	sx.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_XRCD;
	errno = 0;
	CHECK("create-srq-xrc-no-domain", ibv_create_srq_ex(ctx, &sx) == NULL && errno == EINVAL, "errno %d", errno);
	CHECK("query-srq", ibv_query_srq(srq, &sa) == 0 && sa.max_wr == 16 && sa.max_sge >= 1 && sa.srq_limit == 0,
	      "max_wr %u max_sge %u limit %u", sa.max_wr, sa.max_sge, sa.srq_limit);
	sa.max_wr = 64;
	CHECK("resize-refused", ibv_modify_srq(srq, &sa, IBV_SRQ_MAX_WR) == EINVAL, " ");

	memset(&init, 0, sizeof(init));
	init.send_cq = scq;
	init.recv_cq = rcq;
	init.cap.max_send_wr = 8;
	init.cap.max_send_sge = 1;
	init.qp_type = IBV_QPT_RC;
	init.srq = srq;
	qa[0] = ibv_create_qp(pd, &init);
	qa[1] = ibv_create_qp(pd, &init);
	init.srq = NULL;
	init.recv_cq = scq;
	init.cap.max_recv_wr = 8;
	init.cap.max_recv_sge = 1;
	qb[0] = ibv_create_qp(pd, &init);
	qb[1] = ibv_create_qp(pd, &init);
	CHECK("create-qps", qa[0] && qa[1] && qb[0] && qb[1], "errno %d", errno);
	if (!qa[0] || !qa[1] || !qb[0] || !qb[1])
		return 1;
	{
		struct ibv_qp_attr qattr;
		struct ibv_qp_init_attr qinit;

		CHECK("query-qp-srq", ibv_query_qp(qa[0], &qattr, 0, &qinit) == 0 && qinit.srq == srq, " ");
	}
	ok = 1;
	for (int i = 0; i < 2; i++)
		ok = ok && !connect_rc(qa[i], qb[i]->qp_num, &gid, ACC, 0, 0) && !connect_rc(qb[i], qa[i]->qp_num, &gid, ACC, 0, 0);
	CHECK("connect", ok, "errno %d", errno);

	buf = calloc(1, 32 * SLOT);
	m = ibv_reg_mr(pd, buf, 32 * SLOT, ACC);
	CHECK("reg-mr", m != NULL, "errno %d", errno);
	if (!m)
		return 1;
	{
		struct ibv_sge sge[2] = { { .addr = (uintptr_t)buf, .length = 8, .lkey = m->lkey },
					  { .addr = (uintptr_t)buf + 8, .length = 8, .lkey = m->lkey } };
		struct ibv_recv_wr wr = { .wr_id = 99, .sg_list = sge, .num_sge = 1 }, *bad = NULL;

		CHECK("post-recv-on-srq-qp-refused", ibv_post_recv(qa[0], &wr, &bad) == EINVAL && bad == &wr, " ");
		wr.num_sge = sa.max_sge + 1;
		bad = NULL;
		CHECK("post-srq-too-many-sges", sa.max_sge >= 16 || (ibv_post_srq_recv(srq, &wr, &bad) == EINVAL && bad == &wr),
		      " ");
	}

	/* Ten receives; a message to each QP completes on the receive CQ
	 * naming the QP it came to. */
	ok = 1;
	for (uint64_t id = 0; id < 10; id++)
		ok = ok && post_srq(srq, m, buf + 16 * SLOT, id) == 0;
	CHECK("post-srq-recv", ok, "errno %d", errno);
	sa.srq_limit = 7;
	CHECK("arm-limit", ibv_modify_srq(srq, &sa, IBV_SRQ_LIMIT) == 0, " ");
	for (int i = 0; i < 2; i++) {
		memset(buf, 'a' + i, 32);
		CHECK("send", send_from(qb[i], m, buf, 10 + i) == 0, "errno %d", errno);
		CHECK("send-completes", poll_one(scq, &wc) && wc.status == IBV_WC_SUCCESS && wc.wr_id == (uint64_t)(10 + i),
		      "status %d wr_id %lu", wc.status, (unsigned long)wc.wr_id);
		CHECK("recv-names-its-qp",
		      poll_one(rcq, &wc) && wc.status == IBV_WC_SUCCESS && wc.qp_num == qa[i]->qp_num &&
			      wc.src_qp == qb[i]->qp_num && wc.byte_len == 32 && wc.wr_id < 10 &&
			      buf[16 * SLOT + wc.wr_id * SLOT] == 'a' + i,
		      "status %d qp_num 0x%x (want 0x%x) byte_len %u", wc.status, wc.qp_num, qa[i]->qp_num, wc.byte_len);
	}
	/* 8 left, limit 7: no event yet. It comes when fewer than 7 stay:
	 * after two more messages. */
	CHECK("no-limit-event-yet", !readable(ctx->async_fd, 100), "async_fd readable");
	for (int k = 0; k < 2; k++) {
		send_from(qb[0], m, buf, 20 + k);
		poll_one(scq, &wc);
		poll_one(rcq, &wc);
	}
	CHECK("limit-event", next_event(ctx, &ev, 5000) && ev.event_type == IBV_EVENT_SRQ_LIMIT_REACHED && ev.element.srq == srq,
	      "event %d", ev.event_type);
	ibv_ack_async_event(&ev);
	CHECK("limit-disarmed", ibv_query_srq(srq, &sa) == 0 && sa.srq_limit == 0, "limit %u", sa.srq_limit);

	/* qa[0] to ERR: the last-WQE event; the SRQ's receives stay for qa[1]. */
	{
		struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };

		CHECK("modify-err", ibv_modify_qp(qa[0], &a, IBV_QP_STATE) == 0, "errno %d", errno);
	}
	CHECK("last-wqe-event",
	      next_event(ctx, &ev, 5000) && ev.event_type == IBV_EVENT_QP_LAST_WQE_REACHED && ev.element.qp == qa[0],
	      "event %d", ev.event_type);
	ibv_ack_async_event(&ev);
	CHECK("no-flush-of-the-srq", ibv_poll_cq(rcq, 1, &wc) == 0, "completion status %d", wc.status);
	send_from(qb[1], m, buf, 30);
	CHECK("other-qp-still-receives",
	      poll_one(scq, &wc) && wc.status == IBV_WC_SUCCESS && poll_one(rcq, &wc) && wc.status == IBV_WC_SUCCESS &&
		      wc.qp_num == qa[1]->qp_num,
	      "status %d qp_num 0x%x", wc.status, wc.qp_num);

	CHECK("destroy-srq-busy", ibv_destroy_srq(srq) == EBUSY, " ");
	ibv_dereg_mr(m);
	free(buf);
	CHECK("teardown", !ibv_destroy_qp(qa[0]) && !ibv_destroy_qp(qa[1]) && !ibv_destroy_qp(qb[0]) &&
				  !ibv_destroy_qp(qb[1]) && !ibv_destroy_srq(srq) && !ibv_destroy_cq(scq) &&
				  !ibv_destroy_cq(rcq) && !ibv_dealloc_pd(pd) && !ibv_close_device(ctx),
	      "errno %d", errno);
	return failed;
}
