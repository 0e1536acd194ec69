// SPDX-License-Identifier: Apache-2.0
/*
 * xrcshare_check: an XRC target QP shared by two processes of one VM, as
 * MPI libraries share one. Three roles, each a process, driven through
 * stdin lines by internal/verbsabi (TestMiddlewareXRCOpenQP):
 *
 *   owner FILE        opens the domain of FILE (O_CREAT), makes an XRC SRQ
 *                     and the target QP; prints "info QPN SRQN GID".
 *   opener FILE QPN INI GID OTHER
 *                     opens the same domain and target QP QPN with
 *                     ibv_open_qp, after the refusals (a QP that is not a
 *                     target QP, another VM's target QP OTHER, a domain
 *                     the QP is not in, a wrong type or mask: EINVAL);
 *                     makes an XRC SRQ of its own, and connects the opened
 *                     QP to initiator INI at GID; prints "info SRQN".
 *   sender            (another VM) makes an XRC initiator QP, and in a
 *                     private domain an XRC SRQ and a target QP; prints
 *                     "info QPN SRQN TGTQPN GID".
 *
 * Then, on the lines the driver sends: "peer QPN GID SRQN-A SRQN-B" (the
 * sender connects and sends to both processes' SRQs), "wait" (owner and
 * opener take their messages, completed in their own CQs with the target
 * QP's number), "bad" (the sender names its own domain's SRQ:
 * REM_INV_REQ_ERR), "fatal" (owner and opener each get
 * IBV_EVENT_QP_FATAL for their handle of the QP), "destroy" (the owner
 * destroys its handle; the opener's keeps the QP: "query" works) and the
 * opener's "destroy" (its domain then closes).
 * Prints "ok NAME" or "FAIL NAME: why" (check.h).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "check.h"
#include "poll.h"
#include "qp.h"

#define ACC (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)
#define MSGS 8
#define SLOT 64

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static struct ibv_mr *mr;
static char *buf;

/* setup opens the first device, a PD, a CQ and a registered buffer. */
static int setup(void)
{
	struct ibv_device **list;
	int n;

	list = ibv_get_device_list(&n);
	ctx = list && n > 0 ? ibv_open_device(list[0]) : NULL;
	pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	cq = pd ? ibv_create_cq(ctx, 4 * MSGS, NULL, NULL, 0) : NULL;
	buf = calloc(1, 4 * MSGS * SLOT);
	mr = cq && buf ? ibv_reg_mr(pd, buf, 4 * MSGS * SLOT, ACC) : NULL;
	CHECK("setup", mr != NULL, "errno %d", errno);
	return mr != NULL;
}

static struct ibv_xrcd *open_domain(int fd)
{
	struct ibv_xrcd_init_attr xa = { .comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS,
					 .fd = fd,
					 .oflags = fd >= 0 ? O_CREAT : 0 };

	return ibv_open_xrcd(ctx, &xa);
}

/* xrc_srq makes an XRC SRQ of domain x completing in cq, with MSGS
 * receives posted; its number in *n. */
static struct ibv_srq *xrc_srq(struct ibv_xrcd *x, uint32_t *n)
{
	struct ibv_srq_init_attr_ex sx;
	struct ibv_srq *s;

	memset(&sx, 0, sizeof(sx));
	sx.attr.max_wr = 2 * MSGS;
	sx.attr.max_sge = 1;
	sx.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
	sx.srq_type = IBV_SRQT_XRC;
	sx.pd = pd;
	sx.xrcd = x;
	sx.cq = cq;
	s = ibv_create_srq_ex(ctx, &sx);
	if (!s || ibv_get_srq_num(s, n))
		return NULL;
	for (int i = 0; i < MSGS; i++) {
		struct ibv_sge sge = { .addr = (uintptr_t)buf + (MSGS + i) * SLOT, .length = SLOT, .lkey = mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = 100 + i, .sg_list = &sge, .num_sge = 1 }, *bad;

		if (ibv_post_srq_recv(s, &wr, &bad))
			return NULL;
	}
	return s;
}

static struct ibv_qp *target(struct ibv_xrcd *x)
{
	struct ibv_qp_init_attr_ex qx = { .qp_type = IBV_QPT_XRC_RECV, .comp_mask = IBV_QP_INIT_ATTR_XRCD, .xrcd = x };

	return ibv_create_qp_ex(ctx, &qx);
}

static void print_gid(const union ibv_gid *g)
{
	for (int i = 0; i < 16; i++)
		printf("%02x", g->raw[i]);
}

static int parse_gid(const char *s, union ibv_gid *g)
{
	for (int i = 0; i < 16; i++)
		if (sscanf(s + 2 * i, "%2hhx", &g->raw[i]) != 1)
			return 0;
	return 1;
}

/* command reads the driver's next line into line; 0 at EOF. */
static int command(char *line, size_t n)
{
	if (!fgets(line, (int)n, stdin))
		return 0;
	line[strcspn(line, "\n")] = 0;
	return 1;
}

/* take_msgs waits for MSGS receives in cq, each from target QP qpn with
 * the bytes of fill. */
static void take_msgs(uint32_t qpn, char fill)
{
	struct ibv_wc wc;
	int ok = 1, i;

	memset(&wc, 0, sizeof(wc));
	for (i = 0; i < MSGS && ok; i++) {
		ok = poll_one(cq, &wc) && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV && wc.qp_num == qpn &&
		     wc.byte_len == SLOT && wc.wr_id >= 100 && wc.wr_id < 100 + MSGS;
		for (int j = 0; ok && j < SLOT; j++)
			ok = buf[(MSGS + wc.wr_id - 100) * SLOT + j] == fill;
	}
	CHECK("recv-in-own-srq", ok, "message %d: status %d opcode %d qp_num 0x%x (target 0x%x) byte_len %u wr_id %llu", i,
	      wc.status, wc.opcode, wc.qp_num, qpn, wc.byte_len, (unsigned long long)wc.wr_id);
}

/* fatal waits (10 s at most) for IBV_EVENT_QP_FATAL of qp. */
static void fatal(struct ibv_qp *qp)
{
	struct pollfd p = { .fd = ctx->async_fd, .events = POLLIN };
	struct ibv_async_event ev;
	int ok;

	ok = poll(&p, 1, 10000) == 1 && ibv_get_async_event(ctx, &ev) == 0;
	CHECK("qp-fatal-event", ok && ev.event_type == IBV_EVENT_QP_FATAL && ev.element.qp == qp &&
				      ev.element.qp->qp_context == (void *)0x5a,
	      "event %d qp %p (want %p)", ok ? (int)ev.event_type : -1, ok ? (void *)ev.element.qp : NULL, (void *)qp);
	if (ok)
		ibv_ack_async_event(&ev);
}

static int owner(const char *file)
{
	struct ibv_xrcd *x;
	struct ibv_srq *s;
	struct ibv_qp *tgt;
	union ibv_gid gid;
	uint32_t srqn = 0;
	char line[256];
	int fd = open(file, O_RDONLY | O_CREAT, 0600);

	x = fd >= 0 ? open_domain(fd) : NULL;
	s = x ? xrc_srq(x, &srqn) : NULL;
	tgt = s ? target(x) : NULL;
	CHECK("owner-target", tgt && ibv_query_gid(ctx, 1, 0, &gid) == 0, "errno %d", errno);
	if (!tgt)
		return 1;
	tgt->qp_context = (void *)0x5a;
	printf("info %u %u ", tgt->qp_num, srqn);
	print_gid(&gid);
	printf("\n");
	fflush(stdout);
	while (command(line, sizeof(line))) {
		if (!strcmp(line, "wait"))
			take_msgs(tgt->qp_num, 'a');
		else if (!strcmp(line, "fatal"))
			fatal(tgt);
		else if (!strcmp(line, "destroy"))
			CHECK("owner-destroy", ibv_destroy_qp(tgt) == 0, "errno %d", errno);
	}
	return failed;
}

static int opener(const char *file, uint32_t qpn, uint32_t ini, const char *gids, uint32_t other)
{
	struct ibv_qp_open_attr oa;
	struct ibv_xrcd *x, *xp;
	struct ibv_srq *s;
	struct ibv_qp *rc, *q;
	struct ibv_qp_init_attr rca = { .qp_type = IBV_QPT_RC,
					.cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qia;
	union ibv_gid gid;
	uint32_t srqn = 0;
	char line[256];
	int fd = open(file, O_RDONLY);

	x = fd >= 0 ? open_domain(fd) : NULL;
	xp = open_domain(-1);
	rca.send_cq = rca.recv_cq = cq;
	rc = ibv_create_qp(pd, &rca);
	CHECK("opener-setup", x && xp && rc && parse_gid(gids, &gid), "errno %d", errno);
	if (!x || !xp || !rc)
		return 1;

	memset(&oa, 0, sizeof(oa));
	oa.comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE | IBV_QP_OPEN_ATTR_CONTEXT;
	oa.qp_type = IBV_QPT_XRC_RECV;
	oa.qp_context = (void *)0x5a;
	oa.xrcd = x;
	oa.qp_num = rc->qp_num;
	errno = 0;
	CHECK("open-not-target", !ibv_open_qp(ctx, &oa) && errno == EINVAL, "errno %d", errno);
	oa.qp_num = other;
	errno = 0;
	CHECK("open-other-vm", !ibv_open_qp(ctx, &oa) && errno == EINVAL, "errno %d", errno);
	oa.qp_num = qpn;
	oa.xrcd = xp;
	errno = 0;
	CHECK("open-other-domain", !ibv_open_qp(ctx, &oa) && errno == EINVAL, "errno %d", errno);
	oa.xrcd = x;
	oa.qp_type = IBV_QPT_RC;
	errno = 0;
	CHECK("open-wrong-type", !ibv_open_qp(ctx, &oa) && errno == EINVAL, "errno %d", errno);
	oa.qp_type = IBV_QPT_XRC_RECV;
	oa.comp_mask &= ~(uint32_t)IBV_QP_OPEN_ATTR_XRCD;
	errno = 0;
	CHECK("open-no-xrcd", !ibv_open_qp(ctx, &oa) && errno == EINVAL, "errno %d", errno);
	oa.comp_mask |= IBV_QP_OPEN_ATTR_XRCD;
	q = ibv_open_qp(ctx, &oa);
	CHECK("open-qp", q && q->qp_num == qpn && q->qp_type == IBV_QPT_XRC_RECV && q->qp_context == (void *)0x5a && q->context == ctx,
	      "errno %d", errno);
	CHECK("close-xrcd-busy-open", q && ibv_close_xrcd(x) == EBUSY, " ");
	s = q ? xrc_srq(x, &srqn) : NULL;
	CHECK("opener-srq", s != NULL, "errno %d", errno);
	if (!q || !s)
		return 1;
	CHECK("connect-opened", connect_rc(q, ini, &gid, ACC, 0, 0) == 0, "errno %d", errno);
	CHECK("query-opened", ibv_query_qp(q, &qa, IBV_QP_STATE, &qia) == 0 && qa.qp_state == IBV_QPS_RTS, "state %d",
	      qa.qp_state);
	printf("info %u\n", srqn);
	fflush(stdout);
	while (command(line, sizeof(line))) {
		if (!strcmp(line, "wait")) {
			take_msgs(qpn, 'b');
		} else if (!strcmp(line, "fatal")) {
			fatal(q);
		} else if (!strcmp(line, "query")) {
			/* The owner destroyed its handle: the QP lives on for this one. */
			CHECK("opened-outlives-creator-handle",
			      ibv_query_qp(q, &qa, IBV_QP_STATE, &qia) == 0 && qa.qp_state == IBV_QPS_ERR, "state %d",
			      qa.qp_state);
		} else if (!strcmp(line, "destroy")) {
			CHECK("opener-destroy", ibv_destroy_qp(q) == 0 && ibv_destroy_srq(s) == 0 && ibv_close_xrcd(x) == 0,
			      "errno %d", errno);
		}
	}
	return failed;
}

/* send_to posts MSGS SENDs of fill (or one, bad) from ini to XRC SRQ srqn
 * and checks their completions' status. */
static void send_to(const char *name, struct ibv_qp *ini, uint32_t srqn, char fill, int n, enum ibv_wc_status want)
{
	struct ibv_wc wc;
	int ok = 1, i;

	memset(buf, fill, MSGS * SLOT);
	memset(&wc, 0, sizeof(wc));
	for (i = 0; i < n && ok; i++) {
		struct ibv_sge sge = { .addr = (uintptr_t)buf + i * SLOT, .length = SLOT, .lkey = mr->lkey };
		struct ibv_send_wr wr = { .wr_id = i, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED },
				   *bad;

		wr.qp_type.xrc.remote_srqn = srqn;
		ok = ibv_post_send(ini, &wr, &bad) == 0 && poll_one(cq, &wc) && wc.status == want;
	}
	CHECK(name, ok, "message %d: status %s", i, ibv_wc_status_str(wc.status));
}

static int sender(void)
{
	struct ibv_qp_init_attr_ex qx;
	struct ibv_xrcd *xp;
	struct ibv_srq *s;
	struct ibv_qp *ini, *tgt;
	union ibv_gid gid, pgid;
	uint32_t srqn = 0, pqpn, sa, sb;
	char line[256], gids[64];

	xp = open_domain(-1);
	s = xp ? xrc_srq(xp, &srqn) : NULL;
	tgt = s ? target(xp) : NULL;
	memset(&qx, 0, sizeof(qx));
	qx.qp_type = IBV_QPT_XRC_SEND;
	qx.comp_mask = IBV_QP_INIT_ATTR_PD;
	qx.pd = pd;
	qx.send_cq = cq;
	qx.cap.max_send_wr = 2 * MSGS;
	qx.cap.max_send_sge = 1;
	ini = tgt ? ibv_create_qp_ex(ctx, &qx) : NULL;
	CHECK("sender-setup", ini && ibv_query_gid(ctx, 1, 0, &gid) == 0, "errno %d", errno);
	if (!ini)
		return 1;
	printf("info %u %u %u ", ini->qp_num, srqn, tgt->qp_num);
	print_gid(&gid);
	printf("\n");
	fflush(stdout);
	while (command(line, sizeof(line))) {
		if (sscanf(line, "peer %u %63s %u %u", &pqpn, gids, &sa, &sb) == 4) {
			CHECK("connect-ini", parse_gid(gids, &pgid) && connect_rc(ini, pqpn, &pgid, 0, 0, 0) == 0, "errno %d", errno);
			send_to("send-to-opener-srq", ini, sb, 'b', MSGS, IBV_WC_SUCCESS);
			send_to("send-to-owner-srq", ini, sa, 'a', MSGS, IBV_WC_SUCCESS);
		} else if (!strcmp(line, "bad")) {
			/* An SRQ of another domain (this VM's): an invalid request. */
			send_to("send-other-domain-srq", ini, srqn, 'c', 1, IBV_WC_REM_INV_REQ_ERR);
		}
	}
	return failed;
}

int main(int argc, char **argv)
{
	if (argc < 2 || !setup())
		return 1;
	if (!strcmp(argv[1], "owner") && argc == 3)
		return owner(argv[2]);
	if (!strcmp(argv[1], "opener") && argc == 7)
		return opener(argv[2], strtoul(argv[3], NULL, 0), strtoul(argv[4], NULL, 0), argv[5], strtoul(argv[6], NULL, 0));
	if (!strcmp(argv[1], "sender"))
		return sender();
	printf("FAIL usage: xrcshare_check owner FILE | opener FILE QPN INI GID OTHER | sender\n");
	return 1;
}
