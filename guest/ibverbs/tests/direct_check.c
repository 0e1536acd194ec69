// SPDX-License-Identifier: Apache-2.0
/*
 * direct_check: the memcpy-direct path of the drop-in (wire-local.md
 * §4.21) between two VMs that allow each other. Two roles, each a
 * process, driven through stdin lines by internal/verbsabi
 * (TestDropinDirect):
 *
 *   owner   registers a 64 KiB buffer twice: MR1 with remote write, read
 *           and atomics (the peer's target) and MR2 local only (it keeps
 *           the pages the library's, so that what lands in them after MR1
 *           is gone can be seen); prints "info QPN GID ADDR RKEY".
 *   peer    a QP made with ibv_create_qp_ex (ibv_post_send and the
 *           ibv_wr_* API both) and an extended CQ (ibv_poll_cq and
 *           ibv_start_poll both); prints "info QPN GID".
 *
 * Lines: "peer ..." connects each side to the other. The peer's "data":
 * an RDMA WRITE of two SGEs, an inline WRITE, a READ checked against what
 * was written, FETCH_ADD and CMP_SWP (a hit and a miss) with the old
 * values checked, ATOMIC_WRITE (ibv_wr_atomic_write) read back, a WRITE
 * with the ibv_wr_* API, an unsignaled WRITE then a signaled one (one
 * completion), the completions' opcodes, lengths and ids checked; the
 * owner's "check" then finds the bytes in its buffer. The peer's "fork VM":
 * a child's /proc/self/maps has neither VM's (the owner's) guest memory
 * nor a grant table. The peer's "loop"
 * writes a counter into the owner's buffer in a loop of signaled WRITEs
 * (its line's "ok writing" once 200 completed, before its "done"); the
 * owner's "dereg" deregisters MR1, takes a copy of the buffer as the call
 * returns, and checks after 300 ms that no byte changed; the peer's
 * "stop" ends its loop, which must have ended on an error completion, and
 * posts one more WRITE, which must complete with an error too. After each line's work: "done".
 *
 * SEND and RECV (the send channel, wire-local.md §4.22): each role has
 * three more QPs, S (the send tests), N (rnr_retry 1) and E (the errors),
 * connected to the other's; the owner receives, the peer sends, each line
 * one step: "rpost" posts seven receives on S; "sends" posts, in order, a
 * 2-byte SEND, a 64-byte SEND_WITH_IMM, a 0-byte SEND, an inline SEND, a
 * SEND too big for the channel (relayed), a 4-byte SEND, an RDMA WRITE
 * and an 8-byte SEND; "rcheck" polls the seven receives (ibv_poll_cq and
 * ibv_start_poll alternately) in posting order with their lengths, bytes,
 * immediates and source QP, and finds the WRITE's bytes when the SEND
 * behind it arrived; "scheck" polls the sends' completions (ibv_start_poll).
 * Events: "evarm" posts a receive and arms S's recv CQ (a completion
 * channel), and a thread waits for its event, then polls; "evsend" arms
 * the peer's send CQ (a completion channel), sends and waits for that
 * event; "evcheck" joins the thread. "rnr": the peer SENDs on N, whose
 * peer has no receive: RNR_RETRY_EXC_ERR. Errors on E: "epost" posts a
 * 16-byte receive and two more; "esend" posts a 64-byte SEND and two
 * more; "echeck" (owner) expects LOC_LEN_ERR then two WR_FLUSH_ERR, and
 * no more within 300 ms; "echeck2" (peer) REM_INV_REQ_ERR then two
 * WR_FLUSH_ERR, and no more.
 * Prints "ok NAME" or "FAIL NAME: why" (check.h).
 */
#define _GNU_SOURCE
#include <endian.h>
#include <errno.h>
#include <sys/poll.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "check.h"
#include "qp.h"

#define SIZE 65536
#define REMOTE (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC)

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq_ex *cqx;
static struct ibv_cq *cq;
static struct ibv_qp *qp;
static struct ibv_qp_ex *qpx;
static struct ibv_mr *mr, *mr2;
static unsigned char *buf;
static union ibv_gid gid;
static uint64_t raddr;
static uint32_t rkey;

/* The send tests' QPs (S, N, E), CQs and buffers. */
enum { QS, QN, QE, NQ };
static struct ibv_qp *sq[NQ];
static struct ibv_cq_ex *scqx;			/* S's recv CQ (owner) or send CQ (peer): a channel's, ex */
static struct ibv_cq *scq, *ocq[NQ];		/* scq: scqx as a CQ; ocq: each QP's other CQ */
static struct ibv_comp_channel *sch;
static struct ibv_mr *smr;
static unsigned char *sbuf;
static uint32_t dqpn[NQ];

static int setup(int peer)
{
	struct ibv_device **list;
	int n;

	list = ibv_get_device_list(&n);
	ctx = list && n > 0 ? ibv_open_device(list[0]) : NULL;
	pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	if (pd && peer) {
		struct ibv_cq_init_attr_ex ca = { .cqe = 256, .wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_QP_NUM };
		struct ibv_qp_init_attr_ex qa = {
			.qp_type = IBV_QPT_RC,
			.cap = { .max_send_wr = 64, .max_recv_wr = 4, .max_send_sge = 2, .max_recv_sge = 1, .max_inline_data = 64 },
			.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
			.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
					  IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_ATOMIC_WRITE,
		};

		cqx = ibv_create_cq_ex(ctx, &ca);
		cq = cqx ? ibv_cq_ex_to_cq(cqx) : NULL;
		qa.send_cq = qa.recv_cq = cq;
		qa.pd = pd;
		qp = cq ? ibv_create_qp_ex(ctx, &qa) : NULL;
		qpx = qp ? ibv_qp_to_qp_ex(qp) : NULL;
	} else if (pd) {
		struct ibv_qp_init_attr qa = { .qp_type = IBV_QPT_RC,
					       .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };

		cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
		qa.send_cq = qa.recv_cq = cq;
		qp = cq ? ibv_create_qp(pd, &qa) : NULL;
	}
	if (posix_memalign((void **)&buf, 4096, SIZE))
		buf = NULL;
	if (buf)
		memset(buf, 0, SIZE);
	/* The send tests' QPs: S's recv CQ (owner) or send CQ (peer) is an
	 * extended CQ on a completion channel; the rest plain CQs. */
	sch = pd ? ibv_create_comp_channel(ctx) : NULL;
	if (sch) {
		struct ibv_cq_init_attr_ex ca = { .cqe = 64, .channel = sch,
						  .wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_QP_NUM |
							      IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_SRC_QP };

		scqx = ibv_create_cq_ex(ctx, &ca);
		scq = scqx ? ibv_cq_ex_to_cq(scqx) : NULL;
	}
	for (int i = 0; scq && i < NQ; i++) {
		struct ibv_qp_init_attr qa = { .qp_type = IBV_QPT_RC,
					       .cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 2,
							.max_recv_sge = 2, .max_inline_data = 64 } };

		ocq[i] = ibv_create_cq(ctx, 64, NULL, NULL, 0);
		qa.send_cq = i == QS && peer ? scq : ocq[i];
		qa.recv_cq = i == QS && !peer ? scq : ocq[i];
		sq[i] = ocq[i] ? ibv_create_qp(pd, &qa) : NULL;
		if (!sq[i])
			scq = NULL;
	}
	if (posix_memalign((void **)&sbuf, 4096, SIZE))
		sbuf = NULL;
	if (sbuf)
		memset(sbuf, 0, SIZE);
	smr = scq && sbuf ? ibv_reg_mr(pd, sbuf, SIZE, IBV_ACCESS_LOCAL_WRITE) : NULL;
	if (!smr)
		buf = NULL; /* setup fails */
	mr = qp && buf ? ibv_reg_mr(pd, buf, SIZE, REMOTE) : NULL;
	if (mr && !peer)
		mr2 = ibv_reg_mr(pd, buf, SIZE, IBV_ACCESS_LOCAL_WRITE);
	CHECK("setup", mr && (peer ? qpx != NULL : mr2 != NULL) && !ibv_query_gid(ctx, 1, 0, &gid), "errno %d", errno);
	return mr && (peer || mr2);
}

static void print_gid(const union ibv_gid *g)
{
	for (int i = 0; i < 16; i++)
		printf("%02x", g->raw[i]);
}

static int parse_gid(const char *s, union ibv_gid *g)
{
	if (strlen(s) != 32)
		return -1;
	for (int i = 0; i < 16; i++) {
		unsigned v;

		if (sscanf(s + 2 * i, "%2x", &v) != 1)
			return -1;
		g->raw[i] = (uint8_t)v;
	}
	return 0;
}

/* take waits (10 s at most) for one completion, with ibv_poll_cq or, with
 * ex, ibv_start_poll. */
static int take(struct ibv_wc *wc, int ex)
{
	time_t end = time(NULL) + 10;

	while (time(NULL) <= end) {
		if (ex) {
			struct ibv_poll_cq_attr pa = { 0 };
			int rc = ibv_start_poll(cqx, &pa);

			if (rc == ENOENT)
				continue;
			if (rc)
				return -1;
			memset(wc, 0, sizeof(*wc));
			wc->wr_id = cqx->wr_id;
			wc->status = cqx->status;
			wc->opcode = ibv_wc_read_opcode(cqx);
			wc->byte_len = ibv_wc_read_byte_len(cqx);
			wc->qp_num = ibv_wc_read_qp_num(cqx);
			ibv_end_poll(cqx);
			return 0;
		}
		int n = ibv_poll_cq(cq, 1, wc);

		if (n < 0)
			return -1;
		if (n == 1)
			return 0;
	}
	return -1;
}

/* post posts one WR of opcode over sge (NULL: none), signaled. */
static int post(enum ibv_wr_opcode op, struct ibv_sge *sge, int nsge, uint64_t addr, uint64_t id, unsigned flags,
		uint64_t cmp, uint64_t swap)
{
	struct ibv_send_wr wr = { .wr_id = id, .sg_list = sge, .num_sge = nsge, .opcode = op, .send_flags = flags }, *bad;

	if (op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
		wr.wr.atomic.remote_addr = addr;
		wr.wr.atomic.rkey = rkey;
		wr.wr.atomic.compare_add = cmp;
		wr.wr.atomic.swap = swap;
	} else {
		wr.wr.rdma.remote_addr = addr;
		wr.wr.rdma.rkey = rkey;
	}
	return ibv_post_send(qp, &wr, &bad);
}

/* expect takes one completion and checks it. */
static void expect(const char *name, uint64_t id, enum ibv_wc_opcode op, uint32_t len, int ex)
{
	struct ibv_wc wc;
	int rc = take(&wc, ex);

	/* ATOMIC_WRITE: the relayed path reports 0 bytes, the direct one 8
	 * (wire-local.md §4.21). */
	CHECK(name, !rc && wc.status == IBV_WC_SUCCESS && wc.wr_id == id && wc.opcode == op &&
			    (wc.byte_len == len || (op == IBV_WC_ATOMIC_WRITE && wc.byte_len == 0)) && wc.qp_num == qp->qp_num,
	      "rc %d status %s id %" PRIu64 " opcode %d len %u qpn %u", rc, ibv_wc_status_str(wc.status), wc.wr_id, wc.opcode,
	      wc.byte_len, wc.qp_num);
}

static void data(void)
{
	unsigned char *l = buf;
	struct ibv_sge s2[2] = { { (uintptr_t)l, 1000, mr->lkey }, { (uintptr_t)l + 1000, 3096, mr->lkey } };
	struct ibv_sge rd = { (uintptr_t)l + 8192, 4096, mr->lkey };
	struct ibv_sge at = { (uintptr_t)l + 16384, 8, mr->lkey };
	uint64_t old;
	int rc;

	for (int i = 0; i < 4096; i++)
		l[i] = (unsigned char)(i * 7 + 1);
	rc = post(IBV_WR_RDMA_WRITE, s2, 2, raddr, 1, IBV_SEND_SIGNALED, 0, 0);
	CHECK("post-write", !rc, "%s", strerror(rc));
	expect("write", 1, IBV_WC_RDMA_WRITE, 4096, 0);

	memset(l + 4096, 0xa5, 40);
	struct ibv_sge in = { (uintptr_t)l + 4096, 40, 0 };
	rc = post(IBV_WR_RDMA_WRITE, &in, 1, raddr + 4096, 2, IBV_SEND_SIGNALED | IBV_SEND_INLINE, 0, 0);
	CHECK("post-write-inline", !rc, "%s", strerror(rc));
	expect("write-inline", 2, IBV_WC_RDMA_WRITE, 40, 1);

	rc = post(IBV_WR_RDMA_READ, &rd, 1, raddr, 3, IBV_SEND_SIGNALED, 0, 0);
	CHECK("post-read", !rc, "%s", strerror(rc));
	expect("read", 3, IBV_WC_RDMA_READ, 4096, 0);
	CHECK("read-data", !memcmp(l + 8192, l, 4096), "the bytes read differ from those written");

	rc = post(IBV_WR_ATOMIC_FETCH_AND_ADD, &at, 1, raddr + 8192, 4, IBV_SEND_SIGNALED, 5, 0);
	expect("fetch-add", 4, IBV_WC_FETCH_ADD, 8, 1);
	memcpy(&old, l + 16384, 8);
	CHECK("fetch-add-old", !rc && old == 0, "old %" PRIu64 ", want 0", old);
	rc = post(IBV_WR_ATOMIC_FETCH_AND_ADD, &at, 1, raddr + 8192, 5, IBV_SEND_SIGNALED, 3, 0);
	expect("fetch-add-2", 5, IBV_WC_FETCH_ADD, 8, 0);
	memcpy(&old, l + 16384, 8);
	CHECK("fetch-add-2-old", !rc && old == 5, "old %" PRIu64 ", want 5", old);
	rc = post(IBV_WR_ATOMIC_CMP_AND_SWP, &at, 1, raddr + 8192, 6, IBV_SEND_SIGNALED, 8, 42);
	expect("cmp-swp-hit", 6, IBV_WC_COMP_SWAP, 8, 0);
	memcpy(&old, l + 16384, 8);
	CHECK("cmp-swp-hit-old", !rc && old == 8, "old %" PRIu64 ", want 8", old);
	rc = post(IBV_WR_ATOMIC_CMP_AND_SWP, &at, 1, raddr + 8192, 7, IBV_SEND_SIGNALED, 1, 2);
	expect("cmp-swp-miss", 7, IBV_WC_COMP_SWAP, 8, 1);
	memcpy(&old, l + 16384, 8);
	CHECK("cmp-swp-miss-old", !rc && old == 42, "old %" PRIu64 ", want 42", old);

	/* ATOMIC_WRITE and a WRITE through the ibv_wr_* API, in one batch. */
	uint64_t v = 0x1122334455667788ull;
	memset(l + 20480, 0x5a, 64);
	ibv_wr_start(qpx);
	qpx->wr_id = 8;
	qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_atomic_write(qpx, rkey, raddr + 8200, &v);
	qpx->wr_id = 9;
	qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(qpx, rkey, raddr + 12288);
	ibv_wr_set_sge(qpx, mr->lkey, (uintptr_t)l + 20480, 64);
	rc = ibv_wr_complete(qpx);
	CHECK("wr-complete", !rc, "%s", strerror(rc));
	expect("atomic-write", 8, IBV_WC_ATOMIC_WRITE, 8, 0);
	expect("wr-write", 9, IBV_WC_RDMA_WRITE, 64, 0);
	rd.length = 8;
	rd.addr = (uintptr_t)l + 24576;
	rc = post(IBV_WR_RDMA_READ, &rd, 1, raddr + 8200, 10, IBV_SEND_SIGNALED, 0, 0);
	expect("read-atomic-write", 10, IBV_WC_RDMA_READ, 8, 0);
	memcpy(&old, l + 24576, 8);
	CHECK("atomic-write-value", !rc && old == v, "read %" PRIx64 ", want %" PRIx64, old, v);

	/* Unsignaled then signaled: one completion, the second's. */
	rc = post(IBV_WR_RDMA_WRITE, s2, 1, raddr + 32768, 11, 0, 0, 0);
	rc = rc ? rc : post(IBV_WR_RDMA_WRITE, s2, 1, raddr + 32768 + 1000, 12, IBV_SEND_SIGNALED, 0, 0);
	CHECK("post-unsignaled", !rc, "%s", strerror(rc));
	expect("unsignaled-then-signaled", 12, IBV_WC_RDMA_WRITE, 1000, 0);
	struct ibv_wc wc;
	CHECK("no-more-completions", ibv_poll_cq(cq, 1, &wc) == 0, "a completion more");
}

/* check is the owner's view of data's writes. */
static void check(void)
{
	unsigned char want[4096];
	uint64_t w;
	int ok = 1;

	for (int i = 0; i < 4096; i++)
		want[i] = (unsigned char)(i * 7 + 1);
	CHECK("owner-write", !memcmp(buf, want, 4096), "the WRITE's bytes are not in the buffer");
	for (int i = 0; i < 40; i++)
		ok &= buf[4096 + i] == 0xa5;
	CHECK("owner-write-inline", ok, "the inline WRITE's bytes are not in the buffer");
	memcpy(&w, buf + 8192, 8);
	CHECK("owner-atomics", w == 42, "the atomics' word is %" PRIu64 ", want 42", w);
	memcpy(&w, buf + 8200, 8);
	CHECK("owner-atomic-write", w == 0x1122334455667788ull, "the ATOMIC_WRITE word is %" PRIx64, w);
	CHECK("owner-write-both", !memcmp(buf + 32768, want, 1000) && !memcmp(buf + 33768, want, 1000),
	      "the unsignaled and signaled WRITEs' bytes are not in the buffer");
}

/* ---- the peer's write loop ---- */

static pthread_t looper;
static volatile int loop_ok, loop_status = -1, stop;

static void *loop(void *arg)
{
	struct ibv_sge s = { (uintptr_t)buf + 40960, 4096, mr->lkey };

	(void)arg;
	for (uint64_t i = 1; !stop; i++) {
		struct ibv_wc wc;

		memcpy(buf + 40960, &i, 8);
		memset(buf + 40968, (int)(i & 0xff), 4088);
		if (post(IBV_WR_RDMA_WRITE, &s, 1, raddr + 40960, i, IBV_SEND_SIGNALED, 0, 0) || take(&wc, 0)) {
			loop_status = -2;
			return NULL;
		}
		if (wc.status != IBV_WC_SUCCESS) {
			loop_status = wc.status;
			return NULL;
		}
		__atomic_fetch_add(&loop_ok, 1, __ATOMIC_RELEASE);
	}
	loop_status = IBV_WC_SUCCESS;
	return NULL;
}

/* ---- SEND and RECV ---- */

/* ctake waits (10 s at most) for one completion of c: with ex, through
 * ibv_start_poll (c is scq). */
static int ctake(struct ibv_cq *c, struct ibv_wc *wc, int ex)
{
	time_t end = time(NULL) + 10;

	while (time(NULL) <= end) {
		if (ex) {
			struct ibv_poll_cq_attr pa = { 0 };
			int rc = ibv_start_poll(scqx, &pa);

			if (rc == ENOENT)
				continue;
			if (rc)
				return -1;
			memset(wc, 0, sizeof(*wc));
			wc->wr_id = scqx->wr_id;
			wc->status = scqx->status;
			wc->opcode = ibv_wc_read_opcode(scqx);
			wc->byte_len = ibv_wc_read_byte_len(scqx);
			wc->qp_num = ibv_wc_read_qp_num(scqx);
			wc->src_qp = ibv_wc_read_src_qp(scqx);
			wc->wc_flags = ibv_wc_read_wc_flags(scqx);
			wc->imm_data = ibv_wc_read_imm_data(scqx);
			ibv_end_poll(scqx);
			return 0;
		}
		int n = ibv_poll_cq(c, 1, wc);

		if (n < 0)
			return -1;
		if (n == 1)
			return 0;
	}
	return -1;
}

/* none reports whether c gives no completion within ms milliseconds. */
static int none(struct ibv_cq *c, int ms)
{
	struct ibv_wc wc;

	for (int i = 0; i < ms; i++) {
		if (ibv_poll_cq(c, 1, &wc) != 0)
			return 0;
		usleep(1000);
	}
	return 1;
}

static int psend(struct ibv_qp *q, enum ibv_wr_opcode op, uint64_t id, void *p, uint32_t len, unsigned flags,
		 uint32_t imm)
{
	struct ibv_sge sg = { (uintptr_t)p, len, smr->lkey };
	struct ibv_send_wr wr = { .wr_id = id, .sg_list = &sg, .num_sge = len ? 1 : 0, .opcode = op,
				  .send_flags = flags | IBV_SEND_SIGNALED, .imm_data = htobe32(imm) },
			   *bad;

	if (op == IBV_WR_RDMA_WRITE) {
		sg.lkey = mr->lkey; /* the peer's buf */
		wr.wr.rdma.remote_addr = raddr + 49152;
		wr.wr.rdma.rkey = rkey;
	}
	return ibv_post_send(q, &wr, &bad);
}

static int precv(struct ibv_qp *q, uint64_t id, void *p, uint32_t len)
{
	struct ibv_sge sg = { (uintptr_t)p, len, smr->lkey };
	struct ibv_recv_wr wr = { .wr_id = id, .sg_list = &sg, .num_sge = 1 }, *bad;

	return ibv_post_recv(q, &wr, &bad);
}

/* The messages of "sends", in posting order: their lengths (the fifth is
 * above the channel's payload: relayed). */
static const uint32_t slen[] = { 2, 64, 0, 32, 8000, 4, 0 /* the WRITE */, 8 };
#define NSEND 8
#define RSIZE 8192

static void fill(unsigned char *p, uint32_t len, int k)
{
	for (uint32_t i = 0; i < len; i++)
		p[i] = (unsigned char)(k * 31 + i * 3 + 1);
}

static void sends(void)
{
	int rc = 0;

	for (int k = 0; k < NSEND && !rc; k++) {
		unsigned char *p = sbuf + (size_t)k * RSIZE;

		fill(p, slen[k], k);
		switch (k) {
		case 1:
			rc = psend(sq[QS], IBV_WR_SEND_WITH_IMM, 100 + k, p, slen[k], 0, 0x12345678);
			break;
		case 3:
			rc = psend(sq[QS], IBV_WR_SEND, 100 + k, p, slen[k], IBV_SEND_INLINE, 0);
			break;
		case 6:
			memset(buf + 49152, 0x77, 100);
			rc = psend(sq[QS], IBV_WR_RDMA_WRITE, 100 + k, buf + 49152, 100, 0, 0);
			break;
		default:
			rc = psend(sq[QS], IBV_WR_SEND, 100 + k, p, slen[k], 0, 0);
		}
	}
	CHECK("post-sends", !rc, "%s", strerror(rc));
}

static void rcheck(void)
{
	int r = 0;

	for (int k = 0; k < NSEND; k++) {
		struct ibv_wc wc;
		unsigned char want[RSIZE];
		char name[32];
		int rc, ok;

		if (k == 6)
			continue; /* the WRITE: no receive */
		rc = ctake(scq, &wc, r % 2);
		fill(want, slen[k], k);
		snprintf(name, sizeof(name), "recv-%d", k);
		ok = !rc && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV && wc.wr_id == (uint64_t)(200 + r) &&
		     wc.byte_len == slen[k] && wc.qp_num == sq[QS]->qp_num && wc.src_qp == dqpn[QS] &&
		     !memcmp(sbuf + (size_t)r * RSIZE, want, slen[k]) &&
		     (k == 1 ? (wc.wc_flags & IBV_WC_WITH_IMM) && be32toh(wc.imm_data) == 0x12345678
			     : !(wc.wc_flags & IBV_WC_WITH_IMM));
		CHECK(name, ok,
		      "rc %d status %s opcode %d id %" PRIu64 " (want %d) len %u (want %u) qpn %u src %u (want %u) flags %x imm %x",
		      rc, ibv_wc_status_str(wc.status), wc.opcode, wc.wr_id, 200 + r, wc.byte_len, slen[k], wc.qp_num,
		      wc.src_qp, dqpn[QS], wc.wc_flags, be32toh(wc.imm_data));
		if (k == 7) {
			int w = 1;

			for (int i = 0; i < 100; i++)
				w &= buf[49152 + i] == 0x77;
			CHECK("write-before-send", w, "the WRITE posted before the last SEND is not in the buffer when it arrived");
		}
		r++;
	}
	CHECK("recv-no-more", none(scq, 100), "a completion more");
}

static void scheck(void)
{
	for (int k = 0; k < NSEND; k++) {
		struct ibv_wc wc;
		char name[32];
		int rc = ctake(scq, &wc, 1);
		enum ibv_wc_opcode op = k == 6 ? IBV_WC_RDMA_WRITE : IBV_WC_SEND;

		snprintf(name, sizeof(name), "send-%d", k);
		CHECK(name, !rc && wc.status == IBV_WC_SUCCESS && wc.opcode == op && wc.wr_id == (uint64_t)(100 + k),
		      "rc %d status %s opcode %d id %" PRIu64, rc, ibv_wc_status_str(wc.status), wc.opcode, wc.wr_id);
	}
	CHECK("send-no-more", none(scq, 100), "a completion more");
}

/* event waits (10 s at most) for an event of sch, which must be want's. */
static int event(struct ibv_cq *want)
{
	struct pollfd p = { .fd = sch->fd, .events = POLLIN };
	struct ibv_cq *got;
	void *ctx_;

	if (poll(&p, 1, 10000) != 1 || ibv_get_cq_event(sch, &got, &ctx_) || got != want)
		return -1;
	ibv_ack_cq_events(got, 1);
	return 0;
}

static pthread_t evth;
static int ev_rc = -1;
static struct ibv_wc ev_wc;

static void *evwait(void *arg)
{
	(void)arg;
	ev_rc = event(scq);
	if (!ev_rc)
		ev_rc = ctake(scq, &ev_wc, 0);
	return NULL;
}

/* send_line runs a send test's line: 0, or -1 if line is not one. */
static int send_line(const char *line)
{
	struct ibv_wc wc;
	int rc = 0;

	if (!strcmp(line, "rpost\n")) {
		for (int k = 0; k < NSEND - 1 && !rc; k++) /* the WRITE takes none */
			rc = precv(sq[QS], 200 + k, sbuf + (size_t)k * RSIZE, RSIZE);
		CHECK("post-recvs", !rc, "%s", strerror(rc));
	} else if (!strcmp(line, "sends\n")) {
		sends();
	} else if (!strcmp(line, "rcheck\n")) {
		rcheck();
	} else if (!strcmp(line, "scheck\n")) {
		scheck();
	} else if (!strcmp(line, "evarm\n")) {
		rc = precv(sq[QS], 300, sbuf, RSIZE);
		rc = rc ? rc : ibv_req_notify_cq(scq, 0);
		rc = rc ? rc : pthread_create(&evth, NULL, evwait, NULL);
		CHECK("event-arm", !rc, "%s", strerror(rc));
	} else if (!strcmp(line, "evsend\n")) {
		rc = ibv_req_notify_cq(scq, 0);
		rc = rc ? rc : psend(sq[QS], IBV_WR_SEND, 301, sbuf, 16, 0, 0);
		rc = rc ? rc : event(scq);
		rc = rc ? rc : ctake(scq, &wc, 0);
		CHECK("event-send", !rc && wc.status == IBV_WC_SUCCESS && wc.wr_id == 301, "rc %d status %s id %" PRIu64, rc,
		      ibv_wc_status_str(wc.status), wc.wr_id);
	} else if (!strcmp(line, "evcheck\n")) {
		pthread_join(evth, NULL);
		CHECK("event-recv", !ev_rc && ev_wc.status == IBV_WC_SUCCESS && ev_wc.wr_id == 300 && ev_wc.byte_len == 16,
		      "rc %d status %s id %" PRIu64 " len %u", ev_rc, ibv_wc_status_str(ev_wc.status), ev_wc.wr_id,
		      ev_wc.byte_len);
	} else if (!strcmp(line, "rnr\n")) {
		rc = psend(sq[QN], IBV_WR_SEND, 400, sbuf, 8, 0, 0);
		rc = rc ? rc : ctake(ocq[QN], &wc, 0);
		CHECK("rnr", !rc && wc.status == IBV_WC_RNR_RETRY_EXC_ERR && wc.wr_id == 400, "rc %d status %s", rc,
		      ibv_wc_status_str(wc.status));
	} else if (!strcmp(line, "epost\n")) {
		rc = precv(sq[QE], 500, sbuf, 16);
		rc = rc ? rc : precv(sq[QE], 501, sbuf + RSIZE, RSIZE);
		rc = rc ? rc : precv(sq[QE], 502, sbuf + 2 * RSIZE, RSIZE);
		CHECK("post-small-recv", !rc, "%s", strerror(rc));
	} else if (!strcmp(line, "esend\n")) {
		rc = psend(sq[QE], IBV_WR_SEND, 600, sbuf, 64, 0, 0);
		rc = rc ? rc : psend(sq[QE], IBV_WR_SEND, 601, sbuf, 8, 0, 0);
		rc = rc ? rc : psend(sq[QE], IBV_WR_SEND, 602, sbuf, 8, 0, 0);
		CHECK("post-big-send", !rc, "%s", strerror(rc));
	} else if (!strcmp(line, "echeck\n") || !strcmp(line, "echeck2\n")) {
		int owner = !strcmp(line, "echeck\n");
		uint64_t base = owner ? 500 : 600;
		enum ibv_wc_status first = owner ? IBV_WC_LOC_LEN_ERR : IBV_WC_REM_INV_REQ_ERR;

		for (int k = 0; k < 3; k++) {
			char name[32];

			rc = ctake(ocq[QE], &wc, 0);
			snprintf(name, sizeof(name), "%s-%d", owner ? "small-recv" : "big-send", k);
			CHECK(name, !rc && wc.wr_id == base + (uint64_t)k && wc.status == (k ? IBV_WC_WR_FLUSH_ERR : first),
			      "rc %d id %" PRIu64 " status %s (want %s)", rc, wc.wr_id, ibv_wc_status_str(wc.status),
			      ibv_wc_status_str(k ? IBV_WC_WR_FLUSH_ERR : first));
		}
		CHECK(owner ? "small-recv-once" : "big-send-once", none(ocq[QE], 300), "a completion more");
	} else {
		return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	int peer = argc > 1 && !strcmp(argv[1], "peer");
	char line[512];

	if (argc < 2 || !setup(peer))
		return 1;
	printf("info %u ", qp->qp_num);
	print_gid(&gid);
	if (!peer)
		printf(" %" PRIu64 " %u", (uint64_t)(uintptr_t)buf, mr->rkey);
	for (int i = 0; i < NQ; i++)
		printf(" %u", sq[i]->qp_num);
	printf("\n");
	fflush(stdout);
	while (fgets(line, sizeof(line), stdin)) {
		char g[64];
		unsigned dest;

		if (!strncmp(line, "peer ", 5)) {
			union ibv_gid pg;
			int rc = -1;

			if (peer ? sscanf(line + 5, "%u %63s %" SCNu64 " %u %u %u %u", &dest, g, &raddr, &rkey, &dqpn[QS],
					  &dqpn[QN], &dqpn[QE]) == 7
				 : sscanf(line + 5, "%u %63s %u %u %u", &dest, g, &dqpn[QS], &dqpn[QN], &dqpn[QE]) == 5)
				rc = parse_gid(g, &pg) ? -1 : connect_rc(qp, dest, &pg, REMOTE, 0, 0);
			for (int i = 0; !rc && i < NQ; i++)
				rc = connect_rc_rnr(sq[i], dqpn[i], &pg, REMOTE, 0, 0, i == QN ? 1 : 7);
			CHECK("connect", rc == 0, "%d", rc);
		} else if (!strcmp(line, "data\n")) {
			data();
		} else if (!strncmp(line, "fork ", 5) && sscanf(line + 5, "%63s", g) == 1) {
			/* A child of a process holding a grant maps neither the
			 * owner's memory nor the grant table (MADV_DONTFORK). */
			char own[96], tab[96];
			pid_t pid;
			int st = -1;

			snprintf(own, sizeof(own), "/memfd:vrdma-guest-%s", g);
			snprintf(tab, sizeof(tab), "/memfd:vrdma-grants-");
			pid = fork();
			if (pid == 0) {
				FILE *f = fopen("/proc/self/maps", "r");
				char l[512];
				int bad = f ? 0 : 2;

				while (f && fgets(l, sizeof(l), f))
					bad |= strstr(l, own) || strstr(l, tab);
				_exit(bad);
			}
			if (pid > 0)
				waitpid(pid, &st, 0);
			CHECK("fork-child-maps-no-grant", pid > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %d", st);
		} else if (!strcmp(line, "check\n")) {
			check();
		} else if (!send_line(line)) {
			/* a send test's line */
		} else if (!strcmp(line, "loop\n")) {
			/* "ok writing" once 200 WRITEs completed, then "done":
			 * printed here, in that order, so that the test reads
			 * them in that order (10 s at most). */
			time_t end = time(NULL) + 10;

			if (pthread_create(&looper, NULL, loop, NULL)) {
				CHECK("loop", 0, "pthread_create");
			} else {
				while (__atomic_load_n(&loop_ok, __ATOMIC_ACQUIRE) < 200 && loop_status == -1 &&
				       time(NULL) <= end)
					usleep(1000);
				CHECK("writing", __atomic_load_n(&loop_ok, __ATOMIC_ACQUIRE) >= 200,
				      "%d WRITEs completed (status %d), want 200", loop_ok, loop_status);
			}
		} else if (!strcmp(line, "dereg\n")) {
			static unsigned char snap[SIZE];
			int rc = ibv_dereg_mr(mr), diff = 0;

			memcpy(snap, buf, SIZE);
			CHECK("dereg", rc == 0, "%s", strerror(rc));
			usleep(300000);
			for (int i = 0; i < SIZE; i++)
				diff += snap[i] != buf[i];
			CHECK("no-write-after-dereg", diff == 0, "%d bytes changed after ibv_dereg_mr returned", diff);
		} else if (!strcmp(line, "stop\n")) {
			struct ibv_sge s = { (uintptr_t)buf, 8, mr->lkey };
			struct ibv_wc wc;
			int rc;

			stop = 1;
			pthread_join(looper, NULL);
			CHECK("loop-ended-on-error", loop_status > 0, "status %d after %d WRITEs", loop_status, loop_ok);
			rc = post(IBV_WR_RDMA_WRITE, &s, 1, raddr, 99, IBV_SEND_SIGNALED, 0, 0);
			rc = rc ? rc : take(&wc, 0);
			CHECK("later-write-error", rc == 0 && wc.status != IBV_WC_SUCCESS, "rc %d status %s", rc,
			      ibv_wc_status_str(wc.status));
		}
		printf("done\n");
		fflush(stdout);
	}
	return failed;
}
