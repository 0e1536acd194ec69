// SPDX-License-Identifier: Apache-2.0
/*
 * The memcpy-direct path's library state (docs/wire-local.md §4.21): the
 * session's grant table and revocation socket (direct-open), the grants
 * (direct-map) and their mappings, the revocation reader, and the table of
 * this process's regions by lkey that post_send checks local SGEs against.
 * verbs.c decides, WR by WR, whether it may execute one itself (the rules
 * 1-6) and does the copy; this file gives it the grant.
 *
 * Locks:
 *   open_mu  opening the table and starting or stopping the reader; held
 *            across the direct-open command (the reader never takes it).
 *   dmu      the grants by slot (D.g), the notices seen early, the counts;
 *            never held across a command or a blocking call, so that the
 *            reader, which takes only dmu, never waits for a command: the
 *            agent serves a session's commands one at a time, and the one
 *            it serves may be the modify-qp or destroy-qp whose revocation
 *            waits for the reader's acknowledgement.
 *   lmr_mu   the regions by lkey (a read lock per post).
 * A QP's cache of grants by rkey (struct vrdma_qpdirect) is guarded by the
 * QP's send-queue lock, which its caller holds.
 *
 * The revocation reader is a thread, started with the table (or again at
 * the next direct-map after ibv_close_device stopped it: the last context
 * closed while the session held no grant) and ended by that or by the
 * session's end (the socket's end of file). Per notice it removes the
 * grant, munmaps its pages and sends the acknowledgement. The agent sends
 * a notice only after the slot's in-use word read 0 after it marked the
 * slot revoking, and post_send touches a grant's pages only between its
 * increment of in-use and its decrement, after the state read valid
 * (pair 4): no copy is inside the pages the reader unmaps.
 *
 * fork: a grant's pages and the table are MADV_DONTFORK, mapped and
 * advised under dmu, which a fork handler holds across fork: a child never
 * has the owner's pages (a child's mappings would outlive a revocation).
 * The child forgets everything here (vrdma_forget_direct): it has no
 * reader, and closes its copy of the revocation socket.
 */
#define _GNU_SOURCE
#include <endian.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "vrdma.h"

/* How many WRs with an rkey the agent refused a grant for are relayed
 * before the library asks again (the refusal is also forgotten when the
 * QP is modified). */
#define REFUSE_FOR 256
/* A QP remembers at most this many rkeys (grants and refusals). */
#define QD_MAX 4096
/* Notices for grants not seen yet remembered (a direct-map reply in
 * flight while the agent revoked its grant). */
#define EARLY_MAX 64

/* POPULATE_MAX: a grant of at most this many bytes is mapped with its page
 * tables filled at once (MAP_POPULATE; the owner's pages are locked), so
 * that the copies do not fault a 4 KiB page at a time; larger ones fault
 * in as they are touched. The Go library's directPopulateMax. */
#define POPULATE_MAX (256ull << 20)

/* A grant the session holds, in the slot the agent gave it. */
struct dgrant {
	uint32_t state; /* the slot's state word while valid; 0: no grant here */
	uint32_t qp;	/* the QP handle it was granted to */
	uint32_t rkey;
	uint32_t access;
	uint64_t iova, length;
	char *map; /* its pages (NULL: the mapping failed; the grant still awaits its notice) */
	size_t map_len;
	uint64_t mr_offset;
};

static pthread_mutex_t open_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t dmu = PTHREAD_MUTEX_INITIALIZER;

static struct {
	int opened;			  /* direct-open succeeded; +guarded by open_mu, read under dmu */
	int failed;			  /* direct-open failed: never again; +guarded by open_mu */
	struct vrdma_grant_slot *table; /* set once at open */
	size_t table_size;
	uint32_t slots;
	int rev_fd;
	int stop_fd;		/* an eventfd that stops the reader */
	pthread_t reader;
	int reader_on;		/* +guarded by open_mu */
	int reader_exited;	/* the reader saw the socket end; +guarded by dmu */
	struct dgrant *g;	/* slots entries; +guarded by dmu */
	uint32_t ngrants;	/* entries of g with a state; +guarded by dmu */
	uint32_t inflight;	/* direct-map commands under way; +guarded by dmu */
	uint64_t early[EARLY_MAX]; /* slot << 32 | state; +guarded by dmu */
	int nearly, early_next;
} D = { .rev_fd = -1, .stop_fd = -1 };

/* ---- fork ---- */

static void fork_prepare(void)
{
	pthread_mutex_lock(&dmu);
}

static void fork_parent(void)
{
	pthread_mutex_unlock(&dmu);
}

__attribute__((constructor)) static void direct_fork_handler(void)
{
	/* The child's side is vrdma_forget_direct, from device.c's handler. */
	(void)pthread_atfork(fork_prepare, fork_parent, NULL);
}

static void lmr_forget(void);

void vrdma_forget_direct(void)
{
	/* The table and the grants' pages are absent here (MADV_DONTFORK),
	 * and so is the reader: forget them; close the socket's copy. */
	pthread_mutex_init(&open_mu, NULL);
	pthread_mutex_init(&dmu, NULL);
	if (D.rev_fd >= 0)
		close(D.rev_fd);
	if (D.stop_fd >= 0)
		close(D.stop_fd);
	free(D.g);
	memset(&D, 0, sizeof(D));
	D.rev_fd = D.stop_fd = -1;
	lmr_forget();
	vrdma_chan_forget(); /* the send channels' grants (direct_send.c) */
}

/* ---- the revocation reader ---- */

/* early_take removes (slot, state) from the notices seen early; 1 if it
 * was there. Caller holds dmu. */
static int early_take(uint32_t slot, uint32_t state)
{
	uint64_t k = (uint64_t)slot << 32 | state;

	for (int i = 0; i < D.nearly; i++) {
		if (D.early[i] == k) {
			D.early[i] = D.early[--D.nearly];
			return 1;
		}
	}
	return 0;
}

static void early_add(uint32_t slot, uint32_t state)
{
	uint64_t k = (uint64_t)slot << 32 | state;

	if (D.nearly < EARLY_MAX) {
		D.early[D.nearly++] = k;
	} else {
		D.early[D.early_next] = k; /* the oldest goes: its reply is long here */
		D.early_next = (D.early_next + 1) % EARLY_MAX;
	}
}

static int send_ack(const unsigned char *msg)
{
	for (;;) {
		ssize_t n = send(D.rev_fd, msg, VRDMA_REVOKE_MSG_SIZE, MSG_NOSIGNAL | MSG_DONTWAIT);
		struct pollfd p = { .fd = D.rev_fd, .events = POLLOUT };

		if (n == VRDMA_REVOKE_MSG_SIZE)
			return 0;
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN) {
			(void)poll(&p, 1, 100);
			continue;
		}
		return -1;
	}
}

static void *reader(void *arg)
{
	(void)arg;
	for (;;) {
		struct pollfd p[2] = { { .fd = D.rev_fd, .events = POLLIN }, { .fd = D.stop_fd, .events = POLLIN } };
		unsigned char msg[64];
		uint32_t slot, state;
		char *map = NULL;
		size_t len = 0;
		ssize_t n;

		int timeout, rc;

		/* The send channels' timer (direct_send.c): while a channel
		 * has sends out, their refusals and relay deadlines are
		 * looked at every millisecond, for a sender that does not
		 * poll. */
		pthread_mutex_lock(&dmu);
		timeout = vrdma_chan_timer();
		pthread_mutex_unlock(&dmu);
		rc = poll(p, 2, timeout);
		if (rc < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (rc == 0)
			continue;
		if (p[1].revents)
			return NULL; /* stopped: vrdma_direct_idle */
		if (!p[0].revents)
			continue;
		n = recv(D.rev_fd, msg, sizeof(msg), MSG_DONTWAIT);
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			continue;
		if (n <= 0)
			break; /* the session ended: the agent dropped every grant */
		if (n != VRDMA_REVOKE_MSG_SIZE)
			continue; /* not a notice */
		memcpy(&slot, msg, 4);
		memcpy(&state, msg + 4, 4);
		slot = le32toh(slot);
		state = le32toh(state);
		pthread_mutex_lock(&dmu);
		if (slot < D.slots && D.g[slot].state && D.g[slot].state == state) {
			map = D.g[slot].map;
			len = D.g[slot].map_len;
			memset(&D.g[slot], 0, sizeof(D.g[slot]));
			D.ngrants--;
		} else if (vrdma_chan_notice(slot, state)) {
			D.ngrants--; /* a send channel's grant: snapshotted and unmapped (direct_send.c) */
		} else {
			/* No such grant (yet): its direct-map reply may be on
			 * its way; the installer unmaps it then. */
			early_add(slot, state);
		}
		pthread_mutex_unlock(&dmu);
		if (map)
			munmap(map, len);
		if (send_ack(msg))
			break;
	}
	pthread_mutex_lock(&dmu);
	D.reader_exited = 1;
	pthread_mutex_unlock(&dmu);
	return NULL;
}

/* start_reader starts the reader if it is not running; caller holds
 * open_mu. */
static int start_reader(void)
{
	int exited;
	uint64_t v;

	pthread_mutex_lock(&dmu);
	exited = D.reader_exited;
	pthread_mutex_unlock(&dmu);
	if (D.reader_on && !exited)
		return 0;
	if (D.reader_on) {
		pthread_join(D.reader, NULL); /* it saw the session end */
		D.reader_on = 0;
		return EIO;
	}
	while (read(D.stop_fd, &v, sizeof(v)) == (ssize_t)sizeof(v))
		; /* a stop left over */
	if (pthread_create(&D.reader, NULL, reader, NULL))
		return EAGAIN;
	D.reader_on = 1;
	return 0;
}

/* ---- direct-open ---- */

int vrdma_direct_ready(struct vrdma_vm *vm)
{
	struct vrdma_reply r;
	uint32_t slots = 0, slot_size = 0, size = 0;
	struct stat st;
	void *table;
	int e;

	pthread_mutex_lock(&open_mu);
	if (D.opened) {
		e = start_reader();
		pthread_mutex_unlock(&open_mu);
		return e;
	}
	if (D.failed || !(vm->s.caps & VRDMA_CAP_MEMCPY_DIRECT)) {
		pthread_mutex_unlock(&open_mu);
		return EOPNOTSUPP;
	}
	e = vrdma_cmd(vm, VRDMA_OP_DIRECT_OPEN, "{}", &r);
	if (e) {
		/* already-exists (a session opened it before a fork: not
		 * ours) or bad-state: this session relays. */
		if (getenv("VRDMA_DEBUG"))
			vrdma_warn("direct-open: %s: QPs bound to memcpy-direct relay every WR", strerror(e));
		D.failed = 1;
		pthread_mutex_unlock(&open_mu);
		return e;
	}
	if (json_get_u32(&r.doc, 0, "slots", &slots) || json_get_u32(&r.doc, 0, "slot_size", &slot_size) ||
	    json_get_u32(&r.doc, 0, "size", &size) || r.nfds != 2 || slot_size != VRDMA_GRANT_SLOT_SIZE || slots == 0 ||
	    slots > (1u << 20) || (uint64_t)slots * slot_size > size || fstat(r.fds[0], &st) || (uint64_t)st.st_size < size) {
		vrdma_warn("direct-open: the agent's reply is not usable (slots %u of %u bytes, size %u): memcpy-direct "
			   "QPs relay every WR",
			   slots, slot_size, size);
		vrdma_reply_free(&r);
		D.failed = 1;
		pthread_mutex_unlock(&open_mu);
		return EIO;
	}
	D.g = calloc(slots, sizeof(*D.g));
	D.stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	pthread_mutex_lock(&dmu); /* no fork between the mapping and its advice */
	table = D.g && D.stop_fd >= 0 ? mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, r.fds[0], 0) : MAP_FAILED;
	if (table != MAP_FAILED)
		(void)madvise(table, size, MADV_DONTFORK);
	pthread_mutex_unlock(&dmu);
	if (table == MAP_FAILED) {
		e = errno ? errno : ENOMEM;
		vrdma_reply_free(&r);
		free(D.g);
		D.g = NULL;
		if (D.stop_fd >= 0)
			close(D.stop_fd);
		D.stop_fd = -1;
		D.failed = 1;
		pthread_mutex_unlock(&open_mu);
		return e;
	}
	D.table = table;
	D.table_size = size;
	D.slots = slots;
	D.rev_fd = r.fds[1];
	r.fds[1] = -1;
	vrdma_reply_free(&r); /* closes the table's memfd: the mapping stays */
	D.opened = 1;
	e = start_reader();
	pthread_mutex_unlock(&open_mu);
	return e;
}

void vrdma_direct_idle(void)
{
	int stop;
	uint64_t one = 1;

	pthread_mutex_lock(&open_mu);
	pthread_mutex_lock(&dmu);
	/* With no grant held and none being asked for, the agent sends no
	 * notice: the reader may stop (the next direct-map starts it). */
	stop = D.reader_on && D.ngrants == 0 && D.inflight == 0;
	pthread_mutex_unlock(&dmu);
	if (stop) {
		if (write(D.stop_fd, &one, sizeof(one)) == (ssize_t)sizeof(one))
			pthread_join(D.reader, NULL);
		else
			stop = 0;
	}
	if (stop)
		D.reader_on = 0;
	pthread_mutex_unlock(&open_mu);
}

struct vrdma_grant_slot *vrdma_direct_slot(uint32_t slot)
{
	return &D.table[slot];
}

/* For the send channel's grants (direct_send.c), which live in the same
 * table and are revoked through the same reader. */
void vrdma_direct_lock(void)
{
	pthread_mutex_lock(&dmu);
}

void vrdma_direct_unlock(void)
{
	pthread_mutex_unlock(&dmu);
}

int vrdma_direct_early_take(uint32_t slot, uint32_t state)
{
	return early_take(slot, state);
}

void vrdma_direct_count(int delta, int inflight)
{
	D.ngrants += (uint32_t)delta;
	D.inflight += (uint32_t)inflight;
}

uint32_t vrdma_direct_nslots(void)
{
	return D.slots;
}

int vrdma_direct_begin(struct vrdma_vm *vm)
{
	int e = vrdma_direct_ready(vm);

	if (e)
		return e;
	/* Again under open_mu, and the request counted before it is let go:
	 * a context closed since may have stopped the reader
	 * (vrdma_direct_idle), and a grant got without it would never see
	 * its notice (the agent fences a library that does not answer). */
	pthread_mutex_lock(&open_mu);
	e = start_reader();
	if (!e) {
		pthread_mutex_lock(&dmu);
		D.inflight++;
		pthread_mutex_unlock(&dmu);
	}
	pthread_mutex_unlock(&open_mu);
	return e;
}

/* ---- grants ---- */

static struct vrdma_qd_entry *qd_find(struct vrdma_qpdirect *qd, uint32_t rkey)
{
	for (int i = 0; i < qd->n; i++)
		if (qd->e[i].rkey == rkey)
			return &qd->e[i];
	return NULL;
}

static void qd_del(struct vrdma_qpdirect *qd, struct vrdma_qd_entry *e)
{
	*e = qd->e[--qd->n];
}

static struct vrdma_qd_entry *qd_add(struct vrdma_qpdirect *qd, uint32_t rkey)
{
	if (qd->n == qd->cap) {
		int cap = qd->cap ? qd->cap * 2 : 4;
		struct vrdma_qd_entry *n;

		if (qd->n >= QD_MAX || !(n = realloc(qd->e, (size_t)cap * sizeof(*n))))
			return NULL;
		qd->e = n;
		qd->cap = cap;
	}
	qd->e[qd->n] = (struct vrdma_qd_entry){ .rkey = rkey };
	return &qd->e[qd->n++];
}

static void view_of(const struct dgrant *g, uint32_t slot, struct vrdma_grant_view *v)
{
	v->slot = slot;
	v->state = g->state;
	v->access = g->access;
	v->iova = g->iova;
	v->length = g->length;
	v->base = g->map + g->mr_offset;
}

/* refuse remembers that rkey is relayed on this QP for a while. */
static void refuse(struct vrdma_qpdirect *qd, uint32_t rkey)
{
	struct vrdma_qd_entry *e = qd_add(qd, rkey);

	if (e)
		e->refuse = REFUSE_FOR;
}

/* direct_map asks the agent for a grant of rkey to QP handle qp, maps it
 * and installs it: 0 with v filled, or -1 (relay). */
static int direct_map(struct vrdma_vm *vm, uint32_t qp, uint32_t rkey, struct vrdma_grant_view *v)
{
	struct vrdma_reply r;
	uint64_t iova = 0, length = 0, map_offset = 0, map_length = 0, mr_offset = 0;
	uint32_t slot = UINT32_MAX, state = 0, access = 0;
	long page = sysconf(_SC_PAGESIZE);
	char body[64];
	struct stat st;
	char *map = MAP_FAILED;
	int e, ok;

	snprintf(body, sizeof(body), "{\"qp\":%u,\"rkey\":%u}", qp, rkey);
	e = vrdma_cmd(vm, VRDMA_OP_DIRECT_MAP, body, &r); /* the caller's vrdma_direct_begin counted it in flight */
	if (e) {
		pthread_mutex_lock(&dmu);
		D.inflight--;
		pthread_mutex_unlock(&dmu);
		return -1; /* not-found, limit-exceeded, bad-state, unavailable: relay */
	}
	ok = !json_get_u32(&r.doc, 0, "slot", &slot) && !json_get_u32(&r.doc, 0, "state", &state) &&
	     !json_get_u64(&r.doc, 0, "iova", &iova) && !json_get_u64(&r.doc, 0, "length", &length) &&
	     !json_get_u32(&r.doc, 0, "access", &access) && !json_get_u64(&r.doc, 0, "map_offset", &map_offset) &&
	     !json_get_u64(&r.doc, 0, "map_length", &map_length) && !json_get_u64(&r.doc, 0, "mr_offset", &mr_offset) &&
	     r.nfds == 1;
	/* The slot names a grant only if it is one: a valid state word in a
	 * slot of the table. */
	ok = ok && slot < D.slots && (state & 3) == VRDMA_GRANT_VALID && (state >> 2) != 0;
	/* Everything the copies will touch must lie in the mapping, and the
	 * mapping in the file. A reply that fails these is the agent's bug;
	 * the grant is still the session's until its notice: keep its slot
	 * (unmapped) so that the reader acknowledges it. */
	ok = ok && map_length && !(map_offset % (uint64_t)page) && !(map_length % (uint64_t)page) &&
	     map_offset + map_length > map_offset && map_length <= SIZE_MAX && length && iova + length > iova &&
	     mr_offset <= map_length && length <= map_length - mr_offset && !(access & ~(uint32_t)(IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC)) &&
	     !fstat(r.fds[0], &st) && (uint64_t)st.st_size >= map_offset + map_length;
	pthread_mutex_lock(&dmu); /* no fork between the mapping and its advice */
	if (ok) {
		map = mmap(NULL, (size_t)map_length, PROT_READ | PROT_WRITE,
			   MAP_SHARED | (map_length <= POPULATE_MAX ? MAP_POPULATE : 0), r.fds[0], (off_t)map_offset);
		if (map != MAP_FAILED)
			(void)madvise(map, (size_t)map_length, MADV_DONTFORK);
	}
	D.inflight--;
	vrdma_reply_free(&r); /* closes the owner's memfd: the mapping stays */
	if (slot >= D.slots || (state & 3) != VRDMA_GRANT_VALID) {
		pthread_mutex_unlock(&dmu);
		if (map != MAP_FAILED)
			munmap(map, (size_t)map_length);
		return -1;
	}
	if (early_take(slot, state)) {
		/* Revoked (and acknowledged) before this reply was read. */
		pthread_mutex_unlock(&dmu);
		if (map != MAP_FAILED)
			munmap(map, (size_t)map_length);
		return -1;
	}
	if (D.g[slot].state) {
		/* The agent reuses a slot only after the acknowledgement, so
		 * this is a grant whose notice was lost: drop it. */
		if (D.g[slot].map)
			munmap(D.g[slot].map, D.g[slot].map_len);
		D.ngrants--;
	}
	D.g[slot] = (struct dgrant){ .state = state, .qp = qp, .rkey = rkey, .access = access, .iova = iova,
				     .length = length, .map = map == MAP_FAILED ? NULL : map,
				     .map_len = map == MAP_FAILED ? 0 : (size_t)map_length, .mr_offset = mr_offset };
	D.ngrants++;
	if (map == MAP_FAILED) {
		pthread_mutex_unlock(&dmu);
		return -1;
	}
	view_of(&D.g[slot], slot, v);
	pthread_mutex_unlock(&dmu);
	return 0;
}

int vrdma_direct_grant(struct vrdma_vm *vm, struct vrdma_qpdirect *qd, uint32_t qp, uint32_t rkey,
		       struct vrdma_grant_view *v)
{
	struct vrdma_qd_entry *e = qd_find(qd, rkey);

	if (e && !e->v.state) {
		if (--e->refuse > 0)
			return -1; /* refused lately: relay */
		qd_del(qd, e);
		e = NULL;
	}
	if (e) {
		/* No lock: a view revoked since (its pages perhaps unmapped)
		 * fails the caller's state check before a byte is touched,
		 * and the caller then drops it (vrdma_direct_drop). */
		*v = e->v;
		return 0;
	}
	if (vrdma_direct_begin(vm) || direct_map(vm, qp, rkey, v)) {
		refuse(qd, rkey);
		return -1;
	}
	e = qd_add(qd, rkey);
	if (e)
		e->v = *v;
	return 0; /* without a cache entry the grant is used once, then asked for again (refused: in use) */
}

void vrdma_direct_drop(struct vrdma_qpdirect *qd, uint32_t rkey)
{
	struct vrdma_qd_entry *e = qd_find(qd, rkey);

	if (e)
		qd_del(qd, e);
}

void vrdma_direct_qp_reset(struct vrdma_qpdirect *qd)
{
	/* The refusals go; the grants stay until their notices (the agent
	 * revokes the QP's grants when it is modified). */
	for (int i = 0; i < qd->n;)
		if (!qd->e[i].v.state)
			qd_del(qd, &qd->e[i]);
		else
			i++;
}

void vrdma_direct_qp_free(struct vrdma_qpdirect *qd)
{
	free(qd->e);
	memset(qd, 0, sizeof(*qd));
}

/* ---- the session's regions by lkey (rule 4) ---- */

struct lmr_ent {
	uint32_t lkey;
	int used;
	struct vrdma_lmr m;
};

static pthread_rwlock_t lmr_mu = PTHREAD_RWLOCK_INITIALIZER;
static struct lmr_ent *lmr; /* open addressing, linear probing; +guarded by lmr_mu */
static uint32_t lmr_cap, lmr_n;

static void lmr_forget(void)
{
	pthread_rwlock_init(&lmr_mu, NULL);
	free(lmr);
	lmr = NULL;
	lmr_cap = lmr_n = 0;
}

static uint32_t lmr_hash(uint32_t k)
{
	k ^= k >> 16;
	k *= 0x7feb352dU;
	k ^= k >> 15;
	return k;
}

/* lmr_put inserts or replaces; caller holds the write lock. */
static int lmr_put(uint32_t lkey, const struct vrdma_lmr *m)
{
	if ((lmr_n + 1) * 4 > lmr_cap * 3) {
		uint32_t cap = lmr_cap ? lmr_cap * 2 : 64;
		struct lmr_ent *n = calloc(cap, sizeof(*n)), *old = lmr;
		uint32_t oldcap = lmr_cap;

		if (!n)
			return ENOMEM;
		lmr = n;
		lmr_cap = cap;
		lmr_n = 0;
		for (uint32_t i = 0; i < oldcap; i++)
			if (old[i].used)
				lmr_put(old[i].lkey, &old[i].m);
		free(old);
	}
	for (uint32_t i = lmr_hash(lkey) & (lmr_cap - 1);; i = (i + 1) & (lmr_cap - 1)) {
		if (!lmr[i].used || lmr[i].lkey == lkey) {
			if (!lmr[i].used)
				lmr_n++;
			lmr[i].used = 1;
			lmr[i].lkey = lkey;
			lmr[i].m = *m;
			return 0;
		}
	}
}

int vrdma_lmr_set(uint32_t lkey, const struct vrdma_lmr *m)
{
	int e;

	pthread_rwlock_wrlock(&lmr_mu);
	e = lmr_put(lkey, m);
	pthread_rwlock_unlock(&lmr_mu);
	return e;
}

void vrdma_lmr_del(uint32_t lkey)
{
	uint32_t i, j, h, mask;

	pthread_rwlock_wrlock(&lmr_mu);
	if (!lmr_cap)
		goto out;
	mask = lmr_cap - 1;
	for (i = lmr_hash(lkey) & mask; lmr[i].used && lmr[i].lkey != lkey; i = (i + 1) & mask)
		;
	if (!lmr[i].used)
		goto out;
	lmr_n--;
	/* Backward-shift deletion keeps every probe run whole (the table is
	 * never full, so each run ends). */
	for (j = i;;) {
		lmr[i].used = 0;
		for (;;) {
			j = (j + 1) & mask;
			if (!lmr[j].used)
				goto out;
			h = lmr_hash(lmr[j].lkey) & mask;
			/* j's entry stays while its home is cyclically in (i, j]. */
			if (i <= j ? (i < h && h <= j) : (i < h || h <= j))
				continue;
			break;
		}
		lmr[i] = lmr[j];
		i = j;
	}
out:
	pthread_rwlock_unlock(&lmr_mu);
}

int vrdma_lmr_get(uint32_t lkey, struct vrdma_lmr *m)
{
	int found = 0;

	pthread_rwlock_rdlock(&lmr_mu);
	for (uint32_t i = lmr_cap ? lmr_hash(lkey) & (lmr_cap - 1) : 0; lmr_cap && lmr[i].used; i = (i + 1) & (lmr_cap - 1)) {
		if (lmr[i].lkey == lkey) {
			*m = lmr[i].m;
			found = 1;
			break;
		}
	}
	pthread_rwlock_unlock(&lmr_mu);
	return found;
}

/* BULK_MIN is the size from which vrdma_bulk_copy uses the CPU's string
 * move (REP MOVSB) where the CPU has fast ones (ERMS, CPUID leaf 7 EBX bit
 * 9): glibc 2.36's memcpy leaves it above the L2 cache's size on AMD, for
 * a vector loop and then non-temporal stores that are slower between two
 * shared mappings (1 MiB 43 against 52 GB/s, 64 MiB 10 against 22 on this
 * project's machine, docs/PERF-LOG.md); below it memcpy is as fast. The Go
 * library's internal/bulkcopy does the same. */
#define BULK_MIN (64u << 10)

/* erms: 0 not looked up yet, 1 no fast string moves, 2 fast ones. */
static int erms;

void vrdma_bulk_copy(void *dst, const void *src, size_t n)
{
#if defined(__x86_64__)
	int e = __atomic_load_n(&erms, __ATOMIC_RELAXED);

	if (n >= BULK_MIN && !e) {
		unsigned a, b, c, d;

		e = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & (1u << 9)) ? 2 : 1;
		__atomic_store_n(&erms, e, __ATOMIC_RELAXED);
	}
	if (n >= BULK_MIN && e == 2) {
		__asm__ volatile("rep movsb" : "+D"(dst), "+S"(src), "+c"(n) : : "memory");
		return;
	}
#endif
	memcpy(dst, src, n);
}
