/* SPDX-License-Identifier: Apache-2.0 */
/*
 * librdmacm-vrdma: a drop-in librdmacm.so.1 over vrdmad's rdma_cm event
 * channels (docs/wire-local.md §4.12), next to the drop-in libibverbs.
 *
 * Internal declarations shared by cma.c and addrinfo.c. Where the system
 * librdmacm writes commands to /dev/infiniband/rdma_cm, this one sends them
 * to the agent through libibverbs' session (vrdma_cm_call), and reads the
 * agent's events from the channel's socket, whose fd programs poll.
 */
#ifndef VRDMA_RDMACM_H
#define VRDMA_RDMACM_H

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <netinet/in.h>
#include <rdma/rdma_cma.h>

#include "vrdma.h" /* guest/ibverbs: ops, the JSON reader and writer, vrdma_cm_call */

/* The IBTA private data sizes rdma_cm gives RDMA_PS_TCP consumers
 * (internal/abi/cmev.go): REQ less rdma_cm's header, REP, REJ. */
#define MAX_PDATA_REQ 56
#define MAX_PDATA_REP 196
#define MAX_PDATA_SIDR_REQ 180 /* a UD ID's connect: a SIDR REQ's 216 less rdma_cm's header */
#define MAX_PDATA_SIDR_REP 136 /* a UD ID's accept: a SIDR REP's */
#define MAX_PDATA_REJ 148

/* cm_dev is one device (adapter) of the VM, as rdma_cm keeps them: a
 * context opened once and shared by every ID on it, and a default PD. */
struct cm_dev {
	struct ibv_context *ctx;
	struct ibv_pd *pd; /* made with ctx (init_devices), or on first use (dev_pd) if that failed; +guarded by cm_mu */
	char name[IBV_SYSFS_NAME_MAX];
	union ibv_gid gid;     /* GID index 0: IPv4-mapped when the adapter has an IPv4 address */
	struct in_addr ip4;    /* that address */
	int has_ip4;
	enum ibv_mtu mtu;      /* the port's active MTU */
	uint8_t max_rd_atom;   /* max_qp_rd_atom */
	uint8_t max_dest_rd_atom;
};

/* cm_init opens the devices once; 0, or -1 with errno (ENODEV when the
 * process is no VM's workload). */
int cm_init(void);

/* cm_fail sets errno to e and returns -1, rdma_cm's way. */
static inline int cm_fail(int e)
{
	errno = e;
	return -1;
}

#endif
