// SPDX-License-Identifier: Apache-2.0
/*
 * cqoverrun_check: a full CQ overruns as a device's does, on the drop-in.
 * Two RC QPs of one VM connected to each other; qa sends three signaled
 * SENDs to three receives of qb, and nobody polls the CQ of 2 entries
 * they complete into:
 *   recv-overrun: qb's receive CQ (ibv_create_cq) overruns at the third
 *     message: IBV_EVENT_CQ_ERR on async_fd with element.cq that CQ, qb
 *     in ERR (ibv_query_qp), the CQ yielding only the first two
 *     completions, qa's third SEND an error;
 *   send-overrun: qa's send CQ (ibv_create_cq_ex) overruns at the third
 *     SEND's completion;
 *   ignore-overrun: with IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN the third
 *     completion waits for room instead: no event, all three complete.
 * Prints "ok NAME" or "FAIL NAME: why" (check.h); driven by
 * internal/verbsabi (TestVerbsABICQOverrun).
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

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static union ibv_gid gid;
static char *buf;
static struct ibv_mr *mr;

/* new_cq makes a CQ of 2 entries: ibv_create_cq, or ibv_create_cq_ex with
 * flags. */
static struct ibv_cq *new_cq(int ex, uint32_t flags)
{
	struct ibv_cq_init_attr_ex a;
	struct ibv_cq_ex *x;

	if (!ex)
		return ibv_create_cq(ctx, 2, NULL, NULL, 0);
	memset(&a, 0, sizeof(a));
	a.cqe = 2;
	a.comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS;
	a.flags = flags;
	a.wc_flags = IBV_WC_STANDARD_FLAGS;
	x = ibv_create_cq_ex(ctx, &a);
	return x ? ibv_cq_ex_to_cq(x) : NULL;
}

static struct ibv_qp *new_qp(struct ibv_cq *scq, struct ibv_cq *rcq)
{
	struct ibv_qp_init_attr init;

	memset(&init, 0, sizeof(init));
	init.send_cq = scq;
	init.recv_cq = rcq;
	init.cap.max_send_wr = 8;
	init.cap.max_recv_wr = 8;
	init.cap.max_send_sge = 1;
	init.cap.max_recv_sge = 1;
	init.qp_type = IBV_QPT_RC;
	return ibv_create_qp(pd, &init);
}

/* cq_err_within waits ms for IBV_EVENT_CQ_ERR naming cq, passing over
 * other events (the QPs' QP_FATAL). */
static int cq_err_within(struct ibv_cq *cq, int ms)
{
	struct pollfd p = { .fd = ctx->async_fd, .events = POLLIN };
	struct ibv_async_event ev;
	int hit;

	while (poll(&p, 1, ms) == 1) {
		if (ibv_get_async_event(ctx, &ev))
			return 0;
		hit = ev.event_type == IBV_EVENT_CQ_ERR && ev.element.cq == cq;
		ibv_ack_async_event(&ev);
		if (hit)
			return 1;
	}
	return 0;
}

static enum ibv_qp_state state_of(struct ibv_qp *q)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr i;

	if (ibv_query_qp(q, &a, IBV_QP_STATE, &i))
		return (enum ibv_qp_state)-1;
	return a.qp_state;
}

/* three sends three signaled SENDs from qa to three receives of qb. */
static int three(struct ibv_qp *qa, struct ibv_qp *qb)
{
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 64, .lkey = mr->lkey };
	struct ibv_recv_wr rwr = { .sg_list = &sge, .num_sge = 1 }, *rbad;
	struct ibv_send_wr swr, *sbad;

	if (connect_rc(qa, qb->qp_num, &gid, ACC, 0, 0) || connect_rc(qb, qa->qp_num, &gid, ACC, 0, 0))
		return -1;
	for (int i = 0; i < 3; i++) {
		rwr.wr_id = (uint64_t)i;
		if (ibv_post_recv(qb, &rwr, &rbad))
			return -1;
	}
	memset(&swr, 0, sizeof(swr));
	swr.opcode = IBV_WR_SEND;
	swr.send_flags = IBV_SEND_SIGNALED;
	swr.sg_list = &sge;
	swr.num_sge = 1;
	for (int i = 0; i < 3; i++) {
		swr.wr_id = (uint64_t)i;
		if (ibv_post_send(qa, &swr, &sbad))
			return -1;
	}
	return 0;
}

/* first_two reports whether cq yields the completions of WRs 0 and 1 with
 * success, then nothing within 200 ms. */
static int first_two(struct ibv_cq *cq)
{
	struct ibv_wc wc;

	for (uint64_t i = 0; i < 2; i++)
		if (!poll_one(cq, &wc) || wc.wr_id != i || wc.status != IBV_WC_SUCCESS)
			return 0;
	for (int i = 0; i < 200; i++) {
		if (ibv_poll_cq(cq, 1, &wc) != 0)
			return 0;
		usleep(1000);
	}
	return 1;
}

int main(void)
{
	struct ibv_cq *big, *small;
	struct ibv_qp *qa, *qb;
	struct ibv_wc wc[3];
	int ok;

	ctx = open_first_device();
	if (!ctx)
		return 1;
	pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	buf = calloc(1, 4096);
	mr = pd ? ibv_reg_mr(pd, buf, 4096, ACC) : NULL;
	ok = mr && ibv_query_gid(ctx, 1, 0, &gid) == 0;
	CHECK("setup", ok, "errno %d", errno);
	if (!ok)
		return 1;

	big = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	small = new_cq(0, 0);
	qa = big && small ? new_qp(big, big) : NULL;
	qb = qa ? new_qp(big, small) : NULL;
	ok = qb && small->cqe == 2 && three(qa, qb) == 0;
	CHECK("recv-setup", ok, "errno %d cqe %d", errno, small ? small->cqe : -1);
	if (ok) {
		int err = cq_err_within(small, 5000);
		int n2 = 0, bad = 0;

		for (int i = 0; i < 3; i++) { /* qa's three sends, in order */
			if (!poll_one(big, &wc[0]))
				break;
			n2++;
			bad += wc[0].status != IBV_WC_SUCCESS;
		}
		CHECK("recv-overrun", err && state_of(qb) == IBV_QPS_ERR && first_two(small) && n2 == 3 && bad == 1,
		      "event %d state %d sends completed %d (%d bad)", err, state_of(qb), n2, bad);
	}

	small = new_cq(1, 0);
	big = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	qa = small && big ? new_qp(small, big) : NULL;
	qb = qa ? new_qp(big, big) : NULL;
	ok = qb && three(qa, qb) == 0;
	CHECK("send-setup", ok, "errno %d", errno);
	if (ok) {
		int err = cq_err_within(small, 5000);

		CHECK("send-overrun", err && state_of(qa) == IBV_QPS_ERR && first_two(small), "event %d state %d", err,
		      state_of(qa));
	}

	small = new_cq(1, IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN);
	big = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	qa = small && big ? new_qp(small, big) : NULL;
	qb = qa ? new_qp(big, big) : NULL;
	ok = qb && three(qa, qb) == 0;
	CHECK("ignore-setup", ok, "errno %d", errno);
	if (ok) {
		int err = cq_err_within(small, 300);
		int got = 0;

		for (int i = 0; i < 3; i++)
			got += poll_one(small, &wc[i]) && wc[i].wr_id == (uint64_t)i && wc[i].status == IBV_WC_SUCCESS;
		CHECK("ignore-overrun", !err && got == 3 && state_of(qa) == IBV_QPS_RTS, "event %d completions %d state %d",
		      err, got, state_of(qa));
	}
	return failed;
}
