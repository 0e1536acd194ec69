// SPDX-License-Identifier: Apache-2.0
/*
 * mcast_check: UD multicast on the drop-in, in one process: UD QPs sa,
 * ra, rb of one adapter, each with a CQ of its own (what lands in one is
 * that QP's). Checks: ibv_query_device's multicast limits; the refusals of
 * ibv_attach_mcast (a GID that is not multicast, an RC QP) and of
 * ibv_detach_mcast (a QP not attached); attaching twice succeeds; an
 * adapter's QPs in 1024 groups at most (ENOMEM beyond); a SEND
 * from sa to the group (AH with the group's GID, remote QPN 0xFFFFFF)
 * reaches ra and rb, with the group's GID as the GRH's destination and
 * sa's QPN as src_qp, and not sa, which is not attached; one to another
 * QPN reaches nobody; after ibv_detach_mcast rb gets nothing and ra still
 * does; attached itself, sa gets its own datagram (loopback); a QP
 * destroyed while attached leaves the group. The memcpy path delivers
 * before it completes the SEND, so a CQ that is empty once the SEND's
 * completion is in got nothing.
 * Prints "ok NAME" or "FAIL NAME: why" (check.h); driven by
 * internal/verbsabi (TestMcastVerbs), with GROUP the group's GID in argv[1].
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

#define QKEY 0x01234567u
#define SLOT (40 + 256)

static struct ibv_qp *ud_qp(struct ibv_pd *pd, struct ibv_cq *cq)
{
	struct ibv_qp_init_attr init = { .qp_type = IBV_QPT_UD, .send_cq = cq, .recv_cq = cq,
					 .cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = QKEY };
	struct ibv_qp *qp = ibv_create_qp(pd, &init);

	if (!qp || ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
		return NULL;
	a.qp_state = IBV_QPS_RTR;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE))
		return NULL;
	a.qp_state = IBV_QPS_RTS;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN))
		return NULL;
	return qp;
}

static int post_recv(struct ibv_qp *qp, struct ibv_mr *m, char *buf)
{
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = SLOT, .lkey = m->lkey };
	struct ibv_recv_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1 }, *bad;

	return ibv_post_recv(qp, &wr, &bad);
}

/* A receive completion send_group found in the sender's CQ before the
 * send's (the sender attached: it receives its own datagram first). */
static struct ibv_wc stashed;
static struct ibv_cq *stashed_cq;

/* send_group sends 64 bytes from qp through ah to QPN qpn and waits for
 * the send's completion; 1 if it completed with success. */
static int send_group(struct ibv_qp *qp, struct ibv_cq *cq, struct ibv_ah *ah, uint32_t qpn, struct ibv_mr *m,
		      char *src)
{
	struct ibv_sge sge = { .addr = (uintptr_t)src, .length = 64, .lkey = m->lkey };
	struct ibv_send_wr wr = { .wr_id = 9, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	struct ibv_wc wc;

	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = qpn;
	wr.wr.ud.remote_qkey = QKEY;
	if (ibv_post_send(qp, &wr, &bad))
		return 0;
	for (;;) {
		if (!poll_one(cq, &wc))
			return 0;
		if (wc.wr_id == 9)
			return wc.status == IBV_WC_SUCCESS;
		stashed = wc;
		stashed_cq = cq;
	}
}

/* got reports whether cq holds a receive completion now, into wc. */
static int got(struct ibv_cq *cq, struct ibv_wc *wc)
{
	if (stashed_cq == cq) {
		*wc = stashed;
		stashed_cq = NULL;
		return (wc->opcode & IBV_WC_RECV) != 0;
	}
	return ibv_poll_cq(cq, 1, wc) == 1 && (wc->opcode & IBV_WC_RECV);
}

int main(int argc, char **argv)
{
	struct ibv_context *ctx;
	struct ibv_device_attr da;
	struct ibv_pd *pd;
	struct ibv_cq *cs, *ca, *cb, *cc;
	struct ibv_qp *sa, *ra, *rb, *rc;
	struct ibv_mr *m;
	struct ibv_ah *ah;
	struct ibv_wc wc;
	union ibv_gid group, own;
	char *buf;

	if (argc < 2 || inet_pton(AF_INET6, argv[1], group.raw) != 1) {
		printf("FAIL setup: usage: mcast_check GROUP-GID\n");
		return 1;
	}
	ctx = open_first_device();
	if (!ctx)
		return 1;
	pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	cs = pd ? ibv_create_cq(ctx, 16, NULL, NULL, 0) : NULL;
	ca = pd ? ibv_create_cq(ctx, 16, NULL, NULL, 0) : NULL;
	cb = pd ? ibv_create_cq(ctx, 16, NULL, NULL, 0) : NULL;
	cc = pd ? ibv_create_cq(ctx, 16, NULL, NULL, 0) : NULL;
	buf = aligned_alloc(4096, 8 * SLOT);
	m = cc && buf ? ibv_reg_mr(pd, buf, 8 * SLOT, IBV_ACCESS_LOCAL_WRITE) : NULL;
	sa = m ? ud_qp(pd, cs) : NULL;
	ra = sa ? ud_qp(pd, ca) : NULL;
	rb = ra ? ud_qp(pd, cb) : NULL;
	CHECK("setup", rb && ibv_query_gid(ctx, 1, 0, &own) == 0, "errno %d", errno);
	if (!rb)
		return 1;

	CHECK("device-limits",
	      ibv_query_device(ctx, &da) == 0 && da.max_mcast_grp == 1024 && da.max_mcast_qp_attach == 64 &&
		      da.max_total_mcast_qp_attach == 65536,
	      "max_mcast_grp %d max_mcast_qp_attach %d max_total_mcast_qp_attach %d", da.max_mcast_grp,
	      da.max_mcast_qp_attach, da.max_total_mcast_qp_attach);

	/* Hostile: a unicast GID (the port's own), an RC QP, a detach of a
	 * QP not attached. */
	CHECK("attach-unicast-gid", ibv_attach_mcast(ra, &own, 0) == EINVAL, "%s", "accepted");
	{
		struct ibv_qp_init_attr init = { .qp_type = IBV_QPT_RC, .send_cq = cc, .recv_cq = cc,
						 .cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 } };
		struct ibv_qp *rcq = ibv_create_qp(pd, &init);

		CHECK("attach-rc-qp", rcq && ibv_attach_mcast(rcq, &group, 0) == EINVAL, "%s", "accepted");
		if (rcq)
			ibv_destroy_qp(rcq);
	}
	CHECK("detach-not-attached", ibv_detach_mcast(ra, &group, 0) == EINVAL, "%s", "accepted");

	/* max_mcast_grp: an adapter's QPs are in at most 1024 groups. */
	{
		union ibv_gid g = { .raw = { 0xff, 0x0e, [13] = 0x77 } };
		int i, ok = 1, over;

		for (i = 0; i < 1024 && ok; i++) {
			g.raw[14] = (uint8_t)(i >> 8);
			g.raw[15] = (uint8_t)i;
			ok = ibv_attach_mcast(ra, &g, 0) == 0;
		}
		g.raw[14] = 0x7f;
		over = ibv_attach_mcast(rb, &g, 0);
		CHECK("max-mcast-grp", ok && over == ENOMEM, "attached %d groups, then %d", i, over);
		for (i = 0; i < 1024; i++) {
			g.raw[14] = (uint8_t)(i >> 8);
			g.raw[15] = (uint8_t)i;
			ibv_detach_mcast(ra, &g, 0);
		}
	}

	CHECK("attach", ibv_attach_mcast(ra, &group, 0) == 0 && ibv_attach_mcast(rb, &group, 0) == 0, "errno %d", errno);
	CHECK("attach-twice", ibv_attach_mcast(ra, &group, 0) == 0, "errno %d", errno);

	{
		struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1, .grh = { .dgid = group, .hop_limit = 1 } };

		ah = ibv_create_ah(pd, &aa);
	}
	CHECK("create-ah-group", ah != NULL, "errno %d", errno);
	if (!ah)
		return 1;
	memset(buf + 7 * SLOT, 'm', 64);
	post_recv(sa, m, buf);
	post_recv(ra, m, buf + SLOT);
	post_recv(rb, m, buf + 2 * SLOT);

	CHECK("send-group", send_group(sa, cs, ah, 0xffffff, m, buf + 7 * SLOT), "%s", "the send failed");
	CHECK("members-receive",
	      got(ca, &wc) && wc.status == IBV_WC_SUCCESS && wc.byte_len == 40 + 64 && wc.src_qp == sa->qp_num &&
		      (wc.wc_flags & IBV_WC_GRH) && !memcmp(buf + SLOT + 24, group.raw, 16) &&
		      buf[SLOT + 40] == 'm' && got(cb, &wc) && wc.status == IBV_WC_SUCCESS,
	      "status %d byte_len %u src_qp 0x%x", wc.status, wc.byte_len, wc.src_qp);
	CHECK("sender-not-attached-gets-none", !got(cs, &wc), "opcode %d", wc.opcode);

	post_recv(ra, m, buf + SLOT);
	post_recv(rb, m, buf + 2 * SLOT);
	CHECK("other-qpn-reaches-nobody",
	      send_group(sa, cs, ah, ra->qp_num, m, buf + 7 * SLOT) && !got(ca, &wc) && !got(cb, &wc), "%s",
	      "a datagram to the group with another QPN was delivered");

	CHECK("detach", ibv_detach_mcast(rb, &group, 0) == 0, "errno %d", errno);
	CHECK("detached-gets-none",
	      send_group(sa, cs, ah, 0xffffff, m, buf + 7 * SLOT) && got(ca, &wc) && !got(cb, &wc), "%s",
	      "the detached QP received, or the attached one did not");

	CHECK("attach-sender", ibv_attach_mcast(sa, &group, 0) == 0, "errno %d", errno);
	post_recv(ra, m, buf + SLOT);
	CHECK("loopback-to-attached-sender",
	      send_group(sa, cs, ah, 0xffffff, m, buf + 7 * SLOT) && got(cs, &wc) && wc.src_qp == sa->qp_num &&
		      got(ca, &wc),
	      "%s", "the sender, attached, or the member did not receive");

	/* A QP destroyed while attached leaves its group; another one made
	 * afterwards is not in it. */
	CHECK("destroy-attached", ibv_destroy_qp(ra) == 0, "errno %d", errno);
	rc = ud_qp(pd, cc);
	post_recv(rc, m, buf + 3 * SLOT);
	post_recv(sa, m, buf);
	CHECK("destroyed-left-group", rc && send_group(sa, cs, ah, 0xffffff, m, buf + 7 * SLOT) && !got(cc, &wc) &&
					      got(cs, &wc), "%s", "a new QP received, or the sender did not");
	CHECK("detach-all", ibv_detach_mcast(sa, &group, 0) == 0 && ibv_destroy_ah(ah) == 0, "errno %d", errno);
	return failed;
}
