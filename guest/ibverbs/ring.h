/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ring.h: the library's side of the shared rings' words (docs/wire-local.md
 * §5.1 index rules, §6 memory ordering). Every access to a ring-state word
 * goes through these helpers, so that each word's ordering is stated once,
 * here; the slots (WQEs, CQEs) are plain memory ordered by the words
 * (wqe.h writes and reads them).
 *
 * Who writes what (the offsets are vrdma-abi.h's, generated from
 * internal/abi):
 *
 *	word             writer   library's access
 *	SQ tail, RQ tail library  store-release after the slots' bytes
 *	                          (ring_publish_sq/rq: then a full fence)
 *	SRQ tail         library  store-release after the slots' bytes
 *	                          (ring_publish_srq: no fence, no doorbell)
 *	SQ head, RQ head agent    load-acquire before reusing the slots before it
 *	SRQ head         agent    load-acquire before reusing the slots before it
 *	CQ tail          agent    load-acquire, then read the CQEs before it
 *	CQ head          library  store-release after reading the CQEs it frees
 *	QP state         agent    load-acquire; advisory (a peer's error moves
 *	                          the QP to ERR behind the library's back)
 *	SQ doorbell flag agent    load after the SQ tail's store and a fence
 *	CQ armed         library  store 1, then a full fence (ring_arm_cq)
 *
 * Three places are Dekker pairs: each side stores one word and then loads
 * the word the other side stores before its own load. A release store
 * followed by an acquire load is NOT enough there: the store can wait in
 * the store buffer while the load runs (x86 reorders a store with a later
 * load), both sides read the old values, and a wake-up is lost. Between the
 * store and the load there is a sequentially consistent fence
 * (__ATOMIC_SEQ_CST: MFENCE or a locked instruction on x86-64, DMB ISH on
 * arm64); the agent's side of each pair is abi.StoreFenced, a swap.
 *
 *   1. SQ tail / doorbell flag (ring_publish_sq). The library stores the
 *      SQ tail, fences, loads the flag and rings the doorbell if it is 1.
 *      The agent, before it sleeps, stores the flag 1, fences, loads the SQ
 *      tail and works if it moved. Either the agent sees the new tail or
 *      the library sees the flag.
 *   2. CQ armed / CQ tail (ring_arm_cq, then poll's ring_cq_tail). The
 *      library stores armed = 1 and fences; its next load of the CQ tail
 *      comes after. The agent, for each completion, stores the CQ tail,
 *      fences, loads armed and, if it is 1, swaps it to 0 and sends the
 *      event. Either the agent sees armed or the library sees the
 *      completion.
 *   3. RQ tail / QP state (ring_publish_rq). The library stores the RQ
 *      tail, fences, loads the QP state and rings the doorbell if it is ERR
 *      (without looking at the flag), so that the agent flushes the new
 *      receives. The agent stores ERR, fences, loads the RQ tail and
 *      flushes up to it.
 *
 * Each queue has one producer and one consumer on the library's side: the
 * callers serialize them (a lock per queue).
 */
#ifndef VRDMA_RING_H
#define VRDMA_RING_H

#include <stddef.h>
#include <stdint.h>

#include "vrdma-abi.h"

/* ---- index rules (§5.1): entries is a power of two; indices count modulo
 * 2*entries so that full and empty differ ---- */

/* ring_mask is the mask of an index of a ring of entries slots. */
static inline uint32_t ring_mask(uint32_t entries)
{
	return 2 * entries - 1;
}

/* ring_pending is how many entries lie between head and tail. */
static inline uint32_t ring_pending(uint32_t tail, uint32_t head, uint32_t entries)
{
	return (tail - head) & ring_mask(entries);
}

/* ring_tail_ok reports whether tail, read from the other side, is an index
 * at most entries ahead of head: anything else is a broken ring, and no
 * slot may be read on its word. */
static inline int ring_tail_ok(uint32_t tail, uint32_t head, uint32_t entries)
{
	return !(tail & ~ring_mask(entries)) && ring_pending(tail, head, entries) <= entries;
}

/* ring_full reports whether a queue whose consumer is at head has no free
 * slot for the producer at tail. */
static inline int ring_full(uint32_t tail, uint32_t head, uint32_t entries)
{
	return ring_pending(tail, head, entries) >= entries;
}

/* ring_next is the index after idx. */
static inline uint32_t ring_next(uint32_t idx, uint32_t entries)
{
	return (idx + 1) & ring_mask(entries);
}

/* ring_slot is the slot number of idx. */
static inline size_t ring_slot(uint32_t idx, uint32_t entries)
{
	return idx & (entries - 1);
}

/* ---- the words ---- */

static inline uint32_t *ring_word(char *ring, size_t off)
{
	return (uint32_t *)(void *)(ring + off);
}

/* ring_load reads a word the agent writes (SQ head, RQ head, CQ tail, QP
 * state) with acquire: the slots it covers are read after it. */
static inline uint32_t ring_load(char *ring, size_t off)
{
	return __atomic_load_n(ring_word(ring, off), __ATOMIC_ACQUIRE);
}

/* ring_cq_tail reads the CQ tail (acquire); after ring_arm_cq, it is the
 * load of pair 2. */
static inline uint32_t ring_cq_tail(char *cq_ring)
{
	return ring_load(cq_ring, VRDMA_CQ_TAIL);
}

/* ring_cq_consumed stores the CQ head with release, after the CQEs before
 * it were read: the agent may then overwrite them. */
static inline void ring_cq_consumed(char *cq_ring, uint32_t head)
{
	__atomic_store_n(ring_word(cq_ring, VRDMA_CQ_HEAD), head, __ATOMIC_RELEASE);
}

/* ring_publish_sq publishes the SQ slots before tail (store-release, after
 * their bytes) and returns the doorbell flag, loaded after a full fence:
 * nonzero means the agent sleeps and the caller rings the doorbell. Pair 1. */
static inline uint32_t ring_publish_sq(char *qp_ring, uint32_t tail)
{
	__atomic_store_n(ring_word(qp_ring, VRDMA_QP_SQ_TAIL), tail, __ATOMIC_RELEASE);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	return __atomic_load_n(ring_word(qp_ring, VRDMA_QP_SQ_DOORBELL), __ATOMIC_ACQUIRE);
}

/* ring_publish_rq publishes the RQ slots before tail and returns the QP
 * state, loaded after a full fence: VRDMA_QPS_ERR means the caller rings
 * the doorbell so that the agent flushes them. Pair 3. */
static inline uint32_t ring_publish_rq(char *qp_ring, uint32_t tail)
{
	__atomic_store_n(ring_word(qp_ring, VRDMA_QP_RQ_TAIL), tail, __ATOMIC_RELEASE);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	return __atomic_load_n(ring_word(qp_ring, VRDMA_QP_STATE), __ATOMIC_ACQUIRE);
}

/* ring_publish_srq publishes an SRQ's slots before tail (store-release,
 * after their bytes). The agent reads the SRQ only when a message needs a
 * receive, so there is no doorbell and no Dekker pair: an RNR-refused
 * sender retries after its timer and finds the new receives. */
static inline void ring_publish_srq(char *srq_ring, uint32_t tail)
{
	__atomic_store_n(ring_word(srq_ring, VRDMA_SRQ_TAIL), tail, __ATOMIC_RELEASE);
}

/* ring_arm_cq asks for an event at the CQ's next completion (how:
 * VRDMA_CQ_ARM_ALL, or VRDMA_CQ_ARM_SOLICITED for the next solicited or
 * error one): it stores how in armed (§7) and fences, so that the caller's
 * next load of the CQ tail (its poll) is ordered after the store. Pair 2. */
static inline void ring_arm_cq(char *cq_ring, uint32_t how)
{
	__atomic_store_n(ring_word(cq_ring, VRDMA_CQ_ARMED), how, __ATOMIC_RELAXED);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
}

#endif
