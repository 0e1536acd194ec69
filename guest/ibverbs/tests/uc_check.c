// SPDX-License-Identifier: Apache-2.0
/*
 * uc_check: unreliable connected QPs on the drop-in, in one process: two
 * UC QPs of one VM (qa, qb) connected to each other with UC's masks.
 * Checks: ibv_query_qp's qp_type; RC's RTR and RTS attributes refused
 * (EINVAL, as rxe); RDMA READ and both atomics refused at ibv_post_send
 * with EINVAL and *bad_wr at them, nothing posted; ibv_create_qp_ex of a
 * UC QP with READ or atomic send ops EOPNOTSUPP, and ibv_wr_rdma_read on
 * one with SEND and WRITE ops EINVAL at wr_complete; a SEND with no
 * receive posted completing at the sender and dropped at the receiver;
 * SEND with immediate and RDMA WRITE with immediate byte-exact with their
 * completions; the QPs in RTS throughout.
 * Prints "ok NAME" or "FAIL NAME: why" (check.h); driven by
 * internal/verbsabi (TestMiddlewareUCVerbs).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "check.h"
#include "poll.h"

#define ACC (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)

/* none_within reports whether cq yields no completion in about 100 ms. */
static int none_within(struct ibv_cq *cq)
{
	struct ibv_wc wc;

	for (int i = 0; i < 100; i++) {
		if (ibv_poll_cq(cq, 1, &wc) != 0)
			return 0;
		usleep(1000);
	}
	return 1;
}

/* connect_uc moves q to RTS facing dest of gid, with UC's masks (as
 * ibv_uc_pingpong); rc_attrs adds RC's RTR and RTS attributes, which a UC
 * QP refuses. 0 or ibv_modify_qp's error at the first step it fails. */
static int connect_uc(struct ibv_qp *q, uint32_t dest, union ibv_gid *gid, int rc_attrs)
{
	struct ibv_qp_attr a;
	int rc;

	if (q->state == IBV_QPS_RESET) {
		memset(&a, 0, sizeof(a));
		a.qp_state = IBV_QPS_INIT;
		a.port_num = 1;
		a.qp_access_flags = ACC;
		rc = ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
		if (rc)
			return rc;
	}
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dest;
	a.rq_psn = 0x123;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = *gid;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	rc = ibv_modify_qp(q, &a,
			   IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				   (rc_attrs ? IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER : 0));
	if (rc)
		return rc;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0x123;
	a.timeout = 14;
	a.retry_cnt = 7;
	return ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | (rc_attrs ? IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT : 0));
}

static struct ibv_qp *create_uc(struct ibv_pd *pd, struct ibv_cq *scq, struct ibv_cq *rcq)
{
	struct ibv_qp_init_attr ia = { .send_cq = scq, .recv_cq = rcq, .qp_type = IBV_QPT_UC,
				       .cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 } };

	return ibv_create_qp(pd, &ia);
}

int main(void)
{
	struct ibv_device **list;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *scq, *rcq;
	struct ibv_qp *qa, *qb, *qx;
	struct ibv_qp_ex *x;
	struct ibv_qp_attr qattr;
	struct ibv_qp_init_attr qinit;
	union ibv_gid gid;
	struct ibv_mr *m;
	struct ibv_wc wc;
	struct ibv_sge sge;
	struct ibv_recv_wr rwr, *rbad;
	struct ibv_send_wr wr, wr2, *bad;
	char *buf;
	int rc;

	list = ibv_get_device_list(NULL);
	if (!list || !list[0]) {
		printf("FAIL devices: none\n");
		return 1;
	}
	ctx = ibv_open_device(list[0]);
	pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	scq = ctx ? ibv_create_cq(ctx, 64, NULL, NULL, 0) : NULL;
	rcq = ctx ? ibv_create_cq(ctx, 64, NULL, NULL, 0) : NULL;
	if (!pd || !scq || !rcq || ibv_query_gid(ctx, 1, 0, &gid)) {
		printf("FAIL setup: %s\n", strerror(errno));
		return 1;
	}
	buf = aligned_alloc(4096, 1 << 16);
	memset(buf, 0, 1 << 16);
	m = ibv_reg_mr(pd, buf, 1 << 16, ACC);
	qa = create_uc(pd, scq, rcq);
	qb = create_uc(pd, scq, rcq);
	CHECK("create", m && qa && qb && qa->qp_type == IBV_QPT_UC, "%s", strerror(errno));
	if (!m || !qa || !qb)
		return 1;

	rc = ibv_query_qp(qa, &qattr, IBV_QP_STATE, &qinit);
	CHECK("query-type", rc == 0 && qinit.qp_type == IBV_QPT_UC, "rc %d qp_type %d", rc, qinit.qp_type);

	/* RC's attributes: EINVAL at RTR, then UC's masks connect. */
	rc = connect_uc(qa, qb->qp_num, &gid, 1);
	CHECK("rc-attrs-refused", rc == EINVAL && qa->state == IBV_QPS_INIT, "rc %d state %d", rc, qa->state);
	rc = connect_uc(qa, qb->qp_num, &gid, 0);
	CHECK("connect-a", rc == 0, "%s", strerror(rc));
	rc = connect_uc(qb, qa->qp_num, &gid, 0);
	CHECK("connect-b", rc == 0, "%s", strerror(rc));

	/* READ and atomics: EINVAL at post, bad_wr at them, nothing posted. */
	sge = (struct ibv_sge){ .addr = (uintptr_t)buf, .length = 8, .lkey = m->lkey };
	for (int op = IBV_WR_RDMA_READ; op <= IBV_WR_ATOMIC_FETCH_AND_ADD; op++) {
		char name[32];

		memset(&wr, 0, sizeof(wr));
		wr.wr_id = 100 + op;
		wr.opcode = op;
		wr.sg_list = &sge;
		wr.num_sge = 1;
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.wr.rdma.remote_addr = (uintptr_t)buf + 4096;
		wr.wr.rdma.rkey = m->rkey;
		wr.wr.atomic.remote_addr = (uintptr_t)buf + 4096;
		wr.wr.atomic.rkey = m->rkey;
		bad = NULL;
		rc = ibv_post_send(qa, &wr, &bad);
		snprintf(name, sizeof(name), "post-refused-%d", op);
		CHECK(name, rc == EINVAL && bad == &wr, "rc %d bad %p", rc, (void *)bad);
	}
	/* A SEND before a refused READ in one list: the SEND is posted. */
	memset(&wr, 0, sizeof(wr));
	memset(&wr2, 0, sizeof(wr2));
	wr.wr_id = 1;
	wr.opcode = IBV_WR_SEND;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.next = &wr2;
	wr2.wr_id = 2;
	wr2.opcode = IBV_WR_RDMA_READ;
	wr2.sg_list = &sge;
	wr2.num_sge = 1;
	rc = ibv_post_send(qa, &wr, &bad);
	CHECK("post-list-refused-at-read", rc == EINVAL && bad == &wr2, "rc %d", rc);
	/* That SEND had no receive posted: it completes, and is dropped. */
	rc = poll_one(scq, &wc);
	CHECK("send-no-receive-completes", rc && wc.wr_id == 1 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_SEND,
	      "got %d wr_id %llu status %s", rc, (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status));
	CHECK("send-no-receive-dropped", none_within(rcq) && none_within(scq), "a completion came");
	CHECK("rts-after-drop", qa->state == IBV_QPS_RTS && ibv_query_qp(qb, &qattr, IBV_QP_STATE, &qinit) == 0 &&
				      qattr.qp_state == IBV_QPS_RTS,
	      "qb in %d", qattr.qp_state);

	/* SEND with immediate, then RDMA WRITE with immediate. */
	for (int i = 0; i < 2; i++) {
		sge = (struct ibv_sge){ .addr = (uintptr_t)buf + 8192 + i * 4096, .length = 4096, .lkey = m->lkey };
		rwr = (struct ibv_recv_wr){ .wr_id = 10 + i, .sg_list = &sge, .num_sge = 1 };
		if (ibv_post_recv(qb, &rwr, &rbad))
			CHECK("post-recv", 0, "%s", strerror(errno));
	}
	for (int i = 0; i < 3000; i++)
		buf[i] = (char)(i * 7 + 1);
	sge = (struct ibv_sge){ .addr = (uintptr_t)buf, .length = 3000, .lkey = m->lkey };
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = 3;
	wr.opcode = IBV_WR_SEND_WITH_IMM;
	wr.imm_data = htonl(0x1234);
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.send_flags = IBV_SEND_SIGNALED;
	rc = ibv_post_send(qa, &wr, &bad);
	CHECK("send-imm-posted", rc == 0, "%s", strerror(rc));
	rc = poll_one(rcq, &wc);
	CHECK("send-imm-received", rc && wc.wr_id == 10 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV &&
					  wc.byte_len == 3000 && (wc.wc_flags & IBV_WC_WITH_IMM) && ntohl(wc.imm_data) == 0x1234 &&
					  wc.qp_num == qb->qp_num && memcmp(buf + 8192, buf, 3000) == 0,
	      "got %d wr_id %llu %s opcode %d len %u imm 0x%x", rc, (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status),
	      wc.opcode, wc.byte_len, ntohl(wc.imm_data));
	rc = poll_one(scq, &wc);
	CHECK("send-imm-completes", rc && wc.wr_id == 3 && wc.status == IBV_WC_SUCCESS, "got %d", rc);
	wr.wr_id = 4;
	wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
	wr.imm_data = htonl(0xabcd);
	wr.wr.rdma.remote_addr = (uintptr_t)buf + 32768;
	wr.wr.rdma.rkey = m->rkey;
	rc = ibv_post_send(qa, &wr, &bad);
	CHECK("write-imm-posted", rc == 0, "%s", strerror(rc));
	rc = poll_one(rcq, &wc);
	CHECK("write-imm-received", rc && wc.wr_id == 11 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM &&
					   wc.byte_len == 3000 && ntohl(wc.imm_data) == 0xabcd && memcmp(buf + 32768, buf, 3000) == 0,
	      "got %d wr_id %llu %s opcode %d len %u", rc, (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status), wc.opcode,
	      wc.byte_len);
	rc = poll_one(scq, &wc);
	CHECK("write-imm-completes", rc && wc.wr_id == 4 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_WRITE, "got %d", rc);

	/* ibv_create_qp_ex: READ or atomic send ops on UC, EOPNOTSUPP; with
	 * SEND and WRITE ops, wr_rdma_read fails the batch with EINVAL. */
	{
		struct ibv_qp_init_attr_ex ax = { .send_cq = scq, .recv_cq = rcq, .qp_type = IBV_QPT_UC, .pd = pd,
						  .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
						  .send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_READ,
						  .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };

		errno = 0;
		qx = ibv_create_qp_ex(ctx, &ax);
		CHECK("qp-ex-read-ops-refused", !qx && errno == EOPNOTSUPP, "qp %p errno %d", (void *)qx, errno);
		ax.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE;
		qx = ibv_create_qp_ex(ctx, &ax);
		x = qx ? ibv_qp_to_qp_ex(qx) : NULL;
		CHECK("qp-ex-create", x && qx->qp_type == IBV_QPT_UC, "%s", strerror(errno));
		if (x && connect_uc(qx, qb->qp_num, &gid, 0) == 0) {
			ibv_wr_start(x);
			x->wr_id = 5;
			ibv_wr_rdma_read(x, m->rkey, (uintptr_t)buf);
			ibv_wr_set_sge(x, m->lkey, (uintptr_t)buf, 8);
			rc = ibv_wr_complete(x);
			CHECK("qp-ex-read-refused", rc == EINVAL, "rc %d", rc);
			CHECK("qp-ex-nothing-posted", none_within(scq), "a completion came");
		}
		if (qx)
			ibv_destroy_qp(qx);
	}

	ibv_destroy_qp(qa);
	ibv_destroy_qp(qb);
	ibv_dereg_mr(m);
	ibv_destroy_cq(scq);
	ibv_destroy_cq(rcq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	free(buf);
	return failed;
}
