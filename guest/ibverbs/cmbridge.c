// SPDX-License-Identifier: Apache-2.0
/*
 * The bridge the drop-in librdmacm (guest/rdmacm) reaches the agent by.
 *
 * rdma_cm's commands name QPs of this library, so they must travel on the
 * process's own session (wire-local.md §4.12): librdmacm calls
 * vrdma_cm_call, exported in the version node VRDMA_PRIVATE_1 that only
 * it links against. The agent checks every command as it checks verbs.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "vrdma.h"

int vrdma_cm_call(int op, const char *body, char **reply, int *fd, char *msg, size_t msglen)
{
	struct vrdma_vm *vm = vrdma_vm_get();
	struct vrdma_reply r;
	int e;

	if (msg && msglen)
		msg[0] = 0;
	if (fd)
		*fd = -1;
	if (reply)
		*reply = NULL;
	if (!vm)
		return errno ? errno : ENODEV;
	if (op != VRDMA_OP_ACCEPT_REQUEST && op != VRDMA_OP_REJECT_REQUEST && op != VRDMA_OP_CM_ESTABLISH &&
	    op != VRDMA_OP_CM_JOIN && (op < VRDMA_OP_CM_OPEN_CHANNEL || op > VRDMA_OP_CM_DISCONNECT))
		return EINVAL;
	if (!(vm->s.caps & VRDMA_CAP_CM)) {
		if (msg && msglen)
			snprintf(msg, msglen, "the agent does not offer rdma_cm event channels (capability cm)");
		return ENOSYS;
	}
	if (vrdma_call(&vm->s, op, body, &r))
		return errno;
	if (r.is_error) {
		e = r.err;
		if (msg && msglen)
			snprintf(msg, msglen, "%s: %s", r.code, r.message);
		if (getenv("VRDMA_DEBUG"))
			vrdma_warn("rdma_cm op %d: %s: %s", op, r.code, r.message);
		vrdma_reply_free(&r);
		return e;
	}
	if (fd && r.nfds > 0) {
		*fd = r.fds[0];
		r.fds[0] = -1;
	}
	if (reply) {
		*reply = strdup(r.doc.text ? r.doc.text : "{}");
		if (!*reply) {
			if (fd && *fd >= 0) {
				close(*fd);
				*fd = -1;
			}
			vrdma_reply_free(&r);
			return ENOMEM;
		}
	}
	vrdma_reply_free(&r);
	return 0;
}
