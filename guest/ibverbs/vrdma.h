/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libibverbs-vrdma: a drop-in libibverbs.so.1 that talks to vrdmad.
 *
 * Internal declarations shared by the library's files. The contract with
 * the agent is docs/wire-local.md; the ABI rules are rdma-core 44's
 * <infiniband/verbs.h> and docs/verbs-compat.md.
 */
#ifndef VRDMA_H
#define VRDMA_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>
#include <infiniband/verbs.h>

#define VRDMA_CLIENT "libibverbs-vrdma/0.1"
#define VRDMA_MAX_ADAPTERS 10

/* The ops, capability bits, error codes, limits and layouts of
 * docs/wire-local.md, generated from internal/abi. */
#include "vrdma-abi.h"

/* vrdma_now_ns is the monotonic clock, in nanoseconds. */
static inline uint64_t vrdma_now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* ---- json.c: a small JSON reader (jsmn style) and writer ---- */

enum json_type { JSON_NONE, JSON_OBJECT, JSON_ARRAY, JSON_STRING, JSON_PRIMITIVE };

struct json_tok {
	enum json_type type;
	int start, end; /* [start, end) in the text; strings without quotes */
	int size;       /* object: members; array: elements */
	int next;       /* index of the token after this one and its children */
};

struct json_doc {
	const char *text;
	int len;
	struct json_tok *t;
	int n, cap;
};

/* json_parse parses text (len bytes); 0 on success, -1 on malformed input
 * or too many tokens. json_free releases the tokens. */
int json_parse(struct json_doc *d, const char *text, int len);
void json_free(struct json_doc *d);
/* json_get returns the index of member key of object tok, or -1. */
int json_get(const struct json_doc *d, int tok, const char *key);
/* json_u64 reads an unsigned integer; -1 if tok is not one (or absent). */
int json_u64(const struct json_doc *d, int tok, uint64_t *v);
int json_bool(const struct json_doc *d, int tok, int *v);
/* json_str copies a string value, unescaped, NUL-terminated, into buf of
 * size n; -1 if tok is not a string or it does not fit. */
int json_str(const struct json_doc *d, int tok, char *buf, size_t n);
/* json_elem returns the i-th element of array tok, or -1. */
int json_elem(const struct json_doc *d, int tok, int i);
/* Convenience: member key of object tok as u64/u32/string; -1 if absent or
 * of another kind. */
int json_get_u64(const struct json_doc *d, int tok, const char *key, uint64_t *v);
int json_get_u32(const struct json_doc *d, int tok, const char *key, uint32_t *v);
int json_get_str(const struct json_doc *d, int tok, const char *key, char *buf, size_t n);
/* json_get_int reads member key of object tok as a signed 32-bit integer. */
int json_get_int(const struct json_doc *d, int tok, const char *key, int *v);

struct jbuf {
	char *p;
	size_t len, cap;
	int err;
};
void jb_init(struct jbuf *b, char *p, size_t cap);
void jb_raw(struct jbuf *b, const char *s);
void jb_key(struct jbuf *b, const char *key); /* writes ,"key": (comma as needed) */
void jb_u64(struct jbuf *b, const char *key, uint64_t v);
void jb_bool(struct jbuf *b, const char *key, int v);
void jb_str(struct jbuf *b, const char *key, const char *v);

/* ---- session.c: the agent connection ---- */

struct vrdma_reply {
	int is_error;
	int err;           /* errno for an error reply, mapped as wire-local.md §3 */
	char code[32];     /* error code */
	char message[256]; /* error message */
	struct json_doc doc;
	int root; /* token of the body's object */
	int fds[4];
	int nfds;
};

struct vrdma_session {
	pthread_mutex_t mu;
	int fd;   /* -1 once the agent is gone */
	int dead; /* the connection ended: every call fails with EIO */
	uint32_t seq;
	char *buf; /* VRDMA_MAX_MESSAGE bytes, for receiving */
	uint64_t caps;
};

/* vrdma_msg_header_put writes the header of a request of op (§1.2) into
 * buf, VRDMA_MSG_HEADER_SIZE bytes. vrdma_msg_response decodes the header
 * of the n-byte message buf into h (host order) and checks it is a
 * response whose length is n's; 0 if so, -1 if not. */
void vrdma_msg_header_put(unsigned char *buf, int op, uint32_t seq, uint32_t len);
int vrdma_msg_response(const unsigned char *buf, size_t n, struct vrdma_msg_header *h);
/* vrdma_socket_path writes the agent's socket path (wire-local.md §1.1). */
void vrdma_socket_path(char *buf, size_t n);
int vrdma_session_open(struct vrdma_session *s, const char *path);
/* vrdma_call sends op with body (JSON text) and waits for its response.
 * 0: r holds a reply (r->is_error says whether it is an error; then
 * r->err is the errno of §3, adjusted for op). -1: the session failed,
 * errno set (EIO when the agent is gone). vrdma_reply_free releases r and
 * closes the descriptors the caller did not take (set to -1). */
int vrdma_call(struct vrdma_session *s, int op, const char *body, struct vrdma_reply *r);
/* vrdma_call_fd is vrdma_call with descriptor fd carried along
 * (SCM_RIGHTS): open-xrcd's file. */
int vrdma_call_fd(struct vrdma_session *s, int op, const char *body, int fd, struct vrdma_reply *r);
void vrdma_reply_free(struct vrdma_reply *r);
/* vrdma_errno maps an error code to an errno for op (wire-local.md §3). */
int vrdma_errno(const char *code, const char *field, int op);

/* ---- cmbridge.c: the drop-in librdmacm's way to the agent ---- */

/* vrdma_cm_call sends rdma_cm op (accept-request, reject-request or
 * 40..47) with body on the process's session. 0: *reply is the reply's
 * body (malloc'd, NUL-terminated JSON; the caller frees it) and *fd the
 * descriptor it carried, or -1. Otherwise an errno, with the agent's
 * "code: message" in msg. Exported in version node VRDMA_PRIVATE_1. */
int vrdma_cm_call(int op, const char *body, char **reply, int *fd, char *msg, size_t msglen);

/* ---- ud.c: address handles and UD work requests ---- */

struct vrdma_vm;
struct vrdma_reply;

/* vrdma_ud_dest writes a UD QP's send WR's destination (its address
 * handle, remote QPN and Q_Key) into the WQE in slot, which
 * wqe_send_from_wr filled: 0, or EINVAL for an opcode UD does not carry
 * or an address handle this library did not make. */
int vrdma_ud_dest(void *slot, const struct ibv_send_wr *wr);
/* vrdma_ud_set_dest is vrdma_ud_dest's destination part, for ibv_wr_set_ud_addr. */
int vrdma_ud_set_dest(void *slot, struct ibv_ah *ah, uint32_t remote_qpn, uint32_t remote_qkey);

/* mw.c: the context ops of memory windows, and the check that mw is one
 * of this library's. */
void vrdma_set_mw_ops(struct ibv_context_ops *ops);
int vrdma_mw_ok(struct ibv_mw *mw);

/* verbs.c's registry of live objects, PD check and commands, for ud.c and mw.c. */
int vrdma_obj_add(void *p);
int vrdma_obj_take(const void *p);
int vrdma_obj_has(const void *p);
int vrdma_pd_ok(struct ibv_pd *p);
int vrdma_cmd(struct vrdma_vm *vm, int op, const char *body, struct vrdma_reply *r);

/* ---- device.c: the VM, its adapters as devices, contexts ---- */

struct vrdma_device {
	struct ibv_device ibdev; /* first, then a pointer, as rdma-core's verbs_device (verbs-abi.md §2) */
	const void *ops;         /* &vrdma_device_ops: never a vendor's */
	char adapter[16];         /* "vrdma0" */
	int index;                /* N of ethernetN */
	char mac[24];
	union ibv_gid gid;
	__be64 node_guid; /* network order, as ibv_get_device_guid returns it */
	__be64 sys_image_guid;
	struct ibv_device_attr attr; /* from query-device */
	struct ibv_port_attr port;   /* from query-port */
};

struct vrdma_vm {
	struct vrdma_session s;
	char name[72];
	char host[72];
	uint64_t mem_size;
	int mem_locked;
	int async_mode;
	int mem_fd; /* the guest memory memfd, kept for adopting pages (verbs.c) */
	void *mem;  /* its mapping */
	int ndev;
	struct vrdma_device *devs[VRDMA_MAX_ADAPTERS];
};

struct vrdma_context {
	struct verbs_context vctx; /* ends with struct ibv_context */
	struct vrdma_device *dev;
};

static inline struct vrdma_context *to_vctx(struct ibv_context *c)
{
	return (struct vrdma_context *)((char *)c - offsetof(struct vrdma_context, vctx.context));
}

/* vrdma_vm_get returns the process's attached VM, attaching on first use;
 * NULL with errno when there is none. */
struct vrdma_vm *vrdma_vm_get(void);
/* vrdma_dev returns the device d is, if it is one of this library's. */
struct vrdma_device *vrdma_dev(struct ibv_device *d);
/* vrdma_ctx_ok reports whether c is a context this library opened. */
int vrdma_ctx_ok(struct ibv_context *c);
/* In a child of fork (device.c's forget_parent), each part of the library
 * forgets what it holds of the parent's: contexts, guest memory runs and
 * extents (the runs' pages becoming private copies, read from mem_fd),
 * objects. */
void vrdma_forget_contexts(void);
void vrdma_forget_memory(int mem_fd);
void vrdma_forget_objects(void);
void vrdma_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* mem.c: vrdma_adopt makes [addr, addr+length) guest memory (adopting its
 * pages, or finding them adopted already) and returns the guest address of
 * addr and a handle for vrdma_unadopt, which gives the pages back when the
 * last region over them is deregistered; 0 or an errno. With on_demand
 * (an IBV_ACCESS_ON_DEMAND region), only the pages that hold data are
 * copied into guest memory; the rest are populated at first touch. */
int vrdma_adopt(struct vrdma_vm *vm, void *addr, size_t length, int on_demand, uint64_t *guest, void **handle);
void vrdma_unadopt(struct vrdma_vm *vm, void *handle);

/* maps.c: the reader of /proc/self/maps. vrdma_read_maps returns the
 * file's text (malloc'd, NUL-terminated) or NULL. vrdma_parse_mapline
 * parses the line at l (up to its newline): 0, or -1 when it is not a
 * mapping's line. vrdma_maps_check walks the mappings of the text maps
 * over [s, e): with want_ours, every byte must be the file ours, shared,
 * at offset goff + (va - s); otherwise every byte must be private
 * read-write memory (heap, stack, anonymous, a file's private copy). 0, or
 * an errno: EFAULT where nothing is mapped, EINVAL where the memory
 * cannot be adopted (why, of whylen bytes, says which). vrdma_maps_ours
 * counts the bytes of [s, e) mapped from ours at goff + (va - s).
 * vrdma_maps_huge reports whether the mapping holding address a is of
 * huge pages (its path in maps has "huge": /anon_hugepage, hugetlbfs).
 * vrdma_huge_page returns the page size of such a mapping, read from
 * smaps (the text of /proc/self/smaps, or NULL), a power of two up to
 * 1 GiB; 0 for any other mapping or when it is not known.
 * vrdma_read_proc reads a /proc file as vrdma_read_maps reads maps. */
struct vrdma_mapline {
	uintptr_t start, end;
	char perms[5];
	uint64_t offset;
	unsigned major, minor;
	unsigned long inode;
	char path[256];
};
struct vrdma_maps_file {
	unsigned major, minor;
	unsigned long inode;
};
char *vrdma_read_maps(void);
char *vrdma_read_proc(const char *path);
int vrdma_maps_huge(const char *maps, uintptr_t a);
uintptr_t vrdma_huge_page(const char *maps, const char *smaps, uintptr_t a);
int vrdma_parse_mapline(const char *l, struct vrdma_mapline *m);
int vrdma_maps_check(const char *maps, const struct vrdma_maps_file *ours, uintptr_t s, uintptr_t e, int want_ours,
		     uint64_t goff, char *why, size_t whylen);
uint64_t vrdma_maps_ours(const char *maps, const struct vrdma_maps_file *ours, uintptr_t s, uintptr_t e, uint64_t goff);

/* events.c: vrdma_async_open returns the agent's event socket for d's
 * adapter (a context's async_fd), or -1 when the agent has none. */
int vrdma_async_open(struct vrdma_device *d);

/* verbs.c: vrdma_qp_of_handle returns ctx's live QP with the agent's
 * handle, or NULL. */
struct ibv_qp *vrdma_qp_of_handle(struct ibv_context *ctx, uint32_t handle);
/* vrdma_srq_of_handle returns ctx's live SRQ with the agent's handle, or
 * NULL. */
struct ibv_srq *vrdma_srq_of_handle(struct ibv_context *ctx, uint32_t handle);
/* vrdma_cq_of_handle returns ctx's live CQ with the agent's handle, or
 * NULL. */
struct ibv_cq *vrdma_cq_of_handle(struct ibv_context *ctx, uint32_t handle);

/* direct.c: the memcpy-direct path's grants (wire-local.md §4.21).
 *
 * vrdma_direct_ready opens the session's grant table (direct-open) the
 * first time, and (re)starts the revocation reader: 0, or an errno (the
 * QP then relays). vrdma_direct_begin is vrdma_direct_ready for a request
 * that may get a grant (direct-map, direct-channel): it also counts the
 * request in flight, with the reader running, so that the reader keeps
 * running until the caller's vrdma_direct_count(0, -1). vrdma_direct_grant finds the grant of rkey for the QP
 * of handle qp in its cache qd, asking the agent (direct-map) on a miss,
 * and fills v: 0, or -1 when the WR is to be relayed (refused, lately
 * refused, or mapped badly). The caller holds the QP's send-queue lock,
 * which guards qd. vrdma_direct_drop forgets the cached grant of rkey
 * (found revoked: the reader unmaps it); vrdma_direct_qp_reset forgets the
 * refusals (the QP was modified); vrdma_direct_qp_free releases qd.
 * vrdma_direct_slot is slot's words in the table. vrdma_direct_idle
 * stops the reader when the session holds no grant (the last context
 * closed). vrdma_forget_direct is the fork child's part.
 * vrdma_bulk_copy is memcpy for a direct WRITE's or READ's bytes. */
struct vrdma_grant_view {
	char *base; /* the mapping byte of remote address iova */
	uint64_t iova, length;
	uint32_t access, slot, state;
};
struct vrdma_qd_entry {
	uint32_t rkey;
	uint32_t refuse; /* a refusal: WRs left to relay before asking again */
	/* A grant (v.state nonzero; 0: a refusal). Used without a lock: the
	 * caller's check of the slot's state word against v.state, after
	 * its increment of in-use, proves it still valid and mapped. */
	struct vrdma_grant_view v;
};
struct vrdma_qpdirect {
	struct vrdma_qd_entry *e;
	int n, cap;
};
int vrdma_direct_ready(struct vrdma_vm *vm);
int vrdma_direct_begin(struct vrdma_vm *vm);
int vrdma_direct_grant(struct vrdma_vm *vm, struct vrdma_qpdirect *qd, uint32_t qp, uint32_t rkey,
		       struct vrdma_grant_view *v);
void vrdma_direct_drop(struct vrdma_qpdirect *qd, uint32_t rkey);
void vrdma_direct_qp_reset(struct vrdma_qpdirect *qd);
void vrdma_direct_qp_free(struct vrdma_qpdirect *qd);
struct vrdma_grant_slot *vrdma_direct_slot(uint32_t slot);
void vrdma_direct_idle(void);
void vrdma_forget_direct(void);
void vrdma_bulk_copy(void *dst, const void *src, size_t n);

/* direct_send.c: the send channel of memcpy-direct (wire-local.md §4.22):
 * small SEND and SEND_WITH_IMM of an RC QP pair bound to memcpy-direct go
 * from the sender's library to the receiver's through a shared ring that
 * the agent made and granted to both (direct-channel), without the agent.
 * Whatever the receiver cannot take for certain it refuses, and the
 * sender retracts it and every later one and relays them (posts them to
 * the SQ ring): the agent then completes them as it always did.
 *
 * struct vrdma_chan is one grant of a channel to a QP (opaque here); a QP
 * keeps the ones it had in struct vrdma_qpchan (freed with the QP). The
 * grant's pages are touched only between an increment of its in-use word
 * and the decrement, after its state word read valid (§4.21 pair 4), so
 * the revocation reader may unmap it on the notice. Its send records are
 * the sender's (post and retraction: the QP's sq_lock; reaping: the send
 * CQ's lock), its receive index the receiver's (the recv CQ's lock).
 *
 * vrdma_hello_caps is the hello's capability bits (bit 22 as built, or
 * VRDMA_DIRECT_SEND=0/1); vrdma_chan_enabled whether the session has the
 * channel. vrdma_chan_attach asks the agent for the QP's channel when it
 * has none (sq_lock held; a command): 0 with qc->cur set, or an errno
 * (unavailable: asked again after a backoff, or at once when the QP
 * ring's channel-offer word changed; anything else: not until the next
 * RTS). vrdma_chan_off forgets the current one (the QP left RTS for
 * RESET, INIT or RTR, or moved to RTS again); vrdma_chan_free releases
 * them all (the QP's end). vrdma_chan_send puts a SEND into the channel
 * (sq_lock): 0, or -1 (relay it, after vrdma_chan_retract). vrdma_chan_reap
 * makes the send completions of the channel's finished sends in order
 * (the send CQ's lock), setting *err when the QP is to move to ERR and
 * *retract when slots are to be retracted (a refusal, the relay_ns
 * deadline, or a revocation left sends to relay). vrdma_chan_retract
 * retracts what it may from the newest backwards (sq_lock) and gives the
 * indices of the retracted sends in posting order (their WQEs:
 * vrdma_chan_wqe), which the caller posts to the SQ ring.
 * vrdma_chan_posted reports whether sends are posted, taken or refused
 * (not done). vrdma_chan_take takes the peer's messages into the QP's
 * posted receives (the recv CQ's lock): *solicited when one was
 * SOLICITED, *notify 1 (or 2 for a refusal) when the peer's send CQ is to
 * be told (direct-notify), *skipped the retracted messages it skipped
 * (their sender relays them: the agent completes them in the CQ ring). vrdma_chan_arm_rx / _tx store the armed words
 * of an arming CQ and fence (they return 0); the caller then takes and
 * reaps what the channels hold, as completions that came before the
 * arming. vrdma_chan_notice is the revocation
 * reader's, under direct.c's lock: 1 if (slot, state) was a channel's
 * grant, now recorded and unmapped. */
struct vrdma_chan;
struct vrdma_qpchan {
	struct vrdma_chan *cur; /* the current grant (atomic pointer), NULL: none */
	struct vrdma_chan *all; /* every grant this QP had; +guarded by sq_lock */
	uint64_t next_try;	/* monotonic ns before which attach does not ask again; +guarded by sq_lock */
	uint32_t backoff_ms;	/* +guarded by sq_lock */
	uint32_t offer_seen;	/* the QP ring's channel-offer word at the last ask; +guarded by sq_lock */
	int stopped;		/* not asked for again until the next RTS; +guarded by sq_lock */
	uint32_t wqe_size;	/* the SQ's stride: a retracted send's WQE (set at create) */
	void *owner;		/* the QP, for vrdma_chan_kick (set at create) */
	int want_err;		/* 1: the QP is to move to ERR; 2: moved (atomic) */
};
struct vrdma_chan_sge {
	char *p;
	uint32_t len;
};
struct vrdma_chan_msg {
	int opcode; /* IBV_WR_SEND or IBV_WR_SEND_WITH_IMM */
	int solicited;
	int signaled;
	uint32_t imm; /* a number */
	const struct vrdma_chan_sge *sge;
	uint32_t nsge, length;
};
/* A QP's receive queue, as the taker needs it. */
struct vrdma_chan_rq {
	char *ring;
	uint32_t rq_offset, rq_stride, rq_entries, max_recv_sge;
	uint32_t pd, qpn;
};
uint64_t vrdma_hello_caps(void);
int vrdma_chan_enabled(const struct vrdma_vm *vm);
int vrdma_chan_attach(struct vrdma_vm *vm, struct vrdma_qpchan *qc, uint32_t qp_handle, char *qp_ring);
void vrdma_chan_off(struct vrdma_qpchan *qc);
void vrdma_chan_free(struct vrdma_qpchan *qc);
uint32_t vrdma_chan_payload(const struct vrdma_chan *ch);
uint32_t vrdma_chan_outstanding(const struct vrdma_chan *ch, int signaled_only);
int vrdma_chan_live(const struct vrdma_chan *ch);
int vrdma_chan_send(struct vrdma_chan *ch, const struct vrdma_chan_msg *m, const void *wqe, uint32_t max_send_wr,
		    int send_cq_armed, int *notify);
int vrdma_chan_reap(struct vrdma_chan *ch, uint32_t qpn, struct ibv_wc *wc, int max, int *err, int *retract);
int vrdma_chan_retract(struct vrdma_chan *ch, uint32_t *idx, uint32_t max);
const void *vrdma_chan_wqe(const struct vrdma_chan *ch, uint32_t idx);
int vrdma_chan_posted(struct vrdma_chan *ch);
int vrdma_chan_take(struct vrdma_chan *ch, const struct vrdma_chan_rq *rq, struct ibv_wc *wc, int max, int *solicited,
		    int *notify, uint32_t *skipped);
int vrdma_chan_arm_rx(struct vrdma_chan *ch, uint32_t how);
int vrdma_chan_arm_tx(struct vrdma_chan *ch);
int vrdma_chan_notice(uint32_t slot, uint32_t state);
/* vrdma_chan_timer is the revocation reader's timer (direct.c's lock
 * held): it has each live channel with a refused send, or one posted
 * longer than relay_ns, retracted through vrdma_chan_kick (verbs.c: only
 * if the QP's send lock is free: its holder retracts itself), and returns
 * the reader's next poll timeout (ms: 1 while sends are out, 10 while a
 * channel is held, -1 without one). */
int vrdma_chan_timer(void);
void vrdma_chan_kick(void *qp);
void vrdma_chan_forget(void);
/* vrdma_chan_check checks a direct-channel reply's members against the
 * grant table's slots and the file's size (as DirectChannel.Check):
 * 0, or -1. */
struct vrdma_chan_reply {
	uint32_t slot, state, entries, stride, peer_qpn;
	uint64_t size, tx_offset, rx_offset, relay_ns;
};
int vrdma_chan_check(const struct vrdma_chan_reply *r, uint32_t slots, uint64_t file_size);
/* direct.c's lock and counts, for the channel's grants: the grant slots'
 * notices are read under it. */
void vrdma_direct_lock(void);
void vrdma_direct_unlock(void);
int vrdma_direct_early_take(uint32_t slot, uint32_t state); /* caller holds the lock */
void vrdma_direct_count(int delta, int inflight);	     /* caller holds the lock */
uint32_t vrdma_direct_nslots(void);

/* direct.c: the session's regions by lkey, for the local checks of a
 * direct WR (rule 4): the PD's handle, the iova range, where its first
 * byte is in this process, its access flags. vrdma_lmr_set adds or
 * replaces (0 or ENOMEM), vrdma_lmr_get finds (1) or not (0). */
struct vrdma_lmr {
	uint32_t pd;
	uint32_t access;
	uint64_t iova, length;
	char *addr;
};
int vrdma_lmr_set(uint32_t lkey, const struct vrdma_lmr *m);
void vrdma_lmr_del(uint32_t lkey);
int vrdma_lmr_get(uint32_t lkey, struct vrdma_lmr *m);

/* layout.c: the ring layout of a create-cq, create-qp or create-srq reply (the object
 * root of d), read and checked against itself (not yet against the file's
 * size): 0, or -1 when a member is missing or the layout is not one the
 * agent makes. vrdma_qp_layout reads the reply's caps too;
 * vrdma_get_caps reads caps object tok. */
struct vrdma_cq_layout {
	uint32_t entries, offset, size;
};
struct vrdma_qp_layout {
	uint32_t sq_entries, sq_stride, rq_entries, rq_stride, sq_offset, rq_offset, size;
};
int vrdma_cq_layout(const struct json_doc *d, int root, struct vrdma_cq_layout *l);
int vrdma_qp_layout(const struct json_doc *d, int root, struct vrdma_qp_layout *l, struct ibv_qp_cap *caps);
int vrdma_get_caps(const struct json_doc *d, int tok, struct ibv_qp_cap *c);
/* vrdma_srq_layout reads a create-srq reply's layout and attr (§4.14). */
struct vrdma_srq_layout {
	uint32_t entries, stride, offset, size;
};
int vrdma_srq_layout(const struct json_doc *d, int root, struct vrdma_srq_layout *l, struct ibv_srq_attr *attr);

/* verbs.c: installs the context ops of PD/MR/CQ/QP. */
void vrdma_set_ops(struct vrdma_context *ctx);

int vrdma_mtu_enum(uint32_t bytes);
uint32_t vrdma_mtu_bytes(int mtu);
int vrdma_parse_gid(const char *s, union ibv_gid *gid);
void vrdma_format_gid(const union ibv_gid *gid, char *buf, size_t n);

#endif
