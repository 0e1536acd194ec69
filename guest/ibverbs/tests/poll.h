/* SPDX-License-Identifier: Apache-2.0 */
/* The C tests' completion wait: busy-polls a CQ, as the pingpong
 * programs do without -e. */
#ifndef VRDMA_TESTS_POLL_H
#define VRDMA_TESTS_POLL_H

#include <infiniband/verbs.h>

/* poll_one waits for one completion of cq into wc; 0 if none came. */
static inline int poll_one(struct ibv_cq *cq, struct ibv_wc *wc)
{
	for (long i = 0; i < 200000000; i++) {
		int n = ibv_poll_cq(cq, 1, wc);

		if (n)
			return n == 1;
	}
	return 0;
}

#endif
