// SPDX-License-Identifier: Apache-2.0
/*
 * hostaddr_check: rdma_cm by the host's addresses, in one process of a VM
 * in the host's network: a listener on the any address holds the port of
 * the host's addresses; a dialer resolves the host's address (argv[1]:
 * 127.0.0.1 or the host's PVRDMA address) and that port, connects, and
 * both sides report the addresses the program used; a second listener on
 * a host address and the same port is EADDRINUSE; a port nobody holds is
 * REJECTED with reason 8. Prints "ok NAME" or "FAIL NAME: why" per check
 * (../../ibverbs/tests/check.h).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <rdma/rdma_cma.h>

#include "../../ibverbs/tests/check.h"
#include "cmtest.h"

/* is reports whether sa is the IPv4 address ip and, unless port is -1,
 * port. */
static int is(const struct sockaddr *sa, const char *ip, int port)
{
	struct sockaddr_in want = addr_of(ip, port < 0 ? 0 : port);
	const struct sockaddr_in *got = (const struct sockaddr_in *)sa;

	return sa->sa_family == AF_INET && got->sin_addr.s_addr == want.sin_addr.s_addr &&
	       (port < 0 || got->sin_port == want.sin_port);
}

static const char *str(const struct sockaddr *sa)
{
	static char buf[4][64];
	static int n;
	char *b = buf[n++ % 4];

	if (sa->sa_family != AF_INET) {
		snprintf(b, 64, "family %d", sa->sa_family);
		return b;
	}
	inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, b, 48);
	snprintf(b + strlen(b), 16, ":%u", ntohs(((const struct sockaddr_in *)sa)->sin_port));
	return b;
}

int main(int argc, char **argv)
{
	const char *host = argc > 1 ? argv[1] : "127.0.0.1";
	int port = argc > 2 ? atoi(argv[2]) : 7471;
	struct ibv_qp_init_attr qa = { .cap = { .max_send_wr = 2, .max_recv_wr = 2, .max_send_sge = 1, .max_recv_sge = 1 },
				       .qp_type = IBV_QPT_RC };
	struct rdma_cm_id *l, *l2, *cli, *req = NULL;
	struct rdma_cm_event *ev;
	struct sockaddr_in a;

	ch = rdma_create_event_channel();
	CHECK("create-channel", ch != NULL, "errno %d", errno);
	if (!ch)
		return 1;

	/* A listener on the any address holds the host's port. */
	CHECK("listen-create", rdma_create_id(ch, &l, NULL, RDMA_PS_TCP) == 0, "errno %d", errno);
	a = addr_of("0.0.0.0", port);
	CHECK("listen-bind-any", rdma_bind_addr(l, (struct sockaddr *)&a) == 0, "errno %d", errno);
	CHECK("listen", rdma_listen(l, 4) == 0, "errno %d", errno);

	/* A second listener on a host address and the same port. */
	CHECK("second-create", rdma_create_id(ch, &l2, NULL, RDMA_PS_TCP) == 0, "errno %d", errno);
	a = addr_of("127.0.0.1", port);
	CHECK("second-bind-loopback", rdma_bind_addr(l2, (struct sockaddr *)&a) == 0, "errno %d", errno);
	errno = 0;
	CHECK("second-listen-eaddrinuse", rdma_listen(l2, 4) == -1 && errno == EADDRINUSE, "errno %d", errno);
	rdma_destroy_id(l2);

	/* The dialer, by the host's address. */
	cli = dialer(host, port);
	CHECK("resolve-host-address", cli != NULL, "errno %d", errno);
	if (!cli)
		return 1;
	CHECK("dialer-peer-addr", is(rdma_get_peer_addr(cli), host, port), "peer %s, want %s:%d", str(rdma_get_peer_addr(cli)),
	      host, port);
	/* From this host to its own address: from that address. */
	CHECK("dialer-local-addr", is(rdma_get_local_addr(cli), host, -1), "local %s", str(rdma_get_local_addr(cli)));
	CHECK("connect", rdma_connect(cli, NULL) == 0, "errno %d", errno);
	ev = expect(RDMA_CM_EVENT_CONNECT_REQUEST, NULL);
	CHECK("connect-request", ev && ev->listen_id == l, "event %p", (void *)ev);
	if (ev) {
		req = ev->id;
		rdma_ack_cm_event(ev);
	}
	if (!req)
		return 1;
	CHECK("request-local-addr", is(rdma_get_local_addr(req), host, port), "local %s, want %s:%d",
	      str(rdma_get_local_addr(req)), host, port);
	CHECK("request-peer-addr", is(rdma_get_peer_addr(req), host, -1), "peer %s", str(rdma_get_peer_addr(req)));
	CHECK("accept-qp", rdma_create_qp(req, NULL, &qa) == 0, "errno %d", errno);
	CHECK("accept", rdma_accept(req, NULL) == 0, "errno %d", errno);
	ev = expect(RDMA_CM_EVENT_ESTABLISHED, cli);
	CHECK("established", ev && ev->status == 0, "event %p", (void *)ev);
	if (ev)
		rdma_ack_cm_event(ev);
	CHECK("disconnect", rdma_disconnect(cli) == 0, "errno %d", errno);
	if ((ev = expect(RDMA_CM_EVENT_DISCONNECTED, NULL)))
		rdma_ack_cm_event(ev);
	if ((ev = expect(RDMA_CM_EVENT_DISCONNECTED, NULL)))
		rdma_ack_cm_event(ev);
	rdma_destroy_qp(cli);
	rdma_destroy_qp(req);
	rdma_destroy_id(cli);
	rdma_destroy_id(req);

	/* Nobody holds port + 1: the resolve finds the host, the connect is
	 * refused (IBTA reason 8). */
	cli = dialer(host, port + 1);
	CHECK("resolve-unheld-port", cli != NULL, "errno %d", errno);
	if (cli) {
		CHECK("connect-unheld-port", rdma_connect(cli, NULL) == 0, "errno %d", errno);
		ev = expect(RDMA_CM_EVENT_REJECTED, cli);
		CHECK("rejected-unheld-port", ev && ev->status == 8, "event %p status %d", (void *)ev, ev ? ev->status : 0);
		if (ev)
			rdma_ack_cm_event(ev);
		rdma_destroy_qp(cli);
		rdma_destroy_id(cli);
	}

	/* Closing the listener frees the host's port. */
	CHECK("close-listener", rdma_destroy_id(l) == 0, "errno %d", errno);
	CHECK("again-create", rdma_create_id(ch, &l2, NULL, RDMA_PS_TCP) == 0, "errno %d", errno);
	a = addr_of("127.0.0.1", port);
	CHECK("again-listen", rdma_bind_addr(l2, (struct sockaddr *)&a) == 0 && rdma_listen(l2, 4) == 0, "errno %d", errno);
	rdma_destroy_id(l2);
	rdma_destroy_event_channel(ch);
	printf(failed ? "FAILED\n" : "PASSED\n");
	return failed;
}
