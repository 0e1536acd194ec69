// SPDX-License-Identifier: Apache-2.0
/*
 * ext_qp: an rdma_cm connection whose QPs the programs make with
 * ibv_create_qp and move themselves, as UCX's rdmacm transport and
 * rdma-core's test_rdmacm_async_traffic_external_qp do: the QP number goes
 * in conn_param->qp_num, the dialer gets CONNECT_RESPONSE (not
 * ESTABLISHED), both sides take INIT, RTR and RTS from rdma_init_qp_attr,
 * the dialer calls rdma_establish, and only then the acceptor gets
 * ESTABLISHED.
 *
 *   ext_qp server ADDR PORT [managed]
 *   ext_qp client ADDR PORT
 *
 * With "managed" the server accepts with a QP of rdma_create_qp instead,
 * which the agent moves: a mixed pair. The client sends ROUNDS numbered
 * messages, the server checks each and sends it back changed, the client
 * checks the answer; then the server disconnects. Prints "ok NAME" or
 * "FAIL NAME: why" (../../ibverbs/tests/check.h); a client that finds no
 * listener prints the event it got.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <rdma/rdma_cma.h>

#include "../../ibverbs/tests/check.h"

#define ROUNDS 20
#define MSG 64

static struct rdma_event_channel *ch;

/* expect waits up to 10 s for an event of type and returns it unacked, or
 * NULL after printing what came instead. */
static struct rdma_cm_event *expect(enum rdma_cm_event_type type)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	struct rdma_cm_event *ev;

	if (poll(&p, 1, 10000) != 1) {
		printf("# no event: want %s\n", rdma_event_str(type));
		return NULL;
	}
	if (rdma_get_cm_event(ch, &ev)) {
		printf("# rdma_get_cm_event: %s\n", strerror(errno));
		return NULL;
	}
	if (ev->event != type) {
		printf("# got %s (status %d), want %s\n", rdma_event_str(ev->event), ev->status, rdma_event_str(type));
		rdma_ack_cm_event(ev);
		return NULL;
	}
	return ev;
}

/* qp_state returns qp's state as the device reports it, -1 on error. */
static int qp_state(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;

	if (ibv_query_qp(qp, &a, IBV_QP_STATE, &ia))
		return -1;
	return a.qp_state;
}

/* to_rts moves qp through INIT, RTR and RTS with id's attributes. */
static int to_rts(struct rdma_cm_id *id, struct ibv_qp *qp)
{
	enum ibv_qp_state states[] = { IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS };

	for (size_t i = 0; i < sizeof(states) / sizeof(states[0]); i++) {
		struct ibv_qp_attr a = { .qp_state = states[i] };
		int mask;

		if (rdma_init_qp_attr(id, &a, &mask)) {
			printf("# rdma_init_qp_attr(%d): %s\n", states[i], strerror(errno));
			return -1;
		}
		if (ibv_modify_qp(qp, &a, mask)) {
			printf("# ibv_modify_qp(%d): %s\n", states[i], strerror(errno));
			return -1;
		}
	}
	return 0;
}

/* wait_wcs polls cq until it has had *sends SEND completions and *recvs
 * RECV ones, counting both down, in whatever order they come: a SEND's
 * ACK may arrive after the peer's next message. A RECV beyond *recvs
 * counts in *extra (the peer's next message, early); len gets the last
 * received length. */
static int wait_wcs(struct ibv_cq *cq, int *sends, int *recvs, int *extra, uint32_t *len)
{
	struct ibv_wc wc;

	for (long spins = 0; (*sends || *recvs) && spins < 200000000L; spins++) {
		int n = ibv_poll_cq(cq, 1, &wc);

		if (n < 0)
			return -1;
		if (n == 0)
			continue;
		if (wc.status != IBV_WC_SUCCESS || (wc.opcode != IBV_WC_SEND && wc.opcode != IBV_WC_RECV) ||
		    (wc.opcode == IBV_WC_SEND && !*sends)) {
			printf("# completion %s, opcode %d\n", ibv_wc_status_str(wc.status), wc.opcode);
			return -1;
		}
		if (wc.opcode == IBV_WC_SEND) {
			(*sends)--;
			continue;
		}
		*len = wc.byte_len;
		if (*recvs)
			(*recvs)--;
		else
			(*extra)++;
	}
	if (*sends || *recvs) {
		printf("# no completion\n");
		return -1;
	}
	return 0;
}

static int post_recv(struct ibv_qp *qp, struct ibv_mr *mr, char *buf)
{
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = MSG, .lkey = mr->lkey };
	struct ibv_recv_wr wr = { .sg_list = &sge, .num_sge = 1 }, *bad;

	return ibv_post_recv(qp, &wr, &bad);
}

static int post_send(struct ibv_qp *qp, struct ibv_mr *mr, char *buf)
{
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = MSG, .lkey = mr->lkey };
	struct ibv_send_wr wr = { .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED },
			   *bad;

	return ibv_post_send(qp, &wr, &bad);
}

/* ends are what a side holds: its CQ, its own QP (or rdma_create_qp's)
 * and a buffer of two messages (received, sent). */
struct ends {
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	char buf[2 * MSG];
};

static int make_ends(struct rdma_cm_id *id, struct ends *e, int own_qp)
{
	struct ibv_qp_init_attr ia = { .qp_type = IBV_QPT_RC, .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };

	e->pd = ibv_alloc_pd(id->verbs);
	e->cq = e->pd ? ibv_create_cq(id->verbs, 16, NULL, NULL, 0) : NULL;
	if (!e->cq)
		return -1;
	ia.send_cq = ia.recv_cq = e->cq;
	if (own_qp) {
		e->qp = ibv_create_qp(e->pd, &ia);
	} else if (rdma_create_qp(id, e->pd, &ia) == 0) {
		e->qp = id->qp;
	}
	e->mr = e->qp ? ibv_reg_mr(e->pd, e->buf, sizeof(e->buf), IBV_ACCESS_LOCAL_WRITE) : NULL;
	return e->mr ? 0 : -1;
}

static int server(struct rdma_cm_id *lid, struct sockaddr_in *a, int managed)
{
	struct rdma_cm_event *ev;
	struct rdma_cm_id *id;
	struct rdma_conn_param cp = { 0 };
	struct ends e = { 0 };
	char want[MSG];

	CHECK("bind", rdma_bind_addr(lid, (struct sockaddr *)a) == 0, "%s", strerror(errno));
	CHECK("listen", rdma_listen(lid, 4) == 0, "%s", strerror(errno));
	if (failed || !(ev = expect(RDMA_CM_EVENT_CONNECT_REQUEST)))
		return 1;
	id = ev->id;
	CHECK("request carries the dialer's QP number", ev->param.conn.qp_num != 0, "qp_num 0");
	rdma_ack_cm_event(ev);
	CHECK("server ends", make_ends(id, &e, !managed) == 0, "%s", strerror(errno));
	if (failed)
		return 1;
	if (!managed) {
		CHECK("server QP to RTS before accept", to_rts(id, e.qp) == 0, "see above");
		cp.qp_num = e.qp->qp_num;
	}
	for (int i = 0; i < 2; i++)
		post_recv(e.qp, e.mr, e.buf);
	CHECK("accept", rdma_accept(id, &cp) == 0, "%s", strerror(errno));
	if (failed || !(ev = expect(RDMA_CM_EVENT_ESTABLISHED)))
		return 1;
	rdma_ack_cm_event(ev);
	CHECK("server QP in RTS", qp_state(e.qp) == IBV_QPS_RTS, "state %d", qp_state(e.qp));
	for (int i = 0, early = 0; i < ROUNDS && !failed; i++) {
		uint32_t len = MSG;
		int sends = 0, recvs = early ? 0 : 1;

		early = 0;
		if (wait_wcs(e.cq, &sends, &recvs, &early, &len)) {
			CHECK("server receives", 0, "round %d", i);
			break;
		}
		snprintf(want, sizeof(want), "ext-qp ping %d", i);
		if (len != MSG || strcmp(e.buf, want) != 0) {
			CHECK("server's message", 0, "round %d: %u bytes \"%.20s\", want \"%s\"", i, len, e.buf, want);
			break;
		}
		post_recv(e.qp, e.mr, e.buf);
		snprintf(e.buf + MSG, MSG, "ext-qp pong %d", i);
		sends = 1;
		if (post_send(e.qp, e.mr, e.buf + MSG) || wait_wcs(e.cq, &sends, &recvs, &early, &len))
			CHECK("server sends", 0, "round %d", i);
	}
	CHECK("server exchanged every message", !failed, "see above");
	/* The client disconnects; it stays a while after (TIMEWAIT_EXIT), so
	 * that its QP is still there when this one is looked at. */
	CHECK("server gets DISCONNECTED", (ev = expect(RDMA_CM_EVENT_DISCONNECTED)) != NULL, "see above");
	if (ev)
		rdma_ack_cm_event(ev);
	if (!managed)
		CHECK("the server's own QP is left alone on the peer's disconnect", qp_state(e.qp) == IBV_QPS_RTS, "state %d",
		      qp_state(e.qp));
	CHECK("server disconnect", rdma_disconnect(id) == 0, "%s", strerror(errno));
	/* And stays until TIMEWAIT_EXIT: a workload's end flushes its peers'
	 * QPs, which the client looks at. */
	CHECK("server gets TIMEWAIT_EXIT", (ev = expect(RDMA_CM_EVENT_TIMEWAIT_EXIT)) != NULL, "see above");
	if (ev)
		rdma_ack_cm_event(ev);
	return failed;
}

static int client(struct rdma_cm_id *id, struct sockaddr_in *a)
{
	struct rdma_cm_event *ev;
	struct rdma_conn_param cp = { 0 };
	struct ends e = { 0 };
	char want[MSG];

	if (rdma_resolve_addr(id, NULL, (struct sockaddr *)a, 2000) || !(ev = expect(RDMA_CM_EVENT_ADDR_RESOLVED)))
		return 1;
	rdma_ack_cm_event(ev);
	if (rdma_resolve_route(id, 2000) || !(ev = expect(RDMA_CM_EVENT_ROUTE_RESOLVED)))
		return 1;
	rdma_ack_cm_event(ev);
	CHECK("client ends", make_ends(id, &e, 1) == 0, "%s", strerror(errno));
	if (failed)
		return 1;
	CHECK("rdma_establish before a connect", rdma_establish(id) == -1 && errno == EINVAL, "%s", strerror(errno));
	CHECK("rdma_connect without any QP", rdma_connect(id, &cp) == -1 && errno == EINVAL, "%s", strerror(errno));
	cp.qp_num = e.qp->qp_num;
	CHECK("connect", rdma_connect(id, &cp) == 0, "%s", strerror(errno));
	if (failed || !(ev = expect(RDMA_CM_EVENT_CONNECT_RESPONSE)))
		return 1; /* the event printed: a REJECTED client is run again */
	CHECK("response carries the acceptor's QP number", ev->param.conn.qp_num != 0, "qp_num 0");
	rdma_ack_cm_event(ev);
	CHECK("the agent leaves the client's own QP in RESET", qp_state(e.qp) == IBV_QPS_RESET, "state %d", qp_state(e.qp));
	CHECK("client QP to RTS", to_rts(id, e.qp) == 0, "see above");
	CHECK("establish", rdma_establish(id) == 0, "%s", strerror(errno));
	CHECK("establish twice", rdma_establish(id) == -1 && errno == EINVAL, "%s", strerror(errno));
	for (int i = 0; i < ROUNDS && !failed; i++) {
		uint32_t len = 0;
		int sends = 1, recvs = 1, extra = 0;

		post_recv(e.qp, e.mr, e.buf);
		snprintf(e.buf + MSG, MSG, "ext-qp ping %d", i);
		if (post_send(e.qp, e.mr, e.buf + MSG) || wait_wcs(e.cq, &sends, &recvs, &extra, &len) || extra) {
			CHECK("client exchanges", 0, "round %d", i);
			break;
		}
		snprintf(want, sizeof(want), "ext-qp pong %d", i);
		if (len != MSG || strcmp(e.buf, want) != 0)
			CHECK("client's answer", 0, "round %d: %u bytes \"%.20s\", want \"%s\"", i, len, e.buf, want);
	}
	CHECK("client exchanged every message", !failed, "see above");
	CHECK("client disconnect", rdma_disconnect(id) == 0, "%s", strerror(errno));
	CHECK("the client's own QP is left alone on disconnect", qp_state(e.qp) == IBV_QPS_RTS, "state %d", qp_state(e.qp));
	CHECK("client gets DISCONNECTED", (ev = expect(RDMA_CM_EVENT_DISCONNECTED)) != NULL, "see above");
	if (ev)
		rdma_ack_cm_event(ev);
	CHECK("client gets TIMEWAIT_EXIT", (ev = expect(RDMA_CM_EVENT_TIMEWAIT_EXIT)) != NULL, "see above");
	if (ev)
		rdma_ack_cm_event(ev);
	return failed;
}

int main(int argc, char **argv)
{
	struct rdma_cm_id *id;
	struct sockaddr_in a = { .sin_family = AF_INET };

	if (argc < 4 || inet_pton(AF_INET, argv[2], &a.sin_addr) != 1) {
		fprintf(stderr, "usage: ext_qp server|client ADDR PORT [managed]\n");
		return 2;
	}
	a.sin_port = htons((uint16_t)atoi(argv[3]));
	ch = rdma_create_event_channel();
	if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP)) {
		printf("FAIL setup: %s\n", strerror(errno));
		return 1;
	}
	if (strcmp(argv[1], "server") == 0)
		return server(id, &a, argc > 4 && strcmp(argv[4], "managed") == 0);
	return client(id, &a);
}
