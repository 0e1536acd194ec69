// SPDX-License-Identifier: Apache-2.0
/*
 * Asynchronous events: ibv_get_async_event and ibv_ack_async_event.
 *
 * A context's async_fd is the agent's event socket for its adapter
 * (async-open, wire-local.md §4.13), on which the agent writes one JSON
 * event per message: IBV_EVENT_QP_FATAL when it moved one of this
 * process's QPs to ERR for an error it detected;
 * IBV_EVENT_SRQ_LIMIT_REACHED and IBV_EVENT_QP_LAST_WQE_REACHED for its
 * SRQs and the QPs on them; IBV_EVENT_COMM_EST, IBV_EVENT_SQ_DRAINED and
 * IBV_EVENT_CQ_ERR (capability qp-events); the port's events. poll and
 * epoll work on it;
 * with O_NONBLOCK an empty socket is EAGAIN, as the kernel's.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "vrdma.h"

int vrdma_async_open(struct vrdma_device *d)
{
	struct vrdma_vm *vm = vrdma_vm_get();
	struct vrdma_reply r;
	char body[64];
	int fd = -1;

	if (!vm || !(vm->s.caps & VRDMA_CAP_ASYNC_EVENTS))
		return -1;
	snprintf(body, sizeof(body), "{\"adapter\":\"%s\"}", d->adapter);
	if (vrdma_call(&vm->s, VRDMA_OP_ASYNC_OPEN, body, &r))
		return -1;
	if (!r.is_error && r.nfds > 0) {
		fd = r.fds[0];
		r.fds[0] = -1;
	}
	vrdma_reply_free(&r);
	return fd;
}

int ibv_get_async_event(struct ibv_context *context, struct ibv_async_event *event)
{
	char buf[1024];

	if (!vrdma_ctx_ok(context) || !event)
		return EINVAL;
	for (;;) {
		struct json_doc d = { 0 };
		uint32_t type = 0, handle = 0, port = 0, srq = 0, cq = 0;
		ssize_t n = recv(context->async_fd, buf, sizeof(buf), 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -1; /* errno: EAGAIN on a non-blocking fd */
		if (n == 0) {
			errno = EIO; /* the agent is gone */
			return -1;
		}
		if (json_parse(&d, buf, (int)n) || json_get_u32(&d, 0, "event", &type)) {
			json_free(&d);
			continue; /* not an event of the agent's */
		}
		json_get_u32(&d, 0, "qp", &handle);
		json_get_u32(&d, 0, "port", &port);
		json_get_u32(&d, 0, "srq", &srq);
		json_get_u32(&d, 0, "cq", &cq);
		json_free(&d);
		memset(event, 0, sizeof(*event));
		event->event_type = (enum ibv_event_type)type;
		switch (type) {
		case IBV_EVENT_QP_FATAL:
		case IBV_EVENT_QP_REQ_ERR:
		case IBV_EVENT_QP_ACCESS_ERR:
		case IBV_EVENT_COMM_EST:
		case IBV_EVENT_SQ_DRAINED:
		case IBV_EVENT_QP_LAST_WQE_REACHED:
			event->element.qp = vrdma_qp_of_handle(context, handle);
			if (!event->element.qp)
				continue; /* its QP is destroyed: the kernel drops those too */
			return 0;
		case IBV_EVENT_SRQ_ERR:
		case IBV_EVENT_SRQ_LIMIT_REACHED:
			event->element.srq = vrdma_srq_of_handle(context, srq);
			if (!event->element.srq)
				continue; /* its SRQ is destroyed */
			return 0;
		case IBV_EVENT_CQ_ERR:
			event->element.cq = vrdma_cq_of_handle(context, cq);
			if (!event->element.cq)
				continue; /* its CQ is destroyed */
			return 0;
		case IBV_EVENT_PORT_ACTIVE:
		case IBV_EVENT_PORT_ERR:
			event->element.port_num = (int)port;
			return 0;
		default:
			continue; /* an event this library does not know */
		}
	}
}

void ibv_ack_async_event(struct ibv_async_event *event)
{
	/* Nothing is held for an event: ibv_destroy_qp need not wait. */
	(void)event;
}
