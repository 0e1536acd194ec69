/* SPDX-License-Identifier: Apache-2.0 */
/* The C tests' first step: the VM's first adapter (vrdma0), opened. */
#ifndef VRDMA_TESTS_DEVICE_H
#define VRDMA_TESTS_DEVICE_H

#include <errno.h>
#include <stdio.h>

#include <infiniband/verbs.h>

/* open_first_device opens the first device of the list, or prints
 * "FAIL setup: ..." (what the Go side reads) and returns NULL. The list
 * is freed: an opened device stays valid without it. */
static inline struct ibv_context *open_first_device(void)
{
	struct ibv_device **list;
	struct ibv_context *ctx;
	int n;

	list = ibv_get_device_list(&n);
	if (!list || n < 1) {
		printf("FAIL setup: no device (errno %d)\n", errno);
		if (list)
			ibv_free_device_list(list);
		return NULL;
	}
	ctx = ibv_open_device(list[0]);
	if (!ctx)
		printf("FAIL setup: ibv_open_device %s: errno %d\n", ibv_get_device_name(list[0]), errno);
	ibv_free_device_list(list);
	return ctx;
}

#endif
