// SPDX-License-Identifier: Apache-2.0
/*
 * hugetlb_check: memory regions over huge pages (MAP_HUGETLB), as
 * rdma-core's suite registers them. Two 2 MiB huge pages hold a pattern;
 * a region over part of the first (not aligned to it) and one over the
 * second with IBV_ACCESS_HUGETLB register, the pattern survives, an RDMA
 * WRITE from an ordinary region into the first lands in the program's
 * huge-page memory, and after deregistration the pattern and the WRITE's
 * bytes are still there and the mapping unmaps whole. The Go side
 * (TestVerbsABIHugePages) makes sure 2 MiB pages are allocated.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <infiniband/verbs.h>

#include "check.h"
#include "device.h"
#include "poll.h"
#include "qp.h"

#define HUGE (2u << 20)
#define ACC (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

/* intact reports whether buf's bytes are the pattern, except [skip, skip+n). */
static int intact(const unsigned char *buf, size_t len, size_t skip, size_t n)
{
	for (size_t i = 0; i < len; i++)
		if ((i < skip || i >= skip + n) && buf[i] != (unsigned char)(i * 7 + 3))
			return 0;
	return 1;
}

int main(void)
{
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qa, *qb;
	struct ibv_qp_init_attr init;
	struct ibv_mr *m1, *m2, *src;
	struct ibv_sge sge;
	struct ibv_send_wr wr, *bad;
	struct ibv_wc wc;
	union ibv_gid gid;
	unsigned char *buf, *from;
	const size_t off = 3 * 4096 + 100, n = 5000;
	int ok;

	buf = mmap(NULL, 2 * HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
	CHECK("mmap-hugetlb", buf != MAP_FAILED, "errno %d: no 2 MiB huge pages free (/proc/sys/vm/nr_hugepages)", errno);
	if (buf == MAP_FAILED)
		return 1;
	for (size_t i = 0; i < 2 * HUGE; i++)
		buf[i] = (unsigned char)(i * 7 + 3);
	from = malloc(n);
	ctx = open_first_device();
	if (!ctx || !from)
		return 1;
	pd = ibv_alloc_pd(ctx);
	cq = pd ? ibv_create_cq(ctx, 16, NULL, NULL, 0) : NULL;
	CHECK("setup", pd && cq && ibv_query_gid(ctx, 1, 0, &gid) == 0, "errno %d", errno);
	if (!cq)
		return 1;

	m1 = ibv_reg_mr(pd, buf + off, n, ACC);
	CHECK("reg-part-of-a-huge-page", m1, "errno %d", errno);
	m2 = ibv_reg_mr(pd, buf + HUGE, HUGE, ACC | IBV_ACCESS_HUGETLB);
	CHECK("reg-with-access-hugetlb", m2, "errno %d", errno);
	CHECK("pattern-after-reg", intact(buf, 2 * HUGE, 0, 0), "a byte of the huge pages changed");
	if (!m1 || !m2)
		return 1;

	memset(&init, 0, sizeof(init));
	init.send_cq = init.recv_cq = cq;
	init.qp_type = IBV_QPT_RC;
	init.cap.max_send_wr = init.cap.max_recv_wr = 4;
	init.cap.max_send_sge = init.cap.max_recv_sge = 1;
	qa = ibv_create_qp(pd, &init);
	qb = ibv_create_qp(pd, &init);
	ok = qa && qb && !connect_rc(qa, qb->qp_num, &gid, ACC, 0, 0) && !connect_rc(qb, qa->qp_num, &gid, ACC, 0, 0);
	CHECK("connect", ok, "errno %d", errno);
	if (!ok)
		return 1;
	for (size_t i = 0; i < n; i++)
		from[i] = (unsigned char)(0xa5 ^ i);
	src = ibv_reg_mr(pd, from, n, IBV_ACCESS_LOCAL_WRITE);
	sge = (struct ibv_sge){ .addr = (uintptr_t)from, .length = (uint32_t)n, .lkey = src ? src->lkey : 0 };
	memset(&wr, 0, sizeof(wr));
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.wr.rdma.remote_addr = (uintptr_t)(buf + off);
	wr.wr.rdma.rkey = m1->rkey;
	ok = src && ibv_post_send(qa, &wr, &bad) == 0 && poll_one(cq, &wc) && wc.status == IBV_WC_SUCCESS;
	CHECK("write-into-huge-page", ok && !memcmp(buf + off, from, n) && intact(buf, 2 * HUGE, off, n),
	      "status %s, bytes %s", ok ? "success" : ibv_wc_status_str(wc.status),
	      ok && !memcmp(buf + off, from, n) ? "landed, a neighbour changed" : "not where they land");

	CHECK("dereg", ibv_dereg_mr(m1) == 0 && ibv_dereg_mr(m2) == 0, "errno %d", errno);
	CHECK("contents-after-dereg", !memcmp(buf + off, from, n) && intact(buf, 2 * HUGE, off, n),
	      "the memory given back lost a byte");
	CHECK("munmap-whole", munmap(buf, 2 * HUGE) == 0, "errno %d", errno);
	ibv_destroy_qp(qa);
	ibv_destroy_qp(qb);
	if (src)
		ibv_dereg_mr(src);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	free(from);
	return failed;
}
