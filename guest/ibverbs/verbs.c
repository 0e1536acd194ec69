// SPDX-License-Identifier: Apache-2.0
/*
 * PD, MR, CQ, completion channels and RC QPs, and the data path through
 * context->ops (post_send, post_recv, poll_cq, req_notify_cq): the same
 * commands and rings as the Go library (wire-local.md §4-§7).
 *
 * Objects the program passes back are checked against the objects this
 * library created (a registry on the slow path, a magic word on the data
 * path), so a wrong pointer gets EINVAL rather than a crash wherever the
 * pointer is at least readable.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ring.h"
#include "vrdma.h"
#include "wqe.h"

#define MAGIC_PD 0x76706431u
#define MAGIC_MR 0x766d7231u
#define MAGIC_CQ 0x76637131u
#define MAGIC_QP 0x76717031u
#define MAGIC_SRQ 0x76737231u
#define MAGIC_TD 0x76746431u
#define MAGIC_XRCD 0x76787231u

/* poll_cq yields the CPU once per this many polls of an empty CQ. */
#define EMPTY_POLLS_PER_YIELD 64

/* A protection domain, or a parent domain (parent set): an ibv_pd whose
 * handle is its protection domain's, so that every verb taking a PD takes
 * it as that PD ("thread domains and parent domains" below). */
struct vrdma_pd {
	struct ibv_pd ibpd;
	uint32_t magic;
	struct vrdma_pd *parent; /* a parent domain's protection domain; NULL for a PD */
	struct vrdma_td *td;	 /* a parent domain's thread domain, or NULL */
	int users;		 /* a PD's parent domains; +guarded by reg_mu */
};

/* A thread domain (ibv_alloc_td). */
struct vrdma_td {
	struct ibv_td ibtd;
	uint32_t magic;
	int users; /* parent domains on it; +guarded by reg_mu */
};

struct vrdma_mr {
	struct ibv_mr ibmr;
	uint32_t magic;
	void *adopted;
	int on_demand; /* IBV_ACCESS_ON_DEMAND: pages adopted sparse (mem.c) */
	uint64_t iova; /* where SGEs and peers address its first byte */
};

struct vrdma_qp;

struct vrdma_cq {
	union {
		struct ibv_cq ibcq;	/* its fields begin struct ibv_cq_ex too */
		struct ibv_cq_ex cqx; /* the ibv_start_poll API when made by ibv_create_cq_ex */
	};
	uint32_t magic;
	struct ibv_wc cur; /* the completion ibv_start_poll/next_poll are at */
	pthread_mutex_t lock; /* pollers, and ibv_resize_cq, which replaces the ring */
	pthread_mutex_t arm_lock; /* req_notify_cq against ibv_resize_cq (not lock: a poller may hold it) */
	char *ring;
	size_t ring_size;
	uint32_t entries, offset;
	uint32_t head;	/* +guarded by lock */
	uint32_t empty; /* consecutive polls that found nothing; +guarded by lock */
	int event_fd;
	/* The local completion queue (memcpy-direct, wire-local.md §4.21): the
	 * completions the library made itself, and the ring's CQEs moved
	 * ahead of them, a FIFO polled before the ring; +guarded by lock. */
	struct ibv_wc *local;
	uint32_t lhead, lcount, lcap;
	/* The QPs bound to memcpy-direct whose send CQ this is: their send
	 * completions taken from the ring are counted (rule 2); +guarded by lock. */
	struct vrdma_qp **track;
	int ntrack, trackcap;
	/* The QPs whose recv CQ this is that may take messages from a send
	 * channel (wire-local.md §4.22, direct_send.c); +guarded by lock. */
	struct vrdma_qp **rxq;
	int nrxq, rxqcap;
};

struct vrdma_qp {
	struct ibv_qp_ex qpx; /* begins with struct ibv_qp; the ibv_wr_* API when has_ex */
	uint32_t magic;
	int has_ex;
	char *ring;
	size_t ring_size;
	uint32_t sq_entries, sq_stride, rq_entries, rq_stride, sq_offset, rq_offset;
	struct ibv_qp_cap caps;
	int sq_sig_all;
	int doorbell_fd;
	pthread_mutex_t sq_lock, rq_lock;
	uint32_t sq_tail; /* +guarded by sq_lock */
	uint32_t rq_tail; /* +guarded by rq_lock */
	/* Between ibv_wr_start and ibv_wr_complete/abort (sq_lock held): */
	uint32_t wr_tail;      /* the next slot a wr_* call fills */
	void *wr_cur;          /* the slot of the last wr_* call, for wr_set_* */
	int wr_op;	       /* its opcode */
	int wr_err;	       /* the first error: wr_complete returns it */
	/* memcpy-direct (wire-local.md §4.21), +guarded by sq_lock but where
	 * said: */
	int path_known;		 /* the path was asked for since the last RESET, INIT or RTR */
	int direct;		 /* bound to memcpy-direct: post_send may execute WRs itself */
	uint32_t max_rd_atomic;	 /* as the library (or rdma_cm's agent) set it */
	uint64_t relay_signaled; /* signaled WRs posted to the ring (while direct) */
	uint64_t relay_done;	 /* their completions taken from the ring; +guarded by the send CQ's lock */
	struct vrdma_qpdirect qd; /* the grants by rkey */
	struct vrdma_vm *vm;	  /* the session (set at create) */
	struct vrdma_qpchan qc;	  /* its send channel (wire-local.md §4.22; locks: vrdma.h) */
};

struct vrdma_srq {
	struct ibv_srq ibsrq;
	uint32_t magic;
	char *ring;
	size_t ring_size;
	uint32_t entries, stride, offset;
	uint32_t max_sge;
	uint32_t srq_num; /* an XRC SRQ's number (ibv_get_srq_num); 0 for a basic SRQ */
	pthread_mutex_t lock; /* posters */
	uint32_t tail;	      /* +guarded by lock */
};

struct vrdma_xrcd {
	struct ibv_xrcd ibxrcd;
	uint32_t magic;
	uint32_t handle; /* the agent's */
};

/* ---- the registries of live objects ---- */

/* A registry is a set of live pointers: every object this library made
 * (objs), and its QPs, SRQs and CQs again (qps, srqs, cqs, for
 * ibv_get_async_event's handles). */
struct registry {
	void **v;
	int n, cap;
};

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static struct registry objs, qps, srqs, cqs; /* +guarded by reg_mu */

void vrdma_forget_objects(void)
{
	pthread_mutex_init(&reg_mu, NULL);
	memset(&objs, 0, sizeof(objs));
	memset(&qps, 0, sizeof(qps));
	memset(&srqs, 0, sizeof(srqs));
	memset(&cqs, 0, sizeof(cqs));
}

static int reg_add(struct registry *r, void *p)
{
	int rc = 0;

	pthread_mutex_lock(&reg_mu);
	if (r->n == r->cap) {
		int cap = r->cap ? r->cap * 2 : 64;
		void **n = realloc(r->v, (size_t)cap * sizeof(*n));

		if (!n)
			rc = ENOMEM;
		else {
			r->v = n;
			r->cap = cap;
		}
	}
	if (!rc)
		r->v[r->n++] = p;
	pthread_mutex_unlock(&reg_mu);
	return rc;
}

static int reg_has(const void *p)
{
	int ok = 0;

	if (!p)
		return 0;
	pthread_mutex_lock(&reg_mu);
	for (int i = 0; i < objs.n && !ok; i++)
		ok = objs.v[i] == p;
	pthread_mutex_unlock(&reg_mu);
	return ok;
}

/* reg_take removes p; 0 if it was not there (a second destroy, or not ours). */
static int reg_take(struct registry *r, const void *p)
{
	int ok = 0;

	pthread_mutex_lock(&reg_mu);
	for (int i = 0; i < r->n; i++) {
		if (r->v[i] == p) {
			r->v[i] = r->v[--r->n];
			ok = 1;
			break;
		}
	}
	pthread_mutex_unlock(&reg_mu);
	return ok;
}

/* reg_find returns the object of r whose context and handle (members at
 * ctx_off and handle_off of its verbs struct) are ctx and handle, or NULL. */
static void *reg_find(struct registry *r, size_t ctx_off, size_t handle_off, struct ibv_context *ctx, uint32_t handle)
{
	void *found = NULL;

	pthread_mutex_lock(&reg_mu);
	for (int i = 0; i < r->n && !found; i++) {
		char *o = r->v[i];
		struct ibv_context *c;
		uint32_t h;

		memcpy(&c, o + ctx_off, sizeof(c));
		memcpy(&h, o + handle_off, sizeof(h));
		if (c == ctx && h == handle)
			found = o;
	}
	pthread_mutex_unlock(&reg_mu);
	return found;
}

struct ibv_qp *vrdma_qp_of_handle(struct ibv_context *ctx, uint32_t handle)
{
	return reg_find(&qps, offsetof(struct ibv_qp, context), offsetof(struct ibv_qp, handle), ctx, handle);
}

struct ibv_srq *vrdma_srq_of_handle(struct ibv_context *ctx, uint32_t handle)
{
	return reg_find(&srqs, offsetof(struct ibv_srq, context), offsetof(struct ibv_srq, handle), ctx, handle);
}

struct ibv_cq *vrdma_cq_of_handle(struct ibv_context *ctx, uint32_t handle)
{
	return reg_find(&cqs, offsetof(struct ibv_cq, context), offsetof(struct ibv_cq, handle), ctx, handle);
}

static struct vrdma_pd *to_pd(struct ibv_pd *p)
{
	return reg_has(p) && ((struct vrdma_pd *)p)->magic == MAGIC_PD ? (struct vrdma_pd *)p : NULL;
}

static struct vrdma_cq *to_cq(struct ibv_cq *c)
{
	return reg_has(c) && ((struct vrdma_cq *)c)->magic == MAGIC_CQ ? (struct vrdma_cq *)c : NULL;
}

static struct vrdma_qp *to_qp(struct ibv_qp *q)
{
	return reg_has(q) && ((struct vrdma_qp *)q)->magic == MAGIC_QP ? (struct vrdma_qp *)q : NULL;
}

static struct vrdma_xrcd *to_xrcd(struct ibv_xrcd *x)
{
	return reg_has(x) && ((struct vrdma_xrcd *)x)->magic == MAGIC_XRCD ? (struct vrdma_xrcd *)x : NULL;
}

static struct vrdma_srq *to_srq(struct ibv_srq *q)
{
	return reg_has(q) && ((struct vrdma_srq *)q)->magic == MAGIC_SRQ ? (struct vrdma_srq *)q : NULL;
}

/* ---- commands ---- */

static struct vrdma_vm *vm_of(struct ibv_context *c)
{
	return vrdma_ctx_ok(c) ? vrdma_vm_get() : NULL;
}

/* cmd runs op with body; 0 with r to free by the caller, or an errno (r
 * freed). With VRDMA_DEBUG set, an agent error is printed with its code
 * and message. */
static int cmd(struct vrdma_vm *vm, int op, const char *body, struct vrdma_reply *r)
{
	if (vrdma_call(&vm->s, op, body, r))
		return errno;
	if (r->is_error) {
		int e = r->err;

		if (getenv("VRDMA_DEBUG"))
			vrdma_warn("op %d: %s: %s", op, r->code, r->message);
		vrdma_reply_free(r);
		return e;
	}
	return 0;
}

static int cmd_handle(struct vrdma_vm *vm, int op, uint32_t handle)
{
	char body[48];
	struct vrdma_reply r;
	int e;

	snprintf(body, sizeof(body), "{\"handle\":%u}", handle);
	e = cmd(vm, op, body, &r);
	if (!e)
		vrdma_reply_free(&r);
	return e;
}

/* For ud.c: the registry of live objects, the PD check and commands. */
int vrdma_obj_add(void *p) { return reg_add(&objs, p); }
int vrdma_obj_take(const void *p) { return reg_take(&objs, p); }
int vrdma_obj_has(const void *p) { return reg_has(p); }
int vrdma_pd_ok(struct ibv_pd *p) { return to_pd(p) != NULL; }
int vrdma_cmd(struct vrdma_vm *vm, int op, const char *body, struct vrdma_reply *r) { return cmd(vm, op, body, r); }

/* ---- PD ---- */

struct ibv_pd *ibv_alloc_pd(struct ibv_context *context)
{
	struct vrdma_vm *vm = vm_of(context);
	struct vrdma_pd *pd;
	struct vrdma_reply r;
	char body[64];
	uint32_t h;
	int e;

	if (!vm) {
		errno = EINVAL;
		return NULL;
	}
	snprintf(body, sizeof(body), "{\"adapter\":\"%s\"}", to_vctx(context)->dev->adapter);
	e = cmd(vm, VRDMA_OP_ALLOC_PD, body, &r);
	if (e) {
		errno = e;
		return NULL;
	}
	e = json_get_u32(&r.doc, 0, "handle", &h) ? EIO : 0;
	vrdma_reply_free(&r);
	if (e) {
		errno = e;
		return NULL;
	}
	pd = calloc(1, sizeof(*pd));
	if (!pd || reg_add(&objs, pd)) {
		free(pd);
		cmd_handle(vm, VRDMA_OP_DEALLOC_PD, h);
		errno = ENOMEM;
		return NULL;
	}
	pd->ibpd.context = context;
	pd->ibpd.handle = h;
	pd->magic = MAGIC_PD;
	return &pd->ibpd;
}

static int dealloc_parent_domain(struct vrdma_pd *pd);

int ibv_dealloc_pd(struct ibv_pd *ibpd)
{
	struct vrdma_pd *pd = to_pd(ibpd);
	int e;

	if (!pd)
		return EINVAL;
	if (pd->parent)
		return dealloc_parent_domain(pd);
	pthread_mutex_lock(&reg_mu);
	e = pd->users ? EBUSY : 0; /* parent domains on it: as a PD MRs use */
	pthread_mutex_unlock(&reg_mu);
	if (e)
		return e;
	e = cmd_handle(vrdma_vm_get(), VRDMA_OP_DEALLOC_PD, pd->ibpd.handle);
	if (e && e != EIO)
		return e; /* EBUSY: MRs or QPs use it */
	reg_take(&objs, pd);
	pd->magic = 0;
	free(pd);
	return 0;
}

/* ---- thread domains and parent domains ----
 *
 * A parent domain is a protection domain with a thread domain and the
 * program's allocators for queue memory. vrdma's queues (QP, SRQ and CQ
 * rings) are the agent's memory, mapped from the descriptor create-qp,
 * create-srq or create-cq passes, never the program's: the allocators are
 * never called, as a provider whose queues live in device memory would
 * not. A thread domain promises that one thread uses the QPs made on it;
 * vrdma keeps its per-queue locks all the same (uncontended, they cost
 * little). */

static struct ibv_td *alloc_td(struct ibv_context *context, struct ibv_td_init_attr *attr)
{
	struct vrdma_td *td;

	if (!vrdma_ctx_ok(context) || !attr || attr->comp_mask) {
		errno = EINVAL;
		return NULL;
	}
	td = calloc(1, sizeof(*td));
	if (!td || reg_add(&objs, td)) {
		free(td);
		errno = ENOMEM;
		return NULL;
	}
	td->ibtd.context = context;
	td->magic = MAGIC_TD;
	return &td->ibtd;
}

static struct vrdma_td *to_td(struct ibv_td *t)
{
	return reg_has(t) && ((struct vrdma_td *)t)->magic == MAGIC_TD ? (struct vrdma_td *)t : NULL;
}

static int dealloc_td(struct ibv_td *ibtd)
{
	struct vrdma_td *td = to_td(ibtd);
	int e;

	if (!td)
		return EINVAL;
	pthread_mutex_lock(&reg_mu);
	e = td->users ? EBUSY : 0;
	pthread_mutex_unlock(&reg_mu);
	if (e)
		return e;
	reg_take(&objs, td);
	td->magic = 0;
	free(td);
	return 0;
}

static struct ibv_pd *alloc_parent_domain(struct ibv_context *context, struct ibv_parent_domain_init_attr *attr)
{
	struct vrdma_pd *parent = attr ? to_pd(attr->pd) : NULL, *pd;
	struct vrdma_td *td = attr && attr->td ? to_td(attr->td) : NULL;

	if (!vrdma_ctx_ok(context) || !parent || parent->parent || parent->ibpd.context != context ||
	    (attr->td && (!td || td->ibtd.context != context)) ||
	    (attr->comp_mask & ~(uint32_t)(IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT))) {
		errno = EINVAL;
		return NULL;
	}
	pd = calloc(1, sizeof(*pd));
	if (!pd || reg_add(&objs, pd)) {
		free(pd);
		errno = ENOMEM;
		return NULL;
	}
	pd->ibpd.context = context;
	pd->ibpd.handle = parent->ibpd.handle; /* the agent's PD */
	pd->parent = parent;
	pd->td = td;
	pd->magic = MAGIC_PD;
	pthread_mutex_lock(&reg_mu);
	parent->users++;
	if (td)
		td->users++;
	pthread_mutex_unlock(&reg_mu);
	return &pd->ibpd;
}

/* dealloc_parent_domain is ibv_dealloc_pd of a parent domain: its PD and
 * thread domain stay. */
static int dealloc_parent_domain(struct vrdma_pd *pd)
{
	reg_take(&objs, pd);
	pthread_mutex_lock(&reg_mu);
	pd->parent->users--;
	if (pd->td)
		pd->td->users--;
	pthread_mutex_unlock(&reg_mu);
	pd->magic = 0;
	free(pd);
	return 0;
}

/* ---- importing PDs and MRs ----
 *
 * ibv_import_pd and ibv_import_mr give a context imported from another of
 * this process's (ibv_import_device, device.c) a second object for a PD
 * or an MR of the same adapter, by the agent's handle: the same agent
 * object, as uverbs shares the kernel's. The agent's objects are the
 * session's, one per process, so another process's handles are not
 * found (EOPNOTSUPP from ibv_import_device already). An imported PD is
 * released like a parent domain, its PD kept. */

/* original_of finds the live object of kind magic (MAGIC_PD: a PD, not a
 * parent domain nor an imported one; MAGIC_MR: a registered MR, not an
 * imported one), of context c's adapter, whose verbs struct has handle h.
 * The registry holds objects of every kind, each a heap block of this
 * library: a block too small to be one of kind magic is not one. */
static void *original_of(uint32_t magic, struct ibv_context *c, uint32_t h)
{
	void *found = NULL;

	pthread_mutex_lock(&reg_mu);
	for (int i = 0; i < objs.n && !found; i++) {
		struct vrdma_pd *p = objs.v[i];
		struct vrdma_mr *m = objs.v[i];

		if (magic == MAGIC_PD && malloc_usable_size(p) >= sizeof(*p) && p->magic == MAGIC_PD && !p->parent &&
		    p->ibpd.handle == h && to_vctx(p->ibpd.context)->dev == to_vctx(c)->dev)
			found = p;
		if (magic == MAGIC_MR && malloc_usable_size(m) >= sizeof(*m) && m->magic == MAGIC_MR && m->adopted &&
		    m->ibmr.handle == h && to_vctx(m->ibmr.context)->dev == to_vctx(c)->dev)
			found = m;
	}
	pthread_mutex_unlock(&reg_mu);
	return found;
}

struct ibv_pd *ibv_import_pd(struct ibv_context *context, uint32_t pd_handle)
{
	struct vrdma_pd *orig = vrdma_ctx_ok(context) ? original_of(MAGIC_PD, context, pd_handle) : NULL;
	struct ibv_parent_domain_init_attr a = { .pd = orig ? &orig->ibpd : NULL };
	struct ibv_pd *pd;

	if (!orig) {
		errno = EINVAL;
		return NULL;
	}
	pd = alloc_parent_domain(orig->ibpd.context, &a);
	if (pd)
		pd->context = context;
	return pd;
}

void ibv_unimport_pd(struct ibv_pd *ibpd)
{
	struct vrdma_pd *pd = to_pd(ibpd);

	if (pd && pd->parent)
		dealloc_parent_domain(pd);
}

struct ibv_mr *ibv_import_mr(struct ibv_pd *ibpd, uint32_t mr_handle)
{
	struct vrdma_pd *pd = to_pd(ibpd);
	struct vrdma_mr *orig = pd ? original_of(MAGIC_MR, ibpd->context, mr_handle) : NULL, *mr;

	if (!orig || orig->ibmr.pd->handle != pd->ibpd.handle) {
		errno = EINVAL;
		return NULL;
	}
	mr = calloc(1, sizeof(*mr));
	if (!mr || reg_add(&objs, mr)) {
		free(mr);
		errno = ENOMEM;
		return NULL;
	}
	/* As uverbs imports one: keys, handle and length; no address (the
	 * importer knows it from whoever gave it the handle). */
	mr->ibmr.context = ibpd->context;
	mr->ibmr.pd = ibpd;
	mr->ibmr.length = orig->ibmr.length;
	mr->ibmr.handle = orig->ibmr.handle;
	mr->ibmr.lkey = orig->ibmr.lkey;
	mr->ibmr.rkey = orig->ibmr.rkey;
	mr->magic = MAGIC_MR;
	return &mr->ibmr;
}

void ibv_unimport_mr(struct ibv_mr *ibmr)
{
	struct vrdma_mr *mr = (struct vrdma_mr *)ibmr;

	if (!reg_has(ibmr) || mr->magic != MAGIC_MR)
		return;
	reg_take(&objs, mr);
	mr->magic = 0;
	free(mr);
}

/* ---- MR ---- */

#define ACCESS_SUPPORTED                                                                           \
	(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | \
	 IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND | IBV_ACCESS_ON_DEMAND)

/* Access flags verbs defines for capabilities vrdma does not have. */
#define ACCESS_UNSUPPORTED IBV_ACCESS_ZERO_BASED

/* access_flags masks the optional bits (rdma-core lets a device ignore
 * them) and IBV_ACCESS_HUGETLB (a hint that the memory is of huge pages:
 * adoption finds that out itself, mem.c); -EOPNOTSUPP for a capability
 * vrdma lacks (zero-based regions; memory windows or ODP with an agent
 * older than them), as a device without it answers; -EINVAL for bits verbs
 * does not define. */
static int access_flags(struct vrdma_vm *vm, unsigned int access)
{
	access &= ~(unsigned int)(IBV_ACCESS_OPTIONAL_RANGE | IBV_ACCESS_HUGETLB);
	if (access & ~(unsigned int)(ACCESS_SUPPORTED | ACCESS_UNSUPPORTED))
		return -EINVAL;
	if ((access & ACCESS_UNSUPPORTED) || ((access & IBV_ACCESS_MW_BIND) && !(vm && (vm->s.caps & VRDMA_CAP_MW))) ||
	    ((access & IBV_ACCESS_ON_DEMAND) && !(vm && (vm->s.caps & VRDMA_CAP_ODP))))
		return -EOPNOTSUPP;
	return (int)access;
}

/* lmr_record makes mr the region of its lkey for memcpy-direct's local
 * checks (direct.c); without the entry (no memory) a WR over it relays. */
static void lmr_record(struct vrdma_mr *mr, uint32_t access)
{
	struct vrdma_lmr m = { .pd = mr->ibmr.pd->handle, .access = access, .iova = mr->iova,
			       .length = mr->ibmr.length, .addr = mr->ibmr.addr };

	if (vrdma_lmr_set(mr->ibmr.lkey, &m))
		vrdma_lmr_del(mr->ibmr.lkey);
}

static struct ibv_mr *reg_mr(struct ibv_pd *ibpd, void *addr, size_t length, uint64_t iova, unsigned int access)
{
	struct vrdma_pd *pd = to_pd(ibpd);
	struct vrdma_vm *vm = pd ? vrdma_vm_get() : NULL;
	struct vrdma_mr *mr;
	struct vrdma_reply r;
	uint64_t guest;
	uint32_t h, lkey, rkey;
	void *adopted;
	char body[256];
	struct jbuf b;
	int acc = access_flags(vm, access), e;

	if (acc == -EOPNOTSUPP) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (!pd || !vm || acc < 0 || length == 0 || (acc & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC) &&
						   !(acc & IBV_ACCESS_LOCAL_WRITE))) {
		errno = EINVAL;
		return NULL;
	}
	if (!addr) {
		errno = EFAULT;
		return NULL;
	}
	if (!(vm->s.caps & VRDMA_CAP_MR_IOVA)) {
		vrdma_warn("ibv_reg_mr: the agent does not take region iovas (capability mr-iova): upgrade vrdmad");
		errno = EOPNOTSUPP;
		return NULL;
	}
	e = vrdma_adopt(vm, addr, length, acc & IBV_ACCESS_ON_DEMAND, &guest, &adopted);
	if (e) {
		errno = e;
		return NULL;
	}
	jb_init(&b, body, sizeof(body));
	jb_raw(&b, "{");
	jb_u64(&b, "pd", pd->ibpd.handle);
	jb_u64(&b, "addr", guest);
	jb_u64(&b, "length", length);
	jb_u64(&b, "access", (uint64_t)acc);
	jb_u64(&b, "iova", iova);
	jb_raw(&b, "}");
	e = cmd(vm, VRDMA_OP_REG_MR, body, &r);
	if (e) {
		vrdma_unadopt(vm, adopted);
		errno = e;
		return NULL;
	}
	e = json_get_u32(&r.doc, 0, "handle", &h) || json_get_u32(&r.doc, 0, "lkey", &lkey) ||
	    json_get_u32(&r.doc, 0, "rkey", &rkey);
	vrdma_reply_free(&r);
	mr = e ? NULL : calloc(1, sizeof(*mr));
	if (!mr || reg_add(&objs, mr)) {
		if (!e)
			cmd_handle(vm, VRDMA_OP_DEREG_MR, h);
		vrdma_unadopt(vm, adopted);
		free(mr);
		errno = e ? EIO : ENOMEM;
		return NULL;
	}
	mr->ibmr.context = pd->ibpd.context;
	mr->ibmr.pd = &pd->ibpd;
	mr->ibmr.addr = addr;
	mr->ibmr.length = length;
	mr->ibmr.handle = h;
	mr->ibmr.lkey = lkey;
	mr->ibmr.rkey = rkey;
	mr->magic = MAGIC_MR;
	mr->adopted = adopted;
	mr->on_demand = !!(acc & IBV_ACCESS_ON_DEMAND);
	mr->iova = iova;
	lmr_record(mr, (uint32_t)acc);
	return &mr->ibmr;
}

#undef ibv_reg_mr
struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
	return reg_mr(pd, addr, length, (uintptr_t)addr, (unsigned int)access);
}

#undef ibv_reg_mr_iova
struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, int access)
{
	return reg_mr(pd, addr, length, iova, (unsigned int)access);
}

struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, unsigned int access)
{
	return reg_mr(pd, addr, length, iova, access);
}

int ibv_dereg_mr(struct ibv_mr *ibmr)
{
	struct vrdma_mr *mr = (struct vrdma_mr *)ibmr;
	struct vrdma_lmr lm;
	int e, had = 0;

	if (!reg_has(ibmr) || mr->magic != MAGIC_MR)
		return EINVAL;
	if (mr->adopted) {
		/* From now on a WR over it relays: the agent refuses it. */
		if (vrdma_lmr_get(mr->ibmr.lkey, &lm))
			had = 1;
		vrdma_lmr_del(mr->ibmr.lkey);
	}
	e = cmd_handle(vrdma_vm_get(), VRDMA_OP_DEREG_MR, mr->ibmr.handle);
	if (e && e != EIO) {
		if (had)
			vrdma_lmr_set(mr->ibmr.lkey, &lm);
		return e;
	}
	reg_take(&objs, mr);
	vrdma_unadopt(vrdma_vm_get(), mr->adopted);
	mr->magic = 0;
	free(mr);
	return 0;
}

/* advise_mr_op is ibv_advise_mr (capability odp): the agent checks every
 * range against the PD's on-demand regions and populates their guest
 * memory before it replies, with IBV_ADVISE_MR_FLAG_FLUSH or without
 * (advise-mr, wire-local.md §4.20). An errno, as ibv_advise_mr returns. */
static int advise_mr_op(struct ibv_pd *ibpd, enum ibv_advise_mr_advice advice, uint32_t flags, struct ibv_sge *sg_list,
			uint32_t num_sge)
{
	struct vrdma_pd *pd = to_pd(ibpd);
	struct vrdma_vm *vm = pd ? vrdma_vm_get() : NULL;
	struct vrdma_reply r;
	size_t cap = 96 + (size_t)num_sge * 72;
	struct jbuf b;
	char *body;
	int e;

	if (!pd || !vm || !sg_list || num_sge == 0 || num_sge > VRDMA_MAX_ADVISE_SGE || (flags & ~IBV_ADVISE_MR_FLAG_FLUSH))
		return EINVAL;
	if (!(vm->s.caps & VRDMA_CAP_ODP) || advice > IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT)
		return EOPNOTSUPP;
	body = malloc(cap);
	if (!body)
		return ENOMEM;
	jb_init(&b, body, cap);
	jb_raw(&b, "{");
	jb_u64(&b, "pd", pd->ibpd.handle);
	jb_u64(&b, "advice", (uint64_t)advice);
	jb_u64(&b, "flags", flags);
	jb_key(&b, "sges");
	jb_raw(&b, "[");
	for (uint32_t i = 0; i < num_sge; i++) {
		jb_raw(&b, i ? ",{" : "{");
		jb_u64(&b, "addr", sg_list[i].addr);
		jb_u64(&b, "length", sg_list[i].length);
		jb_u64(&b, "lkey", sg_list[i].lkey);
		jb_raw(&b, "}");
	}
	jb_raw(&b, "]}");
	e = b.err ? ENOMEM : cmd(vm, VRDMA_OP_ADVISE_MR, body, &r);
	free(body);
	if (!e)
		vrdma_reply_free(&r);
	return e;
}

/* ibv_rereg_mr changes mr in place (§4.16): a new range is adopted as
 * ibv_reg_mr adopts one, and the old range's pages go back once the agent
 * took the new one. The keys stay. Errors as rdma-core reports them: a
 * negative IBV_REREG_MR_ERR_* with errno set. */
int ibv_rereg_mr(struct ibv_mr *ibmr, int flags, struct ibv_pd *ibpd, void *addr, size_t length, int access)
{
	struct vrdma_mr *mr = (struct vrdma_mr *)ibmr;
	struct vrdma_vm *vm = vrdma_vm_get();
	struct vrdma_pd *pd = NULL;
	struct vrdma_reply r;
	void *adopted = NULL;
	uint64_t guest = 0;
	char body[256];
	struct jbuf b;
	int acc = 0, e;

	if (!reg_has(ibmr) || mr->magic != MAGIC_MR || !vm || !flags || (flags & ~IBV_REREG_MR_FLAGS_SUPPORTED) ||
	    ((flags & IBV_REREG_MR_CHANGE_TRANSLATION) && (!addr || !length)) ||
	    (!(flags & IBV_REREG_MR_CHANGE_TRANSLATION) && (addr || length))) {
		errno = EINVAL;
		return IBV_REREG_MR_ERR_INPUT;
	}
	if (flags & IBV_REREG_MR_CHANGE_PD) {
		pd = to_pd(ibpd);
		if (!pd || pd->ibpd.context != ibmr->context) {
			errno = EINVAL;
			return IBV_REREG_MR_ERR_INPUT;
		}
	}
	if (flags & IBV_REREG_MR_CHANGE_ACCESS) {
		acc = access_flags(vm, (unsigned int)access);
		if (acc == -EOPNOTSUPP) {
			errno = EOPNOTSUPP;
			return IBV_REREG_MR_ERR_INPUT;
		}
		if (acc < 0 || (acc & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC) && !(acc & IBV_ACCESS_LOCAL_WRITE))) {
			errno = EINVAL;
			return IBV_REREG_MR_ERR_INPUT;
		}
	}
	if (!(vm->s.caps & VRDMA_CAP_CORE_VERBS)) {
		errno = EOPNOTSUPP; /* an older agent: as a device without rereg */
		return IBV_REREG_MR_ERR_INPUT;
	}
	if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
		int on_demand = flags & IBV_REREG_MR_CHANGE_ACCESS ? acc & IBV_ACCESS_ON_DEMAND : mr->on_demand;

		e = vrdma_adopt(vm, addr, length, on_demand, &guest, &adopted);
		if (e) {
			errno = e;
			return IBV_REREG_MR_ERR_INPUT;
		}
	}
	jb_init(&b, body, sizeof(body));
	jb_raw(&b, "{");
	jb_u64(&b, "handle", ibmr->handle);
	jb_u64(&b, "flags", (uint64_t)flags);
	if (pd)
		jb_u64(&b, "pd", pd->ibpd.handle);
	if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
		jb_u64(&b, "addr", guest);
		jb_u64(&b, "length", length);
		jb_u64(&b, "iova", (uintptr_t)addr);
	}
	if (flags & IBV_REREG_MR_CHANGE_ACCESS)
		jb_u64(&b, "access", (uint64_t)acc);
	jb_raw(&b, "}");
	e = cmd(vm, VRDMA_OP_REREG_MR, body, &r);
	if (e) {
		if (adopted)
			vrdma_unadopt(vm, adopted);
		errno = e;
		return IBV_REREG_MR_ERR_CMD;
	}
	vrdma_reply_free(&r);
	if (pd)
		ibmr->pd = &pd->ibpd;
	if (flags & IBV_REREG_MR_CHANGE_ACCESS)
		mr->on_demand = !!(acc & IBV_ACCESS_ON_DEMAND);
	if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
		vrdma_unadopt(vm, mr->adopted);
		mr->adopted = adopted;
		ibmr->addr = addr;
		ibmr->length = length;
		mr->iova = (uintptr_t)addr;
	}
	if (mr->adopted) {
		struct vrdma_lmr lm;

		if (flags & IBV_REREG_MR_CHANGE_ACCESS)
			lmr_record(mr, (uint32_t)acc);
		else if (vrdma_lmr_get(ibmr->lkey, &lm))
			lmr_record(mr, lm.access);
	}
	return 0;
}

/* ---- completion channels ---- */

struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *context)
{
	struct ibv_comp_channel *ch;

	if (!vrdma_ctx_ok(context)) {
		errno = EINVAL;
		return NULL;
	}
	ch = calloc(1, sizeof(*ch));
	if (!ch) {
		errno = ENOMEM;
		return NULL;
	}
	/* An epoll set over the event sockets of the channel's CQs. */
	ch->fd = epoll_create1(EPOLL_CLOEXEC);
	if (ch->fd < 0 || reg_add(&objs, ch)) {
		int err = ch->fd < 0 ? errno : ENOMEM;

		if (ch->fd >= 0)
			close(ch->fd);
		free(ch);
		errno = err;
		return NULL;
	}
	ch->context = context;
	return ch;
}

int ibv_destroy_comp_channel(struct ibv_comp_channel *ch)
{
	if (!reg_has(ch))
		return EINVAL;
	if (ch->refcnt)
		return EBUSY;
	reg_take(&objs, ch);
	close(ch->fd);
	free(ch);
	return 0;
}

int ibv_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq_out, void **cq_context)
{
	struct epoll_event ev;
	struct vrdma_cq *cq;
	char buf[64];
	int n, fl;

	if (!reg_has(ch) || !cq_out || !cq_context) {
		errno = EINVAL;
		return -1;
	}
	fl = fcntl(ch->fd, F_GETFL);
	n = epoll_wait(ch->fd, &ev, 1, fl >= 0 && (fl & O_NONBLOCK) ? 0 : -1);
	if (n < 0)
		return -1; /* EINTR, as a read of the kernel's channel */
	if (n == 0) {
		errno = EAGAIN;
		return -1;
	}
	cq = ev.data.ptr;
	for (;;) {
		ssize_t k = recv(cq->event_fd, buf, sizeof(buf), MSG_DONTWAIT);

		if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR)) {
			errno = EIO; /* the agent is gone */
			return -1;
		}
		if (k < 0 && errno == EAGAIN)
			break;
	}
	*cq_out = &cq->ibcq;
	*cq_context = cq->ibcq.cq_context;
	return 0;
}

void ibv_ack_cq_events(struct ibv_cq *ibcq, unsigned int nevents)
{
	if (!to_cq(ibcq))
		return;
	pthread_mutex_lock(&ibcq->mutex);
	ibcq->comp_events_completed += nevents;
	pthread_cond_broadcast(&ibcq->cond);
	pthread_mutex_unlock(&ibcq->mutex);
}

/* ---- CQ ---- */

/* map_ring maps the memfd fd of size bytes after checking its file size. */
static void *map_ring(int fd, uint64_t size)
{
	struct stat st;
	void *p;

	if (fstat(fd, &st) || (uint64_t)st.st_size < size) {
		errno = EIO;
		return NULL;
	}
	p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return NULL;
	(void)madvise(p, size, MADV_DONTFORK); /* device.c's forget_parent */
	return p;
}

/* decode_cqe reads the CQE at cq's head into w (§5.3). */
static void decode_cqe(struct vrdma_cq *cq, struct ibv_wc *w)
{
	cqe_to_wc(cq->ring + cq->offset + ring_slot(cq->head, cq->entries) * VRDMA_CQE_SIZE, w);
}

/* ---- the local completion queue (memcpy-direct, wire-local.md §4.21) ----
 *
 * A signaled WR the library executes itself completes into its send CQ's
 * local queue, a FIFO beside the ring that poll_cq (and ibv_start_poll)
 * empties first. Before a completion is added, the ring's pending CQEs
 * move into the local queue, so that every local completion is older than
 * every CQE left in the ring. Every send CQE of a QP bound to the path
 * that the library takes from the ring (polled or moved) is counted
 * against the QP (relay_done), so that post_send knows when nothing
 * relayed is outstanding (rule 2). The agent does not see the local queue;
 * it may fill the ring behind it. All of it under the CQ's lock. */

/* cq_count counts w, just taken from cq's ring, against its QP if that
 * QP is bound to memcpy-direct and w is a send completion. */
static void cq_count(struct vrdma_cq *cq, const struct ibv_wc *w)
{
	if (cq->ntrack && w->opcode < IBV_WC_RECV)
		for (int i = 0; i < cq->ntrack; i++)
			if (cq->track[i]->qpx.qp_base.qp_num == w->qp_num) {
				cq->track[i]->relay_done++;
				break;
			}
}

/* local_reserve makes room in the local queue for n more completions: 0,
 * or ENOMEM. */
static int local_reserve(struct vrdma_cq *cq, uint32_t n)
{
	uint32_t cap = cq->lcap ? cq->lcap : 64;
	struct ibv_wc *l;

	if (cq->lcount + n <= cq->lcap)
		return 0;
	while (cap < cq->lcount + n)
		cap *= 2;
	l = malloc((size_t)cap * sizeof(*l));
	if (!l)
		return ENOMEM;
	for (uint32_t i = 0; i < cq->lcount; i++)
		l[i] = cq->local[(cq->lhead + i) % cq->lcap];
	free(cq->local);
	cq->local = l;
	cq->lcap = cap;
	cq->lhead = 0;
	return 0;
}

/* local_push appends w (room reserved). */
static void local_push(struct vrdma_cq *cq, const struct ibv_wc *w)
{
	cq->local[(cq->lhead + cq->lcount) % cq->lcap] = *w;
	cq->lcount++;
}

/* local_pop takes the oldest local completion into w. */
static void local_pop(struct vrdma_cq *cq, struct ibv_wc *w)
{
	*w = cq->local[cq->lhead];
	cq->lhead = (cq->lhead + 1) % cq->lcap;
	cq->lcount--;
}

/* cq_drain moves the ring's pending CQEs into the local queue, counting
 * them: 0, or -1 when the ring's tail is not an index the agent writes or
 * there is no memory for them (then none moved). */
static int cq_drain(struct vrdma_cq *cq)
{
	uint32_t tail = ring_cq_tail(cq->ring);

	if (!ring_tail_ok(tail, cq->head, cq->entries) ||
	    local_reserve(cq, ring_pending(tail, cq->head, cq->entries)))
		return -1;
	if (tail == cq->head)
		return 0;
	while (cq->head != tail) {
		struct ibv_wc w;

		decode_cqe(cq, &w);
		cq->head = ring_next(cq->head, cq->entries);
		cq_count(cq, &w);
		local_push(cq, &w);
	}
	ring_cq_consumed(cq->ring, cq->head);
	return 0;
}

/* ---- the send channel's part of a CQ (wire-local.md §4.22) ----
 *
 * At every poll (poll_cq, ibv_start_poll), under the CQ's lock, before the
 * ring's CQEs: the channel sends of the QPs whose send CQ this is are
 * reaped into the local queue, in order and without moving the ring's
 * CQEs first (a channel send is older than every ring CQE of its QP: rule
 * 2), and the messages waiting in the channels of the QPs whose recv CQ
 * this is are taken into their posted receives (the ring's pending CQEs
 * move into the local queue first, as for §4.21's completions). What
 * needs a command or the QP's send lock (direct-notify, cq-notify, a QP
 * moving to ERR, a retraction) is noted in struct chan_acts and done by
 * chan_after once the CQ's lock is released: sq_lock comes before a CQ's
 * lock, the agent may be serving a command of this session that waits for
 * the revocation reader, and a modify-qp to ERR revokes the channel. */

#define CHAN_ACTS 16

static void direct_discover(struct vrdma_vm *vm, struct vrdma_qp *qp);
static void direct_posted(struct vrdma_qp *qp, const void *slot);
static void *sq_slot(struct vrdma_qp *qp, uint32_t idx);
static void publish_sq(struct vrdma_qp *qp);

struct chan_acts {
	struct vrdma_qp *err[CHAN_ACTS]; /* to move to ERR */
	int nerr;
	struct vrdma_qp *retract[CHAN_ACTS]; /* to retract (and relay) */
	int nretract;
	uint32_t notify_send[CHAN_ACTS]; /* QP handles: direct-notify {cq: send} */
	uint8_t notify_sol[CHAN_ACTS];
	int nnotify;
	int notify_own; /* cq-notify for this CQ */
	struct vrdma_qp *skip_qp[CHAN_ACTS]; /* receivers that skipped retracted messages */
	uint32_t skip_n[CHAN_ACTS];	     /* how many each */
	int nskip;
};

static void chan_note(struct vrdma_qp **v, int *n, struct vrdma_qp *qp)
{
	for (int i = 0; i < *n; i++)
		if (v[i] == qp)
			return;
	if (*n < CHAN_ACTS)
		v[(*n)++] = qp;
}

static void chan_acts_init(struct chan_acts *a)
{
	a->nerr = a->nretract = a->nnotify = a->notify_own = a->nskip = 0;
}

static int chan_acts_any(const struct chan_acts *a)
{
	return a->nerr || a->nretract || a->nnotify || a->notify_own;
}

/* chan_err moves qp to ERR if it is to (want_err 1), with no lock held. */
static void chan_err(struct vrdma_qp *qp)
{
	int one = 1;
	struct ibv_qp_attr at = { .qp_state = IBV_QPS_ERR };

	if (__atomic_compare_exchange_n(&qp->qc.want_err, &one, 2, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
		(void)ibv_modify_qp(&qp->qpx.qp_base, &at, IBV_QP_STATE);
}

/* chan_notify tells the agent that the peer of QP handle qp is to have
 * the event of its cq ("send" or "recv") if armed (direct-notify). */
static void chan_notify(struct vrdma_vm *vm, uint32_t qp, const char *which, int solicited)
{
	struct vrdma_reply r;
	char body[80];

	snprintf(body, sizeof(body), "{\"qp\":%u,\"cq\":\"%s\",\"solicited\":%s}", qp, which, solicited ? "true" : "false");
	if (!cmd(vm, VRDMA_OP_DIRECT_NOTIFY, body, &r))
		vrdma_reply_free(&r);
}

/* chan_retract retracts what it may of qp's channel sends and posts them
 * to the SQ ring, in posting order, ahead of the keep WQEs the caller
 * wrote at the SQ tail (not yet counted in it): 0, or ENOMEM when the
 * send queue has no room for them all (nothing retracted). In RESET the
 * sends a revocation left are dropped, as RESET drops WRs. The caller
 * holds sq_lock. */
static int chan_retract(struct vrdma_qp *qp, uint32_t keep)
{
	struct vrdma_chan *ch = __atomic_load_n(&qp->qc.cur, __ATOMIC_ACQUIRE);
	uint32_t idx[VRDMA_CHAN_MAX_ENTRIES], out, room, n;
	char *save = NULL;

	if (!ch || !(out = vrdma_chan_outstanding(ch, 0)))
		return 0;
	room = qp->sq_entries - ring_pending(qp->sq_tail, ring_load(qp->ring, VRDMA_QP_SQ_HEAD), qp->sq_entries);
	if ((uint64_t)out + keep > room || out > VRDMA_CHAN_MAX_ENTRIES)
		return ENOMEM;
	if (keep && !(save = malloc((size_t)keep * qp->sq_stride)))
		return ENOMEM;
	n = (uint32_t)vrdma_chan_retract(ch, idx, out);
	if (!n) {
		free(save);
		return 0;
	}
	if (ring_load(qp->ring, VRDMA_QP_STATE) == IBV_QPS_RESET) {
		free(save);
		return 0; /* retracted: reaped without completions */
	}
	if (getenv("VRDMA_DEBUG"))
		vrdma_warn("QP %u: %u channel sends retracted, relayed before %u more", qp->qpx.qp_base.qp_num, n, keep);
	for (uint32_t k = 0; k < keep; k++)
		memcpy(save + (size_t)k * qp->sq_stride, sq_slot(qp, (qp->sq_tail + k) & ring_mask(qp->sq_entries)),
		       qp->sq_stride);
	for (uint32_t k = 0; k < n; k++) {
		memcpy(sq_slot(qp, qp->sq_tail), vrdma_chan_wqe(ch, idx[k]), qp->sq_stride);
		direct_posted(qp, sq_slot(qp, qp->sq_tail));
		qp->sq_tail = ring_next(qp->sq_tail, qp->sq_entries);
	}
	for (uint32_t k = 0; k < keep; k++)
		memcpy(sq_slot(qp, (qp->sq_tail + k) & ring_mask(qp->sq_entries)), save + (size_t)k * qp->sq_stride,
		       qp->sq_stride);
	free(save);
	publish_sq(qp);
	return 0;
}

/* chan_reap_qp reaps qp's channel sends into cq's local queue; caller
 * holds cq's lock. Without a (a post's reap), what is to be done is left
 * in want_err or for the next poll. */
static void chan_reap_qp(struct vrdma_cq *cq, struct vrdma_qp *qp, struct chan_acts *a)
{
	struct vrdma_chan *ch = __atomic_load_n(&qp->qc.cur, __ATOMIC_ACQUIRE);
	struct ibv_wc w[32];
	int n, err = 0, retract = 0;

	if (!ch || !vrdma_chan_outstanding(ch, 0))
		return;
	do {
		if (local_reserve(cq, 32))
			return; /* no memory: later */
		n = vrdma_chan_reap(ch, qp->qpx.qp_base.qp_num, w, 32, &err, &retract);
		for (int i = 0; i < n; i++)
			local_push(cq, &w[i]);
	} while (n == 32);
	if (err) {
		int zero = 0;

		(void)__atomic_compare_exchange_n(&qp->qc.want_err, &zero, 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
		if (a && __atomic_load_n(&qp->qc.want_err, __ATOMIC_SEQ_CST) == 1)
			chan_note(a->err, &a->nerr, qp);
	}
	if (retract && a)
		chan_note(a->retract, &a->nretract, qp);
}

/* chan_work is a poll's channel part; caller holds cq's lock. */
static void chan_work(struct vrdma_cq *cq, struct chan_acts *a)
{
	for (int i = 0; i < cq->ntrack; i++)
		chan_reap_qp(cq, cq->track[i], a);
	for (int i = 0; i < cq->nrxq; i++) {
		struct vrdma_qp *qp = cq->rxq[i];
		struct vrdma_chan *ch = __atomic_load_n(&qp->qc.cur, __ATOMIC_ACQUIRE);
		struct vrdma_chan_rq rq;
		struct ibv_wc w[32];
		uint32_t ctail, room, skipped = 0;
		int n, sol = 0, notify = 0;

		if (!ch)
			continue;
		ctail = ring_cq_tail(cq->ring);
		if (!ring_tail_ok(ctail, cq->head, cq->entries))
			continue;
		room = cq->lcount + ring_pending(ctail, cq->head, cq->entries);
		room = room < cq->entries ? cq->entries - room : 0;
		if (!room)
			continue; /* the CQ is full: the messages wait (then are retracted and relayed) */
		rq = (struct vrdma_chan_rq){ .ring = qp->ring,
					     .rq_offset = qp->rq_offset,
					     .rq_stride = qp->rq_stride,
					     .rq_entries = qp->rq_entries,
					     .max_recv_sge = qp->caps.max_recv_sge,
					     .pd = qp->qpx.qp_base.pd->handle,
					     .qpn = qp->qpx.qp_base.qp_num };
		if (local_reserve(cq, ring_pending(ctail, cq->head, cq->entries) + 32))
			continue;
		n = vrdma_chan_take(ch, &rq, w, room < 32 ? (int)room : 32, &sol, &notify, &skipped);
		if (skipped && a->nskip < CHAN_ACTS) {
			a->skip_qp[a->nskip] = qp;
			a->skip_n[a->nskip++] = skipped;
		}
		if (n) {
			/* No event of this CQ for these: each message raised it
			 * when it came (its sender's direct-notify) if the CQ was
			 * armed then, or was taken at the arming (req_notify_cq)
			 * and so came before it, as a device's CQE that is there
			 * when the CQ is armed raises none. */
			(void)cq_drain(cq); /* reserved above: moves them all */
			for (int k = 0; k < n; k++)
				local_push(cq, &w[k]);
		}
		if (notify && a->nnotify < CHAN_ACTS) {
			a->notify_sol[a->nnotify] = notify == 2;
			a->notify_send[a->nnotify++] = qp->qpx.qp_base.handle;
		}
	}
}

/* chan_after does what chan_work noted, with no lock held. */
static void chan_after(struct vrdma_cq *cq, struct chan_acts *a)
{
	struct vrdma_vm *vm;

	if (!chan_acts_any(a))
		return;
	vm = vrdma_vm_get();
	for (int i = 0; vm && i < a->nnotify; i++)
		chan_notify(vm, a->notify_send[i], "send", a->notify_sol[i]);
	if (vm && a->notify_own)
		cmd_handle(vm, VRDMA_OP_CQ_NOTIFY, cq->ibcq.handle);
	for (int i = 0; i < a->nretract; i++) {
		struct vrdma_qp *qp = a->retract[i];

		pthread_mutex_lock(&qp->sq_lock);
		(void)chan_retract(qp, 0); /* no room: the next post or poll */
		pthread_mutex_unlock(&qp->sq_lock);
	}
	for (int i = 0; i < a->nerr; i++)
		chan_err(a->err[i]);
}

void vrdma_chan_kick(void *owner)
{
	struct vrdma_qp *qp = owner;

	/* The revocation reader's: never waits for sq_lock, which may be
	 * held across a command (its holder retracts itself). */
	if (pthread_mutex_trylock(&qp->sq_lock))
		return;
	(void)chan_retract(qp, 0);
	pthread_mutex_unlock(&qp->sq_lock);
}

/* chan_ask asks for qp's channel if it has none (at a post, and after a
 * move to RTS); the caller holds sq_lock. */
static void chan_ask(struct vrdma_vm *vm, struct vrdma_qp *qp)
{
	struct vrdma_cq *rcq = (struct vrdma_cq *)qp->qpx.qp_base.recv_cq;
	struct vrdma_chan *ch;
	uint32_t how;

	if (!qp->direct || __atomic_load_n(&qp->qc.cur, __ATOMIC_ACQUIRE) || qp->qc.stopped || qp->qpx.qp_base.srq ||
	    vrdma_chan_attach(vm, &qp->qc, qp->qpx.qp_base.handle, qp->ring))
		return;
	/* Its recv CQ armed before: the new channel is armed too (the
	 * sender posts into it only after this library set ready). */
	ch = __atomic_load_n(&qp->qc.cur, __ATOMIC_ACQUIRE);
	how = __atomic_load_n(ring_word(rcq->ring, VRDMA_CQ_ARMED), __ATOMIC_SEQ_CST);
	if (how == VRDMA_CQ_ARM_ALL || how == VRDMA_CQ_ARM_SOLICITED)
		(void)vrdma_chan_arm_rx(ch, how);
}

static void cq_rxq_add(struct vrdma_cq *cq, struct vrdma_qp *qp)
{
	pthread_mutex_lock(&cq->lock);
	if (cq->nrxq == cq->rxqcap) {
		int cap = cq->rxqcap ? cq->rxqcap * 2 : 4;
		struct vrdma_qp **n = realloc(cq->rxq, (size_t)cap * sizeof(*n));

		if (!n) {
			pthread_mutex_unlock(&cq->lock);
			return; /* then its messages wait for the agent's RNR handling: its sender's channel is never drained */
		}
		cq->rxq = n;
		cq->rxqcap = cap;
	}
	cq->rxq[cq->nrxq++] = qp;
	pthread_mutex_unlock(&cq->lock);
}

static void cq_rxq_del(struct vrdma_cq *cq, struct vrdma_qp *qp)
{
	pthread_mutex_lock(&cq->lock);
	for (int i = 0; i < cq->nrxq; i++)
		if (cq->rxq[i] == qp) {
			cq->rxq[i] = cq->rxq[--cq->nrxq];
			break;
		}
	pthread_mutex_unlock(&cq->lock);
}

static int poll_cq(struct ibv_cq *ibcq, int num_entries, struct ibv_wc *wc)
{
	struct vrdma_cq *cq = (struct vrdma_cq *)ibcq;
	struct chan_acts acts;
	uint32_t tail, head;
	int n = 0;

	if (!ibcq || cq->magic != MAGIC_CQ || num_entries < 0 || (num_entries > 0 && !wc))
		return -EINVAL;
	pthread_mutex_lock(&cq->lock);
	chan_acts_init(&acts);
	if (cq->ntrack || cq->nrxq)
		chan_work(cq, &acts);
	while (n < num_entries && cq->lcount)
		local_pop(cq, &wc[n++]);
	tail = ring_cq_tail(cq->ring);
	if (!ring_tail_ok(tail, cq->head, cq->entries)) {
		pthread_mutex_unlock(&cq->lock);
		chan_after(cq, &acts);
		return n ? n : -EIO; /* not an index the agent writes */
	}
	head = cq->head;
	while (n < num_entries && cq->head != tail) {
		decode_cqe(cq, &wc[n]);
		cq_count(cq, &wc[n++]);
		cq->head = ring_next(cq->head, cq->entries);
	}
	if (cq->head != head)
		ring_cq_consumed(cq->ring, cq->head);
	if (n) {
		cq->empty = 0;
	} else if (++cq->empty % EMPTY_POLLS_PER_YIELD == 0) {
		/* A program that spins on an empty CQ would take the CPU the
		 * agent needs to produce the completion (on a host with few
		 * cores the spinning peers starve it for whole time slices):
		 * now and then, let it run. */
		sched_yield();
	}
	pthread_mutex_unlock(&cq->lock);
	chan_after(cq, &acts);
	return n;
}

/* cq_clean removes the completions of QP qpn that cq holds unpolled, as
 * rdma-core's mlx5 provider does when a QP is reset (a program that resets
 * a QP in ERR and uses it again, as rdma-core's tests do, does not then
 * poll its old flushed completions). The others keep their order: they
 * move up towards the tail, and the head past the gap. Only slots between
 * the head and the tail are touched, which the agent never writes. */
static void cq_clean(struct vrdma_cq *cq, uint32_t qpn)
{
	uint32_t tail, from, to, mask, kept = 0;

	if (!cq)
		return;
	pthread_mutex_lock(&cq->lock);
	for (uint32_t i = 0; i < cq->lcount; i++) {
		struct ibv_wc *w = &cq->local[(cq->lhead + i) % cq->lcap];

		if (w->qp_num != qpn)
			cq->local[(cq->lhead + kept++) % cq->lcap] = *w;
	}
	cq->lcount = kept;
	tail = ring_cq_tail(cq->ring);
	if (ring_tail_ok(tail, cq->head, cq->entries)) {
		mask = ring_mask(cq->entries);
		for (from = to = tail; from != cq->head;) {
			char *slot;

			from = (from - 1) & mask;
			slot = cq->ring + cq->offset + ring_slot(from, cq->entries) * VRDMA_CQE_SIZE;
			if (((const struct vrdma_cqe *)slot)->qp_num == qpn)
				continue;
			to = (to - 1) & mask;
			if (to != from)
				memcpy(cq->ring + cq->offset + ring_slot(to, cq->entries) * VRDMA_CQE_SIZE, slot, VRDMA_CQE_SIZE);
		}
		if (to != cq->head) {
			cq->head = to;
			ring_cq_consumed(cq->ring, cq->head);
		}
	}
	pthread_mutex_unlock(&cq->lock);
}

/* recv_pending counts the receive completions of QP qpn that cq holds
 * unpolled, in its local queue and its ring; caller holds cq's lock. */
static uint32_t recv_pending(struct vrdma_cq *cq, uint32_t qpn)
{
	uint32_t n = 0, tail = ring_cq_tail(cq->ring);

	for (uint32_t i = 0; i < cq->lcount; i++) {
		const struct ibv_wc *w = &cq->local[(cq->lhead + i) % cq->lcap];

		n += w->qp_num == qpn && (w->opcode & IBV_WC_RECV);
	}
	if (!ring_tail_ok(tail, cq->head, cq->entries))
		return n;
	for (uint32_t i = cq->head; i != tail; i = ring_next(i, cq->entries)) {
		const struct vrdma_cqe *e = (const void *)(cq->ring + cq->offset + ring_slot(i, cq->entries) * VRDMA_CQE_SIZE);

		n += e->qp_num == qpn && (e->opcode & IBV_WC_RECV);
	}
	return n;
}

/* RELAY_WAIT_NS bounds relay_wait. */
#define RELAY_WAIT_NS (100 * 1000000ull)

/* relay_wait is an arming's first step on a CQ that receives through send
 * channels (wire-local.md §4.22, "Events"): it takes what the channels
 * hold and, when it skipped messages their senders retracted, waits (at
 * most RELAY_WAIT_NS) until the agent completed them in the ring. A
 * retracted message may already have raised this CQ's event (its
 * sender's direct-notify, when it was posted); its completion comes from
 * the agent's relay, later. Had the CQ been armed again before that
 * completion came, the completion would raise a second event, and a
 * program that polls once per event (perftest's -e) would find nothing
 * behind one of the two: it loses count of its messages and, at the end,
 * waits forever for an event that does not come. Completed before the
 * arming, the relayed message raises no event, as a device's CQE that is
 * there when the CQ is armed raises none, and the program's poll after
 * arming finds it. */
static void relay_wait(struct vrdma_cq *cq)
{
	struct chan_acts acts;
	struct timespec pause = { 0, 20000 };
	uint64_t deadline;
	int waiting;

	chan_acts_init(&acts);
	pthread_mutex_lock(&cq->lock);
	chan_work(cq, &acts);
	pthread_mutex_unlock(&cq->lock);
	chan_after(cq, &acts);
	if (!acts.nskip)
		return;
	deadline = vrdma_now_ns() + RELAY_WAIT_NS;
	do {
		waiting = 0;
		pthread_mutex_lock(&cq->lock);
		for (int i = 0; i < acts.nskip; i++)
			waiting += recv_pending(cq, acts.skip_qp[i]->qpx.qp_base.qp_num) < acts.skip_n[i];
		pthread_mutex_unlock(&cq->lock);
	} while (waiting && vrdma_now_ns() < deadline && !nanosleep(&pause, NULL));
}

static int req_notify_cq(struct ibv_cq *ibcq, int solicited_only)
{
	struct vrdma_cq *cq = (struct vrdma_cq *)ibcq;
	struct vrdma_vm *vm = vrdma_vm_get();

	if (!ibcq || cq->magic != MAGIC_CQ)
		return EINVAL;
	/* An agent without core-verbs knows only 1: every completion then
	 * raises the event (§7). */
	uint32_t how = solicited_only && vm && (vm->s.caps & VRDMA_CAP_CORE_VERBS) ? VRDMA_CQ_ARM_SOLICITED : VRDMA_CQ_ARM_ALL;

	if (cq->nrxq)
		relay_wait(cq); /* read without the lock, as below */
	pthread_mutex_lock(&cq->arm_lock);
	ring_arm_cq(cq->ring, how);
	pthread_mutex_unlock(&cq->arm_lock);
	if (!cq->ntrack && !cq->nrxq)
		return 0; /* read without the lock: a QP that gets a channel later arms it then (chan_ask) */
	/* The send channels (wire-local.md §4.22): the peers' libraries
	 * raise this CQ's event (direct-notify) when its armed words in
	 * their channels say so. A sender about to sleep retracts what is
	 * still posted, so that a receiver that does not poll does not keep
	 * its sends from completing: the agent's relay completes them, and
	 * raises the event. */
	struct vrdma_qp *retract[CHAN_ACTS];
	int nretract = 0;
	struct chan_acts acts;

	chan_acts_init(&acts);
	pthread_mutex_lock(&cq->lock);
	for (int i = 0; i < cq->nrxq; i++) {
		struct vrdma_chan *ch = __atomic_load_n(&cq->rxq[i]->qc.cur, __ATOMIC_ACQUIRE);

		if (ch)
			vrdma_chan_arm_rx(ch, how);
	}
	for (int i = 0; i < cq->ntrack; i++) {
		struct vrdma_chan *ch = __atomic_load_n(&cq->track[i]->qc.cur, __ATOMIC_ACQUIRE);

		if (!ch)
			continue;
		vrdma_chan_arm_tx(ch);
		if (vrdma_chan_posted(ch))
			chan_note(retract, &nretract, cq->track[i]);
	}
	/* After the armed words (each a Dekker pair with the peer's check
	 * of it): what is already in the channels becomes this CQ's
	 * completions now, before the arming, as a device's CQEs that came
	 * before it (they raise no event; the program polls after arming). */
	chan_work(cq, &acts);
	pthread_mutex_unlock(&cq->lock);
	chan_after(cq, &acts);
	for (int i = 0; i < nretract; i++) {
		pthread_mutex_lock(&retract[i]->sq_lock);
		(void)chan_retract(retract[i], 0);
		pthread_mutex_unlock(&retract[i]->sq_lock);
	}
	return 0;
}

/* ibv_resize_cq asks the agent for a ring of at least cqe entries, into
 * which it moves the completions not yet polled (§4.16); then the CQ polls
 * the new ring from its first slot. */
int ibv_resize_cq(struct ibv_cq *ibcq, int cqe)
{
	struct vrdma_cq *cq = to_cq(ibcq);
	struct vrdma_vm *vm = vrdma_vm_get();
	struct vrdma_reply r;
	struct vrdma_cq_layout l;
	char body[64];
	char *ring;
	int e;

	if (!cq || !vm || cqe < 1)
		return EINVAL;
	if (!(vm->s.caps & VRDMA_CAP_CORE_VERBS))
		return EOPNOTSUPP; /* an older agent: as a device that cannot resize */
	snprintf(body, sizeof(body), "{\"handle\":%u,\"cqe\":%d}", cq->ibcq.handle, cqe);
	pthread_mutex_lock(&cq->lock);
	pthread_mutex_lock(&cq->arm_lock);
	e = cmd(vm, VRDMA_OP_RESIZE_CQ, body, &r);
	if (e)
		goto out;
	ring = NULL;
	if (vrdma_cq_layout(&r.doc, 0, &l) || r.nfds != 1 || !(ring = map_ring(r.fds[0], l.size))) {
		/* The agent moved the CQ to a ring this process cannot map:
		 * the CQ is lost to it. */
		e = EIO;
		vrdma_reply_free(&r);
		goto out;
	}
	vrdma_reply_free(&r);
	munmap(cq->ring, cq->ring_size);
	cq->ring = ring;
	cq->ring_size = l.size;
	cq->entries = l.entries;
	cq->offset = l.offset;
	cq->head = 0;
	cq->ibcq.cqe = (int)l.entries;
out:
	pthread_mutex_unlock(&cq->arm_lock);
	pthread_mutex_unlock(&cq->lock);
	return e;
}

/* create_cq makes a CQ of at least cqe entries. With overrun, a full CQ
 * overruns as a device's does (IBV_EVENT_CQ_ERR, its QPs to ERR) on an
 * agent that serves cq-overrun; without it (IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN)
 * the agent holds back the work that would complete into a full CQ. */
static struct ibv_cq *create_cq(struct ibv_context *context, int cqe, void *cq_context,
				struct ibv_comp_channel *channel, int comp_vector, int overrun)
{
	struct vrdma_vm *vm = vm_of(context);
	struct vrdma_cq *cq;
	struct vrdma_reply r;
	char body[96];
	struct vrdma_cq_layout l;
	uint32_t h;
	int e;

	if (!vm || cqe < 1 || comp_vector < 0 || comp_vector >= context->num_comp_vectors ||
	    (channel && (!reg_has(channel) || channel->context != context))) {
		errno = EINVAL;
		return NULL;
	}
	/* A CQ of one entry gets two, as mlx5 makes it (at least cqe + 1):
	 * perftest's ib_send_lat -e (TX depth 1) polls its send CQ once per
	 * iteration and would overrun one entry when a completion is late. */
	snprintf(body, sizeof(body), "{\"adapter\":\"%s\",\"cqe\":%d%s}", to_vctx(context)->dev->adapter, cqe == 1 ? 2 : cqe,
		 overrun && (vm->s.caps & VRDMA_CAP_CQ_OVERRUN) ? ",\"overrun\":true" : "");
	e = cmd(vm, VRDMA_OP_CREATE_CQ, body, &r);
	if (e) {
		errno = e;
		return NULL;
	}
	if (json_get_u32(&r.doc, 0, "handle", &h) || vrdma_cq_layout(&r.doc, 0, &l) || r.nfds != 2) {
		vrdma_reply_free(&r);
		errno = EIO;
		return NULL;
	}
	cq = calloc(1, sizeof(*cq));
	if (!cq)
		goto fail_nomem;
	cq->ring = map_ring(r.fds[0], l.size);
	if (!cq->ring) {
		free(cq);
		goto fail_nomem;
	}
	cq->ring_size = l.size;
	cq->entries = l.entries;
	cq->offset = l.offset;
	cq->event_fd = r.fds[1];
	r.fds[1] = -1;
	vrdma_reply_free(&r); /* closes the ring memfd: the mapping stays */
	(void)fcntl(cq->event_fd, F_SETFL, O_NONBLOCK);
	pthread_mutex_init(&cq->lock, NULL);
	pthread_mutex_init(&cq->arm_lock, NULL);
	cq->magic = MAGIC_CQ;
	cq->ibcq.context = context;
	cq->ibcq.channel = channel;
	cq->ibcq.cq_context = cq_context;
	cq->ibcq.handle = h;
	cq->ibcq.cqe = (int)l.entries;
	pthread_mutex_init(&cq->ibcq.mutex, NULL);
	pthread_cond_init(&cq->ibcq.cond, NULL);
	if (channel) {
		struct epoll_event ev = { .events = EPOLLIN, .data.ptr = cq };

		if (epoll_ctl(channel->fd, EPOLL_CTL_ADD, cq->event_fd, &ev)) {
			e = errno;
			goto fail_destroy;
		}
		__atomic_add_fetch(&channel->refcnt, 1, __ATOMIC_SEQ_CST);
	}
	if (reg_add(&objs, cq) || reg_add(&cqs, cq)) {
		reg_take(&objs, cq);
		e = ENOMEM;
		if (channel) {
			epoll_ctl(channel->fd, EPOLL_CTL_DEL, cq->event_fd, NULL);
			__atomic_sub_fetch(&channel->refcnt, 1, __ATOMIC_SEQ_CST);
		}
		goto fail_destroy;
	}
	return &cq->ibcq;

fail_destroy:
	cmd_handle(vm, VRDMA_OP_DESTROY_CQ, h);
	munmap(cq->ring, cq->ring_size);
	close(cq->event_fd);
	free(cq);
	errno = e;
	return NULL;
fail_nomem:
	e = errno ? errno : ENOMEM;
	vrdma_reply_free(&r);
	cmd_handle(vm, VRDMA_OP_DESTROY_CQ, h);
	errno = e;
	return NULL;
}

struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context,
			     struct ibv_comp_channel *channel, int comp_vector)
{
	return create_cq(context, cqe, cq_context, channel, comp_vector, 1);
}

/* ---- the ibv_start_poll API (struct ibv_cq_ex) ---- */

#define CQ_EX_WC_FLAGS                                                                        \
	(IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM | IBV_WC_EX_WITH_SRC_QP | \
	 IBV_WC_EX_WITH_SLID | IBV_WC_EX_WITH_SL | IBV_WC_EX_WITH_DLID_PATH_BITS)

/* cq_ex_load makes the CQE at the head current, or says there is none. */
static int cq_ex_load(struct vrdma_cq *cq)
{
	uint32_t tail;

	if (cq->lcount) {
		local_pop(cq, &cq->cur); /* the local queue first, as poll_cq */
		cq->cqx.status = cq->cur.status;
		cq->cqx.wr_id = cq->cur.wr_id;
		return 0;
	}
	tail = ring_cq_tail(cq->ring);
	if (!ring_tail_ok(tail, cq->head, cq->entries))
		return EIO;
	if (tail == cq->head)
		return ENOENT;
	decode_cqe(cq, &cq->cur);
	cq_count(cq, &cq->cur);
	cq->head = ring_next(cq->head, cq->entries);
	cq->cqx.status = cq->cur.status;
	cq->cqx.wr_id = cq->cur.wr_id;
	return 0;
}

static int cq_start_poll(struct ibv_cq_ex *x, struct ibv_poll_cq_attr *attr)
{
	struct vrdma_cq *cq = (struct vrdma_cq *)x;
	struct chan_acts acts;
	int rc;

	if (!attr || attr->comp_mask)
		return EINVAL;
	pthread_mutex_lock(&cq->lock);
	chan_acts_init(&acts);
	if (cq->ntrack || cq->nrxq)
		chan_work(cq, &acts);
	if (chan_acts_any(&acts)) {
		/* What the channel needs done is done without the lock. */
		pthread_mutex_unlock(&cq->lock);
		chan_after(cq, &acts);
		pthread_mutex_lock(&cq->lock);
	}
	rc = cq_ex_load(cq);
	if (rc) {
		/* The lock is held only from a successful start to end_poll. */
		pthread_mutex_unlock(&cq->lock);
		if (rc == ENOENT && ++cq->empty % EMPTY_POLLS_PER_YIELD == 0)
			sched_yield(); /* as poll_cq */
		return rc;
	}
	cq->empty = 0;
	return 0;
}

static int cq_next_poll(struct ibv_cq_ex *x)
{
	return cq_ex_load((struct vrdma_cq *)x);
}

static void cq_end_poll(struct ibv_cq_ex *x)
{
	struct vrdma_cq *cq = (struct vrdma_cq *)x;

	ring_cq_consumed(cq->ring, cq->head);
	pthread_mutex_unlock(&cq->lock);
}

static enum ibv_wc_opcode cq_read_opcode(struct ibv_cq_ex *x) { return ((struct vrdma_cq *)x)->cur.opcode; }
static uint32_t cq_read_vendor_err(struct ibv_cq_ex *x) { return ((struct vrdma_cq *)x)->cur.vendor_err; }
static uint32_t cq_read_byte_len(struct ibv_cq_ex *x) { return ((struct vrdma_cq *)x)->cur.byte_len; }
static __be32 cq_read_imm_data(struct ibv_cq_ex *x) { return ((struct vrdma_cq *)x)->cur.imm_data; }
static uint32_t cq_read_qp_num(struct ibv_cq_ex *x) { return ((struct vrdma_cq *)x)->cur.qp_num; }
static uint32_t cq_read_src_qp(struct ibv_cq_ex *x) { return ((struct vrdma_cq *)x)->cur.src_qp; }
static unsigned int cq_read_wc_flags(struct ibv_cq_ex *x) { return ((struct vrdma_cq *)x)->cur.wc_flags; }
static uint32_t cq_read_slid(struct ibv_cq_ex *x) { (void)x; return 0; }   /* RoCE: no LIDs */
static uint8_t cq_read_sl(struct ibv_cq_ex *x) { return ((struct vrdma_cq *)x)->cur.sl; }
static uint8_t cq_read_dlid_path_bits(struct ibv_cq_ex *x) { (void)x; return 0; }

static struct ibv_cq_ex *create_cq_ex(struct ibv_context *context, struct ibv_cq_init_attr_ex *a)
{
	struct vrdma_cq *cq;
	struct ibv_cq *c;

	if (!vrdma_ctx_ok(context) || !a || a->cqe > INT32_MAX) {
		errno = EINVAL;
		return NULL;
	}
	if ((a->wc_flags & ~(uint64_t)CQ_EX_WC_FLAGS) ||
	    (a->comp_mask & ~(uint32_t)(IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD)) ||
	    ((a->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) &&
	     (a->flags & ~(uint32_t)(IBV_CREATE_CQ_ATTR_SINGLE_THREADED | IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN)))) {
		/* Timestamps, flow tags: not in vrdma. */
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (a->comp_mask & IBV_CQ_INIT_ATTR_MASK_PD) {
		/* A CQ on a parent domain: its allocators are not called (the
		 * ring is the agent's), and a CQ has no PD at the agent. */
		struct vrdma_pd *pd = to_pd(a->parent_domain);

		if (!pd || !pd->parent || pd->ibpd.context != context) {
			errno = EINVAL;
			return NULL;
		}
	}
	c = create_cq(context, (int)a->cqe, a->cq_context, a->channel, (int)a->comp_vector,
		      !((a->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) && (a->flags & IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN)));
	if (!c)
		return NULL;
	cq = (struct vrdma_cq *)c;
	cq->cqx.start_poll = cq_start_poll;
	cq->cqx.next_poll = cq_next_poll;
	cq->cqx.end_poll = cq_end_poll;
	cq->cqx.read_opcode = cq_read_opcode;
	cq->cqx.read_vendor_err = cq_read_vendor_err;
	cq->cqx.read_byte_len = cq_read_byte_len;
	cq->cqx.read_imm_data = cq_read_imm_data;
	cq->cqx.read_qp_num = cq_read_qp_num;
	cq->cqx.read_src_qp = cq_read_src_qp;
	cq->cqx.read_wc_flags = cq_read_wc_flags;
	cq->cqx.read_slid = cq_read_slid;
	cq->cqx.read_sl = cq_read_sl;
	cq->cqx.read_dlid_path_bits = cq_read_dlid_path_bits;
	return &cq->cqx;
}

int ibv_destroy_cq(struct ibv_cq *ibcq)
{
	struct vrdma_cq *cq = to_cq(ibcq);
	int e;

	if (!cq)
		return EINVAL;
	e = cmd_handle(vrdma_vm_get(), VRDMA_OP_DESTROY_CQ, cq->ibcq.handle);
	if (e && e != EIO)
		return e; /* EBUSY: a QP uses it */
	reg_take(&objs, cq);
	reg_take(&cqs, cq);
	if (cq->ibcq.channel) {
		epoll_ctl(cq->ibcq.channel->fd, EPOLL_CTL_DEL, cq->event_fd, NULL);
		__atomic_sub_fetch(&cq->ibcq.channel->refcnt, 1, __ATOMIC_SEQ_CST);
	}
	cq->magic = 0;
	munmap(cq->ring, cq->ring_size);
	close(cq->event_fd);
	free(cq->local);
	free(cq->track);
	free(cq->rxq);
	free(cq);
	return 0;
}

/* ---- QP ---- */

static void ring_doorbell(struct vrdma_qp *qp)
{
	/* EAGAIN: the socket is full, a wake-up is pending already (§7). */
	(void)send(qp->doorbell_fd, "\1", 1, MSG_DONTWAIT | MSG_NOSIGNAL);
}

/* sq_slot and rq_slot are the slots of SQ and RQ index idx. */
static void *sq_slot(struct vrdma_qp *qp, uint32_t idx)
{
	return qp->ring + qp->sq_offset + ring_slot(idx, qp->sq_entries) * qp->sq_stride;
}

static void *rq_slot(struct vrdma_qp *qp, uint32_t idx)
{
	return qp->ring + qp->rq_offset + ring_slot(idx, qp->rq_entries) * qp->rq_stride;
}

/* sq_postable reports whether the SQ takes work requests in state (§9). */
static int sq_postable(uint32_t state)
{
	return state == IBV_QPS_RTS || state == IBV_QPS_SQD || state == IBV_QPS_SQE || state == IBV_QPS_ERR;
}

/* publish_sq makes the SQ's slots up to qp->sq_tail the agent's (ring.h
 * pair 1), ringing the doorbell if it sleeps. */
static void publish_sq(struct vrdma_qp *qp)
{
	if (ring_publish_sq(qp->ring, qp->sq_tail))
		ring_doorbell(qp);
}

/* uc_refuses reports whether qp is UC and opcode one UC has not (RDMA READ,
 * atomics, memory windows): EINVAL at post, as rxe's "bad wr opcode for
 * qp type"; or opcode is a memory-window one and the agent has none. */
static int uc_refuses(const struct vrdma_qp *qp, int opcode)
{
	struct vrdma_vm *vm = vrdma_vm_get();

	if ((opcode == IBV_WR_BIND_MW || opcode == IBV_WR_LOCAL_INV || opcode == IBV_WR_SEND_WITH_INV) &&
	    !(vm && (vm->s.caps & VRDMA_CAP_MW)))
		return 1;
	return qp->qpx.qp_base.qp_type == IBV_QPT_UC && opcode != IBV_WR_SEND && opcode != IBV_WR_SEND_WITH_IMM &&
	       opcode != IBV_WR_RDMA_WRITE && opcode != IBV_WR_RDMA_WRITE_WITH_IMM;
}

/* ---- memcpy-direct (wire-local.md §4.21) ----
 *
 * A QP the agent bound to memcpy-direct (query-qp's path after RTR)
 * executes RDMA WRITE, READ, CMP_SWP, FETCH_ADD and ATOMIC_WRITE itself
 * when it can prove them valid (direct_try, the rules 1-6), copying to and
 * from a mapping of the target region's pages that the agent granted
 * (direct.c); every other WR, and every WR it cannot prove valid, goes to
 * the ring as on any QP, so that the agent gives it its right completion.
 * The WQE is written into the next SQ slot either way (post_send and the
 * ibv_wr_* API alike): a WR executed directly leaves its slot unpublished,
 * for the next one. Locks: the QP's sq_lock, then its send CQ's lock. */

/* DIRECT_CHUNK bounds the bytes one copy moves between its increment of
 * the grant's in-use word and its decrement: a revocation waits for at
 * most one chunk (the agent fences a library that keeps it waiting 200
 * ms), and finds the rest relayed. */
#define DIRECT_CHUNK (4u << 20)

static void cq_track(struct vrdma_cq *cq, struct vrdma_qp *qp)
{
	for (int i = 0; i < cq->ntrack; i++)
		if (cq->track[i] == qp)
			return;
	if (cq->ntrack == cq->trackcap) {
		int cap = cq->trackcap ? cq->trackcap * 2 : 4;
		struct vrdma_qp **n = realloc(cq->track, (size_t)cap * sizeof(*n));

		if (!n)
			return;
		cq->track = n;
		cq->trackcap = cap;
	}
	cq->track[cq->ntrack++] = qp;
}

static void cq_untrack(struct vrdma_cq *cq, struct vrdma_qp *qp)
{
	for (int i = 0; i < cq->ntrack; i++)
		if (cq->track[i] == qp) {
			cq->track[i] = cq->track[--cq->ntrack];
			return;
		}
}

/* direct_off unbinds qp (a move to RESET, INIT or RTR, or its end); the
 * caller holds sq_lock. */
static void direct_off(struct vrdma_qp *qp)
{
	struct vrdma_cq *cq = (struct vrdma_cq *)qp->qpx.qp_base.send_cq;

	qp->path_known = 0;
	if (!qp->direct)
		return;
	qp->direct = 0;
	pthread_mutex_lock(&cq->lock);
	cq_untrack(cq, qp);
	pthread_mutex_unlock(&cq->lock);
}

/* direct_discover asks the agent for qp's path (after RTR, or at the first
 * post of a QP rdma_cm's agent moved) and binds it to memcpy-direct if the
 * agent did; the caller holds sq_lock, and nothing relayed is outstanding
 * on the QP (none was posted since its last RESET). */
static void direct_discover(struct vrdma_vm *vm, struct vrdma_qp *qp)
{
	struct vrdma_cq *cq = (struct vrdma_cq *)qp->qpx.qp_base.send_cq;
	struct vrdma_reply r;
	char body[48], path[32] = "";
	uint64_t v;
	int e;

	qp->path_known = 1;
	if (qp->direct || qp->qpx.qp_base.qp_type != IBV_QPT_RC || !qp->ring || !(vm->s.caps & VRDMA_CAP_MEMCPY_DIRECT))
		return;
	snprintf(body, sizeof(body), "{\"handle\":%u}", qp->qpx.qp_base.handle);
	e = cmd(vm, VRDMA_OP_QUERY_QP, body, &r);
	if (e)
		return;
	json_get_str(&r.doc, json_get(&r.doc, 0, "path"), "path", path, sizeof(path));
	if (json_get_u64(&r.doc, json_get(&r.doc, 0, "attr"), "max_rd_atomic", &v) == 0 && v && v <= 255)
		qp->max_rd_atomic = (uint32_t)v; /* a QP rdma_cm's agent moved: it set it */
	vrdma_reply_free(&r);
	if (strcmp(path, "memcpy-direct") || vrdma_direct_ready(vm))
		return;
	pthread_mutex_lock(&cq->lock);
	cq_track(cq, qp);
	qp->relay_signaled = qp->relay_done = 0;
	qp->direct = 1;
	for (int i = 0; i < cq->ntrack; i++)
		if (cq->track[i] == qp)
			goto tracked;
	qp->direct = 0; /* no memory to track it: it relays */
tracked:
	pthread_mutex_unlock(&cq->lock);
}

/* direct_complete adds wc, a completion the library made, to cq's local
 * queue (room reserved by direct_try), behind the ring's pending CQEs, and
 * raises the CQ's event if it is armed for every completion (§6 pair 2,
 * the producer's side: a direct completion is never solicited, so armed 2
 * stays). */
static void direct_complete(struct vrdma_vm *vm, struct vrdma_cq *cq, const struct ibv_wc *wc)
{
	uint32_t one = VRDMA_CQ_ARM_ALL;
	int notify = 0;

	pthread_mutex_lock(&cq->lock);
	(void)cq_drain(cq); /* fails only for a broken ring, or without memory: then the CQEs stay there */
	if (!local_reserve(cq, 1))
		local_push(cq, wc);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	if (__atomic_load_n(ring_word(cq->ring, VRDMA_CQ_ARMED), __ATOMIC_SEQ_CST) == VRDMA_CQ_ARM_ALL)
		notify = __atomic_compare_exchange_n(ring_word(cq->ring, VRDMA_CQ_ARMED), &one, 0, 0, __ATOMIC_SEQ_CST,
						     __ATOMIC_SEQ_CST);
	pthread_mutex_unlock(&cq->lock);
	if (notify)
		cmd_handle(vm, VRDMA_OP_CQ_NOTIFY, cq->ibcq.handle);
}

/* direct_local checks the local side of the send WQE in slot for the
 * library's own execution (wire-local.md §4.21 rule 4, §4.22): an INLINE
 * one's bytes (copied at post, as the ring carries them) at most
 * max_inline_data; else at most max_send_sge SGEs, each of nonzero length
 * in a region of this session of the QP's PD, with LOCAL_WRITE if writes
 * (the library writes there: READ, atomics). It fills loc (*nloc pieces)
 * and *n, the bytes; 1 if the WQE passes, 0: relay it. */
static int direct_local(struct vrdma_qp *qp, void *slot, int writes, struct vrdma_chan_sge *loc, uint32_t *nloc,
			uint64_t *n)
{
	const struct vrdma_send_wqe *w = wqe_send(slot);
	const struct vrdma_sge *sge = wqe_send_sge(slot);

	*nloc = 0;
	*n = 0;
	if (w->flags & VRDMA_WQE_INLINE) {
		if (w->inline_len > qp->caps.max_inline_data)
			return 0;
		if (w->inline_len) {
			loc[*nloc].p = (char *)slot + VRDMA_SEND_HDR;
			loc[(*nloc)++].len = w->inline_len;
		}
		*n = w->inline_len;
		return 1;
	}
	if (w->num_sge > qp->caps.max_send_sge || w->num_sge > VRDMA_MAX_SGE)
		return 0;
	for (uint32_t i = 0; i < w->num_sge; i++) {
		struct vrdma_lmr m;
		uint64_t a = sge[i].addr;

		if (!sge[i].length)
			continue;
		if (!vrdma_lmr_get(sge[i].lkey, &m) || m.pd != qp->qpx.qp_base.pd->handle || a < m.iova ||
		    a - m.iova > m.length || sge[i].length > m.length - (a - m.iova) ||
		    (writes && !(m.access & IBV_ACCESS_LOCAL_WRITE)))
			return 0;
		loc[*nloc].p = m.addr + (a - m.iova);
		loc[(*nloc)++].len = sge[i].length;
		*n += sge[i].length;
	}
	return 1;
}

/* chan_try puts the SEND or SEND_WITH_IMM in slot into qp's send channel
 * (wire-local.md §4.22) if every rule holds, asking for the channel first
 * if the QP has none; 1 if it did, 0: the caller posts it to the ring.
 * The caller holds sq_lock and checked rules 1 and 2's ring part. */
static int chan_try(struct vrdma_vm *vm, struct vrdma_qp *qp, void *slot)
{
	const struct vrdma_send_wqe *w = wqe_send(slot);
	struct vrdma_cq *cq = (struct vrdma_cq *)qp->qpx.qp_base.send_cq;
	struct vrdma_chan *ch = __atomic_load_n(&qp->qc.cur, __ATOMIC_ACQUIRE);
	struct vrdma_chan_sge loc[VRDMA_MAX_SGE];
	struct vrdma_chan_msg m;
	uint32_t nloc = 0, ctail;
	uint64_t n = 0;
	int ok = 1, notify = 0;

	if (!ch) {
		chan_ask(vm, qp);
		if (!(ch = __atomic_load_n(&qp->qc.cur, __ATOMIC_ACQUIRE)))
			return 0;
	}
	if (vrdma_chan_live(ch) != 1)
		return 0;
	/* Rule 4: the local side, each SGE a region of this session (or
	 * inline bytes, copied at post). */
	if (!direct_local(qp, slot, 0, loc, &nloc, &n))
		return 0;
	if (n > vrdma_chan_payload(ch))
		return 0;
	m = (struct vrdma_chan_msg){ .opcode = w->opcode,
				     .solicited = !!(w->flags & VRDMA_WQE_SOLICITED),
				     .signaled = (w->flags & VRDMA_WQE_SIGNALED) || qp->sq_sig_all,
				     .imm = w->imm_data,
				     .sge = loc,
				     .nsge = nloc,
				     .length = (uint32_t)n };
	/* Rules 2 (the CQ's part) and 6: room for the completion beside
	 * the channel sends still to complete. */
	pthread_mutex_lock(&cq->lock);
	chan_reap_qp(cq, qp, NULL); /* frees the slots done */
	if (qp->relay_done < qp->relay_signaled)
		ok = !cq_drain(cq) && qp->relay_done >= qp->relay_signaled;
	if (ok && m.signaled) {
		uint32_t out = vrdma_chan_outstanding(ch, 1);

		ctail = ring_cq_tail(cq->ring);
		ok = ring_tail_ok(ctail, cq->head, cq->entries) &&
		     (uint64_t)cq->lcount + ring_pending(ctail, cq->head, cq->entries) + out < cq->entries &&
		     !local_reserve(cq, ring_pending(ctail, cq->head, cq->entries) + out + 1);
	}
	pthread_mutex_unlock(&cq->lock);
	if (!ok || vrdma_chan_send(ch, &m, slot, qp->caps.max_send_wr,
				   __atomic_load_n(ring_word(cq->ring, VRDMA_CQ_ARMED), __ATOMIC_SEQ_CST) == VRDMA_CQ_ARM_ALL,
				   &notify))
		return 0;
	if (notify)
		chan_notify(vm, qp->qpx.qp_base.handle, "recv", m.solicited);
	return 1;
}

/* chan_quiet reports whether qp has no channel send outstanding (rule 2 for
 * a direct WR), reaping what finished; the caller holds sq_lock. */
static int chan_quiet(struct vrdma_qp *qp)
{
	struct vrdma_chan *ch = __atomic_load_n(&qp->qc.cur, __ATOMIC_ACQUIRE);
	struct vrdma_cq *cq = (struct vrdma_cq *)qp->qpx.qp_base.send_cq;

	if (!ch || !vrdma_chan_outstanding(ch, 0))
		return 1;
	pthread_mutex_lock(&cq->lock);
	chan_reap_qp(cq, qp, NULL);
	pthread_mutex_unlock(&cq->lock);
	return !vrdma_chan_outstanding(ch, 0);
}

/* direct_try executes the WQE in slot itself if every rule of §4.21 holds,
 * and reports whether it did (1); 0: the caller posts it to the ring.
 * tail is the library's SQ tail (the WQEs before it are the ring's). The
 * caller holds sq_lock. */
static int direct_try(struct vrdma_vm *vm, struct vrdma_qp *qp, void *slot, uint32_t tail)
{
	const struct vrdma_send_wqe *w = wqe_send(slot);
	const struct vrdma_sge *sge = wqe_send_sge(slot);
	struct vrdma_cq *cq = (struct vrdma_cq *)qp->qpx.qp_base.send_cq;
	struct vrdma_chan_sge loc[VRDMA_MAX_SGE];
	struct vrdma_grant_view g;
	struct vrdma_grant_slot *gs;
	uint32_t need, wcop, nloc = 0, ctail;
	uint64_t n = 0, off;
	int opcode = w->opcode, rdatomic, atomic, signaled, ok = 1;
	struct ibv_wc wc;

	/* Rules 1 and 2 (the ring's part). */
	if (ring_load(qp->ring, VRDMA_QP_STATE) != IBV_QPS_RTS || ring_load(qp->ring, VRDMA_QP_SQ_HEAD) != tail)
		return 0;
	if (opcode == IBV_WR_SEND || opcode == IBV_WR_SEND_WITH_IMM)
		return chan_try(vm, qp, slot); /* §4.22 */
	if (!chan_quiet(qp))
		return 0; /* behind a channel send: the agent drains the channel first */
	/* Rule 3. */
	switch (opcode) {
	case IBV_WR_RDMA_WRITE:
		need = IBV_ACCESS_REMOTE_WRITE, wcop = IBV_WC_RDMA_WRITE;
		break;
	case IBV_WR_RDMA_READ:
		need = IBV_ACCESS_REMOTE_READ, wcop = IBV_WC_RDMA_READ;
		break;
	case IBV_WR_ATOMIC_CMP_AND_SWP:
		need = IBV_ACCESS_REMOTE_ATOMIC, wcop = IBV_WC_COMP_SWAP;
		break;
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		need = IBV_ACCESS_REMOTE_ATOMIC, wcop = IBV_WC_FETCH_ADD;
		break;
	case IBV_WR_ATOMIC_WRITE:
		need = IBV_ACCESS_REMOTE_WRITE, wcop = IBV_WC_ATOMIC_WRITE; /* as the agent: the target needs REMOTE_WRITE */
		break;
	default:
		return 0;
	}
	rdatomic = opcode == IBV_WR_RDMA_READ || opcode == IBV_WR_ATOMIC_CMP_AND_SWP || opcode == IBV_WR_ATOMIC_FETCH_AND_ADD;
	atomic = opcode == IBV_WR_ATOMIC_CMP_AND_SWP || opcode == IBV_WR_ATOMIC_FETCH_AND_ADD || opcode == IBV_WR_ATOMIC_WRITE;
	if (rdatomic && !qp->max_rd_atomic)
		return 0;
	/* Rule 4: the local side, each SGE a region of this session. */
	if ((w->flags & VRDMA_WQE_INLINE) && opcode != IBV_WR_RDMA_WRITE)
		return 0;
	if (!direct_local(qp, slot, opcode != IBV_WR_RDMA_WRITE, loc, &nloc, &n))
		return 0;
	switch (opcode) {
	case IBV_WR_ATOMIC_CMP_AND_SWP:
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		if ((w->flags & VRDMA_WQE_INLINE) || w->num_sge != 1 || sge[0].length != 8)
			return 0;
		break;
	case IBV_WR_ATOMIC_WRITE:
		if ((w->flags & VRDMA_WQE_INLINE) || w->num_sge != 0)
			return 0;
		n = 8;
		break;
	default:
		if (n == 0 || n > 1ull << 31)
			return 0; /* 0-byte WRs relay; above 2 GiB the agent says LOC_LEN_ERR */
	}
	/* Rules 2 (the CQ's part) and 6, with room for the completion. */
	signaled = (w->flags & VRDMA_WQE_SIGNALED) || qp->sq_sig_all;
	pthread_mutex_lock(&cq->lock);
	if (qp->relay_done < qp->relay_signaled)
		ok = !cq_drain(cq) && qp->relay_done >= qp->relay_signaled;
	if (ok && signaled) {
		ctail = ring_cq_tail(cq->ring);
		ok = ring_tail_ok(ctail, cq->head, cq->entries) &&
		     cq->lcount + ring_pending(ctail, cq->head, cq->entries) < cq->entries &&
		     !local_reserve(cq, ring_pending(ctail, cq->head, cq->entries) + 1);
	}
	pthread_mutex_unlock(&cq->lock);
	if (!ok)
		return 0;
	/* Rule 5: the grant, the range, the right, the alignment. */
	if (vrdma_direct_grant(vm, &qp->qd, qp->qpx.qp_base.handle, w->rkey, &g))
		return 0;
	if (!(g.access & need) || w->remote_addr < g.iova || w->remote_addr - g.iova > g.length ||
	    n > g.length - (w->remote_addr - g.iova))
		return 0;
	off = w->remote_addr - g.iova;
	if (atomic && ((w->remote_addr & 7) || ((uintptr_t)(g.base + off) & 7)))
		return 0;
	gs = vrdma_direct_slot(g.slot);
	if (atomic) {
		uint64_t *word = (uint64_t *)(void *)(g.base + off), old = 0;

		__atomic_fetch_add(&gs->in_use, 1, __ATOMIC_SEQ_CST); /* pair 4 */
		if (__atomic_load_n(&gs->state, __ATOMIC_SEQ_CST) != g.state) {
			__atomic_fetch_sub(&gs->in_use, 1, __ATOMIC_SEQ_CST);
			vrdma_direct_drop(&qp->qd, w->rkey); /* revoked: the reader unmaps it */
			return 0;
		}
		if (opcode == IBV_WR_ATOMIC_CMP_AND_SWP) {
			old = w->compare_add;
			__atomic_compare_exchange_n(word, &old, w->swap, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
		} else if (opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
			old = __atomic_fetch_add(word, w->compare_add, __ATOMIC_SEQ_CST);
		} else {
			__atomic_store_n(word, w->swap, __ATOMIC_SEQ_CST);
		}
		__atomic_fetch_sub(&gs->in_use, 1, __ATOMIC_SEQ_CST);
		if (opcode != IBV_WR_ATOMIC_WRITE)
			memcpy(loc[0].p, &old, 8); /* little endian, as the word */
	} else {
		char *remote = g.base + off;
		uint32_t k = 0, koff = 0;
		uint64_t done = 0;

		while (done < n) {
			uint64_t chunk = n - done < DIRECT_CHUNK ? n - done : DIRECT_CHUNK, left = chunk;

			__atomic_fetch_add(&gs->in_use, 1, __ATOMIC_SEQ_CST); /* pair 4 */
			if (__atomic_load_n(&gs->state, __ATOMIC_SEQ_CST) != g.state) {
				/* Revoked: what was copied is copied; the ring
				 * executes the whole WR again (or fails it). */
				__atomic_fetch_sub(&gs->in_use, 1, __ATOMIC_SEQ_CST);
				vrdma_direct_drop(&qp->qd, w->rkey);
				return 0;
			}
			while (left) {
				uint32_t c = loc[k].len - koff < left ? loc[k].len - koff : (uint32_t)left;

				if (opcode == IBV_WR_RDMA_WRITE)
					vrdma_bulk_copy(remote + done, loc[k].p + koff, c);
				else
					vrdma_bulk_copy(loc[k].p + koff, remote + done, c);
				done += c;
				left -= c;
				koff += c;
				if (koff == loc[k].len)
					k++, koff = 0;
			}
			__atomic_fetch_sub(&gs->in_use, 1, __ATOMIC_SEQ_CST);
		}
	}
	if (rdatomic)
		__atomic_fetch_add(&gs->rd_atomics, 1, __ATOMIC_RELAXED); /* the QP's counters (rd_atomic_peak, §8) */
	if (signaled) {
		memset(&wc, 0, sizeof(wc));
		wc.wr_id = w->wr_id;
		wc.status = IBV_WC_SUCCESS;
		wc.opcode = (enum ibv_wc_opcode)wcop;
		wc.byte_len = (uint32_t)n;
		wc.qp_num = qp->qpx.qp_base.qp_num;
		direct_complete(vm, cq, &wc);
	}
	return 1;
}

/* direct_posted counts the relayed WQE in slot if it is signaled (rule 2). */
static void direct_posted(struct vrdma_qp *qp, const void *slot)
{
	if (qp->direct && ((wqe_send((void *)slot)->flags & VRDMA_WQE_SIGNALED) || qp->sq_sig_all))
		qp->relay_signaled++;
}

static int post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
	struct vrdma_qp *qp = (struct vrdma_qp *)ibqp;
	struct vrdma_vm *vm = NULL;
	uint32_t state;
	int rc = 0, posted = 0;

	if (!ibqp || qp->magic != MAGIC_QP || !bad_wr || !qp->ring) {
		if (bad_wr)
			*bad_wr = wr; /* no ring: an XRC target QP, which has no send queue */
		return EINVAL;
	}
	pthread_mutex_lock(&qp->sq_lock);
	state = ring_load(qp->ring, VRDMA_QP_STATE);
	if (!sq_postable(state)) {
		rc = EINVAL;
		goto out;
	}
	vm = qp->vm;
	if (!qp->path_known && state == IBV_QPS_RTS && vm)
		direct_discover(vm, qp);
	for (; wr; wr = wr->next) {
		if (ring_full(qp->sq_tail, ring_load(qp->ring, VRDMA_QP_SQ_HEAD), qp->sq_entries)) {
			rc = ENOMEM;
			break;
		}
		rc = uc_refuses(qp, wr->opcode) || (wr->opcode == IBV_WR_BIND_MW && !vrdma_mw_ok(wr->bind_mw.mw))
			     ? EINVAL
			     : wqe_send_from_wr(sq_slot(qp, qp->sq_tail), wr, &qp->caps);
		if (!rc && qp->qpx.qp_base.qp_type == IBV_QPT_UD)
			rc = vrdma_ud_dest(sq_slot(qp, qp->sq_tail), wr); /* ud.c */
		if (!rc && qp->qpx.qp_base.qp_type == IBV_QPT_XRC_SEND)
			wqe_send(sq_slot(qp, qp->sq_tail))->xrc_srqn = wr->qp_type.xrc.remote_srqn;
		if (rc)
			break;
		if (qp->direct && vm && direct_try(vm, qp, sq_slot(qp, qp->sq_tail), qp->sq_tail))
			continue; /* done: its slot takes the next WR */
		/* Relayed: the channel's sends still posted go first (§4.22). */
		if (qp->direct && (rc = chan_retract(qp, 1)))
			break;
		direct_posted(qp, sq_slot(qp, qp->sq_tail));
		qp->sq_tail = ring_next(qp->sq_tail, qp->sq_entries);
		posted++;
	}
	if (posted)
		publish_sq(qp);
out:
	if (rc)
		*bad_wr = wr;
	pthread_mutex_unlock(&qp->sq_lock);
	if (__atomic_load_n(&qp->qc.want_err, __ATOMIC_RELAXED) == 1)
		chan_err(qp); /* a channel send failed while reaped here */
	return rc;
}

static int post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	struct vrdma_qp *qp = (struct vrdma_qp *)ibqp;
	int rc = 0, posted = 0;

	if (!ibqp || qp->magic != MAGIC_QP || !bad_wr) {
		if (bad_wr)
			*bad_wr = wr;
		return EINVAL;
	}
	if (qp->qpx.qp_base.srq || qp->qpx.qp_base.qp_type == IBV_QPT_XRC_SEND || !qp->ring) {
		/* Its receives come from an SRQ (an XRC target's, from the SRQ
		 * each sender names: ibv_post_srq_recv), or never (an XRC
		 * initiator). */
		*bad_wr = wr;
		return EINVAL;
	}
	pthread_mutex_lock(&qp->rq_lock);
	if (ring_load(qp->ring, VRDMA_QP_STATE) == IBV_QPS_RESET) {
		rc = EINVAL;
		goto out;
	}
	for (; wr; wr = wr->next) {
		if (ring_full(qp->rq_tail, ring_load(qp->ring, VRDMA_QP_RQ_HEAD), qp->rq_entries)) {
			rc = ENOMEM;
			break;
		}
		if (wr->num_sge < 0 || (uint32_t)wr->num_sge > qp->caps.max_recv_sge || (wr->num_sge > 0 && !wr->sg_list)) {
			rc = EINVAL;
			break;
		}
		wqe_recv_from_wr(rq_slot(qp, qp->rq_tail), wr);
		qp->rq_tail = ring_next(qp->rq_tail, qp->rq_entries);
		posted++;
	}
	/* In ERR the agent flushes new receives only when woken (ring.h pair 3). */
	if (posted && ring_publish_rq(qp->ring, qp->rq_tail) == IBV_QPS_ERR)
		ring_doorbell(qp);
out:
	if (rc)
		*bad_wr = wr;
	pthread_mutex_unlock(&qp->rq_lock);
	if (posted && qp->vm && !__atomic_load_n(&qp->qc.cur, __ATOMIC_ACQUIRE) && vrdma_chan_enabled(qp->vm)) {
		/* The send channel (§4.22): a receiver without one asks again
		 * (vrdma_chan_attach paces it). */
		pthread_mutex_lock(&qp->sq_lock);
		chan_ask(qp->vm, qp);
		pthread_mutex_unlock(&qp->sq_lock);
	}
	return rc;
}

static const char *qp_type_name(enum ibv_qp_type t)
{
	switch (t) {
	case IBV_QPT_UD:
		return "UD";
	case IBV_QPT_UC:
		return "UC";
	case IBV_QPT_XRC_SEND:
		return "XRC_SEND";
	case IBV_QPT_XRC_RECV:
		return "XRC_RECV";
	default:
		return "RC";
	}
}

/* qp_register makes qp, its rings mapped (or none: an XRC target QP), the
 * QP of context with the agent's handle h and number qpn, in the
 * registries; on failure it destroys handle h, frees qp and sets errno. */
static int qp_register(struct vrdma_vm *vm, struct vrdma_qp *qp, struct ibv_context *context, uint32_t h, uint32_t qpn,
		       enum ibv_qp_type type, void *qp_context)
{
	pthread_mutex_init(&qp->sq_lock, NULL);
	pthread_mutex_init(&qp->rq_lock, NULL);
	qp->magic = MAGIC_QP;
	qp->qpx.qp_base.context = context;
	qp->qpx.qp_base.qp_context = qp_context;
	qp->qpx.qp_base.handle = h;
	qp->qpx.qp_base.qp_num = qpn;
	qp->qpx.qp_base.state = IBV_QPS_RESET;
	qp->qpx.qp_base.qp_type = type;
	pthread_mutex_init(&qp->qpx.qp_base.mutex, NULL);
	pthread_cond_init(&qp->qpx.qp_base.cond, NULL);
	if (reg_add(&objs, qp) || (reg_add(&qps, qp) && (reg_take(&objs, qp), 1))) {
		cmd_handle(vm, VRDMA_OP_DESTROY_QP, h);
		if (qp->ring)
			munmap(qp->ring, qp->ring_size);
		if (qp->doorbell_fd >= 0)
			close(qp->doorbell_fd);
		free(qp);
		errno = ENOMEM;
		return -1;
	}
	return 0;
}

/* create_qp makes a QP of context: in PD ibpd, or, an XRC target QP
 * (IBV_QPT_XRC_RECV), in XRC domain xrcd, with no PD, CQs or queues
 * (the agent keeps its rings: ring stays NULL). */
static struct ibv_qp *create_qp(struct ibv_context *context, struct ibv_pd *ibpd, struct vrdma_xrcd *xrcd,
				struct ibv_qp_init_attr *attr)
{
	struct vrdma_pd *pd = to_pd(ibpd);
	struct vrdma_vm *vm = vm_of(context);
	struct vrdma_cq *scq = NULL, *rcq = NULL;
	struct vrdma_srq *srq = NULL;
	struct vrdma_qp *qp;
	struct vrdma_reply r;
	char body[512];
	struct jbuf b;
	struct vrdma_qp_layout l;
	uint32_t h, qpn;
	struct ibv_qp_cap caps;
	int tgt = attr && attr->qp_type == IBV_QPT_XRC_RECV;
	int e;

	if (!vm || !attr || (tgt ? !xrcd || xrcd->ibxrcd.context != context : !pd || ibpd->context != context)) {
		errno = EINVAL;
		return NULL;
	}
	if (attr->qp_type == IBV_QPT_UD && !(vm->s.caps & VRDMA_CAP_UD)) {
		errno = EOPNOTSUPP; /* an agent without UD */
		return NULL;
	}
	if (attr->qp_type != IBV_QPT_RC && attr->qp_type != IBV_QPT_UD && !(attr->qp_type == IBV_QPT_UC && (vm->s.caps & VRDMA_CAP_UC)) &&
	    !((attr->qp_type == IBV_QPT_XRC_SEND || tgt) && (vm->s.caps & VRDMA_CAP_XRC))) {
		/* Raw packet (UC or XRC from an agent without them): not in vrdma. */
		errno = attr->qp_type == IBV_QPT_RC || attr->qp_type == IBV_QPT_UC || attr->qp_type == IBV_QPT_UD ||
				attr->qp_type == IBV_QPT_RAW_PACKET || attr->qp_type == IBV_QPT_XRC_SEND ||
				attr->qp_type == IBV_QPT_XRC_RECV || attr->qp_type == IBV_QPT_DRIVER
			? EOPNOTSUPP
			: EINVAL;
		return NULL;
	}
	if (!tgt) {
		scq = to_cq(attr->send_cq);
		/* An XRC initiator has no receive CQ: it never receives. */
		rcq = attr->qp_type == IBV_QPT_XRC_SEND && !attr->recv_cq ? scq : to_cq(attr->recv_cq);
		if (!scq || !rcq || scq->ibcq.context != context || rcq->ibcq.context != context) {
			errno = EINVAL;
			return NULL;
		}
	}
	if (attr->srq && (attr->qp_type == IBV_QPT_XRC_SEND || tgt)) {
		errno = EINVAL; /* an XRC QP takes no SRQ */
		return NULL;
	}
	if (attr->srq) {
		srq = to_srq(attr->srq);
		if (!srq || srq->ibsrq.context != ibpd->context) {
			errno = EINVAL;
			return NULL;
		}
		if (!(vm->s.caps & VRDMA_CAP_SRQ)) {
			errno = EOPNOTSUPP; /* an agent without shared receive queues */
			return NULL;
		}
	}
	jb_init(&b, body, sizeof(body));
	jb_raw(&b, "{");
	if (tgt) {
		jb_u64(&b, "xrcd", xrcd->handle);
	} else {
		jb_u64(&b, "pd", pd->ibpd.handle);
		jb_u64(&b, "send_cq", scq->ibcq.handle);
		jb_u64(&b, "recv_cq", rcq->ibcq.handle);
	}
	jb_str(&b, "qp_type", qp_type_name(attr->qp_type));
	jb_bool(&b, "sq_sig_all", attr->sq_sig_all);
	if (srq)
		jb_u64(&b, "srq", srq->ibsrq.handle);
	jb_key(&b, "caps");
	jb_raw(&b, "{");
	jb_u64(&b, "max_send_wr", attr->cap.max_send_wr);
	jb_u64(&b, "max_recv_wr", attr->cap.max_recv_wr);
	jb_u64(&b, "max_send_sge", attr->cap.max_send_sge);
	jb_u64(&b, "max_recv_sge", attr->cap.max_recv_sge);
	jb_u64(&b, "max_inline_data", attr->cap.max_inline_data);
	jb_raw(&b, "}}");
	e = cmd(vm, VRDMA_OP_CREATE_QP, body, &r);
	if (e) {
		errno = e;
		return NULL;
	}
	if (json_get_u32(&r.doc, 0, "handle", &h)) {
		vrdma_reply_free(&r);
		errno = EIO;
		return NULL;
	}
	if (json_get_u32(&r.doc, 0, "qpn", &qpn) || (tgt ? r.nfds != 0 : vrdma_qp_layout(&r.doc, 0, &l, &caps) || r.nfds != 2)) {
		vrdma_reply_free(&r);
		cmd_handle(vm, VRDMA_OP_DESTROY_QP, h);
		errno = EIO;
		return NULL;
	}
	if (tgt) {
		memset(&l, 0, sizeof(l));
		memset(&caps, 0, sizeof(caps));
	}
	qp = calloc(1, sizeof(*qp));
	if (qp && !tgt)
		qp->ring = map_ring(r.fds[0], l.size);
	if (!qp || (!tgt && !qp->ring)) {
		e = qp ? errno : ENOMEM;
		free(qp);
		vrdma_reply_free(&r);
		cmd_handle(vm, VRDMA_OP_DESTROY_QP, h);
		errno = e;
		return NULL;
	}
	qp->ring_size = l.size;
	qp->sq_entries = l.sq_entries;
	qp->sq_stride = l.sq_stride;
	qp->rq_entries = l.rq_entries;
	qp->rq_stride = l.rq_stride;
	qp->sq_offset = l.sq_offset;
	qp->rq_offset = l.rq_offset;
	qp->caps = caps;
	qp->sq_sig_all = attr->sq_sig_all;
	qp->doorbell_fd = -1;
	qp->vm = vm;
	if (!tgt) {
		qp->doorbell_fd = r.fds[1];
		r.fds[1] = -1;
		(void)fcntl(qp->doorbell_fd, F_SETFL, O_NONBLOCK);
	}
	vrdma_reply_free(&r);
	qp->qpx.qp_base.pd = tgt ? NULL : ibpd;
	qp->qpx.qp_base.send_cq = tgt ? NULL : attr->send_cq;
	qp->qpx.qp_base.recv_cq = tgt ? NULL : attr->recv_cq;
	qp->qpx.qp_base.srq = attr->srq;
	qp->qc.wqe_size = qp->sq_stride;
	qp->qc.owner = qp;
	if (qp_register(vm, qp, context, h, qpn, attr->qp_type, attr->qp_context))
		return NULL;
	/* The send channel (§4.22): an RC QP with its own receive queue may
	 * take the peer's SENDs at its recv CQ's polls. */
	if (!tgt && attr->qp_type == IBV_QPT_RC && !attr->srq && vrdma_chan_enabled(vm))
		cq_rxq_add((struct vrdma_cq *)attr->recv_cq, qp);
	attr->cap = caps; /* the real sizes, as providers report them */
	return &qp->qpx.qp_base;
}

/* open_qp is ibv_open_qp: the XRC target QP numbered attr->qp_num, which a
 * process of the VM (this one included) created in domain attr->xrcd, as
 * a QP of this process with a handle of its own (wire-local.md §4.18): it
 * modifies, queries and destroys it (the destroy drops this open only),
 * and its async events come with attr->qp_context's QP. As rdma-core's
 * ibv_cmd_open_qp: the number, domain and type must be given, the type
 * XRC_RECV. */
static struct ibv_qp *open_qp(struct ibv_context *context, struct ibv_qp_open_attr *attr)
{
	struct vrdma_vm *vm = vm_of(context);
	struct vrdma_xrcd *xrcd;
	struct vrdma_qp *qp;
	struct vrdma_reply r;
	uint32_t need = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
	uint32_t h, qpn;
	char body[96];
	int e;

	if (!vm || !attr || (attr->comp_mask & ~(uint32_t)(need | IBV_QP_OPEN_ATTR_CONTEXT)) || (attr->comp_mask & need) != need ||
	    attr->qp_type != IBV_QPT_XRC_RECV) {
		errno = EINVAL;
		return NULL;
	}
	xrcd = to_xrcd(attr->xrcd);
	if (!xrcd || xrcd->ibxrcd.context != context) {
		errno = EINVAL;
		return NULL;
	}
	if (!(vm->s.caps & VRDMA_CAP_OPEN_QP)) {
		errno = EOPNOTSUPP; /* an agent without open-qp */
		return NULL;
	}
	snprintf(body, sizeof(body), "{\"xrcd\":%u,\"qpn\":%u}", xrcd->handle, attr->qp_num);
	e = cmd(vm, VRDMA_OP_OPEN_QP, body, &r);
	if (e) {
		errno = e; /* EINVAL: not a target QP of the domain */
		return NULL;
	}
	e = json_get_u32(&r.doc, 0, "handle", &h) || json_get_u32(&r.doc, 0, "qpn", &qpn);
	vrdma_reply_free(&r);
	if (e) {
		errno = EIO;
		return NULL;
	}
	qp = calloc(1, sizeof(*qp));
	if (!qp) {
		cmd_handle(vm, VRDMA_OP_DESTROY_QP, h);
		errno = ENOMEM;
		return NULL;
	}
	qp->doorbell_fd = -1;
	if (qp_register(vm, qp, context, h, qpn, IBV_QPT_XRC_RECV,
			(attr->comp_mask & IBV_QP_OPEN_ATTR_CONTEXT) ? attr->qp_context : NULL))
		return NULL;
	return &qp->qpx.qp_base;
}

struct ibv_qp *ibv_create_qp(struct ibv_pd *ibpd, struct ibv_qp_init_attr *attr)
{
	if (!to_pd(ibpd)) {
		errno = EINVAL;
		return NULL;
	}
	return create_qp(ibpd->context, ibpd, NULL, attr);
}

int ibv_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int mask)
{
	struct vrdma_qp *qp = to_qp(ibqp);
	struct vrdma_vm *vm = qp ? vrdma_vm_get() : NULL;
	struct vrdma_reply r;
	char body[768], gid[64];
	struct jbuf b;
	int acc = 0, e;

	if (!qp || !vm || !attr)
		return EINVAL;
	if (mask & IBV_QP_ACCESS_FLAGS) {
		acc = access_flags(vm, attr->qp_access_flags);
		if (acc < 0)
			return -acc;
		acc &= ~IBV_ACCESS_ON_DEMAND; /* a region's flag: programs give a QP their regions' flags */
	}
	if ((mask & IBV_QP_PATH_MTU) && !vrdma_mtu_bytes(attr->path_mtu))
		return EINVAL;
	if ((mask & IBV_QP_AV) && !attr->ah_attr.is_global) {
		/* RoCE has no LIDs: the address is the GRH's GID. */
		vrdma_warn("ibv_modify_qp: an address vector without a GRH (is_global 0, LID 0x%x): vrdma adapters "
			   "are RoCE and need the peer's GID (ibv_rc_pingpong -g 0)",
			   attr->ah_attr.dlid);
		return EINVAL;
	}
	jb_init(&b, body, sizeof(body));
	jb_raw(&b, "{");
	jb_u64(&b, "handle", qp->qpx.qp_base.handle);
	jb_u64(&b, "mask", (uint32_t)mask);
	jb_key(&b, "attr");
	jb_raw(&b, "{");
	jb_u64(&b, "qp_state", mask & IBV_QP_STATE ? (uint64_t)attr->qp_state : 0);
	jb_u64(&b, "qp_access_flags", (uint64_t)acc);
	jb_u64(&b, "port_num", mask & IBV_QP_PORT ? attr->port_num : 0);
	if (mask & IBV_QP_AV) {
		vrdma_format_gid(&attr->ah_attr.grh.dgid, gid, sizeof(gid));
		jb_str(&b, "dgid", gid);
	}
	jb_u64(&b, "path_mtu", mask & IBV_QP_PATH_MTU ? vrdma_mtu_bytes(attr->path_mtu) : 0);
	jb_u64(&b, "timeout", mask & IBV_QP_TIMEOUT ? attr->timeout : 0);
	jb_u64(&b, "retry_cnt", mask & IBV_QP_RETRY_CNT ? attr->retry_cnt : 0);
	jb_u64(&b, "rnr_retry", mask & IBV_QP_RNR_RETRY ? attr->rnr_retry : 0);
	jb_u64(&b, "rq_psn", mask & IBV_QP_RQ_PSN ? attr->rq_psn : 0);
	jb_u64(&b, "max_rd_atomic", mask & IBV_QP_MAX_QP_RD_ATOMIC ? attr->max_rd_atomic : 0);
	jb_u64(&b, "min_rnr_timer", mask & IBV_QP_MIN_RNR_TIMER ? attr->min_rnr_timer : 0);
	jb_u64(&b, "sq_psn", mask & IBV_QP_SQ_PSN ? attr->sq_psn : 0);
	jb_u64(&b, "max_dest_rd_atomic", mask & IBV_QP_MAX_DEST_RD_ATOMIC ? attr->max_dest_rd_atomic : 0);
	jb_u64(&b, "dest_qp_num", mask & IBV_QP_DEST_QPN ? attr->dest_qp_num : 0);
	jb_u64(&b, "qkey", mask & IBV_QP_QKEY ? attr->qkey : 0);
	jb_u64(&b, "pkey_index", mask & IBV_QP_PKEY_INDEX ? attr->pkey_index : 0);
	jb_raw(&b, "}}");
	if (b.err)
		return EINVAL;
	e = cmd(vm, VRDMA_OP_MODIFY_QP, body, &r);
	if (e)
		return e;
	vrdma_reply_free(&r);
	if (mask & IBV_QP_STATE)
		qp->qpx.qp_base.state = attr->qp_state;
	if (qp->ring) {
		/* memcpy-direct: the agent revoked the QP's grants; its
		 * refusals are forgotten, and a move to RESET, INIT or RTR
		 * unbinds it until RTR asks for its path again. */
		pthread_mutex_lock(&qp->sq_lock);
		vrdma_direct_qp_reset(&qp->qd);
		if (mask & IBV_QP_MAX_QP_RD_ATOMIC)
			qp->max_rd_atomic = attr->max_rd_atomic;
		if ((mask & IBV_QP_STATE) && (attr->qp_state == IBV_QPS_RESET || attr->qp_state == IBV_QPS_INIT ||
					      attr->qp_state == IBV_QPS_RTR)) {
			direct_off(qp);
			if (attr->qp_state == IBV_QPS_RESET)
				qp->max_rd_atomic = 0;
		}
		if ((mask & IBV_QP_STATE) && attr->qp_state == IBV_QPS_RTR)
			direct_discover(vm, qp);
		/* The send channel (§4.22): revoked by a move out of RTR/RTS
		 * (its sends settled at the next post or poll); forgotten at
		 * RESET, INIT or RTR; asked for after a move to RTR (a
		 * receive-only QP, as perftest's ib_send_bw server, never
		 * reaches RTS) and, if it has none, to RTS (an RTR -> RTS or
		 * RTS -> RTS modify keeps it). */
		if ((mask & IBV_QP_STATE) && (attr->qp_state == IBV_QPS_RESET || attr->qp_state == IBV_QPS_INIT ||
					      attr->qp_state == IBV_QPS_RTR))
			vrdma_chan_off(&qp->qc);
		if ((mask & IBV_QP_STATE) && (attr->qp_state == IBV_QPS_RTR || attr->qp_state == IBV_QPS_RTS) && !qp->qc.cur) {
			qp->qc.stopped = 0;
			qp->qc.next_try = 0;
			chan_ask(vm, qp);
		}
		pthread_mutex_unlock(&qp->sq_lock);
	}
	if ((mask & IBV_QP_STATE) && attr->qp_state == IBV_QPS_RESET) {
		cq_clean(to_cq(qp->qpx.qp_base.send_cq), qp->qpx.qp_base.qp_num);
		if (qp->qpx.qp_base.recv_cq != qp->qpx.qp_base.send_cq)
			cq_clean(to_cq(qp->qpx.qp_base.recv_cq), qp->qpx.qp_base.qp_num);
	}
	return 0;
}

int ibv_query_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int mask, struct ibv_qp_init_attr *init_attr)
{
	struct vrdma_qp *qp = to_qp(ibqp);
	struct vrdma_vm *vm = qp ? vrdma_vm_get() : NULL;
	struct vrdma_reply r;
	char body[48], gid[64];
	uint64_t v;
	int a, e;

	(void)mask; /* every attribute is filled, as providers do */
	if (!qp || !vm || !attr || !init_attr)
		return EINVAL;
	snprintf(body, sizeof(body), "{\"handle\":%u}", qp->qpx.qp_base.handle);
	e = cmd(vm, VRDMA_OP_QUERY_QP, body, &r);
	if (e)
		return e;
	a = json_get(&r.doc, 0, "attr");
	memset(attr, 0, sizeof(*attr));
#define U(name, field)                                              \
	do {                                                        \
		if (json_get_u64(&r.doc, a, name, &v) == 0)         \
			attr->field = (__typeof__(attr->field))v;   \
	} while (0)
	U("qp_state", qp_state);
	U("qp_access_flags", qp_access_flags);
	U("port_num", port_num);
	U("timeout", timeout);
	U("retry_cnt", retry_cnt);
	U("rnr_retry", rnr_retry);
	U("rq_psn", rq_psn);
	U("sq_psn", sq_psn);
	U("max_rd_atomic", max_rd_atomic);
	U("max_dest_rd_atomic", max_dest_rd_atomic);
	U("min_rnr_timer", min_rnr_timer);
	U("dest_qp_num", dest_qp_num);
	U("qkey", qkey);
#undef U
	attr->cur_qp_state = attr->qp_state;
	if (json_get_u64(&r.doc, a, "path_mtu", &v) == 0 && v <= 4096)
		attr->path_mtu = (enum ibv_mtu)vrdma_mtu_enum((uint32_t)v);
	if (json_get_str(&r.doc, a, "dgid", gid, sizeof(gid)) == 0 && !vrdma_parse_gid(gid, &attr->ah_attr.grh.dgid)) {
		attr->ah_attr.is_global = 1;
		attr->ah_attr.grh.hop_limit = 64;
		attr->ah_attr.port_num = 1;
	}
	attr->pkey_index = 0;
	attr->cap = qp->caps;
	vrdma_get_caps(&r.doc, json_get(&r.doc, 0, "caps"), &attr->cap);
	vrdma_reply_free(&r);
	memset(init_attr, 0, sizeof(*init_attr));
	init_attr->qp_context = qp->qpx.qp_base.qp_context;
	init_attr->send_cq = qp->qpx.qp_base.send_cq;
	init_attr->recv_cq = qp->qpx.qp_base.recv_cq;
	init_attr->srq = qp->qpx.qp_base.srq;
	init_attr->cap = attr->cap;
	init_attr->qp_type = qp->qpx.qp_base.qp_type;
	init_attr->sq_sig_all = qp->sq_sig_all;
	qp->qpx.qp_base.state = attr->qp_state;
	return 0;
}

int ibv_destroy_qp(struct ibv_qp *ibqp)
{
	struct vrdma_qp *qp = to_qp(ibqp);
	int e;

	if (!qp)
		return EINVAL;
	e = cmd_handle(vrdma_vm_get(), VRDMA_OP_DESTROY_QP, qp->qpx.qp_base.handle);
	if (e && e != EIO)
		return e;
	reg_take(&qps, qp);
	reg_take(&objs, qp);
	if (qp->ring) {
		/* The agent revoked its grants before it replied. */
		if (qp->qpx.qp_base.recv_cq)
			cq_rxq_del((struct vrdma_cq *)qp->qpx.qp_base.recv_cq, qp);
		pthread_mutex_lock(&qp->sq_lock);
		direct_off(qp);
		vrdma_direct_qp_free(&qp->qd);
		vrdma_chan_free(&qp->qc);
		pthread_mutex_unlock(&qp->sq_lock);
	}
	qp->magic = 0;
	if (qp->ring) {
		munmap(qp->ring, qp->ring_size);
		close(qp->doorbell_fd);
	}
	free(qp);
	return 0;
}

/* ---- SRQ (wire-local.md §4.14, §5.4) ---- */

static void *srq_slot(struct vrdma_srq *srq, uint32_t idx)
{
	return srq->ring + srq->offset + ring_slot(idx, srq->entries) * srq->stride;
}

static int post_srq_recv(struct ibv_srq *ibsrq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	struct vrdma_srq *srq = (struct vrdma_srq *)ibsrq;
	int rc = 0, posted = 0;

	if (!ibsrq || srq->magic != MAGIC_SRQ || !bad_wr) {
		if (bad_wr)
			*bad_wr = wr;
		return EINVAL;
	}
	pthread_mutex_lock(&srq->lock);
	for (; wr; wr = wr->next) {
		if (ring_full(srq->tail, ring_load(srq->ring, VRDMA_SRQ_HEAD), srq->entries)) {
			rc = ENOMEM;
			break;
		}
		if (wr->num_sge < 0 || (uint32_t)wr->num_sge > srq->max_sge || (wr->num_sge > 0 && !wr->sg_list)) {
			rc = EINVAL;
			break;
		}
		wqe_recv_from_wr(srq_slot(srq, srq->tail), wr);
		srq->tail = ring_next(srq->tail, srq->entries);
		posted++;
	}
	if (posted)
		ring_publish_srq(srq->ring, srq->tail);
	if (rc)
		*bad_wr = wr;
	pthread_mutex_unlock(&srq->lock);
	return rc;
}

/* create_srq makes an SRQ in PD ibpd: a basic one, or, with xrcd, an XRC
 * SRQ of that domain whose receives complete in cq. */
static struct ibv_srq *create_srq(struct ibv_pd *ibpd, struct ibv_srq_init_attr *attr, struct vrdma_xrcd *xrcd,
				  struct vrdma_cq *cq)
{
	struct vrdma_pd *pd = to_pd(ibpd);
	struct vrdma_vm *vm = pd ? vrdma_vm_get() : NULL;
	struct vrdma_srq *srq;
	struct vrdma_reply r;
	struct vrdma_srq_layout l;
	struct ibv_srq_attr got;
	char body[256];
	uint32_t h, srqn = 0;
	int e;

	if (!pd || !vm || !attr) {
		errno = EINVAL;
		return NULL;
	}
	if (!(vm->s.caps & VRDMA_CAP_SRQ) || (xrcd && !(vm->s.caps & VRDMA_CAP_XRC))) {
		errno = EOPNOTSUPP; /* an agent without shared receive queues, or XRC */
		return NULL;
	}
	snprintf(body, sizeof(body), "{\"pd\":%u,\"attr\":{\"max_wr\":%u,\"max_sge\":%u,\"srq_limit\":%u}", pd->ibpd.handle,
		 attr->attr.max_wr, attr->attr.max_sge, attr->attr.srq_limit);
	if (xrcd)
		snprintf(body + strlen(body), sizeof(body) - strlen(body), ",\"srq_type\":\"xrc\",\"xrcd\":%u,\"cq\":%u",
			 xrcd->handle, cq->ibcq.handle);
	strcat(body, "}");
	e = cmd(vm, VRDMA_OP_CREATE_SRQ, body, &r);
	if (e) {
		errno = e;
		return NULL;
	}
	if (json_get_u32(&r.doc, 0, "handle", &h)) {
		vrdma_reply_free(&r);
		errno = EIO;
		return NULL;
	}
	if (vrdma_srq_layout(&r.doc, 0, &l, &got) || r.nfds != 1 ||
	    (xrcd && (json_get_u32(&r.doc, 0, "srq_num", &srqn) || !srqn || srqn > 0xffffff))) {
		vrdma_reply_free(&r);
		cmd_handle(vm, VRDMA_OP_DESTROY_SRQ, h);
		errno = EIO;
		return NULL;
	}
	srq = calloc(1, sizeof(*srq));
	if (srq)
		srq->ring = map_ring(r.fds[0], l.size);
	if (!srq || !srq->ring) {
		e = srq ? errno : ENOMEM;
		free(srq);
		vrdma_reply_free(&r);
		cmd_handle(vm, VRDMA_OP_DESTROY_SRQ, h);
		errno = e;
		return NULL;
	}
	vrdma_reply_free(&r); /* closes the ring memfd: the mapping stays */
	srq->ring_size = l.size;
	srq->entries = l.entries;
	srq->stride = l.stride;
	srq->offset = l.offset;
	srq->max_sge = got.max_sge;
	srq->srq_num = srqn;
	pthread_mutex_init(&srq->lock, NULL);
	srq->magic = MAGIC_SRQ;
	srq->ibsrq.context = ibpd->context;
	srq->ibsrq.srq_context = attr->srq_context;
	srq->ibsrq.pd = ibpd;
	srq->ibsrq.handle = h;
	pthread_mutex_init(&srq->ibsrq.mutex, NULL);
	pthread_cond_init(&srq->ibsrq.cond, NULL);
	if (reg_add(&objs, srq) || (reg_add(&srqs, srq) && (reg_take(&objs, srq), 1))) {
		cmd_handle(vm, VRDMA_OP_DESTROY_SRQ, h);
		munmap(srq->ring, srq->ring_size);
		free(srq);
		errno = ENOMEM;
		return NULL;
	}
	attr->attr.max_wr = got.max_wr; /* the real sizes, as providers report them */
	attr->attr.max_sge = got.max_sge;
	return &srq->ibsrq;
}

struct ibv_srq *ibv_create_srq(struct ibv_pd *ibpd, struct ibv_srq_init_attr *attr)
{
	return create_srq(ibpd, attr, NULL, NULL);
}

/* create_srq_ex is ibv_create_srq_ex for what its inline does not pass to
 * ibv_create_srq itself: a basic SRQ with more init attributes, or an XRC
 * SRQ (its domain and CQ). Tag matching SRQs are not in vrdma. */
static struct ibv_srq *create_srq_ex(struct ibv_context *context, struct ibv_srq_init_attr_ex *ax)
{
	struct ibv_srq_init_attr a;
	struct vrdma_xrcd *xrcd = NULL;
	struct vrdma_cq *cq = NULL;
	struct ibv_srq *q;
	int xrc;

	if (!vrdma_ctx_ok(context) || !ax) {
		errno = EINVAL;
		return NULL;
	}
	xrc = (ax->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) && ax->srq_type == IBV_SRQT_XRC;
	if ((ax->comp_mask & ~(uint32_t)(IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_XRCD)) ||
	    ((ax->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) && ax->srq_type != IBV_SRQT_BASIC && !xrc)) {
		errno = EOPNOTSUPP; /* tag matching */
		return NULL;
	}
	if (!(ax->comp_mask & IBV_SRQ_INIT_ATTR_PD) || !ax->pd || ax->pd->context != context) {
		errno = EINVAL;
		return NULL;
	}
	if (xrc) {
		/* An XRC SRQ needs its domain and its CQ, as rdma-core's ibv_cmd_create_srq_ex. */
		xrcd = (ax->comp_mask & IBV_SRQ_INIT_ATTR_XRCD) ? to_xrcd(ax->xrcd) : NULL;
		cq = (ax->comp_mask & IBV_SRQ_INIT_ATTR_CQ) ? to_cq(ax->cq) : NULL;
		if (!xrcd || !cq || xrcd->ibxrcd.context != context || cq->ibcq.context != context) {
			errno = EINVAL;
			return NULL;
		}
	}
	memset(&a, 0, sizeof(a));
	a.srq_context = ax->srq_context;
	a.attr = ax->attr;
	q = create_srq(ax->pd, &a, xrcd, cq);
	if (q)
		ax->attr = a.attr;
	return q;
}

/* get_srq_num is ibv_get_srq_num: an XRC SRQ's number, which senders name
 * (wr.qp_type.xrc.remote_srqn); EINVAL for a basic SRQ, which has none. */
static int get_srq_num(struct ibv_srq *ibsrq, uint32_t *srq_num)
{
	struct vrdma_srq *srq = to_srq(ibsrq);

	if (!srq || !srq_num || !srq->srq_num)
		return EINVAL;
	*srq_num = srq->srq_num;
	return 0;
}

/* ---- XRC domains (wire-local.md §4.18) ---- */

/* open_xrcd is ibv_open_xrcd: with a file (attr->fd, not -1) the domain
 * the VM's processes share through it, made with O_CREAT if there is none
 * yet (the agent names it by the file's inode); with fd -1 a private one.
 * As rdma-core, both IBV_XRCD_INIT_ATTR_FD and _OFLAGS must be set. */
static struct ibv_xrcd *open_xrcd(struct ibv_context *context, struct ibv_xrcd_init_attr *attr)
{
	struct vrdma_vm *vm = vm_of(context);
	struct vrdma_xrcd *x;
	struct vrdma_reply r;
	char body[160];
	uint32_t h;
	int e;

	if (!vm || !attr) {
		errno = EINVAL;
		return NULL;
	}
	if (!(vm->s.caps & VRDMA_CAP_XRC)) {
		errno = EOPNOTSUPP; /* an agent without XRC */
		return NULL;
	}
	if (attr->comp_mask & ~(uint32_t)(IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS)) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (!(attr->comp_mask & IBV_XRCD_INIT_ATTR_FD) || !(attr->comp_mask & IBV_XRCD_INIT_ATTR_OFLAGS) ||
	    (attr->oflags & ~(O_CREAT | O_EXCL)) || attr->fd < -1) {
		errno = EINVAL;
		return NULL;
	}
	snprintf(body, sizeof(body), "{\"adapter\":\"%s\",\"fd\":%s,\"oflags\":%d}", to_vctx(context)->dev->adapter,
		 attr->fd >= 0 ? "true" : "false", attr->fd >= 0 ? attr->oflags & (O_CREAT | O_EXCL) : 0);
	if (vrdma_call_fd(&vm->s, VRDMA_OP_OPEN_XRCD, body, attr->fd, &r))
		return NULL;
	if (r.is_error) {
		errno = r.err;
		if (getenv("VRDMA_DEBUG"))
			vrdma_warn("open-xrcd: %s: %s", r.code, r.message);
		vrdma_reply_free(&r);
		return NULL;
	}
	e = json_get_u32(&r.doc, 0, "handle", &h);
	vrdma_reply_free(&r);
	if (e) {
		errno = EIO;
		return NULL;
	}
	x = calloc(1, sizeof(*x));
	if (!x || reg_add(&objs, x)) {
		free(x);
		cmd_handle(vm, VRDMA_OP_CLOSE_XRCD, h);
		errno = ENOMEM;
		return NULL;
	}
	x->magic = MAGIC_XRCD;
	x->ibxrcd.context = context;
	x->handle = h;
	return &x->ibxrcd;
}

static int close_xrcd(struct ibv_xrcd *ibx)
{
	struct vrdma_xrcd *x = to_xrcd(ibx);
	int e;

	if (!x)
		return EINVAL;
	e = cmd_handle(vrdma_vm_get(), VRDMA_OP_CLOSE_XRCD, x->handle);
	if (e && e != EIO)
		return e; /* EBUSY: SRQs or QPs of this process use it */
	reg_take(&objs, x);
	x->magic = 0;
	free(x);
	return 0;
}

int ibv_modify_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr, int mask)
{
	struct vrdma_srq *srq = to_srq(ibsrq);
	struct vrdma_vm *vm = srq ? vrdma_vm_get() : NULL;
	struct vrdma_reply r;
	char body[160];
	int e;

	if (!srq || !vm || !attr || (mask & ~(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT)))
		return EINVAL;
	snprintf(body, sizeof(body), "{\"handle\":%u,\"mask\":%d,\"attr\":{\"max_wr\":%u,\"max_sge\":%u,\"srq_limit\":%u}}",
		 srq->ibsrq.handle, mask, attr->max_wr, attr->max_sge, attr->srq_limit);
	e = cmd(vm, VRDMA_OP_MODIFY_SRQ, body, &r);
	if (e)
		return e;
	vrdma_reply_free(&r);
	return 0;
}

int ibv_query_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr)
{
	struct vrdma_srq *srq = to_srq(ibsrq);
	struct vrdma_vm *vm = srq ? vrdma_vm_get() : NULL;
	struct vrdma_reply r;
	char body[48];
	int e;

	if (!srq || !vm || !attr)
		return EINVAL;
	snprintf(body, sizeof(body), "{\"handle\":%u}", srq->ibsrq.handle);
	e = cmd(vm, VRDMA_OP_QUERY_SRQ, body, &r);
	if (e)
		return e;
	memset(attr, 0, sizeof(*attr));
	if (json_get_u32(&r.doc, 0, "max_wr", &attr->max_wr) || json_get_u32(&r.doc, 0, "max_sge", &attr->max_sge) ||
	    json_get_u32(&r.doc, 0, "srq_limit", &attr->srq_limit)) {
		vrdma_reply_free(&r);
		return EIO;
	}
	vrdma_reply_free(&r);
	return 0;
}

int ibv_destroy_srq(struct ibv_srq *ibsrq)
{
	struct vrdma_srq *srq = to_srq(ibsrq);
	int e;

	if (!srq)
		return EINVAL;
	e = cmd_handle(vrdma_vm_get(), VRDMA_OP_DESTROY_SRQ, srq->ibsrq.handle);
	if (e && e != EIO)
		return e; /* EBUSY: a QP uses it */
	reg_take(&srqs, srq);
	reg_take(&objs, srq);
	srq->magic = 0;
	munmap(srq->ring, srq->ring_size);
	free(srq);
	return 0;
}

/* ---- the ibv_wr_* API (struct ibv_qp_ex), over the same send queue ---- */

#define WR_OPS_SUPPORTED                                                                              \
	(IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_SEND |        \
	 IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | \
	 IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | WR_OPS_MW)

/* The memory-window operations (an agent with capability mw). */
#define WR_OPS_MW (IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_SEND_WITH_INV)

/* wr_begin starts a WQE of opcode in the next slot after the last one of
 * this wr_start; NULL (and wr_err set) if it cannot. */
static void *wr_begin(struct ibv_qp_ex *x, int opcode)
{
	struct vrdma_qp *qp = (struct vrdma_qp *)x;
	void *slot;

	qp->wr_cur = NULL;
	if (qp->wr_err)
		return NULL;
	if (x->qp_base.qp_type == IBV_QPT_UD && opcode != IBV_WR_SEND && opcode != IBV_WR_SEND_WITH_IMM) {
		qp->wr_err = EINVAL; /* UD carries SENDs only */
		return NULL;
	}
	if (x->wr_flags & ~WQE_SEND_FLAGS || uc_refuses(qp, opcode)) {
		qp->wr_err = EINVAL;
		return NULL;
	}
	if (ring_full(qp->wr_tail, ring_load(qp->ring, VRDMA_QP_SQ_HEAD), qp->sq_entries)) {
		qp->wr_err = ENOMEM;
		return NULL;
	}
	slot = sq_slot(qp, qp->wr_tail);
	wqe_send_begin(slot, x->wr_id, opcode, x->wr_flags); /* INLINE comes with wr_set_inline_data */
	qp->wr_tail = ring_next(qp->wr_tail, qp->sq_entries);
	qp->wr_cur = slot;
	qp->wr_op = opcode;
	return slot;
}

/* wr_set_ud_addr sets a UD WQE's destination (ud.c). */
static void wr_set_ud_addr(struct ibv_qp_ex *x, struct ibv_ah *ah, uint32_t remote_qpn, uint32_t remote_qkey)
{
	struct vrdma_qp *qp = (struct vrdma_qp *)x;

	if (qp->wr_cur && vrdma_ud_set_dest(qp->wr_cur, ah, remote_qpn, remote_qkey))
		qp->wr_err = EINVAL;
}

/* wr_set_xrc_srqn names the remote XRC SRQ of an XRC initiator's WQE. */
static void wr_set_xrc_srqn(struct ibv_qp_ex *x, uint32_t remote_srqn)
{
	struct vrdma_qp *qp = (struct vrdma_qp *)x;

	if (qp->wr_cur)
		wqe_send(qp->wr_cur)->xrc_srqn = remote_srqn;
}

static void wr_remote(void *slot, uint32_t rkey, uint64_t raddr)
{
	if (slot)
		wqe_send_remote(slot, raddr, rkey);
}

static void wr_imm(void *slot, __be32 imm)
{
	if (slot)
		wqe_send_imm(slot, imm);
}

static void wr_send(struct ibv_qp_ex *x)
{
	wr_begin(x, IBV_WR_SEND);
}

static void wr_send_imm(struct ibv_qp_ex *x, __be32 imm)
{
	wr_imm(wr_begin(x, IBV_WR_SEND_WITH_IMM), imm);
}

static void wr_send_inv(struct ibv_qp_ex *x, uint32_t invalidate_rkey)
{
	void *slot = wr_begin(x, IBV_WR_SEND_WITH_INV);

	if (slot)
		wqe_send_invalidate(slot, invalidate_rkey);
}

static void wr_local_inv(struct ibv_qp_ex *x, uint32_t invalidate_rkey)
{
	void *slot = wr_begin(x, IBV_WR_LOCAL_INV);

	if (slot)
		wqe_send_invalidate(slot, invalidate_rkey);
}

static void wr_bind_mw(struct ibv_qp_ex *x, struct ibv_mw *mw, uint32_t rkey, const struct ibv_mw_bind_info *info)
{
	struct vrdma_qp *qp = (struct vrdma_qp *)x;
	void *slot = wr_begin(x, IBV_WR_BIND_MW);

	if (slot && (!info || !vrdma_mw_ok(mw) || wqe_send_bind(slot, mw, rkey, info)))
		qp->wr_err = EINVAL;
}

static void wr_rdma_write(struct ibv_qp_ex *x, uint32_t rkey, uint64_t raddr)
{
	wr_remote(wr_begin(x, IBV_WR_RDMA_WRITE), rkey, raddr);
}

static void wr_rdma_write_imm(struct ibv_qp_ex *x, uint32_t rkey, uint64_t raddr, __be32 imm)
{
	void *slot = wr_begin(x, IBV_WR_RDMA_WRITE_WITH_IMM);

	wr_remote(slot, rkey, raddr);
	wr_imm(slot, imm);
}

static void wr_rdma_read(struct ibv_qp_ex *x, uint32_t rkey, uint64_t raddr)
{
	wr_remote(wr_begin(x, IBV_WR_RDMA_READ), rkey, raddr);
}

static void wr_atomic_cmp_swp(struct ibv_qp_ex *x, uint32_t rkey, uint64_t raddr, uint64_t compare, uint64_t swap)
{
	void *slot = wr_begin(x, IBV_WR_ATOMIC_CMP_AND_SWP);

	wr_remote(slot, rkey, raddr);
	if (slot)
		wqe_send_atomic(slot, compare, swap);
}

static void wr_atomic_fetch_add(struct ibv_qp_ex *x, uint32_t rkey, uint64_t raddr, uint64_t add)
{
	void *slot = wr_begin(x, IBV_WR_ATOMIC_FETCH_AND_ADD);

	wr_remote(slot, rkey, raddr);
	if (slot)
		wqe_send_atomic(slot, add, 0);
}

/* wr_atomic_write (capability atomic-write): the 8 bytes at atomic_wr go
 * in the WQE's swap word, as they lie in memory; no SGE (wire-local.md
 * §5.2). */
static void wr_atomic_write(struct ibv_qp_ex *x, uint32_t rkey, uint64_t raddr, const void *atomic_wr)
{
	void *slot = wr_begin(x, IBV_WR_ATOMIC_WRITE);
	uint64_t v;

	wr_remote(slot, rkey, raddr);
	if (!slot)
		return;
	if (!atomic_wr) {
		((struct vrdma_qp *)x)->wr_err = EINVAL;
		return;
	}
	memcpy(&v, atomic_wr, sizeof(v));
	wqe_send_atomic(slot, 0, v);
}

/* wr_data returns the current WQE for a wr_set_* call, or NULL (wr_err set
 * when the call has no WQE to go with). */
static void *wr_data(struct vrdma_qp *qp)
{
	if (!qp->wr_cur && !qp->wr_err)
		qp->wr_err = EINVAL;
	return qp->wr_err ? NULL : qp->wr_cur;
}

static void wr_set_sge_list(struct ibv_qp_ex *x, size_t num_sge, const struct ibv_sge *sg_list)
{
	struct vrdma_qp *qp = (struct vrdma_qp *)x;
	void *slot = wr_data(qp);

	if (!slot)
		return;
	if (num_sge > qp->caps.max_send_sge || (num_sge && !sg_list)) {
		qp->wr_err = EINVAL;
		return;
	}
	wqe_send_sges(slot, num_sge, sg_list);
}

static void wr_set_sge(struct ibv_qp_ex *x, uint32_t lkey, uint64_t addr, uint32_t length)
{
	struct ibv_sge sge = { .addr = addr, .length = length, .lkey = lkey };

	wr_set_sge_list(x, 1, &sge);
}

static void wr_set_inline_data_list(struct ibv_qp_ex *x, size_t num_buf, const struct ibv_data_buf *buf_list)
{
	struct vrdma_qp *qp = (struct vrdma_qp *)x;
	void *slot = wr_data(qp);

	if (!slot)
		return;
	if (!wqe_send_takes_inline(qp->wr_op) || (num_buf && !buf_list)) {
		qp->wr_err = EINVAL;
		return;
	}
	wqe_send_inline(slot);
	for (size_t i = 0; i < num_buf; i++)
		if (wqe_send_inline_add(slot, buf_list[i].addr, buf_list[i].length, qp->caps.max_inline_data)) {
			qp->wr_err = EINVAL;
			return;
		}
}

static void wr_set_inline_data(struct ibv_qp_ex *x, void *addr, size_t length)
{
	struct ibv_data_buf b = { .addr = addr, .length = length };

	wr_set_inline_data_list(x, 1, &b);
}

static void wr_start(struct ibv_qp_ex *x)
{
	struct vrdma_qp *qp = (struct vrdma_qp *)x;

	pthread_mutex_lock(&qp->sq_lock);
	qp->wr_tail = qp->sq_tail;
	qp->wr_cur = NULL;
	qp->wr_err = 0;
}

static int wr_complete(struct ibv_qp_ex *x)
{
	struct vrdma_qp *qp = (struct vrdma_qp *)x;
	int err = qp->wr_err;

	uint32_t state = ring_load(qp->ring, VRDMA_QP_STATE);
	struct vrdma_vm *vm = NULL;

	if (!err && !sq_postable(state))
		err = EINVAL;
	if (!err && !qp->path_known && state == IBV_QPS_RTS && (vm = qp->vm))
		direct_discover(vm, qp);
	if (!err && qp->direct && qp->wr_tail != qp->sq_tail && (vm = qp->vm)) {
		/* memcpy-direct: each WQE executed directly leaves the ring;
		 * the others move down over the gaps, in order. The channel's
		 * sends still posted go before them all (§4.22). */
		uint32_t pending = ring_pending(qp->wr_tail, qp->sq_tail, qp->sq_entries);

		if (chan_retract(qp, pending))
			err = ENOMEM;
		qp->wr_tail = (qp->sq_tail + pending) & ring_mask(qp->sq_entries);
	}
	if (!err && qp->direct && qp->wr_tail != qp->sq_tail && (vm = qp->vm)) {
		uint32_t out = qp->sq_tail;

		for (uint32_t i = qp->sq_tail; i != qp->wr_tail; i = ring_next(i, qp->sq_entries)) {
			int op = wqe_send(sq_slot(qp, i))->opcode;

			/* A SEND of a batch is relayed: a later WR of the batch
			 * relayed would need the channel's sends retracted
			 * before it, in the middle of the compaction. */
			if (op != IBV_WR_SEND && op != IBV_WR_SEND_WITH_IMM && direct_try(vm, qp, sq_slot(qp, i), out))
				continue;
			if (out != i)
				memcpy(sq_slot(qp, out), sq_slot(qp, i), qp->sq_stride);
			direct_posted(qp, sq_slot(qp, out));
			out = ring_next(out, qp->sq_entries);
		}
		qp->wr_tail = out;
	}
	if (!err && qp->wr_tail != qp->sq_tail) {
		/* Publish every WQE since wr_start at once. */
		qp->sq_tail = qp->wr_tail;
		publish_sq(qp);
	}
	qp->wr_cur = NULL;
	pthread_mutex_unlock(&qp->sq_lock);
	if (__atomic_load_n(&qp->qc.want_err, __ATOMIC_RELAXED) == 1)
		chan_err(qp); /* a channel send failed while reaped here */
	return err; /* on an error nothing since wr_start is posted */
}

static void wr_abort(struct ibv_qp_ex *x)
{
	struct vrdma_qp *qp = (struct vrdma_qp *)x;

	qp->wr_cur = NULL;
	pthread_mutex_unlock(&qp->sq_lock); /* the slots filled stay unpublished */
}

static struct ibv_qp *create_qp_ex(struct ibv_context *context, struct ibv_qp_init_attr_ex *ax)
{
	struct ibv_qp_init_attr a;
	struct vrdma_qp *qp;
	struct ibv_qp *q;

	if (!vrdma_ctx_ok(context) || !ax) {
		errno = EINVAL;
		return NULL;
	}
	if (ax->comp_mask & ~(uint32_t)(IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS | IBV_QP_INIT_ATTR_CREATE_FLAGS |
					 IBV_QP_INIT_ATTR_XRCD) ||
	    ((ax->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && ax->create_flags)) {
		errno = EOPNOTSUPP; /* create flags (none asked for is none), TSO, RSS */
		return NULL;
	}
	if (ax->qp_type == IBV_QPT_XRC_RECV) {
		/* An XRC target QP: its domain, no PD, no send queue to post to. */
		if (!(ax->comp_mask & IBV_QP_INIT_ATTR_XRCD) || (ax->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)) {
			errno = EINVAL;
			return NULL;
		}
		memset(&a, 0, sizeof(a));
		a.qp_context = ax->qp_context;
		a.qp_type = ax->qp_type;
		q = create_qp(context, NULL, to_xrcd(ax->xrcd), &a);
		if (q)
			memset(&ax->cap, 0, sizeof(ax->cap));
		return q;
	}
	if (!(ax->comp_mask & IBV_QP_INIT_ATTR_PD) || !ax->pd || ax->pd->context != context) {
		errno = EINVAL;
		return NULL;
	}
	if ((ax->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) &&
	    (ax->send_ops_flags & ~(uint64_t)(WR_OPS_SUPPORTED | IBV_QP_EX_WITH_ATOMIC_WRITE))) {
		errno = EOPNOTSUPP; /* TSO */
		return NULL;
	}
	if ((ax->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) && (ax->send_ops_flags & WR_OPS_MW) &&
	    (ax->qp_type != IBV_QPT_RC || !(vrdma_vm_get() && (vrdma_vm_get()->s.caps & VRDMA_CAP_MW)))) {
		errno = EOPNOTSUPP; /* memory windows: RC QPs of an agent with them */
		return NULL;
	}
	if ((ax->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) && (ax->send_ops_flags & IBV_QP_EX_WITH_ATOMIC_WRITE) &&
	    (ax->qp_type != IBV_QPT_RC || !(vrdma_vm_get() && vrdma_vm_get()->s.caps & VRDMA_CAP_ATOMIC_WRITE))) {
		errno = EOPNOTSUPP; /* RC only, from an agent with atomic-write */
		return NULL;
	}
	if (ax->qp_type == IBV_QPT_UD && (ax->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) &&
	    (ax->send_ops_flags & ~(uint64_t)(IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM))) {
		errno = EOPNOTSUPP; /* UD carries SENDs only */
		return NULL;
	}
	if ((ax->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) && ax->qp_type == IBV_QPT_UC &&
	    (ax->send_ops_flags & (IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD))) {
		errno = EOPNOTSUPP; /* UC has no READ or atomics, as rxe says */
		return NULL;
	}
	memset(&a, 0, sizeof(a));
	a.qp_context = ax->qp_context;
	a.send_cq = ax->send_cq;
	a.recv_cq = ax->recv_cq;
	a.srq = ax->srq;
	a.cap = ax->cap;
	a.qp_type = ax->qp_type;
	a.sq_sig_all = ax->sq_sig_all;
	q = ibv_create_qp(ax->pd, &a);
	if (!q)
		return NULL;
	ax->cap = a.cap;
	if (ax->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) {
		struct ibv_qp_ex *x;

		qp = (struct vrdma_qp *)q;
		x = &qp->qpx;
		x->wr_send = wr_send;
		x->wr_send_imm = wr_send_imm;
		x->wr_send_inv = wr_send_inv;
		x->wr_local_inv = wr_local_inv;
		x->wr_bind_mw = wr_bind_mw;
		x->wr_rdma_write = wr_rdma_write;
		x->wr_rdma_write_imm = wr_rdma_write_imm;
		x->wr_rdma_read = wr_rdma_read;
		x->wr_atomic_cmp_swp = wr_atomic_cmp_swp;
		x->wr_atomic_fetch_add = wr_atomic_fetch_add;
		x->wr_atomic_write = wr_atomic_write;
		x->wr_set_sge = wr_set_sge;
		x->wr_set_sge_list = wr_set_sge_list;
		x->wr_set_inline_data = wr_set_inline_data;
		x->wr_set_inline_data_list = wr_set_inline_data_list;
		x->wr_start = wr_start;
		x->wr_complete = wr_complete;
		x->wr_abort = wr_abort;
		if (ax->qp_type == IBV_QPT_UD)
			x->wr_set_ud_addr = wr_set_ud_addr;
		if (ax->qp_type == IBV_QPT_XRC_SEND)
			x->wr_set_xrc_srqn = wr_set_xrc_srqn;
		qp->has_ex = 1;
	}
	return q;
}

struct ibv_qp_ex *ibv_qp_to_qp_ex(struct ibv_qp *ibqp)
{
	struct vrdma_qp *qp = to_qp(ibqp);

	/* As rdma-core: NULL for a QP not created with send ops. */
	return qp && qp->has_ex ? &qp->qpx : NULL;
}

void vrdma_set_ops(struct vrdma_context *ctx)
{
	struct ibv_context_ops *ops = &ctx->vctx.context.ops;

	ops->poll_cq = poll_cq;
	ops->req_notify_cq = req_notify_cq;
	ops->post_send = post_send;
	ops->post_recv = post_recv;
	ops->post_srq_recv = post_srq_recv;
	vrdma_set_mw_ops(ops); /* mw.c */
	ctx->vctx.create_qp_ex = create_qp_ex;
	ctx->vctx.create_srq_ex = create_srq_ex;
	ctx->vctx.create_cq_ex = create_cq_ex;
	ctx->vctx.advise_mr = advise_mr_op;
	ctx->vctx.alloc_td = alloc_td;
	ctx->vctx.dealloc_td = dealloc_td;
	ctx->vctx.alloc_parent_domain = alloc_parent_domain;
	ctx->vctx.open_xrcd = open_xrcd;
	ctx->vctx.open_qp = open_qp;
	ctx->vctx.close_xrcd = close_xrcd;
	ctx->vctx.get_srq_num = get_srq_num;
}

/* mcast attaches (or detaches) a UD QP to a multicast group by its GID
 * (wire-local.md §4.19); RoCE has no LIDs, so lid is not used. */
static int mcast(struct ibv_qp *ibqp, const union ibv_gid *gid, int op)
{
	struct vrdma_qp *qp = to_qp(ibqp);
	struct vrdma_vm *vm = qp ? vrdma_vm_get() : NULL;
	struct vrdma_reply r;
	char body[128], g[64];
	int e;

	if (!qp || !vm || !gid)
		return EINVAL;
	if (!(vm->s.caps & VRDMA_CAP_MCAST))
		return EOPNOTSUPP; /* an agent without multicast */
	vrdma_format_gid(gid, g, sizeof(g));
	snprintf(body, sizeof(body), "{\"qp\":%u,\"gid\":\"%s\"}", ibqp->handle, g);
	e = vrdma_cmd(vm, op, body, &r);
	if (e)
		return e == ENOENT ? EINVAL : e; /* detaching a QP not attached: EINVAL, as Linux */
	vrdma_reply_free(&r);
	return 0;
}

int ibv_attach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
	(void)lid;
	return mcast(qp, gid, VRDMA_OP_ATTACH_MCAST);
}

int ibv_detach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
	(void)lid;
	return mcast(qp, gid, VRDMA_OP_DETACH_MCAST);
}
