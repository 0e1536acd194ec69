// SPDX-License-Identifier: Apache-2.0
/*
 * Memory windows (wire-local.md §4.17), the context ops behind libibverbs'
 * inline ibv_alloc_mw, ibv_dealloc_mw and ibv_bind_mw. A window's handle is
 * the agent's (ibv_mw.handle); its rkey the agent's, with a tag in its low
 * 8 bits that each bind moves on (ibv_inc_rkey). A type 1 window is bound
 * by ibv_bind_mw, which posts a BIND_MW work request as rdma-core's
 * providers do; a type 2 window by IBV_WR_BIND_MW or ibv_wr_bind_mw
 * (post_send, verbs.c).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "vrdma.h"
#include "wqe.h"

#define MAGIC_MW 0x766d7731u

struct vrdma_mw {
	struct ibv_mw ibmw;
	uint32_t magic;
};

static struct vrdma_mw *to_mw(struct ibv_mw *m)
{
	return vrdma_obj_has(m) && ((struct vrdma_mw *)m)->magic == MAGIC_MW ? (struct vrdma_mw *)m : NULL;
}

int vrdma_mw_ok(struct ibv_mw *mw) { return to_mw(mw) != NULL; }

static struct ibv_mw *alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type)
{
	struct vrdma_vm *vm = vrdma_pd_ok(pd) ? vrdma_vm_get() : NULL;
	struct vrdma_reply r;
	struct vrdma_mw *mw;
	char body[64];
	uint32_t h, rkey;
	int e;

	if (!vm) {
		errno = EINVAL;
		return NULL;
	}
	if (!(vm->s.caps & VRDMA_CAP_MW)) {
		errno = EOPNOTSUPP; /* an agent without memory windows */
		return NULL;
	}
	if (type != IBV_MW_TYPE_1 && type != IBV_MW_TYPE_2) {
		errno = EINVAL;
		return NULL;
	}
	snprintf(body, sizeof(body), "{\"pd\":%u,\"type\":%d}", pd->handle, (int)type);
	e = vrdma_cmd(vm, VRDMA_OP_ALLOC_MW, body, &r);
	if (e) {
		errno = e;
		return NULL;
	}
	e = json_get_u32(&r.doc, 0, "handle", &h) || json_get_u32(&r.doc, 0, "rkey", &rkey) ? EIO : 0;
	vrdma_reply_free(&r);
	mw = e ? NULL : calloc(1, sizeof(*mw));
	if (!mw || vrdma_obj_add(mw)) {
		if (!e) {
			snprintf(body, sizeof(body), "{\"handle\":%u}", h);
			if (vrdma_cmd(vm, VRDMA_OP_DEALLOC_MW, body, &r) == 0)
				vrdma_reply_free(&r);
		}
		free(mw);
		errno = e ? e : ENOMEM;
		return NULL;
	}
	mw->ibmw.context = pd->context;
	mw->ibmw.pd = pd;
	mw->ibmw.rkey = rkey;
	mw->ibmw.handle = h;
	mw->ibmw.type = type;
	mw->magic = MAGIC_MW;
	return &mw->ibmw;
}

static int dealloc_mw(struct ibv_mw *ibmw)
{
	struct vrdma_mw *mw = to_mw(ibmw);
	struct vrdma_vm *vm = mw ? vrdma_vm_get() : NULL;
	struct vrdma_reply r;
	char body[48];
	int e;

	if (!vm)
		return EINVAL;
	snprintf(body, sizeof(body), "{\"handle\":%u}", mw->ibmw.handle);
	e = vrdma_cmd(vm, VRDMA_OP_DEALLOC_MW, body, &r);
	if (e && e != EIO)
		return e;
	if (!e)
		vrdma_reply_free(&r);
	vrdma_obj_take(mw);
	mw->magic = 0;
	free(mw);
	return 0;
}

/* bind_mw binds a type 1 window (ibv_bind_mw checked the type and the
 * PDs): a BIND_MW work request with the rkey's tag moved on, which is the
 * window's rkey from then on, as rdma-core's providers set it at post. */
static int bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mw_bind *b)
{
	struct ibv_send_wr wr = { 0 }, *bad;
	int e;

	if (!to_mw(mw) || !b || !qp)
		return EINVAL;
	wr.wr_id = b->wr_id;
	wr.opcode = IBV_WR_BIND_MW;
	wr.send_flags = b->send_flags;
	wr.bind_mw.mw = mw;
	wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
	wr.bind_mw.bind_info = b->bind_info;
	e = qp->context->ops.post_send(qp, &wr, &bad);
	if (!e)
		mw->rkey = wr.bind_mw.rkey;
	return e;
}

void vrdma_set_mw_ops(struct ibv_context_ops *ops)
{
	ops->alloc_mw = alloc_mw;
	ops->dealloc_mw = dealloc_mw;
	ops->bind_mw = bind_mw;
}
