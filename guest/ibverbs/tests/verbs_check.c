// SPDX-License-Identifier: Apache-2.0
/*
 * verbs_check: memory regions over program memory and the RC data path of
 * the drop-in, through the real <infiniband/verbs.h>, in one process: two
 * QPs of one VM connected to each other. Run as a workload (VRDMA_VM); it
 * prints "ok NAME" or "FAIL NAME: why" per check and exits 1 if any failed.
 * Thread and parent domains (parent_domains), imported contexts, PDs and
 * MRs (imports) too. Driven by
 * internal/verbsabi (TestVerbsABIVerbs).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "check.h"
#include "device.h"
#include "qp.h"

/* A program's static data, as rdma_client registers it. */
static char static_buf[100];

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static struct ibv_qp *qa, *qb;

#define ACC (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC)

/* wait_cq polls c for one completion, a while. */
static int wait_cq(struct ibv_cq *c, struct ibv_wc *wc)
{
	for (long i = 0; i < 50000000; i++) {
		int n = ibv_poll_cq(c, 1, wc);

		if (n != 0)
			return n;
	}
	return 0;
}

static int wait_wc(struct ibv_wc *wc)
{
	return wait_cq(cq, wc);
}


/* one posts wr on qa and returns the status of its completion (-1: none). */
static int one(struct ibv_send_wr *wr)
{
	struct ibv_send_wr *bad = NULL;
	struct ibv_wc wc;
	int rc = ibv_post_send(qa, wr, &bad);

	if (rc) {
		printf("  post_send: %d\n", rc);
		return -1;
	}
	if (wait_wc(&wc) != 1)
		return -1;
	if (wc.qp_num != qa->qp_num || wc.wr_id != wr->wr_id)
		return -2;
	return wc.status;
}

static int write_to(void *dst, uint32_t rkey, void *src, uint32_t lkey, uint32_t len)
{
	struct ibv_sge sge = { .addr = (uintptr_t)src, .length = len, .lkey = lkey };
	struct ibv_send_wr wr = { .wr_id = 77, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				  .send_flags = IBV_SEND_SIGNALED };

	wr.wr.rdma.remote_addr = (uintptr_t)dst;
	wr.wr.rdma.rkey = rkey;
	return one(&wr);
}

/* stack_region registers a buffer of this frame's stack, writes into it by
 * RDMA and returns: a lost return address would crash here. */
static __attribute__((noinline)) int stack_region(struct ibv_mr *src_mr)
{
	char buf[3 * 4096];
	struct ibv_mr *mr;
	int ok;

	memset(buf, 's', sizeof(buf));
	mr = ibv_reg_mr(pd, buf, sizeof(buf), ACC);
	if (!mr)
		return 0;
	ok = buf[0] == 's' && buf[sizeof(buf) - 1] == 's';
	ok = ok && write_to(buf + 100, mr->rkey, src_mr->addr, src_mr->lkey, 64) == IBV_WC_SUCCESS &&
	     !memcmp(buf + 100, src_mr->addr, 64) && buf[99] == 's' && buf[164] == 's';
	ok = ok && ibv_dereg_mr(mr) == 0;
	return ok;
}

/* stack_touch uses as much stack as stack_region did, and more. */
static __attribute__((noinline)) int stack_touch(void)
{
	volatile char buf[8 * 4096];

	for (size_t i = 0; i < sizeof(buf); i += 512)
		buf[i] = 's';
	return buf[4096];
}

/* forked_verbs runs in a child of fork: the parent's context is refused,
 * and the child's own, on a session of its own that joins the parent's VM,
 * sends between two QPs of its own over the adapter the parent has (its
 * GID). It returns 0, or the number of the step that failed. */
static int forked_verbs(struct ibv_context *parent, const union ibv_gid *parent_gid)
{
	struct ibv_device **l;
	struct ibv_context *c;
	struct ibv_pd *p;
	struct ibv_cq *q;
	struct ibv_qp *s1, *s2;
	struct ibv_mr *mr;
	struct ibv_qp_init_attr init;
	union ibv_gid g;
	struct ibv_wc wc[2];
	char *buf;
	int n, got;

	errno = 0;
	if (ibv_alloc_pd(parent) || errno != EINVAL)
		return 10;
	l = ibv_get_device_list(&n);
	if (!l || n < 1)
		return 11;
	c = ibv_open_device(l[0]);
	p = c ? ibv_alloc_pd(c) : NULL;
	q = p ? ibv_create_cq(c, 8, NULL, NULL, 0) : NULL;
	if (!q)
		return 12;
	if (ibv_query_gid(c, 1, 0, &g) || memcmp(&g, parent_gid, sizeof(g)))
		return 13;
	buf = malloc(8192);
	mr = buf ? ibv_reg_mr(p, buf, 8192, ACC) : NULL;
	if (!mr)
		return 14;
	memset(&init, 0, sizeof(init));
	init.send_cq = init.recv_cq = q;
	init.qp_type = IBV_QPT_RC;
	init.cap.max_send_wr = init.cap.max_recv_wr = 4;
	init.cap.max_send_sge = init.cap.max_recv_sge = 1;
	s1 = ibv_create_qp(p, &init);
	s2 = ibv_create_qp(p, &init);
	if (!s1 || !s2 || connect_rc(s1, s2->qp_num, &g, ACC, 7, 7) || connect_rc(s2, s1->qp_num, &g, ACC, 7, 7))
		return 15;
	{
		struct ibv_sge rs = { .addr = (uintptr_t)buf + 4096, .length = 4096, .lkey = mr->lkey };
		struct ibv_sge ss = { .addr = (uintptr_t)buf, .length = 4096, .lkey = mr->lkey };
		struct ibv_recv_wr rwr = { .wr_id = 1, .sg_list = &rs, .num_sge = 1 }, *rb;
		struct ibv_send_wr swr = { .wr_id = 2, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND,
					   .send_flags = IBV_SEND_SIGNALED }, *sb;

		for (int i = 0; i < 4096; i++)
			buf[i] = (char)('a' + i % 26);
		if (ibv_post_recv(s2, &rwr, &rb) || ibv_post_send(s1, &swr, &sb))
			return 16;
	}
	for (got = 0; got < 2;) {
		int k = wait_cq(q, &wc[got]);

		if (k <= 0 || wc[got].status != IBV_WC_SUCCESS)
			return 17;
		got += k;
	}
	if (memcmp(buf, buf + 4096, 4096))
		return 18;
	if (ibv_destroy_qp(s1) || ibv_destroy_qp(s2) || ibv_dereg_mr(mr) || ibv_destroy_cq(q) || ibv_dealloc_pd(p) ||
	    ibv_close_device(c))
		return 19;
	ibv_free_device_list(l);
	free(buf);
	return 0;
}

/* parent_domains checks thread and parent domains: ibv_alloc_td and
 * ibv_alloc_parent_domain (with a thread domain and allocators, which are
 * never called: the queues are the agent's memory), their refusals
 * (EINVAL for an unknown comp_mask bit or a parent domain as the PD, EBUSY
 * for a PD or a thread domain a parent domain uses), and an extended CQ,
 * an SRQ, two QPs and a region made on the parent domain carrying a SEND
 * through the SRQ and an RDMA WRITE. */
static int allocator_calls;

static void *count_alloc(struct ibv_pd *p, void *c, size_t size, size_t align, uint64_t type)
{
	(void)p, (void)c, (void)size, (void)align, (void)type;
	allocator_calls++;
	return IBV_ALLOCATOR_USE_DEFAULT;
}

static void count_free(struct ibv_pd *p, void *c, void *ptr, uint64_t type)
{
	(void)p, (void)c, (void)ptr, (void)type;
	allocator_calls++;
}

/* imports checks ibv_import_device (a dup of a context's cmd_fd: a second
 * context of the adapter, owning the descriptor; a descriptor of no
 * context: EOPNOTSUPP), ibv_import_pd and ibv_import_mr by the agent's
 * handles (the same handle and keys, no address; an unknown handle
 * EINVAL), and their unimports. */
static void imports(struct ibv_mr *m)
{
	struct ibv_context *c2 = ibv_import_device(dup(ctx->cmd_fd));
	struct ibv_pd *p2 = c2 ? ibv_import_pd(c2, pd->handle) : NULL;
	struct ibv_mr *m2 = p2 ? ibv_import_mr(p2, m->handle) : NULL;
	int fds[2] = { -1, -1 };

	CHECK("import-device", c2 && c2->device == ctx->device && c2 != ctx, "errno %d", errno);
	CHECK("import-pd-mr", p2 && p2->handle == pd->handle && m2 && m2->handle == m->handle && m2->lkey == m->lkey &&
				      m2->rkey == m->rkey && m2->length == m->length && !m2->addr,
	      "errno %d", errno);
	errno = 0;
	CHECK("import-pd-unknown", c2 && !ibv_import_pd(c2, pd->handle + 1000) && errno == EINVAL, "errno %d", errno);
	errno = 0;
	CHECK("import-mr-unknown", p2 && !ibv_import_mr(p2, m->handle + 1000) && errno == EINVAL, "errno %d", errno);
	errno = 0;
	CHECK("import-device-not-a-context", pipe(fds) == 0 && !ibv_import_device(fds[0]) && errno == EOPNOTSUPP, "errno %d",
	      errno);
	close(fds[0]);
	close(fds[1]);
	if (m2)
		ibv_unimport_mr(m2);
	if (p2)
		ibv_unimport_pd(p2);
	CHECK("import-close", c2 && ibv_close_device(c2) == 0, "errno %d", errno);
}

static void parent_domains(const union ibv_gid *gid)
{
	struct ibv_td_init_attr tda = { 0 };
	struct ibv_td *td = ibv_alloc_td(ctx, &tda);
	struct ibv_parent_domain_init_attr pa = { .pd = pd, .td = td,
						  .comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS |
							       IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT,
						  .alloc = count_alloc, .free = count_free, .pd_context = &tda };
	struct ibv_pd *par = td ? ibv_alloc_parent_domain(ctx, &pa) : NULL, *bad;
	struct ibv_cq_init_attr_ex cqa = { .cqe = 16, .wc_flags = IBV_WC_STANDARD_FLAGS,
					   .comp_mask = IBV_CQ_INIT_ATTR_MASK_PD, .parent_domain = par };
	struct ibv_cq_ex *cqx = par ? ibv_create_cq_ex(ctx, &cqa) : NULL;
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 8, .max_sge = 1 } };
	struct ibv_srq *srq = cqx ? ibv_create_srq(par, &sa) : NULL;
	struct ibv_qp_init_attr qa_ = { .send_cq = ibv_cq_ex_to_cq(cqx), .recv_cq = ibv_cq_ex_to_cq(cqx), .srq = srq,
					.cap = { .max_send_wr = 8, .max_send_sge = 1 }, .qp_type = IBV_QPT_RC };
	struct ibv_qp *q1 = srq ? ibv_create_qp(par, &qa_) : NULL, *q2 = q1 ? ibv_create_qp(par, &qa_) : NULL;
	static char buf[4096];
	struct ibv_mr *m = q2 ? ibv_reg_mr(par, buf, sizeof(buf), ACC) : NULL;
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 64, .lkey = m ? m->lkey : 0 };
	struct ibv_recv_wr rw = { .wr_id = 7, .sg_list = &sge, .num_sge = 1 }, *badr;
	struct ibv_send_wr sw = { .wr_id = 8, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED }, *bads;
	struct ibv_wc wc[2];
	int ok, n = 0;

	CHECK("parent-domain-objects", m && m->pd == par && q1->pd == par && srq->pd == par, "errno %d", errno);
	if (!m)
		return;
	errno = 0;
	pa.comp_mask = 1u << 5;
	bad = ibv_alloc_parent_domain(ctx, &pa);
	CHECK("parent-domain-bad-comp-mask", !bad && errno == EINVAL, "errno %d", errno);
	pa.comp_mask = 0;
	pa.pd = par;
	errno = 0;
	bad = ibv_alloc_parent_domain(ctx, &pa);
	CHECK("parent-domain-of-parent-domain", !bad && errno == EINVAL, "errno %d", errno);
	tda.comp_mask = 1;
	errno = 0;
	CHECK("alloc-td-bad-comp-mask", !ibv_alloc_td(ctx, &tda) && errno == EINVAL, "errno %d", errno);
	CHECK("dealloc-pd-with-parent-domain-busy", ibv_dealloc_pd(pd) == EBUSY, " ");
	CHECK("dealloc-td-in-use-busy", ibv_dealloc_td(td) == EBUSY, " ");

	ok = connect_rc(q1, q2->qp_num, (union ibv_gid *)gid, ACC, 0, 0) == 0 &&
	     connect_rc(q2, q1->qp_num, (union ibv_gid *)gid, ACC, 0, 0) == 0 && ibv_post_srq_recv(srq, &rw, &badr) == 0 &&
	     ibv_post_send(q1, &sw, &bads) == 0;
	sw.wr_id = 9;
	sw.opcode = IBV_WR_RDMA_WRITE;
	sw.wr.rdma.remote_addr = (uintptr_t)buf + 1024;
	sw.wr.rdma.rkey = m->rkey;
	buf[0] = 'p';
	ok = ok && ibv_post_send(q2, &sw, &bads) == 0;
	for (long i = 0; ok && n < 3 && i < 50000000; i++)
		n += ibv_poll_cq(ibv_cq_ex_to_cq(cqx), 1, wc) == 1 && wc[0].status == IBV_WC_SUCCESS;
	CHECK("parent-domain-traffic", ok && n == 3 && buf[1024] == 'p', "ok %d completions %d", ok, n);
	CHECK("parent-domain-allocators-not-called", allocator_calls == 0, "%d calls", allocator_calls);
	ok = ibv_dereg_mr(m) == 0 && ibv_destroy_qp(q1) == 0 && ibv_destroy_qp(q2) == 0 && ibv_destroy_srq(srq) == 0 &&
	     ibv_destroy_cq(ibv_cq_ex_to_cq(cqx)) == 0 && ibv_dealloc_pd(par) == 0 && ibv_dealloc_td(td) == 0;
	CHECK("parent-domain-teardown", ok, "errno %d", errno);
}

int main(void)
{
	struct ibv_qp_init_attr init;
	struct ibv_qp_attr qattr;
	struct ibv_wc wc;
	union ibv_gid gid;
	struct ibv_mr *ma, *mb, *m;
	struct ibv_send_wr swr, *bad;
	struct ibv_recv_wr rwr, *rbad;
	struct ibv_sge sge, sges[8];
	char *bufa, *bufb;
	uint64_t *word;
	int rc;

	ctx = open_first_device();
	if (!ctx)
		return 1;
	pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	cq = pd ? ibv_create_cq(ctx, 64, NULL, NULL, 0) : NULL;
	CHECK("setup", ctx && pd && cq, "errno %d", errno);
	if (!cq)
		return 1;
	CHECK("query-gid", ibv_query_gid(ctx, 1, 0, &gid) == 0, "errno %d", errno);

	errno = 0;
	CHECK("create-cq-0", !ibv_create_cq(ctx, 0, NULL, NULL, 0) && errno == EINVAL, "errno %d", errno);
	errno = 0;
	CHECK("create-cq-huge", !ibv_create_cq(ctx, 1 << 20, NULL, NULL, 0) && errno == EINVAL, "errno %d", errno);
	memset(&init, 0, sizeof(init));
	init.send_cq = init.recv_cq = cq;
	init.cap.max_send_wr = 16;
	init.cap.max_recv_wr = 16;
	init.cap.max_send_sge = 2;
	init.cap.max_recv_sge = 2;
	init.cap.max_inline_data = 64;
	init.qp_type = IBV_QPT_RAW_PACKET;
	errno = 0;
	CHECK("create-qp-raw", !ibv_create_qp(pd, &init) && errno == EOPNOTSUPP, "errno %d", errno);
	init.qp_type = IBV_QPT_RC;
	init.cap.max_send_wr = 100000;
	errno = 0;
	CHECK("create-qp-caps", !ibv_create_qp(pd, &init) && errno == EINVAL, "errno %d", errno);
	init.cap.max_send_wr = 16;
	qa = ibv_create_qp(pd, &init);
	qb = ibv_create_qp(pd, &init);
	CHECK("create-qp", qa && qb && init.cap.max_send_sge >= 2 && init.cap.max_inline_data >= 64,
	      "errno %d caps %u %u", errno, init.cap.max_send_sge, init.cap.max_inline_data);
	if (!qa || !qb)
		return 1;

	bufa = malloc(8192);
	bufb = aligned_alloc(4096, 3 * 4096);
	memset(bufa, 'a', 8192);
	memset(bufb, 'b', 3 * 4096);
	/* perftest's access: an optional bit, which must be accepted. */
	ma = ibv_reg_mr(pd, bufa, 8192, ACC | IBV_ACCESS_RELAXED_ORDERING);
	mb = ibv_reg_mr_iova2(pd, bufb, 3 * 4096, (uintptr_t)bufb, ACC);
	CHECK("reg-mr", ma && mb && ma->addr == bufa && ma->length == 8192 && ma->lkey && mb->rkey,
	      "errno %d", errno);
	if (!ma || !mb)
		return 1;
	CHECK("reg-mr-keeps-contents", bufa[0] == 'a' && bufa[8191] == 'a' && bufb[3 * 4096 - 1] == 'b', " ");
	{
		/* Memory windows may be bound to a region with MW_BIND. */
		struct ibv_mr *mw_mr = ibv_reg_mr(pd, bufa, 64, ACC | IBV_ACCESS_MW_BIND);

		CHECK("reg-mr-mw-bind", mw_mr && ibv_dereg_mr(mw_mr) == 0, "errno %d", errno);
	}
	{
		/* IBV_ACCESS_HUGETLB is a hint: on memory of 4 KiB pages too. */
		struct ibv_mr *hm = ibv_reg_mr(pd, bufa, 64, ACC | IBV_ACCESS_HUGETLB);

		CHECK("reg-mr-hugetlb-hint", hm && ibv_dereg_mr(hm) == 0, "errno %d", errno);
	}
	errno = 0;
	CHECK("reg-mr-unknown-access", !ibv_reg_mr(pd, bufa, 64, ACC | (1 << 15)) && errno == EINVAL, "errno %d", errno);
	errno = 0;
	CHECK("reg-mr-remote-write-alone", !ibv_reg_mr(pd, bufa, 64, IBV_ACCESS_REMOTE_WRITE) && errno == EINVAL,
	      "errno %d", errno);
	errno = 0;
	CHECK("reg-mr-length-0", !ibv_reg_mr(pd, bufa, 0, ACC) && errno == EINVAL, "errno %d", errno);
	errno = 0;
	CHECK("reg-mr-null-pd", !ibv_reg_mr(NULL, bufa, 64, ACC) && errno == EINVAL, "errno %d", errno);

	/* Before RTS the library refuses to post. */
	sge = (struct ibv_sge){ (uintptr_t)bufa, 16, ma->lkey };
	memset(&swr, 0, sizeof(swr));
	swr.wr_id = 1;
	swr.sg_list = &sge;
	swr.num_sge = 1;
	swr.opcode = IBV_WR_SEND;
	swr.send_flags = IBV_SEND_SIGNALED;
	bad = NULL;
	CHECK("post-send-reset", ibv_post_send(qa, &swr, &bad) == EINVAL && bad == &swr, " ");
	memset(&rwr, 0, sizeof(rwr));
	rwr.sg_list = &sge;
	rwr.num_sge = 1;
	rbad = NULL;
	CHECK("post-recv-reset", ibv_post_recv(qb, &rwr, &rbad) == EINVAL && rbad == &rwr, " ");
	memset(&qattr, 0, sizeof(qattr));
	qattr.qp_state = IBV_QPS_RTS;
	CHECK("modify-reset-to-rts", ibv_modify_qp(qa, &qattr, IBV_QP_STATE) == EINVAL, " ");

	rc = connect_rc(qa, qb->qp_num, &gid, ACC, 0x123, 0x123);
	CHECK("connect-a", rc == 0, "rc %d", rc);
	rc = connect_rc(qb, qa->qp_num, &gid, ACC, 0x123, 0x123);
	CHECK("connect-b", rc == 0, "rc %d", rc);
	rc = ibv_query_qp(qa, &qattr, IBV_QP_STATE | IBV_QP_DEST_QPN, &init);
	CHECK("query-qp", rc == 0 && qattr.qp_state == IBV_QPS_RTS && qattr.dest_qp_num == qb->qp_num &&
				  qattr.path_mtu == IBV_MTU_1024 && init.qp_type == IBV_QPT_RC && init.send_cq == cq,
	      "rc %d state %d dest %u", rc, qattr.qp_state, qattr.dest_qp_num);

	/* SEND with immediate, two SGEs gathered. */
	memcpy(bufa, "hello, ", 7);
	memcpy(bufa + 4096, "vrdma!", 6);
	sges[0] = (struct ibv_sge){ (uintptr_t)bufa, 7, ma->lkey };
	sges[1] = (struct ibv_sge){ (uintptr_t)(bufa + 4096), 6, ma->lkey };
	sge = (struct ibv_sge){ (uintptr_t)bufb, 256, mb->lkey };
	rwr.wr_id = 0x5151;
	rwr.sg_list = &sge;
	rwr.num_sge = 1;
	CHECK("post-recv", ibv_post_recv(qb, &rwr, &rbad) == 0, " ");
	swr.wr_id = 0x4242;
	swr.sg_list = sges;
	swr.num_sge = 2;
	swr.opcode = IBV_WR_SEND_WITH_IMM;
	swr.imm_data = htonl(0xdeadbeef);
	rc = ibv_post_send(qa, &swr, &bad);
	{
		struct ibv_wc w[2];
		int got = 0, sendok = 0, recvok = 0;

		for (long i = 0; i < 50000000 && got < 2; i++)
			got += ibv_poll_cq(cq, 2 - got, w + got);
		for (int i = 0; i < got; i++) {
			if (w[i].wr_id == 0x4242 && w[i].status == IBV_WC_SUCCESS && w[i].opcode == IBV_WC_SEND &&
			    w[i].qp_num == qa->qp_num)
				sendok = 1;
			if (w[i].wr_id == 0x5151 && w[i].status == IBV_WC_SUCCESS && w[i].opcode == IBV_WC_RECV &&
			    w[i].byte_len == 13 && (w[i].wc_flags & IBV_WC_WITH_IMM) &&
			    ntohl(w[i].imm_data) == 0xdeadbeef && w[i].src_qp == qa->qp_num && w[i].qp_num == qb->qp_num)
				recvok = 1;
		}
		CHECK("send-imm", rc == 0 && sendok && recvok && !memcmp(bufb, "hello, vrdma!", 13) && bufb[13] == 'b',
		      "rc %d got %d send %d recv %d", rc, got, sendok, recvok);
	}

	/* RDMA WRITE to the peer's virtual address. */
	memset(bufa + 100, 'W', 300);
	CHECK("rdma-write", write_to(bufb + 5000, mb->rkey, bufa + 100, ma->lkey, 300) == IBV_WC_SUCCESS &&
				    bufb[4999] == 'b' && bufb[5000] == 'W' && bufb[5299] == 'W' && bufb[5300] == 'b',
	      " ");
	/* RDMA READ from it. */
	memset(bufb + 9000, 'R', 100);
	sge = (struct ibv_sge){ (uintptr_t)(bufa + 6000), 100, ma->lkey };
	memset(&swr, 0, sizeof(swr));
	swr.wr_id = 3;
	swr.sg_list = &sge;
	swr.num_sge = 1;
	swr.opcode = IBV_WR_RDMA_READ;
	swr.send_flags = IBV_SEND_SIGNALED;
	swr.wr.rdma.remote_addr = (uintptr_t)(bufb + 9000);
	swr.wr.rdma.rkey = mb->rkey;
	CHECK("rdma-read", one(&swr) == IBV_WC_SUCCESS && bufa[6000] == 'R' && bufa[6099] == 'R' && bufa[6100] == 'a',
	      " ");
	/* Atomics on an 8-byte word of the peer. */
	word = (uint64_t *)(bufb + 8192);
	*word = 100;
	sge = (struct ibv_sge){ (uintptr_t)(bufa + 7000 - 7000 % 8), 8, ma->lkey };
	swr.wr_id = 4;
	swr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
	swr.wr.atomic.remote_addr = (uintptr_t)word;
	swr.wr.atomic.rkey = mb->rkey;
	swr.wr.atomic.compare_add = 5;
	CHECK("fetch-add", one(&swr) == IBV_WC_SUCCESS && *word == 105 && *(uint64_t *)(uintptr_t)sge.addr == 100,
	      "word %llu", (unsigned long long)*word);
	swr.wr_id = 5;
	swr.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
	swr.wr.atomic.compare_add = 105;
	swr.wr.atomic.swap = 7;
	CHECK("cmp-swap", one(&swr) == IBV_WC_SUCCESS && *word == 7 && *(uint64_t *)(uintptr_t)sge.addr == 105,
	      "word %llu", (unsigned long long)*word);

	/* Inline SEND from unregistered memory. */
	{
		char note[20] = "inline, unregistered";

		sge = (struct ibv_sge){ (uintptr_t)(bufb + 256), 64, mb->lkey };
		rwr.wr_id = 6;
		rwr.sg_list = &sge;
		CHECK("post-recv-2", ibv_post_recv(qb, &rwr, &rbad) == 0, " ");
		sges[0] = (struct ibv_sge){ (uintptr_t)note, sizeof(note), 0 };
		memset(&swr, 0, sizeof(swr));
		swr.wr_id = 7;
		swr.sg_list = sges;
		swr.num_sge = 1;
		swr.opcode = IBV_WR_SEND;
		swr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
		rc = ibv_post_send(qa, &swr, &bad);
		memset(note, 0, sizeof(note)); /* inline: copied at post time */
		{
			struct ibv_wc w[2];
			int got = 0, ok = 0;

			for (long i = 0; i < 50000000 && got < 2; i++)
				got += ibv_poll_cq(cq, 2 - got, w + got);
			for (int i = 0; i < got; i++)
				ok += (w[i].wr_id == 7 && w[i].status == IBV_WC_SUCCESS) ||
				      (w[i].wr_id == 6 && w[i].status == IBV_WC_SUCCESS && w[i].byte_len == 20);
			CHECK("send-inline", rc == 0 && got == 2 && ok == 2 && !memcmp(bufb + 256, "inline, unregistered", 20),
			      "rc %d got %d ok %d", rc, got, ok);
		}
	}

	/* The ibv_wr_* API on QPs made by ibv_create_qp_ex. */
	{
		struct ibv_qp_init_attr_ex ax;
		struct ibv_qp *qc, *qd;
		struct ibv_qp_ex *x;
		struct ibv_wc w[2];
		int got = 0;
		struct ibv_cq_init_attr_ex cax;
		struct ibv_cq_ex *cqx;
		struct ibv_cq *ccq;
		struct ibv_poll_cq_attr pattr = { 0 };

		memset(&cax, 0, sizeof(cax));
		cax.cqe = 16;
		cax.wc_flags = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP;
		errno = 0;
		CHECK("create-cq-ex-timestamps", !ibv_create_cq_ex(ctx, &cax) && errno == EOPNOTSUPP, "errno %d", errno);
		cax.wc_flags = IBV_WC_STANDARD_FLAGS;
		cqx = ibv_create_cq_ex(ctx, &cax);
		CHECK("create-cq-ex", cqx != NULL, "errno %d", errno);
		if (!cqx)
			return 1;
		ccq = ibv_cq_ex_to_cq(cqx);
		CHECK("start-poll-empty", ibv_start_poll(cqx, &pattr) == ENOENT, " ");

		CHECK("qp-to-qp-ex-plain", ibv_qp_to_qp_ex(qa) == NULL, " ");
		memset(&ax, 0, sizeof(ax));
		ax.send_cq = ax.recv_cq = ccq;
		ax.cap = init.cap;
		ax.qp_type = IBV_QPT_RC;
		ax.pd = pd;
		ax.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
		ax.send_ops_flags = IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_SEND_WITH_INV;
		{
			/* The memory-window send ops on RC; not on UC. */
			struct ibv_qp *qmw = ibv_create_qp_ex(ctx, &ax);
			struct ibv_qp_ex *xmw = qmw ? ibv_qp_to_qp_ex(qmw) : NULL;

			CHECK("create-qp-ex-bind-mw", xmw && xmw->wr_bind_mw && xmw->wr_local_inv && xmw->wr_send_inv &&
							      ibv_destroy_qp(qmw) == 0,
			      "errno %d", errno);
			ax.qp_type = IBV_QPT_UC;
			errno = 0;
			CHECK("create-qp-ex-uc-bind-mw", !ibv_create_qp_ex(ctx, &ax) && errno == EOPNOTSUPP, "errno %d", errno);
			ax.qp_type = IBV_QPT_RC;
		}
		ax.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_READ |
				    IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_SEND;
		qc = ibv_create_qp_ex(ctx, &ax);
		qd = ibv_create_qp_ex(ctx, &ax);
		x = qc ? ibv_qp_to_qp_ex(qc) : NULL;
		CHECK("create-qp-ex", qc && qd && x && &x->qp_base == qc, "errno %d", errno);
		if (!x || !qd)
			return 1;
		CHECK("connect-ex",
		      connect_rc(qc, qd->qp_num, &gid, ACC, 0x123, 0x123) == 0 && connect_rc(qd, qc->qp_num, &gid, ACC, 0x123, 0x123) == 0,
		      " ");

		memset(bufb + 6000, 'b', 200);
		ibv_wr_start(x);
		x->wr_id = 11;
		x->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_rdma_write(x, mb->rkey, (uintptr_t)(bufb + 6000));
		ibv_wr_set_sge(x, ma->lkey, (uintptr_t)(bufa + 100), 32);
		x->wr_id = 12;
		ibv_wr_rdma_write(x, mb->rkey, (uintptr_t)(bufb + 6100));
		ibv_wr_set_inline_data(x, "inline-write", 12);
		rc = ibv_wr_complete(x);
		/* Both completions through the ibv_start_poll API. */
		for (long i = 0; i < 50000000; i++) {
			int prc = ibv_start_poll(cqx, &pattr);

			if (prc == ENOENT)
				continue;
			while (prc == 0 && got < 2) {
				w[got].wr_id = cqx->wr_id;
				w[got].status = cqx->status;
				w[got].opcode = ibv_wc_read_opcode(cqx);
				w[got].qp_num = ibv_wc_read_qp_num(cqx);
				w[got].byte_len = ibv_wc_read_byte_len(cqx);
				got++;
				prc = got < 2 ? ibv_next_poll(cqx) : 0;
			}
			ibv_end_poll(cqx);
			if (got == 2)
				break;
		}
		CHECK("wr-write-sge-and-inline",
		      rc == 0 && got == 2 && w[0].status == IBV_WC_SUCCESS && w[1].status == IBV_WC_SUCCESS &&
			      w[0].wr_id + w[1].wr_id == 23 && w[0].qp_num == qc->qp_num &&
			      w[0].opcode == IBV_WC_RDMA_WRITE && bufb[6000] == 'W' && bufb[6031] == 'W' &&
			      bufb[6032] == 'b' && !memcmp(bufb + 6100, "inline-write", 12),
		      "rc %d got %d", rc, got);

		*word = 40;
		sge = (struct ibv_sge){ (uintptr_t)(bufa + 7000 - 7000 % 8), 8, ma->lkey };
		ibv_wr_start(x);
		x->wr_id = 13;
		ibv_wr_atomic_fetch_add(x, mb->rkey, (uintptr_t)word, 2);
		ibv_wr_set_sge_list(x, 1, &sge);
		rc = ibv_wr_complete(x);
		CHECK("wr-fetch-add", rc == 0 && wait_cq(ccq, &wc) == 1 && wc.wr_id == 13 && wc.status == IBV_WC_SUCCESS &&
					      *word == 42 && *(uint64_t *)(uintptr_t)sge.addr == 40,
		      "rc %d word %llu", rc, (unsigned long long)*word);

		ibv_wr_start(x);
		x->wr_id = 14;
		ibv_wr_rdma_read(x, mb->rkey, (uintptr_t)bufb);
		ibv_wr_set_inline_data(x, "no", 2);
		rc = ibv_wr_complete(x);
		CHECK("wr-inline-read-refused", rc == EINVAL && ibv_poll_cq(ccq, 1, &wc) == 0, "rc %d", rc);
		ibv_wr_start(x);
		x->wr_id = 15;
		ibv_wr_rdma_write(x, mb->rkey, (uintptr_t)(bufb + 6000));
		ibv_wr_set_sge(x, ma->lkey, (uintptr_t)bufa, 8);
		ibv_wr_abort(x);
		bufb[6000] = 'b';
		for (long i = 0; i < 1000000; i++)
			if (ibv_poll_cq(ccq, 1, &wc))
				break;
		CHECK("wr-abort", bufb[6000] == 'b', " ");
		CHECK("destroy-qp-ex", ibv_destroy_qp(qc) == 0 && ibv_destroy_qp(qd) == 0, " ");
		CHECK("destroy-cq-ex", ibv_destroy_cq(ccq) == 0, " ");
	}

	/* What post_send refuses (§9), with bad_wr at the first refused WR. */
	memset(&swr, 0, sizeof(swr));
	swr.sg_list = sges;
	swr.opcode = IBV_WR_SEND;
	swr.num_sge = (int)init.cap.max_send_sge + 1;
	for (int i = 0; i < 8; i++)
		sges[i] = (struct ibv_sge){ (uintptr_t)bufa, 1, ma->lkey };
	CHECK("post-too-many-sges", ibv_post_send(qa, &swr, &bad) == EINVAL && bad == &swr, " ");
	swr.num_sge = 1;
	swr.opcode = IBV_WR_RDMA_READ;
	swr.send_flags = IBV_SEND_INLINE;
	CHECK("post-inline-read", ibv_post_send(qa, &swr, &bad) == EINVAL, " ");
	swr.opcode = IBV_WR_SEND;
	sges[0].length = init.cap.max_inline_data + 1;
	CHECK("post-inline-too-long", ibv_post_send(qa, &swr, &bad) == EINVAL, " ");
	swr.send_flags = 0;
	swr.opcode = (enum ibv_wr_opcode)42;
	CHECK("post-bad-opcode", ibv_post_send(qa, &swr, &bad) == EINVAL, " ");
	CHECK("poll-bad-count", ibv_poll_cq(cq, -1, &wc) < 0, " ");
	rwr.num_sge = -1;
	CHECK("post-recv-negative-sges", ibv_post_recv(qb, &rwr, &rbad) == EINVAL && rbad == &rwr, " ");
	rwr.num_sge = 1;
	memset(&qattr, 0, sizeof(qattr));
	qattr.qp_state = IBV_QPS_RTS;
	qattr.path_mtu = (enum ibv_mtu)9;
	CHECK("modify-bad-mtu", ibv_modify_qp(qa, &qattr, IBV_QP_STATE | IBV_QP_PATH_MTU) == EINVAL, " ");
	CHECK("query-qp-null", ibv_query_qp(NULL, &qattr, 0, &init) == EINVAL && ibv_query_qp(qa, NULL, 0, &init) == EINVAL,
	      " ");
	{
		struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
		struct ibv_cq *evcq = ch ? ibv_create_cq(ctx, 4, (void *)0x1234, ch, 0) : NULL;
		struct ibv_cq *got = NULL;
		void *gctx = NULL;

		fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK);
		errno = 0;
		CHECK("get-cq-event-nonblocking", evcq && ibv_get_cq_event(ch, &got, &gctx) == -1 && errno == EAGAIN,
		      "errno %d", errno);
		CHECK("destroy-channel-busy", ibv_destroy_comp_channel(ch) == EBUSY, " ");
		errno = 0;
		CHECK("create-cq-bad-vector", !ibv_create_cq(ctx, 4, NULL, ch, 1) && errno == EINVAL, "errno %d", errno);
		CHECK("destroy-cq-twice", evcq && ibv_destroy_cq(evcq) == 0 && ibv_destroy_cq(evcq) == EINVAL, " ");
		CHECK("destroy-channel", ibv_destroy_comp_channel(ch) == 0, " ");
	}

	/* Memory: the stack, heap neighbours, repeated and inner ranges,
	 * partial overlaps, memory that cannot be adopted. */
	CHECK("stack-region", stack_region(ma), " ");
	{
		char *x = malloc(64), *y = malloc(64);

		strcpy(y, "neighbour");
		memset(x, 'x', 64);
		m = ibv_reg_mr(pd, x, 64, ACC);
		CHECK("heap-neighbour", m && !strcmp(y, "neighbour") && x[63] == 'x', "errno %d", errno);
		strcpy(y, "changed");
		CHECK("heap-neighbour-write",
		      m && write_to(x, m->rkey, bufa + 100, ma->lkey, 64) == IBV_WC_SUCCESS && x[0] == 'W' &&
			      !strcmp(y, "changed"),
		      " ");
		CHECK("heap-dereg-keeps-contents", m && ibv_dereg_mr(m) == 0 && x[0] == 'W' && x[63] == 'W' &&
							   !strcmp(y, "changed"),
		      " ");
	}
	/* Heap neighbours over two pages, registered one after the other (as
	 * ucmatose's buffers): the second straddles the first's page and the
	 * next, and the run grows in place; both regions work, and contents
	 * stay. */
	{
		char *g = mmap(NULL, 4 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		struct ibv_mr *m1, *m2;

		memset(g, 'g', 4 * 4096);
		m1 = ibv_reg_mr(pd, g + 100, 1000, ACC);
		m2 = m1 ? ibv_reg_mr(pd, g + 4000, 3000, ACC) : NULL;
		CHECK("reg-grow", m1 && m2 && g[0] == 'g' && g[4 * 4096 - 1] == 'g' && g[7000] == 'g', "errno %d", errno);
		CHECK("grown-write", m2 && write_to(g + 4000, m2->rkey, bufa, ma->lkey, 3000) == IBV_WC_SUCCESS &&
					     !memcmp(g + 4000, bufa, 3000) && g[3999] == 'g' && g[7000] == 'g',
		      " ");
		CHECK("grown-dereg", m2 && !ibv_dereg_mr(m2) && m1 && !ibv_dereg_mr(m1) && !memcmp(g + 4000, bufa, 3000) &&
					     g[8191] == 'g',
		      "errno %d", errno);
		munmap(g, 4 * 4096);
	}
	/* Deregistering gives the guest memory back: 24 MiB registered and
	 * deregistered one MiB at a time fit a VM of 8. */
	{
		int ok = 1;

		for (int i = 0; i < 24 && ok; i++) {
			char *p = malloc(1 << 20);

			memset(p, i, 1 << 20);
			m = ibv_reg_mr(pd, p, 1 << 20, ACC);
			ok = m && p[0] == i && p[(1 << 20) - 1] == i && ibv_dereg_mr(m) == 0 && p[12345] == i;
			free(p);
		}
		CHECK("reg-dereg-reuses-guest-memory", ok, "errno %d", errno);
	}
	m = ibv_reg_mr(pd, bufa, 8192, ACC);
	CHECK("reg-again", m && m->lkey != ma->lkey, "errno %d", errno);
	if (m)
		ibv_dereg_mr(m);
	m = ibv_reg_mr(pd, bufa + 100, 50, ACC);
	CHECK("reg-inner", m != NULL, "errno %d", errno);
	if (m) {
		/* The inner region's bounds are its own, in the agent. */
		/* (The error moves both QPs to ERR: nothing below posts.) */
		CHECK("inner-bounds", write_to(bufa + 140, m->rkey, bufb, mb->lkey, 20) == IBV_WC_REM_ACCESS_ERR, " ");
		ibv_dereg_mr(m);
	}
	/* Neighbouring registrations, then one across both (ucmatose's heap
	 * buffers): the two runs become one; contents are kept throughout.
	 * And a range over an adopted page and a shared one: refused. */
	{
		char *n3 = mmap(NULL, 3 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		struct ibv_mr *m0 = NULL, *m12 = NULL, *across = NULL;

		if (n3 != MAP_FAILED) {
			memset(n3, 'n', 3 * 4096);
			m0 = ibv_reg_mr(pd, n3, 4096, ACC);
			m12 = ibv_reg_mr(pd, n3 + 4096, 2 * 4096, ACC);
			across = ibv_reg_mr(pd, n3 + 100, 3 * 4096 - 200, ACC);
		}
		CHECK("reg-across-neighbours", m0 && m12 && across && n3[0] == 'n' && n3[3 * 4096 - 1] == 'n', "errno %d", errno);
		CHECK("dereg-across-neighbours",
		      (!across || ibv_dereg_mr(across) == 0) && (!m0 || ibv_dereg_mr(m0) == 0) && (!m12 || ibv_dereg_mr(m12) == 0) &&
			      n3 != MAP_FAILED && n3[4096] == 'n' && n3[3 * 4096 - 1] == 'n',
		      " ");
		if (n3 != MAP_FAILED) {
			/* Page 1 shared: page 0's run cannot grow over it. */
			mmap(n3 + 4096, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
			m0 = ibv_reg_mr(pd, n3, 4096, ACC);
			errno = 0;
			CHECK("reg-partial-overlap", m0 && !ibv_reg_mr(pd, n3 + 2000, 4096, ACC) && errno == EINVAL, "errno %d",
			      errno);
			if (m0)
				ibv_dereg_mr(m0);
			munmap(n3, 3 * 4096);
		}
	}
	{
		char path[] = "/tmp/verbs_check.XXXXXX";
		int fd = mkstemp(path);
		void *f = MAP_FAILED, *sh, *gone;

		if (fd >= 0 && ftruncate(fd, 4096) == 0)
			f = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
		unlink(path);
		/* A file's private copy is the process's memory: adopted,
		 * contents kept; so is a program's static data. */
		if (f != MAP_FAILED)
			memset(f, 'f', 4096);
		m = f != MAP_FAILED ? ibv_reg_mr(pd, f, 4096, ACC) : NULL;
		CHECK("reg-file-private", m && ((char *)f)[0] == 'f' && ((char *)f)[4095] == 'f', "errno %d", errno);
		if (m)
			ibv_dereg_mr(m);
		memset(static_buf, 's', sizeof(static_buf));
		m = ibv_reg_mr(pd, static_buf, sizeof(static_buf), ACC);
		CHECK("reg-static", m && static_buf[0] == 's' && static_buf[sizeof(static_buf) - 1] == 's', "errno %d",
		      errno);
		if (m)
			ibv_dereg_mr(m);
		sh = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
		errno = 0;
		CHECK("refuse-shared", !ibv_reg_mr(pd, sh, 4096, ACC) && errno == EINVAL, "errno %d", errno);
		gone = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		munmap(gone, 4096);
		errno = 0;
		CHECK("refuse-unmapped", !ibv_reg_mr(pd, gone, 4096, ACC) && errno == EFAULT, "errno %d", errno);
	}
	/* A buffer freed (unmapped by malloc) before dereg, then one at the
	 * same place registered again. */
	{
		char *p = malloc(1 << 20), *q;

		memset(p, 'p', 1 << 20);
		m = ibv_reg_mr(pd, p, 1 << 20, ACC);
		free(p);
		CHECK("free-before-dereg", m && ibv_dereg_mr(m) == 0, "errno %d", errno);
		q = malloc(1 << 20);
		memset(q, 'q', 1 << 20);
		m = ibv_reg_mr(pd, q, 1 << 20, ACC);
		CHECK("reg-after-free", m && q[0] == 'q' && q[(1 << 20) - 1] == 'q', "errno %d", errno);
		if (m)
			ibv_dereg_mr(m);
		free(q);
	}
	/* fork: the child has private copies of registered pages (as on a
	 * kernel that copies pinned pages at fork), and its writes stay its
	 * own; the stack a deregistered region used is the child's again. */
	{
		pid_t pid = fork();
		int st = 0;

		if (pid == 0)
			_exit(stack_touch() == 's' ? 0 : 3);
		waitpid(pid, &st, 0);
		CHECK("fork-stack-given-back", pid > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "status 0x%x", st);
	}
	{
		pid_t pid = fork();
		int st = 0;

		if (pid == 0) {
			int ok = bufb[0] == 'h' && ibv_is_fork_initialized() == IBV_FORK_UNNEEDED;

			bufb[0] = 'c';
			_exit(ok && bufb[0] == 'c' ? 0 : 4);
		}
		waitpid(pid, &st, 0);
		CHECK("fork-private-copy", pid > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0 && bufb[0] == 'h',
		      "status 0x%x, parent's byte %c", st, bufb[0]);
	}
	{
		pid_t pid = fork();
		int st = 0;

		if (pid == 0)
			_exit(forked_verbs(ctx, &gid));
		waitpid(pid, &st, 0);
		CHECK("fork-child-own-session", pid > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
		      "status 0x%x (exit code: the child's step that failed)", st);
	}
	/* The parent's session outlived the child's copy of it (its QPs are
	 * in ERR since inner-bounds: a registration asks the agent). */
	{
		struct ibv_mr *m2 = ibv_reg_mr(pd, bufa, 64, ACC);

		CHECK("fork-parent-after-child", m2 && ibv_dereg_mr(m2) == 0, "errno %d", errno);
	}

	parent_domains(&gid);
	imports(ma);
	CHECK("dereg-mr", ibv_dereg_mr(ma) == 0 && ibv_dereg_mr(mb) == 0, " ");
	CHECK("dereg-twice", ibv_dereg_mr(ma) == EINVAL, " ");
	CHECK("dealloc-pd-busy", ibv_dealloc_pd(pd) == EBUSY, " ");
	CHECK("destroy-cq-busy", ibv_destroy_cq(cq) == EBUSY, " ");
	CHECK("destroy-qp", ibv_destroy_qp(qa) == 0 && ibv_destroy_qp(qb) == 0, " ");
	CHECK("destroy-cq", ibv_destroy_cq(cq) == 0, " ");
	CHECK("dealloc-pd", ibv_dealloc_pd(pd) == 0, " ");
	CHECK("close", ibv_close_device(ctx) == 0, " ");
	return failed;
}
