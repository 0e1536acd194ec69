// SPDX-License-Identifier: Apache-2.0
/*
 * The send channel of memcpy-direct (docs/wire-local.md §4.22): a SEND or
 * SEND_WITH_IMM small enough for a slot goes from the sender's library
 * into a ring the agent made and granted to both libraries of an RC QP
 * pair; the receiver's library takes it into its own posted receive and
 * makes the receive completion, and writes its verdict into the slot, from
 * which the sender's library makes the send completion. The agent keeps
 * the control path: it makes and revokes the channel, flushes, and relays
 * everything the libraries do not do themselves (after the channel of
 * that direction drained, so that RC order holds).
 *
 * Each direction has its ring (the QP produces into tx, consumes rx):
 *
 *	header  0 tail (sender), 64 head (receiver), 128 rx_armed (receiver
 *	        sets, sender clears), 192 tx_armed (sender sets, receiver
 *	        clears); then entries slots of stride bytes at 256:
 *	slot    0 state: 0 free, 1 posted, 2 taken, 3 done, 4 retracted;
 *	        4 opcode, 5 flags, 6 status (the verdict), 8 length, 12 imm;
 *	        the message at 64.
 *
 * Who touches what (verbs.c calls these under the locks said in vrdma.h):
 * the sender fills the slot at its tail (only when its state is 0), stores
 * the state 1 (release), then the tail; the receiver takes the slot at its
 * head by a compare-and-swap 1 -> 2, consumes the receive at the QP ring's
 * RQ-head word (which it then stores, as the agent does), copies, stores
 * the verdict and the state 3 (release), then its head; the sender reaps
 * done slots in order into send completions and stores their state 0. A
 * slot left posted past the RNR time (rnr_retry < 7) is retracted by the
 * sender (CAS 1 -> 4) and completes RNR_RETRY_EXC_ERR. Every access to the
 * mapping lies between an increment of the grant's in-use word and its
 * decrement, after the grant's state word read valid (§4.21 pair 4).
 *
 * Revocation: the revocation reader (direct.c) calls vrdma_chan_notice
 * under direct.c's lock: the channel is quiescent then (the agent waited
 * for both in-use words to read 0 after marking the grants revoking), so
 * the reader copies the states and verdicts of the send slots into the
 * records, unmaps, and marks the grant revoked; the send CQ's next poll
 * completes what was outstanding from the records (done: the verdict;
 * posted: WR_FLUSH_ERR once the QP is in ERR or RESET, else
 * RETRY_EXC_ERR and the QP to ERR). The reader never waits for a command
 * or for a lock held across one: it takes only direct.c's lock.
 *
 * A grant (struct vrdma_chan) is never freed while its QP lives: a poller
 * that loaded the QP's current pointer may still read it (its fields are
 * set before the pointer is published and never change after, but live
 * and the indices); a QP that gets a new channel (after RESET, RTR, RTS)
 * keeps the old one in its list, freed with the QP.
 *
 * fork: the mappings are MADV_DONTFORK, mapped and advised under direct.c's
 * lock, which its fork handler holds: a child maps no channel, and forgets
 * the registry (vrdma_chan_forget).
 */
#define _GNU_SOURCE
#include <endian.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ring.h"
#include "vrdma.h"
#include "wqe.h"

/* The ring layout (§4.22). */
#define CH_TAIL 0
#define CH_HEAD 64
#define CH_RX_ARMED 128
#define CH_TX_ARMED 192
#define CH_HDR 256
#define CH_SLOT_HDR 64
#define CH_MAX_ENTRIES 4096
#define CH_MIN_STRIDE 128
#define CH_MAX_STRIDE 65536

enum { CS_FREE = 0, CS_POSTED = 1, CS_TAKEN = 2, CS_DONE = 3, CS_RETRACTED = 4 };

/* A slot's header. */
struct ch_slot {
	uint32_t state;
	uint8_t opcode;
	uint8_t flags;
	uint8_t status;
	uint8_t reserved7;
	uint32_t length;
	uint32_t imm;
	uint8_t reserved16[48];
};
_Static_assert(sizeof(struct ch_slot) == CH_SLOT_HDR, "a slot's header is 64 bytes");

#define CH_FLAG_SOLICITED 2 /* as VRDMA_WQE_SOLICITED */

/* Why a channel may not be asked for again for a while (ms), at most. */
#define BACKOFF_MIN_MS 1
#define BACKOFF_MAX_MS 50

/* What the sender keeps of a send it put in slot i. */
struct ch_rec {
	uint64_t wr_id;
	uint64_t posted_ns; /* for the RNR time; 0 when rnr_retry is 7 */
	uint32_t length;
	uint8_t signaled;
	uint8_t snap_state, snap_status; /* the slot's, copied at the revocation */
};

struct vrdma_chan {
	struct vrdma_chan *older; /* the QP's previous grants */
	/* Set before the grant is published, never changed after: */
	char *map;
	size_t size;
	char *tx, *rx;
	uint32_t entries, stride, peer_qpn, slot, state, qp_handle;
	uint64_t rnr_ns;
	struct vrdma_grant_slot *gs;
	/* 1 live, 2 revoked (records hold the snapshot, unmapped), 0 done
	 * (every send completed); atomic. */
	int live;
	int registered; /* in the reader's registry; +guarded by direct.c's lock */
	/* The sender: tx_tail under the QP's sq_lock; tx_reap under the send
	 * CQ's lock; out and sig (sends posted, not reaped; the signaled ones
	 * of them) atomic. */
	uint32_t tx_tail, tx_reap;
	uint32_t out, sig;
	struct ch_rec *rec; /* entries of them, by slot */
	/* The receiver, under the recv CQ's lock: */
	uint32_t rx_head;
	int rx_stop; /* an error verdict was given: no more taking */
	int told;    /* the sender told the peer's recv CQ once (sq_lock) */
};

/* The registry of live grants, for the revocation reader; +guarded by
 * direct.c's lock. */
static struct vrdma_chan **reg;
static int nreg, capreg;

static uint64_t now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static uint32_t *word(char *ring, size_t off)
{
	return (uint32_t *)(void *)(ring + off);
}

static struct ch_slot *slot_at(const struct vrdma_chan *ch, char *ring, uint32_t idx)
{
	return (struct ch_slot *)(void *)(ring + CH_HDR + ring_slot(idx, ch->entries) * (size_t)ch->stride);
}

/* DIRECT_SEND_ON: whether this library sets hello bit 22 (direct-send)
 * unless the environment says otherwise (VRDMA_DIRECT_SEND=0 or 1). */
#ifndef DIRECT_SEND_ON
#define DIRECT_SEND_ON 0
#endif

uint64_t vrdma_hello_caps(void)
{
	const char *e = getenv("VRDMA_DIRECT_SEND");
	int on = e && *e ? strcmp(e, "0") != 0 : DIRECT_SEND_ON;

	return (VRDMA_CAPS_KNOWN & ~VRDMA_CAP_DIRECT_SEND) | (on ? VRDMA_CAP_DIRECT_SEND : 0);
}

int vrdma_chan_enabled(const struct vrdma_vm *vm)
{
	return vm && (vm->s.caps & VRDMA_CAP_DIRECT_SEND) && (vm->s.caps & VRDMA_CAP_MEMCPY_DIRECT);
}

uint32_t vrdma_chan_payload(const struct vrdma_chan *ch)
{
	return ch->stride - CH_SLOT_HDR;
}

uint32_t vrdma_chan_outstanding(const struct vrdma_chan *ch, int signaled_only)
{
	return __atomic_load_n(signaled_only ? &ch->sig : &ch->out, __ATOMIC_ACQUIRE);
}

int vrdma_chan_live(const struct vrdma_chan *ch)
{
	return __atomic_load_n(&ch->live, __ATOMIC_ACQUIRE);
}

uint32_t vrdma_chan_qp(const struct vrdma_chan *ch)
{
	return ch->qp_handle;
}

/* enter marks the grant in use and reports whether it is still valid
 * (pair 4); 0: revoked or revoking, in-use given back. */
static int enter(struct vrdma_chan *ch)
{
	__atomic_fetch_add(&ch->gs->in_use, 1, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(&ch->gs->state, __ATOMIC_SEQ_CST) == ch->state)
		return 1;
	__atomic_fetch_sub(&ch->gs->in_use, 1, __ATOMIC_SEQ_CST);
	return 0;
}

static void leave(struct vrdma_chan *ch)
{
	__atomic_fetch_sub(&ch->gs->in_use, 1, __ATOMIC_SEQ_CST);
}

/* ---- the grant ---- */

int vrdma_chan_check(const struct vrdma_chan_reply *r, uint32_t slots, uint64_t file_size)
{
	uint64_t ring;

	if (r->slot >= slots || (r->state & 3) != VRDMA_GRANT_VALID || (r->state >> 2) == 0)
		return -1;
	if (r->entries == 0 || r->entries > CH_MAX_ENTRIES || (r->entries & (r->entries - 1)))
		return -1;
	if (r->stride < CH_MIN_STRIDE || r->stride > CH_MAX_STRIDE || r->stride % 64)
		return -1;
	if (r->peer_qpn > 0xffffff || r->size == 0 || r->size > file_size || r->size > SIZE_MAX)
		return -1;
	ring = CH_HDR + (uint64_t)r->entries * r->stride; /* at most 256 + 4096 * 65536: no overflow */
	if (r->tx_offset % 64 || r->rx_offset % 64)
		return -1;
	if (r->tx_offset > r->size || ring > r->size - r->tx_offset || r->rx_offset > r->size ||
	    ring > r->size - r->rx_offset)
		return -1;
	/* The rings must not overlap. */
	if (r->tx_offset < r->rx_offset ? r->tx_offset + ring > r->rx_offset : r->rx_offset + ring > r->tx_offset)
		return -1;
	return 0;
}

/* reg_del removes ch from the registry; caller holds direct.c's lock. */
static void reg_del(struct vrdma_chan *ch)
{
	for (int i = 0; i < nreg; i++)
		if (reg[i] == ch) {
			reg[i] = reg[--nreg];
			break;
		}
	ch->registered = 0;
}

int vrdma_chan_notice(uint32_t slot, uint32_t state)
{
	struct vrdma_chan *ch = NULL;

	for (int i = 0; i < nreg; i++)
		if (reg[i]->slot == slot && reg[i]->state == state) {
			ch = reg[i];
			break;
		}
	if (!ch)
		return 0;
	/* Quiescent: both libraries' in-use read 0 after the agent marked
	 * the grants revoking, and no copy starts on a revoking grant. */
	for (uint32_t i = 0; i < ch->entries; i++) {
		struct ch_slot *s = slot_at(ch, ch->tx, i);

		ch->rec[i].snap_state = (uint8_t)__atomic_load_n(&s->state, __ATOMIC_ACQUIRE);
		ch->rec[i].snap_status = s->status;
	}
	munmap(ch->map, ch->size);
	reg_del(ch);
	__atomic_store_n(&ch->live, 2, __ATOMIC_RELEASE);
	return 1;
}

void vrdma_chan_forget(void)
{
	/* The child has none of the mappings (MADV_DONTFORK); the grants
	 * stay in the parent's QPs, which the child cannot use. */
	free(reg);
	reg = NULL;
	nreg = capreg = 0;
}

int vrdma_chan_attach(struct vrdma_vm *vm, struct vrdma_qpchan *qc, uint32_t qp_handle, char *qp_ring)
{
	struct vrdma_chan_reply cr = { 0 };
	struct vrdma_reply r;
	struct vrdma_chan *ch;
	struct stat st;
	char body[48];
	char *map = MAP_FAILED;
	uint64_t now = now_ns();
	int e, ok;

	if (__atomic_load_n(&qc->cur, __ATOMIC_ACQUIRE))
		return 0;
	if (now < __atomic_load_n(&qc->next_try, __ATOMIC_RELAXED))
		return EAGAIN;
	if (!vrdma_chan_enabled(vm) || ring_load(qp_ring, VRDMA_QP_STATE) != IBV_QPS_RTS)
		return EAGAIN;
	snprintf(body, sizeof(body), "{\"handle\":%u}", qp_handle);
	vrdma_direct_lock();
	vrdma_direct_count(0, 1); /* the reader keeps running: a notice may come */
	vrdma_direct_unlock();
	e = vrdma_cmd(vm, VRDMA_OP_DIRECT_CHANNEL, body, &r);
	if (e) {
		vrdma_direct_lock();
		vrdma_direct_count(0, -1);
		vrdma_direct_unlock();
		/* bad-state: the peer is not in RTS yet, or its session does
		 * not take the channel; not-found: no such pair. Ask again
		 * later, less and less often. */
		qc->backoff_ms = qc->backoff_ms ? qc->backoff_ms * 2 : BACKOFF_MIN_MS;
		if (qc->backoff_ms > BACKOFF_MAX_MS)
			qc->backoff_ms = BACKOFF_MAX_MS;
		__atomic_store_n(&qc->next_try, now + (uint64_t)qc->backoff_ms * 1000000u, __ATOMIC_RELAXED);
		return e;
	}
	ok = !json_get_u32(&r.doc, 0, "slot", &cr.slot) && !json_get_u32(&r.doc, 0, "state", &cr.state) &&
	     !json_get_u64(&r.doc, 0, "size", &cr.size) && !json_get_u64(&r.doc, 0, "tx_offset", &cr.tx_offset) &&
	     !json_get_u64(&r.doc, 0, "rx_offset", &cr.rx_offset) && !json_get_u32(&r.doc, 0, "entries", &cr.entries) &&
	     !json_get_u32(&r.doc, 0, "stride", &cr.stride) && !json_get_u32(&r.doc, 0, "peer_qpn", &cr.peer_qpn) &&
	     !json_get_u64(&r.doc, 0, "rnr_ns", &cr.rnr_ns) && r.nfds == 1 && !fstat(r.fds[0], &st) && st.st_size > 0;
	ok = ok && !vrdma_chan_check(&cr, vrdma_direct_nslots(), (uint64_t)st.st_size);
	ch = ok ? calloc(1, sizeof(*ch)) : NULL;
	if (ch)
		ch->rec = calloc(cr.entries, sizeof(*ch->rec));
	vrdma_direct_lock(); /* no fork between the mapping and its advice */
	if (ch && ch->rec) {
		map = mmap(NULL, (size_t)cr.size, PROT_READ | PROT_WRITE, MAP_SHARED, r.fds[0], 0);
		if (map != MAP_FAILED)
			(void)madvise(map, (size_t)cr.size, MADV_DONTFORK);
	}
	vrdma_direct_count(0, -1);
	vrdma_reply_free(&r); /* closes the channel's memfd: the mapping stays */
	if (map != MAP_FAILED && nreg == capreg) {
		int cap = capreg ? capreg * 2 : 8;
		struct vrdma_chan **n = realloc(reg, (size_t)cap * sizeof(*n));

		if (n) {
			reg = n;
			capreg = cap;
		}
	}
	if (ok && (vrdma_direct_early_take(cr.slot, cr.state) || map == MAP_FAILED || nreg == capreg)) {
		/* Revoked before this reply was read (acknowledged then), or
		 * no memory for it: the grant stays unused. A grant this
		 * library holds unmapped would keep the agent's notice
		 * unanswered; it is answered (the reader finds no channel
		 * and acknowledges). */
		vrdma_direct_unlock();
		if (map != MAP_FAILED)
			munmap(map, (size_t)cr.size);
		if (ch)
			free(ch->rec);
		free(ch);
		return EIO;
	}
	if (!ok) {
		vrdma_direct_unlock();
		vrdma_warn("direct-channel: the agent's reply is not usable (slot %u, %u entries of %u bytes, size %llu, "
			   "rings at %llu and %llu): this QP's SENDs are relayed",
			   cr.slot, cr.entries, cr.stride, (unsigned long long)cr.size, (unsigned long long)cr.tx_offset,
			   (unsigned long long)cr.rx_offset);
		if (ch)
			free(ch->rec);
		free(ch);
		__atomic_store_n(&qc->next_try, UINT64_MAX, __ATOMIC_RELAXED); /* not again: the agent's bug */
		return EIO;
	}
	ch->map = map;
	ch->size = (size_t)cr.size;
	ch->tx = map + cr.tx_offset;
	ch->rx = map + cr.rx_offset;
	ch->entries = cr.entries;
	ch->stride = cr.stride;
	ch->peer_qpn = cr.peer_qpn;
	ch->slot = cr.slot;
	ch->state = cr.state;
	ch->qp_handle = qp_handle;
	ch->rnr_ns = cr.rnr_ns;
	ch->gs = vrdma_direct_slot(cr.slot);
	/* This QP's own indices: where the channel is now (a fresh one: 0).
	 * Read inside the grant: the agent may have revoked it already. */
	if (enter(ch)) {
		ch->tx_tail = ch->tx_reap = __atomic_load_n(word(ch->tx, CH_TAIL), __ATOMIC_ACQUIRE) & ring_mask(ch->entries);
		ch->rx_head = __atomic_load_n(word(ch->rx, CH_HEAD), __ATOMIC_ACQUIRE) & ring_mask(ch->entries);
		leave(ch);
	}
	ch->live = 1;
	ch->registered = 1;
	reg[nreg++] = ch;
	vrdma_direct_count(1, 0);
	ch->older = qc->all;
	qc->all = ch;
	qc->backoff_ms = 0;
	__atomic_store_n(&qc->cur, ch, __ATOMIC_RELEASE);
	__atomic_store_n(&qc->need, 0, __ATOMIC_RELAXED);
	vrdma_direct_unlock();
	return 0;
}

void vrdma_chan_off(struct vrdma_qpchan *qc)
{
	__atomic_store_n(&qc->cur, NULL, __ATOMIC_RELEASE);
	__atomic_store_n(&qc->next_try, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&qc->need, 1, __ATOMIC_RELAXED);
	__atomic_store_n(&qc->want_err, 0, __ATOMIC_RELAXED);
	qc->backoff_ms = 0;
}

void vrdma_chan_free(struct vrdma_qpchan *qc)
{
	struct vrdma_chan *ch = qc->all, *next;

	vrdma_direct_lock();
	for (; ch; ch = next) {
		next = ch->older;
		if (ch->registered) {
			/* The agent is gone (it revokes before destroy-qp's
			 * reply): nobody else touches the mapping. */
			munmap(ch->map, ch->size);
			reg_del(ch);
			vrdma_direct_count(-1, 0);
		}
		free(ch->rec);
		free(ch);
	}
	vrdma_direct_unlock();
	memset(qc, 0, sizeof(*qc));
}

/* ---- the sender ---- */

int vrdma_chan_send(struct vrdma_chan *ch, const struct vrdma_chan_msg *m, uint8_t rnr_retry, int *notify)
{
	struct ch_slot *s;
	uint32_t head, armed, idx = ch->tx_tail, k;
	char *data;
	uint64_t t = 0;

	*notify = 0;
	if (__atomic_load_n(&ch->live, __ATOMIC_ACQUIRE) != 1 || m->length > vrdma_chan_payload(ch))
		return -1;
	if (rnr_retry < 7)
		t = now_ns();
	if (!enter(ch))
		return -1;
	head = __atomic_load_n(word(ch->tx, CH_HEAD), __ATOMIC_ACQUIRE);
	s = slot_at(ch, ch->tx, idx);
	if (!ring_tail_ok(idx, head, ch->entries) || ring_full(idx, head, ch->entries) ||
	    __atomic_load_n(&s->state, __ATOMIC_ACQUIRE) != CS_FREE) {
		leave(ch);
		return -1; /* full, or the peer's head is not one: relay (the agent drains, or fails it) */
	}
	s->opcode = (uint8_t)m->opcode;
	s->flags = m->solicited ? CH_FLAG_SOLICITED : 0;
	s->status = 0;
	s->reserved7 = 0;
	s->length = m->length;
	s->imm = m->opcode == IBV_WR_SEND_WITH_IMM ? m->imm : 0;
	data = (char *)s + CH_SLOT_HDR;
	for (k = 0; k < m->nsge; k++) {
		memcpy(data, m->sge[k].p, m->sge[k].len);
		data += m->sge[k].len;
	}
	ch->rec[ring_slot(idx, ch->entries)] =
		(struct ch_rec){ .wr_id = m->wr_id, .posted_ns = t, .length = m->length, .signaled = (uint8_t)!!m->signaled };
	__atomic_fetch_add(&ch->out, 1, __ATOMIC_RELEASE);
	if (m->signaled)
		__atomic_fetch_add(&ch->sig, 1, __ATOMIC_RELEASE);
	__atomic_store_n(&s->state, CS_POSTED, __ATOMIC_RELEASE);
	ch->tx_tail = ring_next(idx, ch->entries);
	__atomic_store_n(word(ch->tx, CH_TAIL), ch->tx_tail, __ATOMIC_SEQ_CST);
	/* The receiver's arming (its recv CQ's rx_armed) against this tail:
	 * a Dekker pair, the receiver's side in vrdma_chan_arm_rx. */
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	armed = __atomic_load_n(word(ch->tx, CH_RX_ARMED), __ATOMIC_SEQ_CST);
	if (armed == VRDMA_CQ_ARM_ALL || (armed == VRDMA_CQ_ARM_SOLICITED && m->solicited))
		*notify = __atomic_compare_exchange_n(word(ch->tx, CH_RX_ARMED), &armed, 0, 0, __ATOMIC_SEQ_CST,
						      __ATOMIC_SEQ_CST);
	if (!ch->told) {
		/* The receiver may have armed its recv CQ before it had the
		 * channel (and so stored no rx_armed here): the first message
		 * tells its CQ anyway; the agent raises the event only if the
		 * CQ is armed. */
		ch->told = 1;
		*notify = 1;
	}
	leave(ch);
	return 0;
}

/* complete makes the send completion of the send in slot i with status
 * (an IBV_WC_* number) into wc if it is to have one; 1 if it made one. */
static int complete(struct vrdma_chan *ch, uint32_t i, uint32_t qpn, int status, struct ibv_wc *wc)
{
	struct ch_rec *r = &ch->rec[i];
	int made = r->signaled || status != IBV_WC_SUCCESS;

	if (made) {
		memset(wc, 0, sizeof(*wc));
		wc->wr_id = r->wr_id;
		wc->status = (enum ibv_wc_status)status;
		wc->opcode = IBV_WC_SEND;
		wc->byte_len = status == IBV_WC_SUCCESS ? r->length : 0;
		wc->qp_num = qpn;
	}
	if (r->signaled)
		__atomic_fetch_sub(&ch->sig, 1, __ATOMIC_RELEASE);
	__atomic_fetch_sub(&ch->out, 1, __ATOMIC_RELEASE);
	return made;
}

/* verdict turns a receiver's status byte into a send completion's: the
 * ones §4.22 names, anything else REM_OP_ERR (a peer's bug). */
static int verdict(uint8_t st)
{
	switch (st) {
	case IBV_WC_SUCCESS:
	case IBV_WC_REM_INV_REQ_ERR:
	case IBV_WC_REM_OP_ERR:
	case IBV_WC_REM_ACCESS_ERR:
		return st;
	default:
		return IBV_WC_REM_OP_ERR;
	}
}

int vrdma_chan_reap(struct vrdma_chan *ch, uint32_t qp_state, uint8_t rnr_retry, uint32_t qpn, struct ibv_wc *wc,
		    int max, int *err)
{
	int live = __atomic_load_n(&ch->live, __ATOMIC_ACQUIRE), n = 0;

	if (live == 0 || !__atomic_load_n(&ch->out, __ATOMIC_ACQUIRE))
		return 0;
	if (live == 2) {
		/* Revoked: the records hold the slots' last states. */
		while (n < max && __atomic_load_n(&ch->out, __ATOMIC_ACQUIRE)) {
			uint32_t i = (uint32_t)ring_slot(ch->tx_reap, ch->entries);
			int st;

			if (ch->rec[i].snap_state == CS_DONE) {
				st = verdict(ch->rec[i].snap_status);
			} else if (qp_state == IBV_QPS_ERR || qp_state == IBV_QPS_RESET) {
				st = IBV_WC_WR_FLUSH_ERR;
			} else {
				st = IBV_WC_RETRY_EXC_ERR; /* the channel went while the QP is up: the peer went */
				*err = 1;
			}
			if (st != IBV_WC_SUCCESS && st != IBV_WC_WR_FLUSH_ERR)
				*err = 1;
			n += complete(ch, i, qpn, st, &wc[n]);
			ch->tx_reap = ring_next(ch->tx_reap, ch->entries);
		}
		if (!__atomic_load_n(&ch->out, __ATOMIC_ACQUIRE))
			__atomic_store_n(&ch->live, 0, __ATOMIC_RELEASE);
		return n;
	}
	if (!enter(ch))
		return 0; /* revoking: the notice comes, then the snapshot */
	while (n < max && __atomic_load_n(&ch->out, __ATOMIC_ACQUIRE)) {
		uint32_t i = (uint32_t)ring_slot(ch->tx_reap, ch->entries);
		struct ch_slot *s = slot_at(ch, ch->tx, ch->tx_reap);
		uint32_t st = __atomic_load_n(&s->state, __ATOMIC_ACQUIRE), one = CS_POSTED;

		if (st == CS_DONE) {
			int v = verdict(s->status);

			if (v != IBV_WC_SUCCESS)
				*err = 1;
			n += complete(ch, i, qpn, v, &wc[n]);
			__atomic_store_n(&s->state, CS_FREE, __ATOMIC_RELEASE);
		} else if (st == CS_POSTED && rnr_retry < 7 && ch->rec[i].posted_ns &&
			   now_ns() - ch->rec[i].posted_ns > (uint64_t)(rnr_retry + 1) * ch->rnr_ns &&
			   __atomic_compare_exchange_n(&s->state, &one, CS_RETRACTED, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
			/* No receive for it in time: the slot stays retracted
			 * (the receiver skips it); the QP goes to ERR. */
			*err = 1;
			n += complete(ch, i, qpn, IBV_WC_RNR_RETRY_EXC_ERR, &wc[n]);
		} else if (st == CS_RETRACTED) {
			n += complete(ch, i, qpn, IBV_WC_WR_FLUSH_ERR, &wc[n]); /* not ours to retract: a peer's bug */
		} else {
			break; /* posted or taken: not yet */
		}
		ch->tx_reap = ring_next(ch->tx_reap, ch->entries);
	}
	leave(ch);
	return n;
}

int vrdma_chan_arm_tx(struct vrdma_chan *ch)
{
	uint32_t one = 1, st;
	int ready = 0;

	if (__atomic_load_n(&ch->live, __ATOMIC_ACQUIRE) == 2 && __atomic_load_n(&ch->out, __ATOMIC_ACQUIRE))
		return 1; /* revoked with sends to complete: they complete at the next poll */
	if (__atomic_load_n(&ch->live, __ATOMIC_ACQUIRE) != 1 || !__atomic_load_n(&ch->out, __ATOMIC_ACQUIRE) ||
	    !enter(ch))
		return 0;
	__atomic_store_n(word(ch->tx, CH_TX_ARMED), 1, __ATOMIC_SEQ_CST);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	/* The oldest outstanding send's verdict may already be there. */
	st = __atomic_load_n(&slot_at(ch, ch->tx, ch->tx_reap)->state, __ATOMIC_SEQ_CST);
	if (st == CS_DONE || st == CS_RETRACTED)
		ready = __atomic_compare_exchange_n(word(ch->tx, CH_TX_ARMED), &one, 0, 0, __ATOMIC_SEQ_CST,
						    __ATOMIC_SEQ_CST);
	leave(ch);
	return ready;
}

/* ---- the receiver ---- */

int vrdma_chan_arm_rx(struct vrdma_chan *ch, uint32_t how)
{
	uint32_t tail, exp = how;
	int ready = 0;

	if (__atomic_load_n(&ch->live, __ATOMIC_ACQUIRE) != 1 || ch->rx_stop || !enter(ch))
		return 0;
	__atomic_store_n(word(ch->rx, CH_RX_ARMED), how, __ATOMIC_SEQ_CST);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	tail = __atomic_load_n(word(ch->rx, CH_TAIL), __ATOMIC_SEQ_CST);
	if (tail != ch->rx_head)
		ready = __atomic_compare_exchange_n(word(ch->rx, CH_RX_ARMED), &exp, 0, 0, __ATOMIC_SEQ_CST,
						    __ATOMIC_SEQ_CST);
	leave(ch);
	return ready;
}

/* recv_check checks the receive WQE at slot against a message of length
 * bytes as the agent does (§5.2): IBV_WC_SUCCESS with the destinations in
 * d (*nd of them), or the receiver's error status with the sender's in
 * *peer. */
static int recv_check(const struct vrdma_chan_rq *rq, const void *slot, uint32_t length, struct vrdma_chan_sge *d,
		      uint32_t *nd, uint8_t *peer)
{
	const struct vrdma_recv_wqe *w = slot;
	const struct vrdma_sge *sge = (const struct vrdma_sge *)(const void *)((const char *)slot + VRDMA_RECV_HDR);
	uint32_t nsge = w->num_sge;
	uint64_t total = 0;

	*nd = 0;
	if (nsge > rq->max_recv_sge || nsge > VRDMA_MAX_SGE ||
	    VRDMA_RECV_HDR + (size_t)nsge * sizeof(struct vrdma_sge) > rq->rq_stride) {
		*peer = IBV_WC_REM_OP_ERR;
		return IBV_WC_LOC_LEN_ERR;
	}
	for (uint32_t i = 0; i < nsge; i++) {
		struct vrdma_sge g = sge[i];
		struct vrdma_lmr m;

		if (!g.length)
			continue;
		if (!vrdma_lmr_get(g.lkey, &m) || m.pd != rq->pd || !(m.access & IBV_ACCESS_LOCAL_WRITE) || g.addr < m.iova ||
		    g.addr - m.iova > m.length || g.length > m.length - (g.addr - m.iova)) {
			*peer = IBV_WC_REM_OP_ERR;
			return IBV_WC_LOC_PROT_ERR;
		}
		d[*nd].p = m.addr + (g.addr - m.iova);
		d[(*nd)++].len = g.length;
		total += g.length;
	}
	if (total < length) {
		*peer = IBV_WC_REM_INV_REQ_ERR;
		return IBV_WC_LOC_LEN_ERR;
	}
	*peer = IBV_WC_SUCCESS;
	return IBV_WC_SUCCESS;
}

int vrdma_chan_take(struct vrdma_chan *ch, const struct vrdma_chan_rq *rq, struct ibv_wc *wc, int max, int *err,
		    int *notify)
{
	uint32_t tail;
	int n = 0;

	if (max <= 0 || ch->rx_stop || __atomic_load_n(&ch->live, __ATOMIC_ACQUIRE) != 1)
		return 0;
	/* Nothing there: no atomic read-modify-write on the way. */
	tail = __atomic_load_n(word(ch->rx, CH_TAIL), __ATOMIC_ACQUIRE);
	if (tail == ch->rx_head || !enter(ch))
		return 0;
	if (!ring_tail_ok(tail, ch->rx_head, ch->entries)) {
		/* Not an index the peer's library writes: the peer is broken;
		 * this QP takes no more, and goes to ERR. */
		ch->rx_stop = 1;
		*err = 1;
		leave(ch);
		return 0;
	}
	while (n < max && ch->rx_head != tail) {
		struct ch_slot *s = slot_at(ch, ch->rx, ch->rx_head);
		uint32_t one = CS_POSTED, rqh, rqt, nd = 0, len, imm;
		struct vrdma_chan_sge d[VRDMA_MAX_SGE];
		uint8_t opcode, peer = IBV_WC_SUCCESS;
		int st;

		if (!__atomic_compare_exchange_n(&s->state, &one, CS_TAKEN, 0, __ATOMIC_ACQUIRE, __ATOMIC_ACQUIRE)) {
			/* Retracted by the sender (RNR): no receive taken. */
			ch->rx_head = ring_next(ch->rx_head, ch->entries);
			__atomic_store_n(word(ch->rx, CH_HEAD), ch->rx_head, __ATOMIC_RELEASE);
			continue;
		}
		opcode = s->opcode;
		len = s->length;
		imm = s->imm;
		rqh = ring_load(rq->ring, VRDMA_QP_RQ_HEAD);
		rqt = ring_load(rq->ring, VRDMA_QP_RQ_TAIL);
		if (!ring_tail_ok(rqt, rqh, rq->rq_entries) || rqh == rqt) {
			/* No receive posted (or a ring this library cannot
			 * read): the sender waits (RNR). */
			__atomic_store_n(&s->state, CS_POSTED, __ATOMIC_RELEASE);
			break;
		}
		if ((opcode != IBV_WR_SEND && opcode != IBV_WR_SEND_WITH_IMM) || len > vrdma_chan_payload(ch)) {
			st = IBV_WC_REM_INV_REQ_ERR; /* not a message the sender's library makes */
			peer = IBV_WC_REM_INV_REQ_ERR;
		} else {
			st = recv_check(rq, rq->ring + rq->rq_offset + ring_slot(rqh, rq->rq_entries) * (size_t)rq->rq_stride,
					len, d, &nd, &peer);
		}
		memset(&wc[n], 0, sizeof(wc[n]));
		wc[n].wr_id = ((const struct vrdma_recv_wqe *)(const void *)(rq->ring + rq->rq_offset +
									      ring_slot(rqh, rq->rq_entries) *
										      (size_t)rq->rq_stride))
				      ->wr_id;
		wc[n].status = (enum ibv_wc_status)st;
		wc[n].opcode = IBV_WC_RECV;
		wc[n].qp_num = rq->qpn;
		wc[n].src_qp = ch->peer_qpn;
		if (st == IBV_WC_SUCCESS) {
			const char *src = (const char *)s + CH_SLOT_HDR;
			uint32_t left = len;

			for (uint32_t k = 0; k < nd && left; k++) {
				uint32_t c = d[k].len < left ? d[k].len : left;

				memcpy(d[k].p, src, c);
				src += c;
				left -= c;
			}
			wc[n].byte_len = len;
			if (opcode == IBV_WR_SEND_WITH_IMM) {
				wc[n].wc_flags = IBV_WC_WITH_IMM;
				wc[n].imm_data = htobe32(imm);
			}
		}
		n++;
		/* The receive is consumed (as the agent's RQ head would say),
		 * then the verdict goes out. */
		__atomic_store_n(ring_word(rq->ring, VRDMA_QP_RQ_HEAD), ring_next(rqh, rq->rq_entries), __ATOMIC_RELEASE);
		s->status = peer;
		__atomic_store_n(&s->state, CS_DONE, __ATOMIC_RELEASE);
		ch->rx_head = ring_next(ch->rx_head, ch->entries);
		__atomic_store_n(word(ch->rx, CH_HEAD), ch->rx_head, __ATOMIC_RELEASE);
		/* The sender's arming of its send CQ against this verdict
		 * (vrdma_chan_arm_tx's pair). */
		__atomic_thread_fence(__ATOMIC_SEQ_CST);
		if (__atomic_load_n(word(ch->rx, CH_TX_ARMED), __ATOMIC_SEQ_CST) == 1) {
			uint32_t a = 1;

			if (__atomic_compare_exchange_n(word(ch->rx, CH_TX_ARMED), &a, 0, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
				*notify = 1;
		}
		if (st != IBV_WC_SUCCESS) {
			ch->rx_stop = 1;
			*err = 1;
			break;
		}
	}
	leave(ch);
	return n;
}
