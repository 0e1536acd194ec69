// SPDX-License-Identifier: Apache-2.0
/*
 * The parts of libibverbs that need no device: names of enums, rate
 * conversions, fork support, and the private symbols vendor providers
 * import (verbs-abi.md §1).
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include "vrdma.h"

/* A data object of IBVERBS_PRIVATE_34 that libmlx5 and libefa import. */
bool verbs_allow_disassociate_destroy;

/* Vendor providers' constructors register themselves; this library serves
 * only vrdma's devices, so there is nothing to do. */
void verbs_register_driver_34(const void *ops);
void verbs_register_driver_34(const void *ops)
{
	(void)ops;
}

const char *ibv_node_type_str(enum ibv_node_type node_type)
{
	static const char *const names[] = {
		[IBV_NODE_CA] = "InfiniBand channel adapter",
		[IBV_NODE_SWITCH] = "InfiniBand switch",
		[IBV_NODE_ROUTER] = "InfiniBand router",
		[IBV_NODE_RNIC] = "iWARP NIC",
		[IBV_NODE_USNIC] = "usNIC",
		[IBV_NODE_USNIC_UDP] = "usNIC UDP",
		[IBV_NODE_UNSPECIFIED] = "unspecified",
	};

	if (node_type < IBV_NODE_CA || node_type > IBV_NODE_UNSPECIFIED)
		return "unknown";
	return names[node_type];
}

const char *ibv_port_state_str(enum ibv_port_state port_state)
{
	static const char *const names[] = {
		[IBV_PORT_NOP] = "no state change (NOP)",
		[IBV_PORT_DOWN] = "down",
		[IBV_PORT_INIT] = "init",
		[IBV_PORT_ARMED] = "armed",
		[IBV_PORT_ACTIVE] = "active",
		[IBV_PORT_ACTIVE_DEFER] = "active defer",
	};

	if (port_state < IBV_PORT_NOP || port_state > IBV_PORT_ACTIVE_DEFER)
		return "unknown";
	return names[port_state];
}

const char *ibv_event_type_str(enum ibv_event_type event)
{
	static const char *const names[] = {
		[IBV_EVENT_CQ_ERR] = "CQ error",
		[IBV_EVENT_QP_FATAL] = "local work queue catastrophic error",
		[IBV_EVENT_QP_REQ_ERR] = "invalid request local work queue error",
		[IBV_EVENT_QP_ACCESS_ERR] = "local access violation work queue error",
		[IBV_EVENT_COMM_EST] = "communication established",
		[IBV_EVENT_SQ_DRAINED] = "send queue drained",
		[IBV_EVENT_PATH_MIG] = "path migrated",
		[IBV_EVENT_PATH_MIG_ERR] = "path migration request error",
		[IBV_EVENT_DEVICE_FATAL] = "local catastrophic error",
		[IBV_EVENT_PORT_ACTIVE] = "port active",
		[IBV_EVENT_PORT_ERR] = "port error",
		[IBV_EVENT_LID_CHANGE] = "LID change",
		[IBV_EVENT_PKEY_CHANGE] = "P_Key change",
		[IBV_EVENT_SM_CHANGE] = "SM change",
		[IBV_EVENT_SRQ_ERR] = "SRQ catastrophic error",
		[IBV_EVENT_SRQ_LIMIT_REACHED] = "SRQ limit reached",
		[IBV_EVENT_QP_LAST_WQE_REACHED] = "last WQE reached",
		[IBV_EVENT_CLIENT_REREGISTER] = "client reregistration",
		[IBV_EVENT_GID_CHANGE] = "GID table change",
		[IBV_EVENT_WQ_FATAL] = "WQ fatal",
	};

	if (event < IBV_EVENT_CQ_ERR || event > IBV_EVENT_WQ_FATAL)
		return "unknown";
	return names[event];
}

const char *ibv_wc_status_str(enum ibv_wc_status status)
{
	static const char *const names[] = {
		[IBV_WC_SUCCESS] = "success",
		[IBV_WC_LOC_LEN_ERR] = "local length error",
		[IBV_WC_LOC_QP_OP_ERR] = "local QP operation error",
		[IBV_WC_LOC_EEC_OP_ERR] = "local EE context operation error",
		[IBV_WC_LOC_PROT_ERR] = "local protection error",
		[IBV_WC_WR_FLUSH_ERR] = "Work Request Flushed Error",
		[IBV_WC_MW_BIND_ERR] = "memory management operation error",
		[IBV_WC_BAD_RESP_ERR] = "bad response error",
		[IBV_WC_LOC_ACCESS_ERR] = "local access error",
		[IBV_WC_REM_INV_REQ_ERR] = "remote invalid request error",
		[IBV_WC_REM_ACCESS_ERR] = "remote access error",
		[IBV_WC_REM_OP_ERR] = "remote operation error",
		[IBV_WC_RETRY_EXC_ERR] = "transport retry counter exceeded",
		[IBV_WC_RNR_RETRY_EXC_ERR] = "RNR retry counter exceeded",
		[IBV_WC_LOC_RDD_VIOL_ERR] = "local RDD violation error",
		[IBV_WC_REM_INV_RD_REQ_ERR] = "remote invalid RD request",
		[IBV_WC_REM_ABORT_ERR] = "aborted error",
		[IBV_WC_INV_EECN_ERR] = "invalid EE context number",
		[IBV_WC_INV_EEC_STATE_ERR] = "invalid EE context state",
		[IBV_WC_FATAL_ERR] = "fatal error",
		[IBV_WC_RESP_TIMEOUT_ERR] = "response timeout error",
		[IBV_WC_GENERAL_ERR] = "general error",
		[IBV_WC_TM_ERR] = "TM error",
		[IBV_WC_TM_RNDV_INCOMPLETE] = "TM software rendezvous",
	};

	if (status < IBV_WC_SUCCESS || status > IBV_WC_TM_RNDV_INCOMPLETE)
		return "unknown";
	return names[status];
}

/* Static rates (IBTA 9.7.4, as rdma-core's verbs.c tabulates them). */
static const struct {
	enum ibv_rate rate;
	int mult;
	int mbps;
} rates[] = {
	{ IBV_RATE_2_5_GBPS, 1, 2500 },	  { IBV_RATE_5_GBPS, 2, 5000 },	   { IBV_RATE_10_GBPS, 4, 10000 },
	{ IBV_RATE_20_GBPS, 8, 20000 },	  { IBV_RATE_30_GBPS, 12, 30000 }, { IBV_RATE_40_GBPS, 16, 40000 },
	{ IBV_RATE_60_GBPS, 24, 60000 },  { IBV_RATE_80_GBPS, 32, 80000 }, { IBV_RATE_120_GBPS, 48, 120000 },
	{ IBV_RATE_14_GBPS, 0, 14062 },	  { IBV_RATE_56_GBPS, 0, 56250 },  { IBV_RATE_112_GBPS, 0, 112500 },
	{ IBV_RATE_168_GBPS, 0, 168750 }, { IBV_RATE_25_GBPS, 0, 25781 },  { IBV_RATE_100_GBPS, 0, 103125 },
	{ IBV_RATE_200_GBPS, 0, 206250 }, { IBV_RATE_300_GBPS, 0, 309375 }, { IBV_RATE_28_GBPS, 0, 28125 },
	{ IBV_RATE_50_GBPS, 0, 53125 },	  { IBV_RATE_400_GBPS, 0, 425000 }, { IBV_RATE_600_GBPS, 0, 637500 },
};

int ibv_rate_to_mult(enum ibv_rate rate)
{
	for (size_t i = 0; i < sizeof(rates) / sizeof(rates[0]); i++)
		if (rates[i].rate == rate)
			return rates[i].mult ? rates[i].mult : -1;
	return -1;
}

enum ibv_rate mult_to_ibv_rate(int mult)
{
	for (size_t i = 0; i < sizeof(rates) / sizeof(rates[0]); i++)
		if (rates[i].mult && rates[i].mult == mult)
			return rates[i].rate;
	return IBV_RATE_MAX;
}

int ibv_rate_to_mbps(enum ibv_rate rate)
{
	for (size_t i = 0; i < sizeof(rates) / sizeof(rates[0]); i++)
		if (rates[i].rate == rate)
			return rates[i].mbps;
	return -1;
}

enum ibv_rate mbps_to_ibv_rate(int mbps)
{
	for (size_t i = 0; i < sizeof(rates) / sizeof(rates[0]); i++)
		if (rates[i].mbps == mbps)
			return rates[i].rate;
	return IBV_RATE_MAX;
}

/* Fork: a child gets a private copy of every registered page, and the
 * parent keeps its own (mem.c's vrdma_forget_memory), which is what
 * rdma-core gives on kernels that copy pinned pages at fork (5.13 and
 * later, Debian 12's among them): ibv_fork_init has nothing to do, and
 * ibv_is_fork_initialized says IBV_FORK_UNNEEDED. */
int ibv_fork_init(void)
{
	return 0;
}

enum ibv_fork_status ibv_is_fork_initialized(void)
{
	return IBV_FORK_UNNEEDED;
}

static int madvise_range(void *base, size_t size, int advice)
{
	uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
	uintptr_t start = (uintptr_t)base & ~(page - 1);
	uintptr_t end;

	if (!base || size == 0 || (uintptr_t)base + size < (uintptr_t)base)
		return EINVAL;
	end = ((uintptr_t)base + size + page - 1) & ~(page - 1);
	if (madvise((void *)start, end - start, advice))
		return errno;
	return 0;
}

int ibv_dontfork_range(void *base, size_t size)
{
	return madvise_range(base, size, MADV_DONTFORK);
}

int ibv_dofork_range(void *base, size_t size)
{
	return madvise_range(base, size, MADV_DOFORK);
}
