// SPDX-License-Identifier: Apache-2.0
/*
 * interop: the C side of a C <-> Go pair (TestVerbsABIInterop). Protocol on
 * stdin/stdout, one line each:
 *   C -> Go: "C QPN PSN GID RKEY ADDR"   (ADDR: this program's virtual address)
 *   Go -> C: "G QPN PSN GID RKEY ADDR"   (ADDR: the Go side's guest address)
 *   C -> Go: "ready" once its QP is in RTS with a receive posted
 * Then the Go side RDMA-WRITEs 64 'G's to ADDR+100 and SENDs "from go"; the
 * C side checks both, RDMA-WRITEs 64 'C's to the Go buffer + 1024, adds 1 to
 * the Go side's word at + 512, and prints "done".
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

#include "check.h"
#include "qp.h"

#define ACC (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC)

static int wait_wc(struct ibv_cq *cq, struct ibv_wc *wc)
{
	for (long i = 0; i < 100000000; i++) {
		int n = ibv_poll_cq(cq, 1, wc);

		if (n)
			return n;
	}
	return 0;
}

int main(void)
{
	struct ibv_device **list;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	struct ibv_qp_init_attr init;
	struct ibv_sge sge;
	struct ibv_send_wr swr, *bad;
	struct ibv_recv_wr rwr, *rbad;
	struct ibv_wc wc;
	union ibv_gid gid, rgid;
	char gs[64], rgs[64];
	unsigned rqpn, rpsn, rrkey;
	unsigned long long raddr;
	char *buf;
	int n;

	list = ibv_get_device_list(&n);
	ctx = list && n ? ibv_open_device(list[0]) : NULL;
	pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	cq = pd ? ibv_create_cq(ctx, 16, NULL, NULL, 0) : NULL;
	memset(&init, 0, sizeof(init));
	init.send_cq = init.recv_cq = cq;
	init.cap.max_send_wr = init.cap.max_recv_wr = 8;
	init.cap.max_send_sge = init.cap.max_recv_sge = 1;
	init.qp_type = IBV_QPT_RC;
	qp = cq ? ibv_create_qp(pd, &init) : NULL;
	buf = malloc(4096);
	memset(buf, 'c', 4096);
	mr = qp ? ibv_reg_mr(pd, buf, 4096, ACC) : NULL;
	if (!mr || ibv_query_gid(ctx, 1, 0, &gid)) {
		printf("FAIL setup: errno %d\n", errno);
		return 1;
	}
	inet_ntop(AF_INET6, gid.raw, gs, sizeof(gs));
	printf("C %u %u %s %u %llu\n", qp->qp_num, 0x4242u, gs, mr->rkey, (unsigned long long)(uintptr_t)buf);
	fflush(stdout);
	if (scanf("G %u %u %63s %u %llu", &rqpn, &rpsn, rgs, &rrkey, &raddr) != 5 ||
	    inet_pton(AF_INET6, rgs, rgid.raw) != 1) {
		printf("FAIL exchange\n");
		return 1;
	}

	n = connect_rc(qp, rqpn, &rgid, ACC, rpsn, 0x4242);
	CHECK("connect", n == 0, "rc %d", n);
	sge = (struct ibv_sge){ (uintptr_t)(buf + 1000), 64, mr->lkey };
	memset(&rwr, 0, sizeof(rwr));
	rwr.wr_id = 1;
	rwr.sg_list = &sge;
	rwr.num_sge = 1;
	CHECK("post-recv", ibv_post_recv(qp, &rwr, &rbad) == 0, " ");
	printf("ready\n");
	fflush(stdout);

	n = wait_wc(cq, &wc);
	CHECK("recv-from-go", n == 1 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV && wc.byte_len == 7 &&
				      !memcmp(buf + 1000, "from go", 7),
	      "n %d status %d opcode %d len %u", n, wc.status, wc.opcode, wc.byte_len);
	{
		int ok = buf[99] == 'c' && buf[164] == 'c';

		for (int i = 100; i < 164; i++)
			ok = ok && buf[i] == 'G';
		CHECK("write-from-go", ok, "buf[100] %c", buf[100]);
	}

	memset(buf + 2000, 'C', 64);
	sge = (struct ibv_sge){ (uintptr_t)(buf + 2000), 64, mr->lkey };
	memset(&swr, 0, sizeof(swr));
	swr.wr_id = 2;
	swr.sg_list = &sge;
	swr.num_sge = 1;
	swr.opcode = IBV_WR_RDMA_WRITE;
	swr.send_flags = IBV_SEND_SIGNALED;
	swr.wr.rdma.remote_addr = raddr + 1024;
	swr.wr.rdma.rkey = rrkey;
	n = ibv_post_send(qp, &swr, &bad);
	n = n ? -n : wait_wc(cq, &wc);
	CHECK("write-to-go", n == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 2, "n %d status %d", n, wc.status);

	sge = (struct ibv_sge){ (uintptr_t)(buf + 3000), 8, mr->lkey };
	swr.wr_id = 3;
	swr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
	swr.wr.atomic.remote_addr = raddr + 512;
	swr.wr.atomic.rkey = rrkey;
	swr.wr.atomic.compare_add = 1;
	n = ibv_post_send(qp, &swr, &bad);
	n = n ? -n : wait_wc(cq, &wc);
	CHECK("fetch-add-on-go", n == 1 && wc.status == IBV_WC_SUCCESS && *(uint64_t *)(buf + 3000) == 41,
	      "n %d status %d old %llu", n, wc.status, (unsigned long long)*(uint64_t *)(buf + 3000));
	printf("done\n");
	fflush(stdout);
	return failed;
}
