// SPDX-License-Identifier: Apache-2.0
/*
 * async_check: ibv_get_async_event on the drop-in, in one process: two QPs
 * of one VM connected to each other. A QP the program moves to ERR itself
 * gives no event; an RDMA WRITE with a bad rkey makes the agent move both
 * QPs to ERR (the responder refuses it, the requester's work request
 * fails), and each gives IBV_EVENT_QP_FATAL naming that QP, through poll
 * on async_fd. A non-blocking async_fd with nothing in it is EAGAIN.
 * Prints "ok NAME" or "FAIL NAME: why" (check.h); driven by
 * internal/verbsabi (TestVerbsABIAsyncEvents).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

#include "check.h"
#include "device.h"
#include "qp.h"

#define ACC (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)


/* readable waits up to ms for fd to be readable. */
static int readable(int fd, int ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	return poll(&p, 1, ms) == 1 && (p.revents & POLLIN);
}

int main(void)
{
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qa, *qb, *qc, *qd;
	struct ibv_qp_init_attr init;
	struct ibv_async_event ev;
	struct ibv_mr *m;
	union ibv_gid gid;
	struct ibv_wc wc;
	char *buf;
	int flags, seen_a = 0, seen_b = 0, others = 0;

	ctx = open_first_device();
	if (!ctx)
		return 1;
	pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	cq = pd ? ibv_create_cq(ctx, 64, NULL, NULL, 0) : NULL;
	CHECK("setup", ctx && pd && cq && ibv_query_gid(ctx, 1, 0, &gid) == 0, "errno %d", errno);
	if (!cq)
		return 1;
	memset(&init, 0, sizeof(init));
	init.send_cq = init.recv_cq = cq;
	init.cap.max_send_wr = init.cap.max_recv_wr = 8;
	init.cap.max_send_sge = init.cap.max_recv_sge = 1;
	init.qp_type = IBV_QPT_RC;
	qa = ibv_create_qp(pd, &init);
	qb = ibv_create_qp(pd, &init);
	qc = ibv_create_qp(pd, &init);
	qd = ibv_create_qp(pd, &init);
	CHECK("create-qps", qa && qb && qc && qd, "errno %d", errno);
	if (!qa || !qb || !qc || !qd)
		return 1;
	CHECK("connect", !connect_rc(qa, qb->qp_num, &gid, ACC, 0, 0) && !connect_rc(qb, qa->qp_num, &gid, ACC, 0, 0) &&
				 !connect_rc(qc, qd->qp_num, &gid, ACC, 0, 0) && !connect_rc(qd, qc->qp_num, &gid, ACC, 0, 0),
	      "errno %d", errno);

	/* The program's own move to ERR, and destroying a QP: no event. */
	{
		struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };

		CHECK("modify-err", ibv_modify_qp(qc, &a, IBV_QP_STATE) == 0, "errno %d", errno);
		CHECK("no-event-for-own-modify", !readable(ctx->async_fd, 300), "async_fd readable");
	}

	flags = fcntl(ctx->async_fd, F_GETFL);
	fcntl(ctx->async_fd, F_SETFL, flags | O_NONBLOCK);
	errno = 0;
	CHECK("nonblocking-empty", ibv_get_async_event(ctx, &ev) == -1 && errno == EAGAIN, "errno %d", errno);
	fcntl(ctx->async_fd, F_SETFL, flags);

	/* An RDMA WRITE with an rkey no region has: the responder (qb) refuses
	 * it, the requester's (qa's) work request fails; the agent moves both
	 * to ERR. */
	buf = malloc(4096);
	memset(buf, 'x', 4096);
	m = ibv_reg_mr(pd, buf, 4096, ACC);
	CHECK("reg-mr", m != NULL, "errno %d", errno);
	if (!m)
		return 1;
	{
		struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 64, .lkey = m->lkey };
		struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
					  .send_flags = IBV_SEND_SIGNALED },
				   *bad;
		long i;

		wr.wr.rdma.remote_addr = (uintptr_t)buf;
		wr.wr.rdma.rkey = m->rkey ^ 0x5a5a00;
		CHECK("post-bad-rkey", ibv_post_send(qa, &wr, &bad) == 0, "errno %d", errno);
		for (i = 0; i < 100000000 && ibv_poll_cq(cq, 1, &wc) == 0; i++)
			;
		CHECK("remote-access-error", wc.status == IBV_WC_REM_ACCESS_ERR, "status %d", wc.status);
	}
	for (int k = 0; k < 4 && !(seen_a && seen_b); k++) {
		if (!readable(ctx->async_fd, 5000))
			break;
		if (ibv_get_async_event(ctx, &ev))
			break;
		if (ev.event_type == IBV_EVENT_QP_FATAL && ev.element.qp == qa)
			seen_a = 1;
		else if (ev.event_type == IBV_EVENT_QP_FATAL && ev.element.qp == qb)
			seen_b = 1;
		else
			others++;
		ibv_ack_async_event(&ev);
	}
	CHECK("qp-fatal-requester", seen_a, "no IBV_EVENT_QP_FATAL for the requester's QP");
	CHECK("qp-fatal-responder", seen_b, "no IBV_EVENT_QP_FATAL for the responder's QP");
	CHECK("no-other-events", others == 0, "%d others", others);
	CHECK("event-str", !strcmp(ibv_event_type_str(IBV_EVENT_QP_FATAL), "local work queue catastrophic error"),
	      "%s", ibv_event_type_str(IBV_EVENT_QP_FATAL));
	CHECK("get-async-bad-args", ibv_get_async_event(NULL, &ev) != 0, " ");

	ibv_dereg_mr(m);
	free(buf);
	CHECK("teardown", !ibv_destroy_qp(qa) && !ibv_destroy_qp(qb) && !ibv_destroy_qp(qc) && !ibv_destroy_qp(qd) &&
				  !ibv_destroy_cq(cq) && !ibv_dealloc_pd(pd) && !ibv_close_device(ctx),
	      "errno %d", errno);
	return failed;
}
