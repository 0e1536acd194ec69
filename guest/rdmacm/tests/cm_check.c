// SPDX-License-Identifier: Apache-2.0
/*
 * cm_check: the drop-in librdmacm's events, private data and refusals, in
 * one process: a listener and dialers on one event channel, connecting to
 * the VM's own adapter by its IP address (argv[1]). Prints "ok NAME" or
 * "FAIL NAME: why" per check (../../ibverbs/tests/check.h).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#include "../../ibverbs/tests/check.h"
#include "cmtest.h"

int main(int argc, char **argv)
{
	const char *ip = argc > 1 ? argv[1] : "";
	int port = argc > 2 ? atoi(argv[2]) : 7471;
	struct rdma_cm_id *listen_id, *cli, *req;
	struct rdma_cm_event *ev;
	struct rdma_conn_param cp;
	uint8_t pd[256];
	struct sockaddr_in a;
	int flags;

	ch = rdma_create_event_channel();
	CHECK("create-channel", ch && ch->fd >= 0, "errno %d", errno);
	if (!ch)
		return 1;

	/* Binding an address no adapter of this VM has. */
	{
		struct rdma_cm_id *id;

		a = addr_of("10.255.255.254", port);
		CHECK("create-id", rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0, "errno %d", errno);
		errno = 0;
		CHECK("bind-foreign-address", rdma_bind_addr(id, (struct sockaddr *)&a) == -1 && errno == EADDRNOTAVAIL,
		      "errno %d", errno);
		/* Resolving an address nobody has: ADDR_ERROR. */
		a = addr_of("10.255.255.254", port);
		CHECK("resolve-nobody", rdma_resolve_addr(id, NULL, (struct sockaddr *)&a, 2000) == 0, "errno %d", errno);
		ev = expect(RDMA_CM_EVENT_ADDR_ERROR, id);
		CHECK("addr-error", ev && ev->status < 0, "event %p status %d", (void *)ev, ev ? ev->status : 0);
		if (ev)
			rdma_ack_cm_event(ev);
		CHECK("destroy-id", rdma_destroy_id(id) == 0, "errno %d", errno);
	}

	/* A listener on every adapter (0.0.0.0). */
	CHECK("listen-create", rdma_create_id(ch, &listen_id, (void *)0x1157, RDMA_PS_TCP) == 0, "errno %d", errno);
	a = addr_of("0.0.0.0", port);
	CHECK("listen-bind-any", rdma_bind_addr(listen_id, (struct sockaddr *)&a) == 0, "errno %d", errno);
	CHECK("listen", rdma_listen(listen_id, 8) == 0, "errno %d", errno);
	CHECK("src-port", rdma_get_src_port(listen_id) == htons((uint16_t)port), "port %u", ntohs(rdma_get_src_port(listen_id)));

	/* Connect: 57 bytes of private data are refused, 56 go. */
	cli = dialer(ip, port);
	CHECK("resolve", cli && cli->verbs && cli->qp && cli->route.num_paths == 1, "cli %p", (void *)cli);
	if (!cli)
		return 1;
	CHECK("dst-port", rdma_get_dst_port(cli) == htons((uint16_t)port), "port %u", ntohs(rdma_get_dst_port(cli)));
	memset(&cp, 0, sizeof(cp));
	cp.private_data = pd;
	cp.private_data_len = 57;
	errno = 0;
	CHECK("connect-pdata-57", rdma_connect(cli, &cp) == -1 && errno == EINVAL, "errno %d", errno);
	fill(pd, 56, 1);
	cp.private_data_len = 56;
	CHECK("connect", rdma_connect(cli, &cp) == 0, "errno %d", errno);
	ev = expect(RDMA_CM_EVENT_CONNECT_REQUEST, NULL);
	CHECK("connect-request", ev && ev->listen_id == listen_id && ev->id && ev->id != listen_id &&
					 ev->id->context == (void *)0x1157 && ev->id->verbs,
	      "event %p", (void *)ev);
	if (!ev)
		return 1;
	CHECK("request-pdata", ev->param.conn.private_data_len >= 56 && same(ev->param.conn.private_data, 56, 1),
	      "len %u", ev->param.conn.private_data_len);
	req = ev->id;
	CHECK("request-peer-address",
	      req->route.addr.dst_addr.sa_family == AF_INET &&
		      req->route.addr.dst_sin.sin_addr.s_addr == addr_of(ip, 0).sin_addr.s_addr,
	      "family %d", req->route.addr.dst_addr.sa_family);
	rdma_ack_cm_event(ev);
	/* Reject: 149 bytes refused; 148 reach the dialer with reason 28. */
	errno = 0;
	CHECK("reject-pdata-149", rdma_reject(req, pd, 149) == -1 && errno == EINVAL, "errno %d", errno);
	fill(pd, 148, 2);
	CHECK("reject", rdma_reject(req, pd, 148) == 0, "errno %d", errno);
	ev = expect(RDMA_CM_EVENT_REJECTED, cli);
	CHECK("rejected-consumer", ev && ev->status == 28, "status %d", ev ? ev->status : 0);
	CHECK("rejected-pdata", ev && ev->param.conn.private_data_len == 148 && same(ev->param.conn.private_data, 148, 2),
	      "len %u", ev ? ev->param.conn.private_data_len : 0);
	if (ev)
		rdma_ack_cm_event(ev);
	rdma_destroy_id(req);
	rdma_destroy_qp(cli);
	rdma_destroy_id(cli);

	/* Accept: 197 bytes refused; 196 reach the dialer's ESTABLISHED. */
	cli = dialer(ip, port);
	CHECK("connect-2", cli && rdma_connect(cli, NULL) == 0, "errno %d", errno);
	ev = expect(RDMA_CM_EVENT_CONNECT_REQUEST, NULL);
	CHECK("connect-request-2", ev != NULL, "no event");
	if (!ev || !cli)
		return 1;
	req = ev->id;
	rdma_ack_cm_event(ev);
	{
		struct ibv_qp_init_attr qa = { .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
					       .qp_type = IBV_QPT_RC };
		struct ibv_srq_init_attr sa = { .attr = { .max_wr = 8, .max_sge = 1 } };

		/* The acceptor's QP takes its receives from the ID's SRQ. */
		CHECK("accept-srq", rdma_create_srq(req, NULL, &sa) == 0 && req->srq && sa.attr.max_wr >= 8, "errno %d", errno);
		CHECK("accept-qp", rdma_create_qp(req, NULL, &qa) == 0, "errno %d", errno);
		CHECK("accept-qp-on-srq", req->qp && req->srq && req->qp->srq == req->srq, " ");
	}
	memset(&cp, 0, sizeof(cp));
	cp.private_data = pd;
	cp.private_data_len = 197;
	errno = 0;
	CHECK("accept-pdata-197", rdma_accept(req, &cp) == -1 && errno == EINVAL, "errno %d", errno);
	fill(pd, 196, 3);
	cp.private_data_len = 196;
	CHECK("accept", rdma_accept(req, &cp) == 0, "errno %d", errno);
	{
		int dialer_ok = 0, acceptor_ok = 0;

		for (int i = 0; i < 2; i++) {
			ev = expect(RDMA_CM_EVENT_ESTABLISHED, NULL);
			if (!ev)
				break;
			if (ev->id == cli)
				dialer_ok = ev->param.conn.private_data_len == 196 &&
					    same(ev->param.conn.private_data, 196, 3);
			if (ev->id == req)
				acceptor_ok = 1;
			rdma_ack_cm_event(ev);
		}
		CHECK("established-dialer", dialer_ok, "no ESTABLISHED with the REP's 196 bytes");
		CHECK("established-acceptor", acceptor_ok, "no ESTABLISHED");
	}
	{
		struct ibv_qp_attr qa;
		struct ibv_qp_init_attr qi;

		CHECK("qp-rts", ibv_query_qp(cli->qp, &qa, IBV_QP_STATE, &qi) == 0 && qa.qp_state == IBV_QPS_RTS,
		      "state %d", qa.qp_state);
	}
	/* A non-blocking channel with nothing in it. */
	flags = fcntl(ch->fd, F_GETFL);
	fcntl(ch->fd, F_SETFL, flags | O_NONBLOCK);
	errno = 0;
	CHECK("nonblocking-empty", rdma_get_cm_event(ch, &ev) == -1 && errno == EAGAIN, "errno %d", errno);
	fcntl(ch->fd, F_SETFL, flags);

	/* Disconnect: DISCONNECTED on both sides, then TIMEWAIT_EXIT (their
	 * QPs still exist). */
	CHECK("disconnect", rdma_disconnect(cli) == 0, "errno %d", errno);
	{
		int dis = 0, tw = 0;

		for (int i = 0; i < 8 && (dis != 3 || tw != 3); i++) {
			ev = next(3000);
			if (!ev)
				break;
			if (ev->event == RDMA_CM_EVENT_DISCONNECTED)
				dis |= ev->id == cli ? 1 : ev->id == req ? 2 : 4;
			if (ev->event == RDMA_CM_EVENT_TIMEWAIT_EXIT)
				tw |= ev->id == cli ? 1 : ev->id == req ? 2 : 4;
			rdma_ack_cm_event(ev);
		}
		CHECK("disconnected-both", dis == 3, "mask %d", dis);
		CHECK("timewait-exit-both", tw == 3, "mask %d", tw);
	}
	{
		struct ibv_qp_attr qa;
		struct ibv_qp_init_attr qi;

		/* The disconnecting side's QP is in ERR; the other's waits for
		 * its own rdma_disconnect, as with the kernel's rdma_cm. */
		CHECK("qp-err", ibv_query_qp(cli->qp, &qa, IBV_QP_STATE, &qi) == 0 && qa.qp_state == IBV_QPS_ERR,
		      "state %d", qa.qp_state);
		CHECK("passive-disconnect", rdma_disconnect(req) == 0, "errno %d", errno);
	}
	errno = 0;
	CHECK("disconnect-twice", rdma_disconnect(cli) == -1 && errno == EINVAL, "errno %d", errno);
	rdma_destroy_qp(req);
	rdma_destroy_srq(req);
	CHECK("destroy-srq", req->srq == NULL, " ");
	rdma_destroy_id(req);
	rdma_destroy_qp(cli);
	rdma_destroy_id(cli);

	/* QPs the program makes and moves itself (conn_param->qp_num): the
	 * dialer gets CONNECT_RESPONSE, the acceptor's ESTABLISHED waits for
	 * rdma_establish, and rdma_init_qp_attr gives each side the other's
	 * QP number and matching PSNs. */
	{
		struct ibv_qp_init_attr qa = { .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
					       .qp_type = IBV_QPT_RC };
		struct ibv_qp_attr ra, sa, pra, psa;
		struct ibv_qp *dq = NULL, *aq = NULL;
		struct ibv_cq *cq = NULL;
		int m;

		cli = dialer(ip, port);
		if (cli) {
			rdma_destroy_qp(cli); /* the dialer's own QP instead */
			cq = ibv_create_cq(cli->verbs, 8, NULL, NULL, 0);
			qa.send_cq = qa.recv_cq = cq;
			dq = cq ? ibv_create_qp(cli->pd ? cli->pd : ibv_alloc_pd(cli->verbs), &qa) : NULL;
		}
		memset(&cp, 0, sizeof(cp));
		cp.qp_num = dq ? dq->qp_num : 0;
		CHECK("ext-connect", dq && rdma_connect(cli, &cp) == 0, "errno %d", errno);
		ev = dq ? expect(RDMA_CM_EVENT_CONNECT_REQUEST, NULL) : NULL;
		req = ev ? ev->id : NULL;
		CHECK("ext-request-qpn", ev && ev->param.conn.qp_num == cp.qp_num, "qp_num %u, want %u", ev ? ev->param.conn.qp_num : 0,
		      cp.qp_num);
		if (ev)
			rdma_ack_cm_event(ev);
		aq = req ? ibv_create_qp(dq->pd, &qa) : NULL;
		pra.qp_state = IBV_QPS_RTR;
		psa.qp_state = IBV_QPS_RTS;
		CHECK("ext-acceptor-attrs", aq && rdma_init_qp_attr(req, &pra, &m) == 0 && rdma_init_qp_attr(req, &psa, &m) == 0 &&
						    pra.dest_qp_num == dq->qp_num,
		      "errno %d", errno);
		memset(&cp, 0, sizeof(cp));
		cp.qp_num = aq ? aq->qp_num : 0;
		CHECK("ext-accept", aq && rdma_accept(req, &cp) == 0, "errno %d", errno);
		ev = aq ? expect(RDMA_CM_EVENT_CONNECT_RESPONSE, cli) : NULL;
		CHECK("ext-connect-response", ev && ev->param.conn.qp_num == cp.qp_num, "event %p", (void *)ev);
		if (ev)
			rdma_ack_cm_event(ev);
		ra.qp_state = IBV_QPS_RTR;
		sa.qp_state = IBV_QPS_RTS;
		CHECK("ext-dialer-attrs",
		      ev && rdma_init_qp_attr(cli, &ra, &m) == 0 && rdma_init_qp_attr(cli, &sa, &m) == 0 && ra.dest_qp_num == aq->qp_num &&
			      ra.rq_psn == psa.sq_psn && pra.rq_psn == sa.sq_psn && ra.path_mtu == pra.path_mtu,
		      "dest %u (want %u), dialer rq %u / acceptor sq %u, acceptor rq %u / dialer sq %u, mtu %d / %d",
		      ra.dest_qp_num, aq ? aq->qp_num : 0, ra.rq_psn, psa.sq_psn, pra.rq_psn, sa.sq_psn, ra.path_mtu, pra.path_mtu);
		ev = next(300);
		CHECK("ext-no-established-before-establish", ev == NULL, "%s", ev ? rdma_event_str(ev->event) : "");
		if (ev)
			rdma_ack_cm_event(ev);
		CHECK("ext-establish", rdma_establish(cli) == 0, "errno %d", errno);
		ev = expect(RDMA_CM_EVENT_ESTABLISHED, req);
		CHECK("ext-established-acceptor", ev != NULL, "no ESTABLISHED after rdma_establish");
		if (ev)
			rdma_ack_cm_event(ev);
		if (dq)
			ibv_destroy_qp(dq);
		if (aq)
			ibv_destroy_qp(aq);
		if (req)
			rdma_destroy_id(req);
		if (cli)
			rdma_destroy_id(cli);
		if (cq)
			ibv_destroy_cq(cq);
	}

	/* A port nobody listens on: REJECTED, reason 8. */
	cli = dialer(ip, port + 1);
	CHECK("connect-no-listener", cli && rdma_connect(cli, NULL) == 0, "errno %d", errno);
	ev = cli ? expect(RDMA_CM_EVENT_REJECTED, cli) : NULL;
	CHECK("rejected-no-listener", ev && ev->status == 8, "status %d", ev ? ev->status : 0);
	if (ev)
		rdma_ack_cm_event(ev);
	if (cli) {
		rdma_destroy_qp(cli);
		rdma_destroy_id(cli);
	}

	/* The rest of the surface. */
	{
		struct rdma_addrinfo hints = { .ai_port_space = RDMA_PS_TCP }, *res = NULL;
		struct ibv_context **devs;
		uint8_t tos = 32;
		int n = 0;

		CHECK("getaddrinfo", rdma_getaddrinfo(ip, "7471", &hints, &res) == 0 && res && res->ai_dst_addr &&
					     res->ai_qp_type == IBV_QPT_RC && res->ai_port_space == RDMA_PS_TCP,
		      "res %p", (void *)res);
		rdma_freeaddrinfo(res);
		devs = rdma_get_devices(&n);
		CHECK("get-devices", devs && n >= 1 && devs[0] && !devs[n], "n %d", n);
		rdma_free_devices(devs);
		CHECK("set-option-tos", rdma_set_option(listen_id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, 1) == 0,
		      "errno %d", errno);
		CHECK("event-str", !strcmp(rdma_event_str(RDMA_CM_EVENT_ESTABLISHED), "RDMA_CM_EVENT_ESTABLISHED"), " ");
		errno = 0;
		CHECK("join-multicast-unicast-address", rdma_join_multicast(listen_id, (struct sockaddr *)&a, NULL) == -1 && errno == EINVAL,
		      "errno %d", errno);
	}
	CHECK("destroy-listen", rdma_destroy_id(listen_id) == 0, "errno %d", errno);
	rdma_destroy_event_channel(ch);
	return failed;
}
