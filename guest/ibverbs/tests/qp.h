/* SPDX-License-Identifier: Apache-2.0 */
/* The C tests' RC connection: a QP brought to RTS facing (gid, dest) of
 * the same VM or another, as ibv_rc_pingpong does it. */
#ifndef VRDMA_TESTS_QP_H
#define VRDMA_TESTS_QP_H

#include <string.h>
#include <infiniband/verbs.h>

/* connect_rc_rnr moves q through INIT (with access) and RTR (receiving
 * from rq_psn) to RTS (sending from sq_psn, rnr_retry as given); 0 or
 * ibv_modify_qp's error. connect_rc is it with rnr_retry 7 (for ever). */
static inline int connect_rc_rnr(struct ibv_qp *q, uint32_t dest, union ibv_gid *gid, int access, uint32_t rq_psn,
				 uint32_t sq_psn, int rnr_retry)
{
	struct ibv_qp_attr a;
	int rc;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = access;
	rc = ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
	if (rc)
		return rc;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dest;
	a.rq_psn = rq_psn;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = *gid;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	rc = ibv_modify_qp(q, &a,
			   IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				   IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	if (rc)
		return rc;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = (uint8_t)rnr_retry;
	a.sq_psn = sq_psn;
	a.max_rd_atomic = 1;
	return ibv_modify_qp(q, &a,
			     IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
				     IBV_QP_MAX_QP_RD_ATOMIC);
}

static inline int connect_rc(struct ibv_qp *q, uint32_t dest, union ibv_gid *gid, int access, uint32_t rq_psn,
			     uint32_t sq_psn)
{
	return connect_rc_rnr(q, dest, gid, access, rq_psn, sq_psn, 7);
}

#endif
