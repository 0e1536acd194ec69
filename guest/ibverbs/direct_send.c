// SPDX-License-Identifier: Apache-2.0
/*
 * The send channel of memcpy-direct (docs/wire-local.md §4.22): a SEND or
 * SEND_WITH_IMM small enough for a slot goes from the sender's library
 * into a ring the agent made and granted to both libraries of an RC QP
 * pair; the receiver's library takes it into its own posted receive and
 * makes the receive completion, and writes its verdict into the slot, from
 * which the sender's library makes the send completion. Whatever the
 * receiver cannot take for certain it refuses, and the sender retracts
 * that message and every later one and relays them (verbs.c posts their
 * kept WQEs to the SQ ring): the agent's relay then completes them as it
 * always did. The agent makes and revokes the channel, drains it before
 * it executes a relayed WR of the QP, and flushes.
 *
 * Each direction has its ring (this QP produces into tx, consumes rx): a
 * 512-byte header (tail, head, rx_armed, tx_armed, ready, each on its own
 * line), then entries slots of stride bytes (state, opcode, flags,
 * status, length, imm_data; the message at 64). Slot states: the sender
 * 0 -> 1 (publish: the bytes, state 1 release, then the tail), 1 -> 4 and
 * 5 -> 4 (retract, compare-and-swap, newest first), 3 -> 0 and 4 -> 0
 * (reap); the receiver checks a posted slot and then 1 -> 2 (take) or
 * 1 -> 5 (refuse), and 2 -> 3 (done) after it consumed the receive at the
 * QP ring's RQ-head word (which it stores, as the agent does). Every
 * access to the mapping lies between an increment of the grant's in-use
 * word and its decrement, after the grant's state word read valid (§4.21
 * pair 4).
 *
 * Revocation: the revocation reader (direct.c) calls vrdma_chan_notice
 * under direct.c's lock: the channel is quiescent then (the agent waited
 * for both in-use words to read 0 after marking the grants revoking), so
 * the reader records the states and verdicts of the send slots, unmaps,
 * and marks the grant revoked; the next post or poll settles the records
 * (done: the verdict; posted, taken or refused: relayed in order, as a
 * retraction; in RESET dropped). The same reader runs the channels'
 * timer (vrdma_chan_timer): a refused or overdue send of a sender that
 * does not poll is retracted through vrdma_chan_kick, which takes the
 * QP's send lock only if it is free. The reader never waits for a
 * command or for a lock held across one.
 *
 * A grant (struct vrdma_chan) is never freed while its QP lives: a poller
 * that loaded the QP's current pointer may still read it (its fields are
 * set before the pointer is published and never change after, but live,
 * the indices and the counts); a QP that gets a new channel (after RESET,
 * RTR, RTS) keeps the old one in its list, freed with the QP.
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

#define CH_HDR VRDMA_CHAN_HEADER_SIZE
#define CH_SLOT_HDR VRDMA_CHAN_SLOT_HEADER

_Static_assert(sizeof(struct vrdma_chan_slot) == CH_SLOT_HDR, "a slot's header");

/* How long an unavailable channel is not asked for again: 1 ms, doubling
 * to 1 s (§4.22 "When a library asks"). */
#define BACKOFF_MIN_MS 1
#define BACKOFF_MAX_MS 1000

/* What the sender keeps of a send it put in slot i: its WQE (to relay it
 * when retracted) and when it posted it. */
struct ch_rec {
	uint64_t posted_ns;
	uint32_t length;
	uint8_t signaled;
	uint8_t snap;	     /* the slot's state, copied at the revocation; then the settling's (atomic) */
	uint8_t snap_status; /* its status then */
};

struct vrdma_chan {
	struct vrdma_chan *older; /* the QP's previous grants */
	/* Set before the grant is published, never changed after: */
	char *map;
	size_t size;
	char *tx, *rx;
	uint32_t entries, stride, peer_qpn, slot, state, qp_handle, wqe_size;
	void *owner; /* the QP (vrdma_chan_kick) */
	uint64_t relay_ns;
	struct vrdma_grant_slot *gs;
	/* 1 live, 2 revoked (the records hold the snapshot; unmapped); atomic. */
	int live;
	int registered; /* in the reader's registry; +guarded by direct.c's lock */
	/* The sender: tx_tail under the QP's sq_lock; tx_reap under the send
	 * CQ's lock; out and sig (sends in the channel not reaped; the
	 * signaled ones of them) atomic; halt (a nonzero verdict: no more
	 * posting) atomic. */
	uint32_t tx_tail, tx_reap;
	uint32_t out, sig;
	int halt;
	struct ch_rec *rec; /* entries of them, by slot */
	char *wqe;	    /* entries WQEs of wqe_size bytes, by slot (sq_lock) */
	/* The receiver, under the recv CQ's lock: */
	uint32_t rx_head;
};

/* The registry of live grants, for the revocation reader; +guarded by
 * direct.c's lock. */
static struct vrdma_chan **reg;
static int nreg, capreg;

/* What the channels did, for VRDMA_DEBUG (atomic). */
static struct {
	uint64_t sent, notready, full, taken, refused, retracted, skipped;
} dstat;
#define STAT(f) __atomic_fetch_add(&dstat.f, 1, __ATOMIC_RELAXED)

/* chan_state reports whether a QP in state s holds and takes from a send
 * channel: RTR or RTS (§4.22). In RTR it receives through it (a
 * receive-only QP, as perftest's ib_send_bw server leaves it); it sends
 * through it once in RTS. */
static int chan_state(uint32_t s)
{
	return s == IBV_QPS_RTR || s == IBV_QPS_RTS;
}

/* DIRECT_SEND_ON: whether this library sets hello bit 22 (direct-send)
 * unless the environment says otherwise (VRDMA_DIRECT_SEND=0 or 1). */
#ifndef DIRECT_SEND_ON
#define DIRECT_SEND_ON 1
#endif

uint64_t vrdma_hello_caps(void)
{
	const char *e = getenv("VRDMA_DIRECT_SEND");
	int on = e && *e ? strcmp(e, "0") != 0 : DIRECT_SEND_ON;

	return (VRDMA_CAPS_KNOWN & ~VRDMA_CAP_DIRECT_SEND) | (on ? VRDMA_CAP_DIRECT_SEND : 0);
}


static uint32_t *word(char *ring, size_t off)
{
	return (uint32_t *)(void *)(ring + off);
}

static struct vrdma_chan_slot *slot_at(const struct vrdma_chan *ch, char *ring, uint32_t idx)
{
	return (struct vrdma_chan_slot *)(void *)(ring + CH_HDR + ring_slot(idx, ch->entries) * (size_t)ch->stride);
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

const void *vrdma_chan_wqe(const struct vrdma_chan *ch, uint32_t idx)
{
	return ch->wqe + ring_slot(idx, ch->entries) * (size_t)ch->wqe_size;
}

/* enter marks the grant in use and reports whether it is still valid
 * (§4.21 pair 4); 0: revoked or revoking, in-use given back. */
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
	if (r->entries == 0 || r->entries > VRDMA_CHAN_MAX_ENTRIES || (r->entries & (r->entries - 1)))
		return -1;
	if (r->stride < VRDMA_CHAN_MIN_STRIDE || r->stride > VRDMA_CHAN_MAX_STRIDE || r->stride % 64)
		return -1;
	if (r->peer_qpn > 0xffffff || r->size == 0 || r->size > file_size || r->size > SIZE_MAX)
		return -1;
	if (r->relay_ns < 1000 || r->relay_ns > 60000000000ull)
		return -1;
	ring = CH_HDR + (uint64_t)r->entries * r->stride; /* at most 512 + 4096 * 65536: no overflow */
	if (r->tx_offset % 64 || r->rx_offset % 64)
		return -1;
	if (r->tx_offset > r->size || ring > r->size - r->tx_offset || r->rx_offset > r->size ||
	    ring > r->size - r->rx_offset)
		return -1;
	/* The rings must not overlap. */
	if ((r->tx_offset > r->rx_offset ? r->tx_offset - r->rx_offset : r->rx_offset - r->tx_offset) < ring)
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
	 * the grants revoking, and nothing starts on a revoking grant. */
	for (uint32_t i = 0; i < ch->entries; i++) {
		struct vrdma_chan_slot *s = slot_at(ch, ch->tx, i);

		ch->rec[i].snap_status = s->status;
		__atomic_store_n(&ch->rec[i].snap, (uint8_t)__atomic_load_n(&s->state, __ATOMIC_ACQUIRE), __ATOMIC_RELEASE);
	}
	munmap(ch->map, ch->size);
	reg_del(ch);
	__atomic_store_n(&ch->live, 2, __ATOMIC_RELEASE);
	return 1;
}

/* due reports whether ch has a send to retract now: refused, or posted
 * longer than relay_ns. Its indices are the sender's: read atomically,
 * and a stale one only makes this look at a slot more or less. */
static int due(struct vrdma_chan *ch, uint64_t now)
{
	uint32_t i = __atomic_load_n(&ch->tx_reap, __ATOMIC_RELAXED), tail = __atomic_load_n(&ch->tx_tail, __ATOMIC_RELAXED);
	int d = 0;

	if (!enter(ch))
		return 0;
	for (uint32_t k = 0; i != tail && k < ch->entries; i = ring_next(i, ch->entries), k++) {
		uint32_t st = __atomic_load_n(&slot_at(ch, ch->tx, i)->state, __ATOMIC_ACQUIRE);

		if (st == VRDMA_SLOT_REFUSED ||
		    (st == VRDMA_SLOT_POSTED && now - ch->rec[ring_slot(i, ch->entries)].posted_ns > ch->relay_ns)) {
			d = 1;
			break;
		}
		if (st != VRDMA_SLOT_DONE && st != VRDMA_SLOT_RETRACTED && st != VRDMA_SLOT_TAKEN)
			break;
	}
	leave(ch);
	return d;
}

int vrdma_chan_timer(void)
{
	int out = 0;
	uint64_t now = 0;

	for (int i = 0; i < nreg; i++) {
		struct vrdma_chan *ch = reg[i];

		if (!__atomic_load_n(&ch->out, __ATOMIC_ACQUIRE))
			continue;
		out = 1;
		if (!now)
			now = vrdma_now_ns();
		if (ch->owner && due(ch, now))
			vrdma_chan_kick(ch->owner);
	}
	/* A send posted while the reader sleeps is seen at its next
	 * wake-up: every 10 ms while a channel is held. */
	return out ? 1 : nreg ? 10 : -1;
}

void vrdma_chan_forget(void)
{
	/* The child has none of the mappings (MADV_DONTFORK); the grants
	 * stay in the parent's QPs, which the child cannot use. */
	free(reg);
	reg = NULL;
	nreg = capreg = 0;
}

static void chan_release(struct vrdma_chan *ch)
{
	if (ch) {
		free(ch->rec);
		free(ch->wqe);
		free(ch);
	}
}

int vrdma_chan_attach(struct vrdma_vm *vm, struct vrdma_qpchan *qc, uint32_t qp_handle, char *qp_ring)
{
	struct vrdma_chan_reply cr = { 0 };
	struct vrdma_reply r;
	struct vrdma_chan *ch;
	struct stat st;
	char body[48];
	char *map = MAP_FAILED;
	uint64_t now;
	uint32_t offer;
	int e, ok;

	if (__atomic_load_n(&qc->cur, __ATOMIC_ACQUIRE) || qc->stopped || !vrdma_chan_enabled(vm) ||
	    !chan_state(ring_load(qp_ring, VRDMA_QP_STATE)))
		return EAGAIN;
	/* After an unavailable, not before the backoff ends, unless the
	 * channel-offer word says the peer got the channel since. */
	offer = ring_load(qp_ring, VRDMA_QP_CHAN_OFFER);
	now = vrdma_now_ns();
	if (now < qc->next_try && offer == qc->offer_seen)
		return EAGAIN;
	qc->offer_seen = offer;
	snprintf(body, sizeof(body), "{\"handle\":%u}", qp_handle);
	if (vrdma_direct_begin(vm))
		return EAGAIN; /* no revocation reader: not now (counted in flight otherwise) */
	e = vrdma_cmd(vm, VRDMA_OP_DIRECT_CHANNEL, body, &r);
	if (e) {
		vrdma_direct_lock();
		vrdma_direct_count(0, -1);
		vrdma_direct_unlock();
		if (getenv("VRDMA_DEBUG"))
			vrdma_warn("direct-channel for QP %u: %s", qp_handle, strerror(e));
		if (e == EAGAIN) {
			/* unavailable: the peer is not connected or in RTR/RTS
			 * yet. Ask again later, less and less often. */
			qc->backoff_ms = qc->backoff_ms ? qc->backoff_ms * 2 : BACKOFF_MIN_MS;
			if (qc->backoff_ms > BACKOFF_MAX_MS)
				qc->backoff_ms = BACKOFF_MAX_MS;
			qc->next_try = now + (uint64_t)qc->backoff_ms * 1000000u;
		} else {
			qc->stopped = 1; /* bad-state, not-found, limit-exceeded: not until the next move to RTR or RTS */
		}
		return e;
	}
	ok = !json_get_u32(&r.doc, 0, "slot", &cr.slot) && !json_get_u32(&r.doc, 0, "state", &cr.state) &&
	     !json_get_u64(&r.doc, 0, "size", &cr.size) && !json_get_u64(&r.doc, 0, "tx_offset", &cr.tx_offset) &&
	     !json_get_u64(&r.doc, 0, "rx_offset", &cr.rx_offset) && !json_get_u32(&r.doc, 0, "entries", &cr.entries) &&
	     !json_get_u32(&r.doc, 0, "stride", &cr.stride) && !json_get_u32(&r.doc, 0, "peer_qpn", &cr.peer_qpn) &&
	     !json_get_u64(&r.doc, 0, "relay_ns", &cr.relay_ns) && r.nfds == 1 && !fstat(r.fds[0], &st) &&
	     st.st_size > 0;
	ok = ok && !vrdma_chan_check(&cr, vrdma_direct_nslots(), (uint64_t)st.st_size) && qc->wqe_size;
	ch = ok ? calloc(1, sizeof(*ch)) : NULL;
	if (ch) {
		ch->rec = calloc(cr.entries, sizeof(*ch->rec));
		ch->wqe = calloc(cr.entries, qc->wqe_size);
	}
	vrdma_direct_lock(); /* no fork between the mapping and its advice */
	if (ch && ch->rec && ch->wqe) {
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
	if (!ok || vrdma_direct_early_take(cr.slot, cr.state) || map == MAP_FAILED || nreg == capreg) {
		/* A bad reply, revoked before this reply was read (and
		 * acknowledged then), or no memory: the grant stays unused
		 * (its notice, when it comes, finds no channel and is
		 * acknowledged). Not asked for again until the next move to
		 * RTR or RTS. */
		vrdma_direct_unlock();
		if (!ok)
			vrdma_warn("direct-channel: the agent's reply is not usable (slot %u, %u entries of %u bytes, size "
				   "%llu, rings at %llu and %llu): this QP's SENDs are relayed",
				   cr.slot, cr.entries, cr.stride, (unsigned long long)cr.size,
				   (unsigned long long)cr.tx_offset, (unsigned long long)cr.rx_offset);
		if (map != MAP_FAILED)
			munmap(map, (size_t)cr.size);
		chan_release(ch);
		qc->stopped = 1;
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
	ch->relay_ns = cr.relay_ns;
	ch->wqe_size = qc->wqe_size;
	ch->owner = qc->owner;
	ch->gs = vrdma_direct_slot(cr.slot);
	/* This QP's own indices where the channel is now (a fresh one: 0),
	 * and the rx ring ready: read and stored inside the grant, which the
	 * agent may have revoked already. */
	if (enter(ch)) {
		ch->tx_tail = ch->tx_reap = __atomic_load_n(word(ch->tx, VRDMA_CHAN_TAIL), __ATOMIC_ACQUIRE) & ring_mask(ch->entries);
		ch->rx_head = __atomic_load_n(word(ch->rx, VRDMA_CHAN_HEAD), __ATOMIC_ACQUIRE) & ring_mask(ch->entries);
		__atomic_store_n(word(ch->rx, VRDMA_CHAN_READY), 1, __ATOMIC_SEQ_CST);
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
	vrdma_direct_unlock();
	if (getenv("VRDMA_DEBUG"))
		vrdma_warn("direct-channel for QP %u: slot %u, %u entries of %u bytes", qp_handle, ch->slot, ch->entries,
			   ch->stride);
	return 0;
}

void vrdma_chan_off(struct vrdma_qpchan *qc)
{
	__atomic_store_n(&qc->cur, NULL, __ATOMIC_RELEASE);
	__atomic_store_n(&qc->want_err, 0, __ATOMIC_RELAXED);
	qc->next_try = 0;
	qc->backoff_ms = 0;
	qc->stopped = 0;
}

void vrdma_chan_free(struct vrdma_qpchan *qc)
{
	struct vrdma_chan *ch = qc->all, *next;

	if (ch && getenv("VRDMA_DEBUG"))
		vrdma_warn("send channel: %llu sent, %llu not ready, %llu full, %llu taken, %llu refused, %llu retracted, "
			   "%llu skipped",
			   (unsigned long long)dstat.sent, (unsigned long long)dstat.notready, (unsigned long long)dstat.full,
			   (unsigned long long)dstat.taken, (unsigned long long)dstat.refused, (unsigned long long)dstat.retracted,
			   (unsigned long long)dstat.skipped);

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
		chan_release(ch);
	}
	vrdma_direct_unlock();
	memset(qc, 0, sizeof(*qc));
}

/* ---- the sender ---- */

int vrdma_chan_send(struct vrdma_chan *ch, const struct vrdma_chan_msg *m, const void *wqe, uint32_t max_send_wr,
		    int send_cq_armed, int *notify)
{
	struct vrdma_chan_slot *s;
	uint32_t head, armed, idx = ch->tx_tail, k;
	char *data;

	*notify = 0;
	if (__atomic_load_n(&ch->live, __ATOMIC_ACQUIRE) != 1 || __atomic_load_n(&ch->halt, __ATOMIC_ACQUIRE) ||
	    m->length > vrdma_chan_payload(ch) || __atomic_load_n(&ch->out, __ATOMIC_ACQUIRE) + 1 > max_send_wr)
		return -1;
	if (!enter(ch))
		return -1;
	head = __atomic_load_n(word(ch->tx, VRDMA_CHAN_HEAD), __ATOMIC_ACQUIRE);
	s = slot_at(ch, ch->tx, idx);
	if (__atomic_load_n(word(ch->tx, VRDMA_CHAN_READY), __ATOMIC_ACQUIRE) != 1 || !ring_tail_ok(idx, head, ch->entries) ||
	    ring_full(idx, head, ch->entries) || __atomic_load_n(&s->state, __ATOMIC_ACQUIRE) != VRDMA_SLOT_FREE) {
		if (__atomic_load_n(word(ch->tx, VRDMA_CHAN_READY), __ATOMIC_ACQUIRE) != 1)
			STAT(notready);
		else
			STAT(full);
		leave(ch);
		return -1; /* not ready, full, or the peer's head is not one: relay */
	}
	/* No refused slot among ours (rule 4): the caller retracts first. */
	for (uint32_t i = ch->tx_reap; i != idx; i = ring_next(i, ch->entries))
		if (__atomic_load_n(&slot_at(ch, ch->tx, i)->state, __ATOMIC_ACQUIRE) == VRDMA_SLOT_REFUSED) {
			leave(ch);
			return -1;
		}
	s->opcode = (uint8_t)m->opcode;
	s->flags = (uint8_t)((m->solicited ? VRDMA_CHAN_FLAG_SOLICITED : 0) | (m->signaled ? VRDMA_CHAN_FLAG_SIGNALED : 0));
	s->status = 0;
	s->reserved7 = 0;
	s->length = m->length;
	s->imm_data = m->opcode == IBV_WR_SEND_WITH_IMM ? m->imm : 0;
	data = (char *)s + CH_SLOT_HDR;
	for (k = 0; k < m->nsge; k++) {
		memcpy(data, m->sge[k].p, m->sge[k].len);
		data += m->sge[k].len;
	}
	memcpy(ch->wqe + ring_slot(idx, ch->entries) * (size_t)ch->wqe_size, wqe, ch->wqe_size);
	ch->rec[ring_slot(idx, ch->entries)] = (struct ch_rec){ .posted_ns = vrdma_now_ns(), .length = m->length, .signaled = (uint8_t)!!m->signaled };
	__atomic_fetch_add(&ch->out, 1, __ATOMIC_RELEASE);
	if (m->signaled)
		__atomic_fetch_add(&ch->sig, 1, __ATOMIC_RELEASE);
	/* A send CQ armed before this send: its verdict is to raise the
	 * event (vrdma_chan_arm_tx's word, stored now that a send is out).
	 * Stored before the slot is published: a receiver that takes it at
	 * once must find the word set when it looks after its verdict. */
	if (send_cq_armed && m->signaled)
		__atomic_store_n(word(ch->tx, VRDMA_CHAN_TX_ARMED), 1, __ATOMIC_SEQ_CST);
	__atomic_store_n(&s->state, VRDMA_SLOT_POSTED, __ATOMIC_RELEASE);
	STAT(sent);
	ch->tx_tail = ring_next(idx, ch->entries);
	__atomic_store_n(word(ch->tx, VRDMA_CHAN_TAIL), ch->tx_tail, __ATOMIC_SEQ_CST);
	/* The receiver's arming (rx_armed) against this tail: a Dekker pair,
	 * the receiver's side in vrdma_chan_arm_rx. */
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	armed = __atomic_load_n(word(ch->tx, VRDMA_CHAN_RX_ARMED), __ATOMIC_SEQ_CST);
	if (armed == VRDMA_CQ_ARM_ALL || (armed == VRDMA_CQ_ARM_SOLICITED && m->solicited))
		*notify = __atomic_compare_exchange_n(word(ch->tx, VRDMA_CHAN_RX_ARMED), &armed, 0, 0, __ATOMIC_SEQ_CST,
						      __ATOMIC_SEQ_CST);
	leave(ch);
	return 0;
}

/* settle_state is slot i's state for the reaper and the retraction: the
 * ring's while live, the snapshot's once revoked. */
static uint32_t settle_state(struct vrdma_chan *ch, int live, uint32_t idx)
{
	if (live == 2)
		return __atomic_load_n(&ch->rec[ring_slot(idx, ch->entries)].snap, __ATOMIC_ACQUIRE);
	return __atomic_load_n(&slot_at(ch, ch->tx, idx)->state, __ATOMIC_ACQUIRE);
}

int vrdma_chan_reap(struct vrdma_chan *ch, uint32_t qpn, struct ibv_wc *wc, int max, int *err, int *retract)
{
	int live = __atomic_load_n(&ch->live, __ATOMIC_ACQUIRE), n = 0;

	if (!__atomic_load_n(&ch->out, __ATOMIC_ACQUIRE))
		return 0;
	if (live == 1 && !enter(ch))
		return 0; /* revoking: the notice comes, then the snapshot */
	while (n < max && __atomic_load_n(&ch->out, __ATOMIC_ACQUIRE)) {
		uint32_t i = (uint32_t)ring_slot(ch->tx_reap, ch->entries);
		uint32_t st = settle_state(ch, live, ch->tx_reap);
		struct ch_rec *r = &ch->rec[i];

		if (st == VRDMA_SLOT_DONE) {
			uint8_t status = live == 2 ? r->snap_status : slot_at(ch, ch->tx, ch->tx_reap)->status;
			const struct vrdma_send_wqe *w = (const void *)vrdma_chan_wqe(ch, ch->tx_reap);

			if (r->signaled || status) {
				memset(&wc[n], 0, sizeof(wc[n]));
				wc[n].wr_id = w->wr_id;
				wc[n].status = (enum ibv_wc_status)status;
				wc[n].opcode = IBV_WC_SEND;
				wc[n].byte_len = r->length;
				wc[n].qp_num = qpn;
				n++;
			}
			if (status) {
				__atomic_store_n(&ch->halt, 1, __ATOMIC_RELEASE);
				*err = 1;
			}
		} else if (st != VRDMA_SLOT_RETRACTED) {
			/* Posted, taken or refused: not yet (or to retract). */
			if (st == VRDMA_SLOT_REFUSED || live == 2 || vrdma_now_ns() - r->posted_ns > ch->relay_ns)
				*retract = 1;
			break;
		}
		if (live == 1)
			__atomic_store_n(&slot_at(ch, ch->tx, ch->tx_reap)->state, VRDMA_SLOT_FREE, __ATOMIC_RELEASE);
		if (r->signaled)
			__atomic_fetch_sub(&ch->sig, 1, __ATOMIC_RELEASE);
		__atomic_fetch_sub(&ch->out, 1, __ATOMIC_RELEASE);
		ch->tx_reap = ring_next(ch->tx_reap, ch->entries);
	}
	if (live == 1)
		leave(ch);
	return n;
}

int vrdma_chan_retract(struct vrdma_chan *ch, uint32_t *idx, uint32_t max)
{
	int live = __atomic_load_n(&ch->live, __ATOMIC_ACQUIRE);
	uint32_t n = 0, i = ch->tx_tail, first;

	if (!__atomic_load_n(&ch->out, __ATOMIC_ACQUIRE))
		return 0;
	if (live == 1 && !enter(ch))
		return 0; /* revoking: settled after the notice */
	/* From the newest unreaped slot backwards; the reaper moves only
	 * done and retracted slots, never past a posted one. */
	first = ch->tx_tail;
	while (i != ch->tx_reap && n < max) {
		uint32_t p = (i - 1) & ring_mask(ch->entries), st = settle_state(ch, live, p);

		if (live == 2) {
			uint8_t want = (uint8_t)st;

			if (st != VRDMA_SLOT_POSTED && st != VRDMA_SLOT_TAKEN && st != VRDMA_SLOT_REFUSED)
				break;
			if (!__atomic_compare_exchange_n(&ch->rec[ring_slot(p, ch->entries)].snap, &want, VRDMA_SLOT_RETRACTED,
							 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
				break;
		} else {
			if (st != VRDMA_SLOT_POSTED && st != VRDMA_SLOT_REFUSED)
				break;
			if (!__atomic_compare_exchange_n(&slot_at(ch, ch->tx, p)->state, &st, VRDMA_SLOT_RETRACTED, 0,
							 __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
				break; /* the receiver took it */
		}
		first = p;
		n++;
		i = p;
		STAT(retracted);
	}
	if (live == 1)
		leave(ch);
	/* Their indices in posting order. */
	for (uint32_t k = 0; k < n; k++) {
		idx[k] = first;
		first = ring_next(first, ch->entries);
	}
	return (int)n;
}

int vrdma_chan_arm_tx(struct vrdma_chan *ch)
{
	/* Stored (and fenced) only: the caller reaps after it, so a verdict
	 * already there becomes a completion before the arming, and one
	 * that comes later finds the word set. */
	if (__atomic_load_n(&ch->live, __ATOMIC_ACQUIRE) != 1 || !__atomic_load_n(&ch->out, __ATOMIC_ACQUIRE) ||
	    !enter(ch))
		return 0;
	__atomic_store_n(word(ch->tx, VRDMA_CHAN_TX_ARMED), 1, __ATOMIC_SEQ_CST);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	leave(ch);
	return 0;
}

int vrdma_chan_posted(struct vrdma_chan *ch)
{
	uint32_t st;

	if (__atomic_load_n(&ch->live, __ATOMIC_ACQUIRE) != 1)
		return __atomic_load_n(&ch->out, __ATOMIC_ACQUIRE) != 0;
	if (!__atomic_load_n(&ch->out, __ATOMIC_ACQUIRE) || !enter(ch))
		return 0;
	st = __atomic_load_n(&slot_at(ch, ch->tx, (ch->tx_tail - 1) & ring_mask(ch->entries))->state, __ATOMIC_ACQUIRE);
	leave(ch);
	return st == VRDMA_SLOT_POSTED || st == VRDMA_SLOT_REFUSED || st == VRDMA_SLOT_TAKEN;
}

/* ---- the receiver ---- */

int vrdma_chan_arm_rx(struct vrdma_chan *ch, uint32_t how)
{
	/* Stored (and fenced) only, never cleared here: the caller takes
	 * what the ring holds after it (the other side of the sender's
	 * Dekker pair), so a message already there becomes a completion
	 * before the arming, and one that comes later finds the word set. */
	if (__atomic_load_n(&ch->live, __ATOMIC_ACQUIRE) != 1 || !enter(ch))
		return 0;
	__atomic_store_n(word(ch->rx, VRDMA_CHAN_RX_ARMED), how, __ATOMIC_SEQ_CST);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	leave(ch);
	return 0;
}

/* recv_ok checks the receive WQE at slot against a message of length
 * bytes as §4.22 says (what the agent would complete with an error is
 * refused): 1 with the destinations in d (*nd of them), or 0. */
static int recv_ok(const struct vrdma_chan_rq *rq, const void *slot, uint32_t length, struct vrdma_chan_sge *d,
		   uint32_t *nd)
{
	const struct vrdma_recv_wqe *w = slot;
	const struct vrdma_sge *sge = (const struct vrdma_sge *)(const void *)((const char *)slot + VRDMA_RECV_HDR);
	uint32_t nsge = w->num_sge;
	uint64_t total = 0;

	*nd = 0;
	if (nsge > rq->max_recv_sge || nsge > VRDMA_MAX_SGE ||
	    VRDMA_RECV_HDR + (size_t)nsge * sizeof(struct vrdma_sge) > rq->rq_stride)
		return 0;
	for (uint32_t i = 0; i < nsge; i++) {
		struct vrdma_sge g = sge[i];
		struct vrdma_lmr m;

		if (!g.length)
			continue;
		if (!vrdma_lmr_get(g.lkey, &m) || m.pd != rq->pd || !(m.access & IBV_ACCESS_LOCAL_WRITE) || g.addr < m.iova ||
		    g.addr - m.iova > m.length || g.length > m.length - (g.addr - m.iova))
			return 0;
		d[*nd].p = m.addr + (g.addr - m.iova);
		d[(*nd)++].len = g.length;
		total += g.length;
	}
	return total >= length;
}

int vrdma_chan_take(struct vrdma_chan *ch, const struct vrdma_chan_rq *rq, struct ibv_wc *wc, int max, int *solicited,
		    int *notify, uint32_t *skipped)
{
	uint32_t tail;
	int n = 0, tell = 0, refused = 0;

	*solicited = 0;
	*skipped = 0;
	if (max <= 0 || __atomic_load_n(&ch->live, __ATOMIC_ACQUIRE) != 1)
		return 0;
	if (!chan_state(ring_load(rq->ring, VRDMA_QP_STATE)) || !enter(ch))
		return 0;
	tail = __atomic_load_n(word(ch->rx, VRDMA_CHAN_TAIL), __ATOMIC_ACQUIRE);
	while (n < max && ch->rx_head != tail && ring_tail_ok(tail, ch->rx_head, ch->entries)) {
		struct vrdma_chan_slot *s = slot_at(ch, ch->rx, ch->rx_head);
		uint32_t st = __atomic_load_n(&s->state, __ATOMIC_ACQUIRE), rqh, rqt, nd = 0, len, imm;
		struct vrdma_chan_sge d[VRDMA_MAX_SGE];
		const char *wqe;
		uint8_t opcode, flags;

		if (st == VRDMA_SLOT_RETRACTED || st == VRDMA_SLOT_FREE) {
			/* Retracted (its sender relays it): skipped, no receive
			 * consumed. Free between head and tail is a retracted
			 * slot its sender reaped already (4 -> 0) before this
			 * receiver skipped it: the sender publishes a slot (1)
			 * before its tail, and cannot refill this one while the
			 * head is on it (the ring would be full). */
			ch->rx_head = ring_next(ch->rx_head, ch->entries);
			__atomic_store_n(word(ch->rx, VRDMA_CHAN_HEAD), ch->rx_head, __ATOMIC_RELEASE);
			STAT(skipped);
			(*skipped)++;
			continue;
		}
		if (st != VRDMA_SLOT_POSTED)
			break;
		/* Checked while posted (the sender changes nothing of a posted
		 * slot but its state), then taken: a taken slot always ends
		 * done. */
		opcode = s->opcode;
		flags = s->flags;
		len = s->length;
		imm = s->imm_data;
		rqh = ring_load(rq->ring, VRDMA_QP_RQ_HEAD);
		rqt = ring_load(rq->ring, VRDMA_QP_RQ_TAIL);
		wqe = rq->ring + rq->rq_offset + ring_slot(rqh, rq->rq_entries) * (size_t)rq->rq_stride;
		if ((opcode != IBV_WR_SEND && opcode != IBV_WR_SEND_WITH_IMM) || len > vrdma_chan_payload(ch) ||
		    !ring_tail_ok(rqt, rqh, rq->rq_entries) || rqh == rqt || !recv_ok(rq, wqe, len, d, &nd)) {
			/* Not for certain: refused; the sender retracts it and
			 * relays it, and the agent completes it as it always
			 * did. Lost: it was retracted, look again. */
			if (!__atomic_compare_exchange_n(&s->state, &st, VRDMA_SLOT_REFUSED, 0, __ATOMIC_SEQ_CST,
							 __ATOMIC_SEQ_CST))
				continue;
			refused = tell = 1;
			STAT(refused);
			if (getenv("VRDMA_DEBUG"))
				vrdma_warn("QP %u: refused a message: opcode %u length %u, RQ head %u tail %u", rq->qpn, opcode,
					   len, rqh, rqt);
			break;
		}
		if (!__atomic_compare_exchange_n(&s->state, &st, VRDMA_SLOT_TAKEN, 0, __ATOMIC_ACQUIRE, __ATOMIC_ACQUIRE))
			continue; /* retracted meanwhile: look again */
		memset(&wc[n], 0, sizeof(wc[n]));
		wc[n].wr_id = ((const struct vrdma_recv_wqe *)(const void *)wqe)->wr_id;
		wc[n].status = IBV_WC_SUCCESS;
		wc[n].opcode = IBV_WC_RECV;
		wc[n].qp_num = rq->qpn;
		wc[n].src_qp = ch->peer_qpn;
		wc[n].byte_len = len;
		if (opcode == IBV_WR_SEND_WITH_IMM) {
			wc[n].wc_flags = IBV_WC_WITH_IMM;
			wc[n].imm_data = htobe32(imm);
		}
		{
			const char *src = (const char *)s + CH_SLOT_HDR;
			uint32_t left = len;

			for (uint32_t k = 0; k < nd && left; k++) {
				uint32_t c = d[k].len < left ? d[k].len : left;

				memcpy(d[k].p, src, c);
				src += c;
				left -= c;
			}
		}
		if (flags & VRDMA_CHAN_FLAG_SOLICITED)
			*solicited = 1;
		n++;
		STAT(taken);
		/* The receive is consumed (the RQ-head word, as the agent
		 * stores it), then the verdict goes out. */
		__atomic_store_n(ring_word(rq->ring, VRDMA_QP_RQ_HEAD), ring_next(rqh, rq->rq_entries), __ATOMIC_RELEASE);
		s->status = 0;
		__atomic_store_n(&s->state, VRDMA_SLOT_DONE, __ATOMIC_RELEASE);
		ch->rx_head = ring_next(ch->rx_head, ch->entries);
		__atomic_store_n(word(ch->rx, VRDMA_CHAN_HEAD), ch->rx_head, __ATOMIC_RELEASE);
		if (flags & VRDMA_CHAN_FLAG_SIGNALED)
			tell = 1;
	}
	if (tell) {
		/* The sender's arming of its send CQ against this verdict
		 * (vrdma_chan_arm_tx's pair). */
		uint32_t a = 1;

		__atomic_thread_fence(__ATOMIC_SEQ_CST);
		if (__atomic_load_n(word(ch->rx, VRDMA_CHAN_TX_ARMED), __ATOMIC_SEQ_CST) == 1 &&
		    __atomic_compare_exchange_n(word(ch->rx, VRDMA_CHAN_TX_ARMED), &a, 0, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
			*notify = refused ? 2 : 1;
	}
	leave(ch);
	return n;
}
