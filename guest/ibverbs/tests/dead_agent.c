// SPDX-License-Identifier: Apache-2.0
/*
 * dead_agent: what a program sees when its agent dies under it. It sets up
 * a context, PD, CQ with a completion channel and a QP, prints "ready",
 * waits for a line on stdin (the test kills vrdmad first), then checks that
 * every verb fails with EIO (or, on the rings, does no harm) and that
 * nothing blocks. Driven by internal/verbsabi (TestVerbsABIDeadAgent).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

#include "check.h"

int main(void)
{
	struct ibv_device **list;
	struct ibv_context *ctx;
	struct ibv_comp_channel *ch;
	struct ibv_pd *pd;
	struct ibv_cq *cq, *evcq;
	struct ibv_qp *qp;
	struct ibv_qp_init_attr init;
	struct ibv_port_attr port;
	struct ibv_device_attr dattr;
	struct ibv_wc wc;
	char line[16];
	void *evctx;
	int n, rc;

	list = ibv_get_device_list(&n);
	ctx = list && n > 0 ? ibv_open_device(list[0]) : NULL;
	pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	ch = ctx ? ibv_create_comp_channel(ctx) : NULL;
	cq = ch ? ibv_create_cq(ctx, 16, NULL, ch, 0) : NULL;
	memset(&init, 0, sizeof(init));
	init.send_cq = init.recv_cq = cq;
	init.cap.max_send_wr = init.cap.max_recv_wr = 4;
	init.cap.max_send_sge = init.cap.max_recv_sge = 1;
	init.qp_type = IBV_QPT_RC;
	qp = cq ? ibv_create_qp(pd, &init) : NULL;
	CHECK("setup", qp != NULL, "errno %d", errno);
	if (!qp)
		return 1;
	CHECK("arm", ibv_req_notify_cq(cq, 0) == 0, " ");
	printf("ready\n");
	fflush(stdout);
	if (!fgets(line, sizeof(line), stdin))
		return 1;

	errno = 0;
	CHECK("alloc-pd", ibv_alloc_pd(ctx) == NULL && errno == EIO, "errno %d", errno);
	rc = ibv_query_port(ctx, 1, &port);
	CHECK("query-port", rc == EIO, "rc %d", rc);
	rc = ibv_query_device(ctx, &dattr);
	CHECK("query-device", rc == EIO, "rc %d", rc);
	errno = 0;
	CHECK("create-cq", ibv_create_cq(ctx, 16, NULL, NULL, 0) == NULL && errno == EIO, "errno %d", errno);
	/* The CQ's event socket ends with the agent: an error, not a hang. */
	errno = 0;
	rc = ibv_get_cq_event(ch, &evcq, &evctx);
	CHECK("get-cq-event", rc == -1 && errno == EIO, "rc %d errno %d", rc, errno);
	/* The rings stay mapped: polling finds what was there (nothing). */
	CHECK("poll-cq", ibv_poll_cq(cq, 1, &wc) == 0, " ");
	errno = 0;
	CHECK("open-device", ibv_open_device(list[0]) == NULL && errno == EIO, "errno %d", errno);
	/* Teardown frees the library's side although the agent cannot answer. */
	CHECK("destroy-qp", ibv_destroy_qp(qp) == 0, " ");
	CHECK("destroy-cq", ibv_destroy_cq(cq) == 0, " ");
	CHECK("destroy-channel", ibv_destroy_comp_channel(ch) == 0, " ");
	CHECK("dealloc-pd", ibv_dealloc_pd(pd) == 0, " ");
	CHECK("close-device", ibv_close_device(ctx) == 0, " ");
	ibv_free_device_list(list);
	return failed;
}
