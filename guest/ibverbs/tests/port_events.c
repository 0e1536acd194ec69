// SPDX-License-Identifier: Apache-2.0
/*
 * port_events: IBV_EVENT_PORT_ERR and IBV_EVENT_PORT_ACTIVE on the
 * drop-in. Two contexts of the first device; the driver (internal/verbsabi,
 * TestVerbsABIPortEvents) disconnects the adapter when this prints
 * "ready" (vrdmactl vm disconnect) and connects it again when this prints
 * "down". Each context gets PORT_ERR for port 1 through poll on its
 * async_fd, ibv_query_port then says IBV_PORT_DOWN with physical state
 * Disabled (3); then PORT_ACTIVE, and IBV_PORT_ACTIVE, LinkUp (5).
 * Prints "ok NAME" or "FAIL NAME: why" (check.h).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <infiniband/verbs.h>

#include "check.h"

/* next waits up to 10 s for ctx's next async event into ev. */
static int next(struct ibv_context *ctx, struct ibv_async_event *ev)
{
	struct pollfd p = { .fd = ctx->async_fd, .events = POLLIN };

	if (poll(&p, 1, 10000) != 1 || !(p.revents & POLLIN))
		return -1;
	return ibv_get_async_event(ctx, ev);
}

/* expect checks that each context's next event is want on port 1 and
 * that its port is then in state, physical state phys. */
static void expect(struct ibv_context **ctxs, int n, enum ibv_event_type want, enum ibv_port_state state, int phys)
{
	struct ibv_async_event ev;
	struct ibv_port_attr pa;
	char name[64];

	for (int i = 0; i < n; i++) {
		int r = next(ctxs[i], &ev);

		snprintf(name, sizeof(name), "context %d %s", i, ibv_event_type_str(want));
		CHECK(name, r == 0 && ev.event_type == want && ev.element.port_num == 1,
		      "got %d (%s) port %d, errno %d", r, r == 0 ? ibv_event_type_str(ev.event_type) : "none",
		      r == 0 ? ev.element.port_num : 0, errno);
		if (r == 0)
			ibv_ack_async_event(&ev);
		snprintf(name, sizeof(name), "context %d port %s", i, ibv_port_state_str(state));
		r = ibv_query_port(ctxs[i], 1, &pa);
		CHECK(name, r == 0 && pa.state == state && pa.phys_state == phys, "ibv_query_port %d: state %s phys %d",
		      r, ibv_port_state_str(pa.state), pa.phys_state);
	}
}

int main(void)
{
	struct ibv_device **list;
	struct ibv_context *ctxs[2];
	struct ibv_port_attr pa;
	int n;

	list = ibv_get_device_list(&n);
	if (!list || n < 1) {
		printf("FAIL setup: no device\n");
		return 1;
	}
	ctxs[0] = ibv_open_device(list[0]);
	ctxs[1] = ibv_open_device(list[0]);
	CHECK("setup", ctxs[0] && ctxs[1] && ibv_query_port(ctxs[0], 1, &pa) == 0 && pa.state == IBV_PORT_ACTIVE,
	      "errno %d", errno);
	if (!ctxs[0] || !ctxs[1])
		return 1;
	printf("ready\n");
	fflush(stdout);
	expect(ctxs, 2, IBV_EVENT_PORT_ERR, IBV_PORT_DOWN, 3);
	printf("down\n");
	fflush(stdout);
	expect(ctxs, 2, IBV_EVENT_PORT_ACTIVE, IBV_PORT_ACTIVE, 5);
	ibv_close_device(ctxs[0]);
	ibv_close_device(ctxs[1]);
	ibv_free_device_list(list);
	return failed;
}
