// SPDX-License-Identifier: Apache-2.0
/*
 * odp_check: on-demand paging regions (IBV_ACCESS_ON_DEMAND) and
 * ibv_advise_mr on the drop-in, in one process: two RC QPs of one VM.
 * Checks: ibv_query_device_ex's odp_caps (explicit ODP on every transport,
 * no implicit ODP); a region registered on demand keeps the program's
 * bytes but brings into guest memory only the pages that hold data
 * (mincore over the adopted range: the guest memory's pages, resident or
 * not), where a region without the flag has every page; PREFETCH_WRITE
 * with FLUSH and PREFETCH without it populate the ranges named,
 * PREFETCH_NO_FAULT none; advise_mr's refusals (an unknown lkey ENOENT; a
 * region not on demand, a range past its region, PREFETCH_WRITE without
 * LOCAL_WRITE, an unknown flag, no range: EINVAL); an RDMA WRITE, READ
 * and fetch-and-add on pages of the region never touched, each populating
 * the page it reaches; QP access flags that carry ON_DEMAND (as programs
 * pass their regions' flags); the program's bytes kept after
 * deregistration.
 * Prints "ok NAME" or "FAIL NAME: why" (check.h); driven by
 * internal/verbsabi (TestVerbsABIODP).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "check.h"
#include "device.h"
#include "poll.h"
#include "qp.h"

#define PG 4096
#define ODP_LEN (4u << 20)
#define PIN_LEN (1u << 20)
#define ACC (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC)

/* resident counts the pages of [p, p+len) in memory (mincore). */
static long resident(void *p, size_t len)
{
	unsigned char v[ODP_LEN / PG];
	long n = 0;

	if (len > sizeof(v) * PG || mincore(p, len, v))
		return -1;
	for (size_t i = 0; i < len / PG; i++)
		n += v[i] & 1;
	return n;
}

static int post1(struct ibv_qp *q, enum ibv_wr_opcode op, struct ibv_sge *sge, uint64_t raddr, uint32_t rkey)
{
	struct ibv_send_wr wr, *bad;

	memset(&wr, 0, sizeof(wr));
	wr.opcode = op;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.sg_list = sge;
	wr.num_sge = 1;
	if (op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
		wr.wr.atomic.remote_addr = raddr;
		wr.wr.atomic.rkey = rkey;
		wr.wr.atomic.compare_add = 1;
	} else {
		wr.wr.rdma.remote_addr = raddr;
		wr.wr.rdma.rkey = rkey;
	}
	return ibv_post_send(q, &wr, &bad);
}

int main(void)
{
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qa, *qb;
	struct ibv_qp_init_attr init;
	struct ibv_mr *pin, *odp, *ro;
	struct ibv_device_attr_ex dx;
	union ibv_gid gid;
	struct ibv_wc wc;
	struct ibv_sge sge;
	unsigned char *pbuf, *obuf, *rbuf;
	long res;
	int ok, rc;

	ctx = open_first_device();
	if (!ctx)
		return 1;
	pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	cq = pd ? ibv_create_cq(ctx, 64, NULL, NULL, 0) : NULL;
	memset(&init, 0, sizeof(init));
	init.send_cq = init.recv_cq = cq;
	init.cap.max_send_wr = init.cap.max_recv_wr = 16;
	init.cap.max_send_sge = init.cap.max_recv_sge = 1;
	init.qp_type = IBV_QPT_RC;
	qa = cq ? ibv_create_qp(pd, &init) : NULL;
	qb = qa ? ibv_create_qp(pd, &init) : NULL;
	ok = qb && ibv_query_gid(ctx, 1, 0, &gid) == 0 &&
	     connect_rc(qa, qb->qp_num, &gid, ACC | IBV_ACCESS_ON_DEMAND, 0, 0) == 0 &&
	     connect_rc(qb, qa->qp_num, &gid, ACC | IBV_ACCESS_ON_DEMAND, 0, 0) == 0;
	CHECK("setup-qp-access-on-demand", ok, "errno %d", errno);
	if (!ok)
		return 1;

	memset(&dx, 0, sizeof(dx));
	rc = ibv_query_device_ex(ctx, NULL, &dx);
	CHECK("odp-caps",
	      rc == 0 && dx.odp_caps.general_caps == IBV_ODP_SUPPORT &&
		      dx.odp_caps.per_transport_caps.rc_odp_caps ==
			      (IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ |
			       IBV_ODP_SUPPORT_ATOMIC | IBV_ODP_SUPPORT_SRQ_RECV) &&
		      dx.odp_caps.per_transport_caps.uc_odp_caps ==
			      (IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_SRQ_RECV) &&
		      dx.odp_caps.per_transport_caps.ud_odp_caps ==
			      (IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_SRQ_RECV),
	      "rc %d general 0x%llx rc 0x%x uc 0x%x ud 0x%x", rc, (unsigned long long)dx.odp_caps.general_caps,
	      dx.odp_caps.per_transport_caps.rc_odp_caps, dx.odp_caps.per_transport_caps.uc_odp_caps,
	      dx.odp_caps.per_transport_caps.ud_odp_caps);

	/* A pinned region: every page in guest memory at registration. */
	pbuf = mmap(NULL, PIN_LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	pbuf[5] = 0x5a;
	pin = ibv_reg_mr(pd, pbuf, PIN_LEN, ACC);
	res = pin ? resident(pbuf, PIN_LEN) : -1;
	CHECK("pinned-all-pages", res == PIN_LEN / PG && pbuf[5] == 0x5a, "resident %ld of %u, errno %d", res, PIN_LEN / PG,
	      errno);

	/* An on-demand region of 1024 pages, two of them with data. */
	obuf = mmap(NULL, ODP_LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	memset(obuf + 3 * PG, 0xa3, PG);
	obuf[700 * PG + 17] = 0x7e;
	odp = ibv_reg_mr(pd, obuf, ODP_LEN, ACC | IBV_ACCESS_ON_DEMAND);
	res = odp ? resident(obuf, ODP_LEN) : -1;
	CHECK("on-demand-data-pages-only", res == 2, "resident %ld of %u, errno %d", res, ODP_LEN / PG, errno);
	if (!pin || !odp)
		return 1;

	/* Prefetch. */
	sge = (struct ibv_sge){ .addr = (uintptr_t)obuf + (1u << 20), .length = 16 * PG, .lkey = odp->lkey };
	rc = ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH, &sge, 1);
	res = resident(obuf + (1u << 20), 16 * PG);
	CHECK("prefetch-write-flush", rc == 0 && res == 16, "rc %d resident %ld", rc, res);
	sge.addr = (uintptr_t)obuf + (3u << 20);
	rc = ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT, IBV_ADVISE_MR_FLAG_FLUSH, &sge, 1);
	res = resident(obuf + (3u << 20), 16 * PG);
	CHECK("prefetch-no-fault-populates-nothing", rc == 0 && res == 0, "rc %d resident %ld", rc, res);
	rc = ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &sge, 1);
	res = resident(obuf + (3u << 20), 16 * PG);
	CHECK("prefetch-read-async", rc == 0 && res == 16, "rc %d resident %ld", rc, res);
	CHECK("prefetch-only-ranges", resident(obuf, ODP_LEN) == 2 + 16 + 16, "resident %ld", resident(obuf, ODP_LEN));
	/* The program's reads populate what they touch: every page, here. */
	ok = 1;
	for (size_t i = 0; ok && i < ODP_LEN; i++)
		ok = obuf[i] == (i / PG == 3 ? 0xa3 : i == 700 * PG + 17 ? 0x7e : 0);
	CHECK("on-demand-bytes-kept", ok && resident(obuf, ODP_LEN) == ODP_LEN / PG, "a byte changed");

	/* advise_mr's refusals. */
	sge = (struct ibv_sge){ .addr = (uintptr_t)obuf, .length = PG, .lkey = odp->lkey ^ 0x5500 };
	rc = ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, IBV_ADVISE_MR_FLAG_FLUSH, &sge, 1);
	CHECK("advise-unknown-lkey", rc == ENOENT, "rc %d", rc);
	sge = (struct ibv_sge){ .addr = (uintptr_t)pbuf, .length = PG, .lkey = pin->lkey };
	rc = ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, IBV_ADVISE_MR_FLAG_FLUSH, &sge, 1);
	CHECK("advise-not-on-demand", rc == EINVAL, "rc %d", rc);
	sge = (struct ibv_sge){ .addr = (uintptr_t)obuf + ODP_LEN - 8, .length = 16, .lkey = odp->lkey };
	rc = ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, IBV_ADVISE_MR_FLAG_FLUSH, &sge, 1);
	CHECK("advise-past-region", rc == EINVAL, "rc %d", rc);
	sge = (struct ibv_sge){ .addr = (uintptr_t)obuf, .length = PG, .lkey = odp->lkey };
	rc = ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 2, &sge, 1);
	CHECK("advise-unknown-flag", rc == EINVAL, "rc %d", rc);
	rc = ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &sge, 0);
	CHECK("advise-no-range", rc == EINVAL, "rc %d", rc);
	rbuf = mmap(NULL, 16 * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ro = ibv_reg_mr(pd, rbuf, 16 * PG, IBV_ACCESS_REMOTE_READ | IBV_ACCESS_ON_DEMAND);
	sge = (struct ibv_sge){ .addr = (uintptr_t)rbuf, .length = PG, .lkey = ro ? ro->lkey : 0 };
	rc = ro ? ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH, &sge, 1) : -1;
	CHECK("advise-write-without-local-write", rc == EINVAL, "rc %d errno %d", rc, errno);

	/* The device's first access populates the page it reaches: pages of
	 * a second on-demand region, untouched. */
	ibv_dereg_mr(odp);
	munmap(obuf, ODP_LEN);
	obuf = mmap(NULL, ODP_LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	memset(obuf + 3 * PG, 0xa3, PG);
	obuf[700 * PG + 17] = 0x7e;
	odp = ibv_reg_mr(pd, obuf, ODP_LEN, ACC | IBV_ACCESS_ON_DEMAND);
	if (!odp) {
		printf("FAIL reregister: errno %d\n", errno);
		return 1;
	}
	memset(pbuf, 0x11, 64);
	sge = (struct ibv_sge){ .addr = (uintptr_t)pbuf, .length = 64, .lkey = pin->lkey };
	ok = post1(qa, IBV_WR_RDMA_WRITE, &sge, (uintptr_t)obuf + (2u << 20) + 100, odp->rkey) == 0 && poll_one(cq, &wc) &&
	     wc.status == IBV_WC_SUCCESS;
	res = resident(obuf + (2u << 20), PG);
	CHECK("write-into-untouched-page", ok && res == 1 && obuf[(2u << 20) + 100] == 0x11 && obuf[(2u << 20) + 163] == 0x11 &&
						   obuf[(2u << 20) + 164] == 0,
	      "status %d byte 0x%x", wc.status, obuf[(2u << 20) + 100]);
	memset(pbuf + 128, 0xff, 64);
	sge.addr = (uintptr_t)pbuf + 128;
	ok = post1(qa, IBV_WR_RDMA_READ, &sge, (uintptr_t)obuf + (2u << 20) + 5 * PG, odp->rkey) == 0 && poll_one(cq, &wc) &&
	     wc.status == IBV_WC_SUCCESS;
	CHECK("read-untouched-page-zeros", ok && pbuf[128] == 0 && pbuf[191] == 0, "status %d byte 0x%x", wc.status, pbuf[128]);
	sge.length = 8;
	ok = post1(qa, IBV_WR_ATOMIC_FETCH_AND_ADD, &sge, (uintptr_t)obuf + (2u << 20) + 9 * PG, odp->rkey) == 0 &&
	     poll_one(cq, &wc) && wc.status == IBV_WC_SUCCESS;
	CHECK("atomic-untouched-page", ok && *(uint64_t *)(pbuf + 128) == 0 && *(uint64_t *)(obuf + (2u << 20) + 9 * PG) == 1,
	      "status %d", wc.status);

	/* Deregistration gives the pages back with the bytes. */
	rc = ibv_dereg_mr(odp);
	CHECK("dereg-keeps-bytes", rc == 0 && obuf[3 * PG + 9] == 0xa3 && obuf[700 * PG + 17] == 0x7e &&
					   obuf[(2u << 20) + 100] == 0x11 && *(uint64_t *)(obuf + (2u << 20) + 9 * PG) == 1,
	      "rc %d", rc);
	obuf[(3u << 20) + 1] = 1; /* private memory again: writable */
	CHECK("dereg-private-again", obuf[(3u << 20) + 1] == 1, "not writable");
	if (ro)
		ibv_dereg_mr(ro);
	ibv_dereg_mr(pin);
	ibv_destroy_qp(qb);
	ibv_destroy_qp(qa);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	return failed;
}
