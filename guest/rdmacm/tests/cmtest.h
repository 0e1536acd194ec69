/* SPDX-License-Identifier: Apache-2.0 */
/* The rdma_cm C tests' helpers: one event channel per program (ch), its
 * events waited for with a timeout, IPv4 addresses, and data patterns.
 * Functions are static inline: each test uses what it needs. */
#ifndef VRDMA_CM_TESTS_CMTEST_H
#define VRDMA_CM_TESTS_CMTEST_H

#include <arpa/inet.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <rdma/rdma_cma.h>

static struct rdma_event_channel *ch;

/* next waits up to ms for an event and returns it (to ack), or NULL. */
static inline struct rdma_cm_event *next(int ms)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	struct rdma_cm_event *ev;

	if (poll(&p, 1, ms) != 1)
		return NULL;
	if (rdma_get_cm_event(ch, &ev))
		return NULL;
	return ev;
}

/* expect waits for an event of type on id (any when NULL), acks the
 * others it meets on the way, and returns it unacked, or NULL. */
static inline struct rdma_cm_event *expect(enum rdma_cm_event_type type, struct rdma_cm_id *id)
{
	for (int i = 0; i < 20; i++) {
		struct rdma_cm_event *ev = next(5000);

		if (!ev)
			return NULL;
		if (ev->event == type && (!id || ev->id == id))
			return ev;
		printf("# skipped %s on %p (status %d)\n", rdma_event_str(ev->event), (void *)ev->id, ev->status);
		rdma_ack_cm_event(ev);
	}
	return NULL;
}

static inline struct sockaddr_in addr_of(const char *ip, int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };

	inet_pton(AF_INET, ip, &a.sin_addr);
	return a;
}

/* resolve makes an ID of port space ps resolved (address and route) to
 * ip:port; NULL on a failure. */
static inline struct rdma_cm_id *resolve(const char *ip, int port, enum rdma_port_space ps)
{
	struct sockaddr_in dst = addr_of(ip, port);
	struct rdma_cm_event *ev;
	struct rdma_cm_id *id;

	if (rdma_create_id(ch, &id, NULL, ps))
		return NULL;
	if (rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000) || !(ev = expect(RDMA_CM_EVENT_ADDR_RESOLVED, id)))
		goto err;
	rdma_ack_cm_event(ev);
	if (rdma_resolve_route(id, 2000) || !(ev = expect(RDMA_CM_EVENT_ROUTE_RESOLVED, id)))
		goto err;
	rdma_ack_cm_event(ev);
	return id;
err:
	rdma_destroy_id(id);
	return NULL;
}

/* dialer is resolve of an RC ID with a QP of rdma_create_qp. */
static inline struct rdma_cm_id *dialer(const char *ip, int port)
{
	struct ibv_qp_init_attr qa = { .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
				       .qp_type = IBV_QPT_RC };
	struct rdma_cm_id *id = resolve(ip, port, RDMA_PS_TCP);

	if (id && rdma_create_qp(id, NULL, &qa)) {
		rdma_destroy_id(id);
		return NULL;
	}
	return id;
}

static inline void fill(uint8_t *p, size_t n, uint8_t seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(seed + i * 7);
}

static inline int same(const void *p, size_t n, uint8_t seed)
{
	uint8_t want[256];

	fill(want, n, seed);
	return p && !memcmp(p, want, n);
}

#endif
