// SPDX-License-Identifier: Apache-2.0
/*
 * rdma_cm over vrdmad: event channels, IDs, address and route resolution,
 * listen, connect, accept, reject, disconnect, and the events they give.
 *
 * An event channel is an agent channel (cm-open-channel): its fd is the
 * socket on which the agent writes one JSON event per message, so programs
 * poll it as they poll /dev/infiniband/rdma_cm. Every ID has a cookie the
 * agent echoes in the events of its requests; a connection's later events
 * (DISCONNECTED, TIMEWAIT_EXIT) name its QP's handle instead, and a
 * request's ESTABLISHED its (listener, request) pair. An ID made without a
 * channel is synchronous, as in rdma-core: it gets a channel of its own and
 * each call waits for its event there.
 *
 * Locking: cm_mu guards the ID list and the fields events change; calls to
 * the agent are made without it, except the channel a synchronous
 * request's ID gets when its CONNECT_REQUEST is read.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <rdma/rdma_verbs.h>

#include "rdmacm.h"

#define CHANNEL_MAGIC 0x76636d63u /* "vcmc" */
#define CHANNEL_DEAD 0x64656164u  /* "dead": destroyed; the struct is kept (see rdma_destroy_event_channel) */
#define ID_MAGIC 0x76636d69u      /* "vcmi" */
#define EVENT_MAX 8192            /* an agent event is well under this */
#define PDATA_MAX 256
#define EPHEMERAL_LO 32768
#define EPHEMERAL_HI 60999

struct cm_channel {
	struct rdma_event_channel ch; /* first: what programs see */
	uint32_t magic;
	uint32_t handle; /* the agent's */
};

struct cm_id {
	struct rdma_cm_id id; /* first: what programs see */
	uint32_t magic;
	uint64_t cookie;
	int sync; /* made without a channel: id.channel is its own */
	struct cm_dev *dev;
	int bound;       /* rdma_bind_addr (or resolve_addr's source) was given */
	int host_bound;  /* bound to an address of the host's network, not an adapter's (cm-listen's host_port) */
	char remote[64]; /* what cm-connect dials: the resolved address */
	uint32_t listen_handle; /* the cm-listen, while listening */
	/* A CONNECT_REQUEST's ID: the agent's listener and request IDs, until
	 * accepted or rejected. */
	int request, answered;
	uint32_t listener, req;
	/* Connected: the QP's handle, which the connection's events name, and
	 * the peer's QPN. */
	int connected;
	uint32_t qp_handle;
	uint32_t remote_qpn;
	/* A connection whose QP the program made and moves itself (rdma_cm's
	 * external QP: no id->qp, conn_param->qp_num): its number, and what
	 * rdma_init_qp_attr gives for it, from CONNECT_REQUEST or
	 * CONNECT_RESPONSE: the PSNs and the path MTU (an enum ibv_mtu, 0:
	 * the device's). established: rdma_establish was called. */
	uint32_t ext_qpn;
	uint32_t sq_psn, rq_psn;
	int path_mtu;
	int established;
	struct ibv_qp_init_attr *qp_init_attr; /* rdma_create_ep's, for a passive synchronous ID */
	uint8_t tos, ack_timeout;
	int events_out; /* delivered, not acked: rdma_destroy_id waits for 0; +guarded by cm_mu */
	struct cm_mc *mcs; /* the groups joined, newest first; +guarded by cm_mu */
	struct cm_id *next;
};

/* cm_mc is a multicast group an ID joined (rdma_join_multicast): its
 * address and GID, the join's context (the events' private_data), and
 * whether the ID's QP is attached to it (when MULTICAST_JOIN is read, as
 * librdmacm attaches it; never for a send-only join). */
struct cm_mc {
	struct sockaddr_storage addr;
	union ibv_gid mgid;
	void *context;
	int send_only, attached;
	struct cm_mc *next;
};

static struct cm_mc *find_mc(struct cm_id *c, const union ibv_gid *g, struct cm_mc ***prev);

struct cm_event {
	struct rdma_cm_event ev; /* first */
	struct cm_id *owner;     /* whose events_out it counts in */
	uint8_t pdata[PDATA_MAX];
};

static pthread_mutex_t cm_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cm_acked = PTHREAD_COND_INITIALIZER;
static struct cm_id *ids; /* +guarded by cm_mu */
static uint64_t next_cookie; /* +guarded by cm_mu */

static struct cm_dev devs[VRDMA_MAX_ADAPTERS];
static int ndevs;
static int init_errno;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

/* In a child of fork the parent's devices, channels and IDs are the
 * parent's (libibverbs forgets its session there, guest/ibverbs/device.c's
 * forget_parent): the child starts again with none, and its first call
 * opens the devices on the session of its own that libibverbs opens for
 * it. The channels' sockets stay open in the child, as a kernel
 * rdma_cm's fds would; the agent serves them to the parent only. Locks
 * another thread held at the fork are made anew. */
static void forget_parent(void)
{
	static const pthread_once_t once = PTHREAD_ONCE_INIT;

	pthread_mutex_init(&cm_mu, NULL);
	pthread_cond_init(&cm_acked, NULL);
	ids = NULL;
	memset(devs, 0, sizeof(devs));
	ndevs = 0;
	init_errno = 0;
	init_once = once;
}

__attribute__((constructor)) static void fork_handler(void)
{
	(void)pthread_atfork(NULL, NULL, forget_parent);
}

/* ---- devices ---- */

static void init_devices(void)
{
	struct ibv_device **list;
	int n = 0;

	list = ibv_get_device_list(&n);
	if (!list) {
		init_errno = errno ? errno : ENODEV;
		return;
	}
	for (int i = 0; i < n && ndevs < VRDMA_MAX_ADAPTERS; i++) {
		struct cm_dev *d = &devs[ndevs];
		struct ibv_device_attr attr;
		struct ibv_port_attr port;

		d->ctx = ibv_open_device(list[i]);
		if (!d->ctx)
			continue;
		snprintf(d->name, sizeof(d->name), "%s", ibv_get_device_name(list[i]));
		if (ibv_query_gid(d->ctx, 1, 0, &d->gid) == 0) {
			static const uint8_t mapped[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };

			if (!memcmp(d->gid.raw, mapped, sizeof(mapped))) {
				memcpy(&d->ip4, d->gid.raw + 12, 4);
				d->has_ip4 = 1;
			}
		}
		d->pd = ibv_alloc_pd(d->ctx); /* the IDs' id->pd (use_dev); dev_pd retries */
		d->mtu = IBV_MTU_1024;
		if (ibv_query_port(d->ctx, 1, &port) == 0)
			d->mtu = port.active_mtu;
		if (ibv_query_device(d->ctx, &attr) == 0) {
			d->max_rd_atom = (uint8_t)(attr.max_qp_init_rd_atom > 255 ? 255 : attr.max_qp_init_rd_atom);
			d->max_dest_rd_atom = (uint8_t)(attr.max_qp_rd_atom > 255 ? 255 : attr.max_qp_rd_atom);
		}
		ndevs++;
	}
	ibv_free_device_list(list);
	if (!ndevs)
		init_errno = ENODEV;
}

int cm_init(void)
{
	pthread_once(&init_once, init_devices);
	if (init_errno)
		return cm_fail(init_errno);
	return 0;
}

static struct cm_dev *dev_by_name(const char *name)
{
	for (int i = 0; i < ndevs; i++)
		if (!strcmp(devs[i].name, name))
			return &devs[i];
	return NULL;
}

/* dev_by_addr finds the adapter whose address a is (IPv4, IPv4-mapped
 * IPv6, or a GID). */
static struct cm_dev *dev_by_addr(const struct sockaddr *a)
{
	for (int i = 0; i < ndevs; i++) {
		struct cm_dev *d = &devs[i];

		if (a->sa_family == AF_INET && d->has_ip4 &&
		    ((const struct sockaddr_in *)a)->sin_addr.s_addr == d->ip4.s_addr)
			return d;
		if (a->sa_family == AF_INET6 &&
		    !memcmp(((const struct sockaddr_in6 *)a)->sin6_addr.s6_addr, d->gid.raw, 16))
			return d;
	}
	return NULL;
}

static struct ibv_pd *dev_pd(struct cm_dev *d)
{
	struct ibv_pd *pd;

	pthread_mutex_lock(&cm_mu);
	if (!d->pd)
		d->pd = ibv_alloc_pd(d->ctx);
	pd = d->pd;
	pthread_mutex_unlock(&cm_mu);
	return pd;
}

struct ibv_context **rdma_get_devices(int *num_devices)
{
	struct ibv_context **list;

	if (cm_init()) {
		if (num_devices)
			*num_devices = 0;
		return NULL;
	}
	list = calloc((size_t)ndevs + 1, sizeof(*list));
	if (!list) {
		errno = ENOMEM;
		return NULL;
	}
	for (int i = 0; i < ndevs; i++)
		list[i] = devs[i].ctx;
	if (num_devices)
		*num_devices = ndevs;
	return list;
}

void rdma_free_devices(struct ibv_context **list)
{
	free(list);
}

/* ---- addresses ---- */

static socklen_t addr_len(const struct sockaddr *a)
{
	if (!a)
		return 0;
	switch (a->sa_family) {
	case AF_INET:
		return sizeof(struct sockaddr_in);
	case AF_INET6:
		return sizeof(struct sockaddr_in6);
	}
	return 0;
}

static int is_any(const struct sockaddr *a)
{
	if (a->sa_family == AF_INET)
		return ((const struct sockaddr_in *)a)->sin_addr.s_addr == htonl(INADDR_ANY);
	return !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, &in6addr_any, sizeof(in6addr_any));
}

/* is_host_addr: a loopback address, or an address of an interface of this
 * process's network namespace: an address of the host's network, whose
 * ports a VM's listener may hold (the agent checks that the process is in
 * the host's network, and says EINVAL to a listen otherwise). */
static int is_host_addr(const struct sockaddr *a)
{
	struct ifaddrs *ifs, *i;
	int found = 0;

	if (a->sa_family == AF_INET &&
	    (ntohl(((const struct sockaddr_in *)a)->sin_addr.s_addr) >> 24) == 127)
		return 1;
	if (a->sa_family == AF_INET6 && IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)a)->sin6_addr))
		return 1;
	if (getifaddrs(&ifs))
		return 0;
	for (i = ifs; i && !found; i = i->ifa_next) {
		if (!i->ifa_addr || i->ifa_addr->sa_family != a->sa_family)
			continue;
		if (a->sa_family == AF_INET)
			found = ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr ==
				((const struct sockaddr_in *)a)->sin_addr.s_addr;
		else
			found = !memcmp(&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr,
					&((const struct sockaddr_in6 *)a)->sin6_addr, 16);
	}
	freeifaddrs(ifs);
	return found;
}

/* set_ip writes the textual address ip (as the agent gives it) and port
 * into *sa; 0 when ip is an address. */
static int set_ip(struct sockaddr_storage *sa, const char *ip, __be16 port)
{
	struct sockaddr_in *s4 = (struct sockaddr_in *)sa;
	struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)sa;
	struct in_addr a4;
	struct in6_addr a6;

	if (inet_pton(AF_INET, ip, &a4) == 1) {
		memset(sa, 0, sizeof(*sa));
		s4->sin_family = AF_INET;
		s4->sin_addr = a4;
		s4->sin_port = port;
		return 0;
	}
	if (inet_pton(AF_INET6, ip, &a6) == 1) {
		memset(sa, 0, sizeof(*sa));
		s6->sin6_family = AF_INET6;
		s6->sin6_addr = a6;
		s6->sin6_port = port;
		return 0;
	}
	return -1;
}

static __be16 *port_of(struct sockaddr *a)
{
	return a->sa_family == AF_INET6 ? &((struct sockaddr_in6 *)a)->sin6_port : &((struct sockaddr_in *)a)->sin_port;
}

/* set_local writes d's address (the family of like, else IPv4) and port
 * into id's source address. */
static void set_local(struct cm_id *c, struct cm_dev *d, int family, __be16 port)
{
	struct rdma_addr *ra = &c->id.route.addr;

	memset(&ra->src_storage, 0, sizeof(ra->src_storage));
	if (family == AF_INET6 || !d->has_ip4) {
		ra->src_sin6.sin6_family = AF_INET6;
		memcpy(&ra->src_sin6.sin6_addr, d->gid.raw, 16);
		ra->src_sin6.sin6_port = port;
	} else {
		ra->src_sin.sin_family = AF_INET;
		ra->src_sin.sin_addr = d->ip4;
		ra->src_sin.sin_port = port;
	}
	ra->addr.ibaddr.sgid = d->gid;
	ra->addr.ibaddr.pkey = htobe16(0xffff);
}

/* set_remote writes gid (the family of like) and port into id's
 * destination address. */
static void set_remote(struct cm_id *c, const union ibv_gid *gid, int family, __be16 port)
{
	static const uint8_t mapped[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };
	struct rdma_addr *ra = &c->id.route.addr;

	memset(&ra->dst_storage, 0, sizeof(ra->dst_storage));
	if (family != AF_INET6 && !memcmp(gid->raw, mapped, sizeof(mapped))) {
		ra->dst_sin.sin_family = AF_INET;
		memcpy(&ra->dst_sin.sin_addr, gid->raw + 12, 4);
		ra->dst_sin.sin_port = port;
	} else {
		ra->dst_sin6.sin6_family = AF_INET6;
		memcpy(&ra->dst_sin6.sin6_addr, gid->raw, 16);
		ra->dst_sin6.sin6_port = port;
	}
	ra->addr.ibaddr.dgid = *gid;
}

/* use_dev binds c to d: its context, port and, as in rdma-core, the
 * device's PD in id->pd (pyverbs' PD(cmid) takes it from there). */
static void use_dev(struct cm_id *c, struct cm_dev *d)
{
	c->dev = d;
	c->id.verbs = d->ctx;
	c->id.port_num = 1;
	if (!c->id.pd)
		c->id.pd = d->pd;
}

static uint16_t ephemeral_port(void)
{
	static __thread unsigned seed;

	if (!seed)
		seed = (unsigned)getpid() ^ (unsigned)(uintptr_t)&seed;
	return (uint16_t)(EPHEMERAL_LO + rand_r(&seed) % (EPHEMERAL_HI - EPHEMERAL_LO + 1));
}

/* ---- the agent ---- */

/* call runs op with body; 0, or -1 with errno. *reply (if asked for) is
 * the reply's JSON, to free. */
static int call(int op, const char *body, char **reply, int *fd)
{
	char msg[320];
	int e = vrdma_cm_call(op, body, reply, fd, msg, sizeof(msg));

	if (e)
		return cm_fail(e);
	return 0;
}

static void hex(struct jbuf *b, const char *key, const void *p, size_t n)
{
	static const char digits[] = "0123456789abcdef";
	char s[2 * PDATA_MAX + 1];
	const uint8_t *u = p;

	if (!p || !n)
		return;
	for (size_t i = 0; i < n; i++) {
		s[2 * i] = digits[u[i] >> 4];
		s[2 * i + 1] = digits[u[i] & 15];
	}
	s[2 * n] = 0;
	jb_str(b, key, s);
}

static int unhex(const char *s, uint8_t *out, size_t max)
{
	size_t n = strlen(s);

	if (n % 2 || n / 2 > max)
		return -1;
	for (size_t i = 0; i < n / 2; i++) {
		unsigned v;

		if (sscanf(s + 2 * i, "%2x", &v) != 1)
			return -1;
		out[i] = (uint8_t)v;
	}
	return (int)(n / 2);
}

/* ---- event channels ---- */

static struct cm_channel *to_channel(struct rdma_event_channel *ch)
{
	struct cm_channel *c = (struct cm_channel *)ch;

	return c && c->magic == CHANNEL_MAGIC ? c : NULL;
}

struct rdma_event_channel *rdma_create_event_channel(void)
{
	struct cm_channel *c;
	struct json_doc d = { 0 };
	char *reply = NULL;
	uint32_t h;
	int fd = -1;

	if (cm_init())
		return NULL;
	if (call(VRDMA_OP_CM_OPEN_CHANNEL, "{}", &reply, &fd))
		return NULL;
	if (fd < 0 || json_parse(&d, reply, (int)strlen(reply)) || json_get_u32(&d, 0, "handle", &h)) {
		json_free(&d);
		free(reply);
		if (fd >= 0)
			close(fd);
		errno = EIO;
		return NULL;
	}
	json_free(&d);
	free(reply);
	c = calloc(1, sizeof(*c));
	if (!c) {
		char body[48];

		snprintf(body, sizeof(body), "{\"handle\":%u}", h);
		call(VRDMA_OP_CM_CLOSE_CHANNEL, body, NULL, NULL);
		close(fd);
		errno = ENOMEM;
		return NULL;
	}
	c->ch.fd = fd;
	c->magic = CHANNEL_MAGIC;
	c->handle = h;
	return &c->ch;
}

/* rdma_destroy_event_channel closes the channel. Programs (rping among
 * them) destroy a channel while a thread of theirs is blocked reading it;
 * on the kernel's rdma_cm that thread stays blocked, so here too: the
 * struct is not freed but marked dead (a few bytes per channel), and a
 * reader that wakes on a dead channel, or comes to one, waits for good
 * (rdma_get_cm_event). */
void rdma_destroy_event_channel(struct rdma_event_channel *channel)
{
	struct cm_channel *c = to_channel(channel);
	char body[48];

	if (!c)
		return;
	c->magic = CHANNEL_DEAD;
	close(c->ch.fd);
	snprintf(body, sizeof(body), "{\"handle\":%u}", c->handle);
	call(VRDMA_OP_CM_CLOSE_CHANNEL, body, NULL, NULL);
}

/* ---- IDs ---- */

static struct cm_id *to_id(struct rdma_cm_id *id)
{
	struct cm_id *c = (struct cm_id *)id;

	return c && c->magic == ID_MAGIC ? c : NULL;
}

/* new_id makes an ID on channel (its own, and synchronous, when NULL). */
/* is_ud: an ID of a UD port space (RDMA_PS_UDP, RDMA_PS_IPOIB), whose
 * connects are service ID resolutions (SIDR) and whose QPs are UD. */
static int is_ud(const struct cm_id *c)
{
	return c->id.qp_type == IBV_QPT_UD;
}

static struct cm_id *new_id(struct rdma_event_channel *channel, void *context, enum rdma_port_space ps,
			    enum ibv_qp_type qp_type)
{
	struct cm_id *c = calloc(1, sizeof(*c));

	if (!c) {
		errno = ENOMEM;
		return NULL;
	}
	if (!channel) {
		channel = rdma_create_event_channel();
		if (!channel) {
			free(c);
			return NULL;
		}
		c->sync = 1;
	}
	c->magic = ID_MAGIC;
	c->id.channel = channel;
	c->id.context = context;
	c->id.ps = ps;
	c->id.qp_type = qp_type;
	c->ack_timeout = 18;
	pthread_mutex_lock(&cm_mu);
	c->cookie = ++next_cookie;
	c->next = ids;
	ids = c;
	pthread_mutex_unlock(&cm_mu);
	return c;
}

int rdma_create_id(struct rdma_event_channel *channel, struct rdma_cm_id **id, void *context,
		   enum rdma_port_space ps)
{
	struct cm_id *c;
	enum ibv_qp_type qpt;

	if (!id || (channel && !to_channel(channel)))
		return cm_fail(EINVAL);
	switch (ps) {
	case RDMA_PS_TCP:
	case RDMA_PS_IB:
		qpt = IBV_QPT_RC;
		break;
	case RDMA_PS_UDP:
	case RDMA_PS_IPOIB:
		qpt = IBV_QPT_UD;
		break;
	default:
		return cm_fail(EINVAL);
	}
	if (cm_init())
		return -1;
	c = new_id(channel, context, ps, qpt);
	if (!c)
		return -1;
	*id = &c->id;
	return 0;
}

/* find_cookie returns the live ID of cookie. +checklocks:cm_mu */
static struct cm_id *find_cookie(uint64_t cookie)
{
	for (struct cm_id *c = ids; c; c = c->next)
		if (c->cookie == cookie)
			return c;
	return NULL;
}

int rdma_destroy_id(struct rdma_cm_id *id)
{
	struct cm_id *c = to_id(id);
	char body[160];

	if (!c)
		return cm_fail(EINVAL);
	if (c->listen_handle) {
		snprintf(body, sizeof(body), "{\"handle\":%u}", c->listen_handle);
		call(VRDMA_OP_CM_CLOSE_LISTEN, body, NULL, NULL);
		c->listen_handle = 0;
	}
	if (c->request && !c->answered) {
		/* As the kernel does for a request's ID destroyed unanswered. */
		snprintf(body, sizeof(body), "{\"listener\":%u,\"id\":%u,\"reason\":\"the listener destroyed the request's rdma_cm ID\"}",
			 c->listener, c->req);
		call(VRDMA_OP_REJECT_REQUEST, body, NULL, NULL);
		c->answered = 1;
	}
	if (c->id.event) {
		rdma_ack_cm_event(c->id.event);
		c->id.event = NULL;
	}
	while (c->mcs)
		rdma_leave_multicast(&c->id, (struct sockaddr *)&c->mcs->addr); /* as rdma-core's */
	pthread_mutex_lock(&cm_mu);
	while (c->events_out > 0)
		pthread_cond_wait(&cm_acked, &cm_mu);
	for (struct cm_id **p = &ids; *p; p = &(*p)->next) {
		if (*p == c) {
			*p = c->next;
			break;
		}
	}
	pthread_mutex_unlock(&cm_mu);
	if (c->sync)
		rdma_destroy_event_channel(c->id.channel);
	free(c->id.route.path_rec);
	free(c->qp_init_attr);
	c->magic = 0;
	free(c);
	return 0;
}

int rdma_bind_addr(struct rdma_cm_id *id, struct sockaddr *addr)
{
	struct cm_id *c = to_id(id);
	socklen_t n = addr ? addr_len(addr) : 0;

	if (!c || !addr)
		return cm_fail(EINVAL);
	if (!n)
		return cm_fail(EAFNOSUPPORT);
	if (c->bound || c->listen_handle)
		return cm_fail(EINVAL);
	if (!is_any(addr)) {
		struct cm_dev *d = dev_by_addr(addr);

		if (d) {
			use_dev(c, d);
			set_local(c, d, addr->sa_family, *port_of(addr));
		} else if (is_host_addr(addr)) {
			/* An address of the host: every adapter of the VM, and
			 * the host's port (rdma_listen). */
			c->host_bound = 1;
			memset(&c->id.route.addr.src_storage, 0, sizeof(c->id.route.addr.src_storage));
			memcpy(&c->id.route.addr.src_storage, addr, n);
		} else {
			return cm_fail(EADDRNOTAVAIL); /* no adapter of this VM has it, nor the host */
		}
	} else {
		memset(&c->id.route.addr.src_storage, 0, sizeof(c->id.route.addr.src_storage));
		memcpy(&c->id.route.addr.src_storage, addr, n);
	}
	c->bound = 1;
	return 0;
}

/* complete is a synchronous ID's wait for the event of its call (rdma-core's
 * ucma_complete): 0, or -1 with the event's errno. */
static int complete(struct cm_id *c)
{
	struct rdma_cm_event *ev;

	if (!c->sync)
		return 0;
	if (c->id.event) {
		rdma_ack_cm_event(c->id.event);
		c->id.event = NULL;
	}
	if (rdma_get_cm_event(c->id.channel, &c->id.event))
		return -1;
	ev = c->id.event;
	if (ev->status) {
		if (ev->event == RDMA_CM_EVENT_REJECTED)
			return cm_fail(ECONNREFUSED);
		return cm_fail(ev->status < 0 ? -ev->status : ev->status);
	}
	return 0;
}

static uint32_t channel_handle(struct cm_id *c)
{
	struct cm_channel *ch = to_channel(c->id.channel);

	return ch ? ch->handle : 0;
}

int rdma_resolve_addr(struct rdma_cm_id *id, struct sockaddr *src_addr, struct sockaddr *dst_addr, int timeout_ms)
{
	struct cm_id *c = to_id(id);
	char body[320], ip[INET6_ADDRSTRLEN];
	struct jbuf b;
	socklen_t n;

	(void)timeout_ms; /* the agent answers from its directory at once */
	if (!c || !dst_addr)
		return cm_fail(EINVAL);
	n = addr_len(dst_addr);
	if (!n)
		return cm_fail(EAFNOSUPPORT);
	if (src_addr && !c->bound && rdma_bind_addr(id, src_addr))
		return -1;
	if (dst_addr->sa_family == AF_INET)
		inet_ntop(AF_INET, &((struct sockaddr_in *)dst_addr)->sin_addr, ip, sizeof(ip));
	else
		inet_ntop(AF_INET6, &((struct sockaddr_in6 *)dst_addr)->sin6_addr, ip, sizeof(ip));
	snprintf(c->remote, sizeof(c->remote), "%s", ip);
	memset(&c->id.route.addr.dst_storage, 0, sizeof(c->id.route.addr.dst_storage));
	memcpy(&c->id.route.addr.dst_storage, dst_addr, n);
	jb_init(&b, body, sizeof(body));
	jb_raw(&b, "{");
	jb_u64(&b, "channel", channel_handle(c));
	jb_u64(&b, "cookie", c->cookie);
	jb_str(&b, "remote", ip);
	if (c->dev)
		jb_str(&b, "adapter", c->dev->name);
	/* The port: a host's address resolves to the VM holding it there. */
	jb_u64(&b, "port", be16toh(*port_of(dst_addr)));
	if (is_ud(c))
		jb_bool(&b, "ud", 1);
	jb_raw(&b, "}");
	if (b.err)
		return cm_fail(EINVAL);
	if (call(VRDMA_OP_CM_RESOLVE, body, NULL, NULL))
		return -1;
	return complete(c);
}

int rdma_resolve_route(struct rdma_cm_id *id, int timeout_ms)
{
	struct cm_id *c = to_id(id);
	char body[96];

	(void)timeout_ms;
	if (!c || !c->dev || !c->remote[0])
		return cm_fail(EINVAL); /* rdma_resolve_addr first */
	snprintf(body, sizeof(body), "{\"channel\":%u,\"cookie\":%llu}", channel_handle(c), (unsigned long long)c->cookie);
	if (call(VRDMA_OP_CM_ROUTE, body, NULL, NULL))
		return -1;
	return complete(c);
}

/* ---- QPs ---- */

/* qp_to_init brings a new QP of c to INIT, as rdma_init_qp_attr says; a
 * UD QP on to RTS, as rdma-core's rdma_create_qp does (its Q_Key is
 * RDMA_UDP_QKEY: it sends and receives at once). */
static int qp_to_init(struct cm_id *c, struct ibv_qp *qp)
{
	static const enum ibv_qp_state states[] = { IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS };
	int i, n = qp->qp_type == IBV_QPT_UD ? 3 : 1;

	for (i = 0; i < n; i++) {
		struct ibv_qp_attr a;
		int mask;

		a.qp_state = states[i];
		if (rdma_init_qp_attr(&c->id, &a, &mask) || ibv_modify_qp(qp, &a, mask))
			return -1;
	}
	return 0;
}

static void destroy_cqs(struct rdma_cm_id *id)
{
	if (id->recv_cq) {
		if (id->send_cq && id->send_cq != id->recv_cq)
			ibv_destroy_cq(id->send_cq);
		ibv_destroy_cq(id->recv_cq);
	} else if (id->send_cq) {
		ibv_destroy_cq(id->send_cq);
	}
	id->send_cq = id->recv_cq = NULL;
	if (id->recv_cq_channel) {
		if (id->send_cq_channel && id->send_cq_channel != id->recv_cq_channel)
			ibv_destroy_comp_channel(id->send_cq_channel);
		ibv_destroy_comp_channel(id->recv_cq_channel);
	} else if (id->send_cq_channel) {
		ibv_destroy_comp_channel(id->send_cq_channel);
	}
	id->send_cq_channel = id->recv_cq_channel = NULL;
}

/* make_cq gives id a CQ of size entries with a completion channel of its
 * own (what rdma_get_send_comp and rdma_get_recv_comp wait on). */
static struct ibv_cq *make_cq(struct rdma_cm_id *id, uint32_t entries, struct ibv_comp_channel **chp)
{
	struct ibv_comp_channel *ch = ibv_create_comp_channel(id->verbs);
	struct ibv_cq *cq;

	if (!ch)
		return NULL;
	cq = ibv_create_cq(id->verbs, (int)(entries ? entries : 1), id, ch, 0);
	if (!cq) {
		int e = errno;

		ibv_destroy_comp_channel(ch);
		errno = e;
		return NULL;
	}
	*chp = ch;
	return cq;
}

int rdma_create_qp_ex(struct rdma_cm_id *id, struct ibv_qp_init_attr_ex *attr)
{
	struct cm_id *c = to_id(id);
	struct ibv_qp *qp;
	int made_send = 0, made_recv = 0;

	if (!c || !attr)
		return cm_fail(EINVAL);
	if (id->qp || !c->dev)
		return cm_fail(EINVAL); /* one QP per ID, on a bound or resolved ID */
	if ((attr->qp_type == IBV_QPT_UD) != is_ud(c))
		return cm_fail(EINVAL); /* a UD QP on a UD ID (RDMA_PS_UDP), a connected one on the others */
	if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || !attr->pd) {
		attr->comp_mask |= IBV_QP_INIT_ATTR_PD;
		attr->pd = id->pd ? id->pd : dev_pd(c->dev);
		if (!attr->pd)
			return -1;
	} else if (attr->pd->context != id->verbs) {
		return cm_fail(EINVAL);
	}
	if ((id->recv_cq && attr->recv_cq && id->recv_cq != attr->recv_cq) ||
	    (id->send_cq && attr->send_cq && id->send_cq != attr->send_cq))
		return cm_fail(EINVAL);
	if (!attr->recv_cq && !id->recv_cq) {
		id->recv_cq = make_cq(id, attr->cap.max_recv_wr, &id->recv_cq_channel);
		if (!id->recv_cq)
			return -1;
		made_recv = 1;
	}
	if (!attr->send_cq && !id->send_cq) {
		id->send_cq = make_cq(id, attr->cap.max_send_wr, &id->send_cq_channel);
		if (!id->send_cq) {
			if (made_recv)
				destroy_cqs(id);
			return -1;
		}
		made_send = 1;
	}
	if (!attr->send_cq)
		attr->send_cq = id->send_cq;
	if (!attr->recv_cq)
		attr->recv_cq = id->recv_cq;
	if (!attr->srq && id->srq)
		attr->srq = id->srq; /* rdma_create_srq's, as librdmacm does */
	qp = ibv_create_qp_ex(id->verbs, attr);
	if (!qp)
		goto err;
	if (qp_to_init(c, qp)) {
		int e = errno;

		ibv_destroy_qp(qp);
		errno = e;
		goto err;
	}
	id->pd = qp->pd;
	id->qp = qp;
	return 0;
err:
	if (made_send || made_recv) {
		int e = errno;

		destroy_cqs(id);
		errno = e;
	}
	return -1;
}

int rdma_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp_init_attr *qp_init_attr)
{
	struct ibv_qp_init_attr_ex ax;
	int rc;

	if (!qp_init_attr)
		return cm_fail(EINVAL);
	memset(&ax, 0, sizeof(ax));
	memcpy(&ax, qp_init_attr, sizeof(*qp_init_attr));
	ax.comp_mask = IBV_QP_INIT_ATTR_PD;
	ax.pd = pd ? pd : id ? id->pd : NULL;
	rc = rdma_create_qp_ex(id, &ax);
	memcpy(qp_init_attr, &ax, sizeof(*qp_init_attr));
	return rc;
}

/* rdma_create_srq_ex makes a basic SRQ on id's device (in attr's PD, or
 * id's, or the device's), which id's QP then takes its receives from;
 * XRC SRQs are not in vrdma (EOPNOTSUPP from ibv_create_srq_ex). */
int rdma_create_srq_ex(struct rdma_cm_id *id, struct ibv_srq_init_attr_ex *attr)
{
	struct cm_id *c = to_id(id);
	struct ibv_srq *srq;

	if (!c || !attr)
		return cm_fail(EINVAL);
	if (id->srq || !c->dev)
		return cm_fail(EINVAL); /* one SRQ per ID, on a bound or resolved ID */
	if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE)) {
		attr->comp_mask |= IBV_SRQ_INIT_ATTR_TYPE;
		attr->srq_type = IBV_SRQT_BASIC;
	}
	if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) || !attr->pd) {
		attr->comp_mask |= IBV_SRQ_INIT_ATTR_PD;
		attr->pd = id->pd ? id->pd : dev_pd(c->dev);
		if (!attr->pd)
			return -1;
	} else if (attr->pd->context != id->verbs) {
		return cm_fail(EINVAL);
	}
	srq = ibv_create_srq_ex(id->verbs, attr);
	if (!srq)
		return -1;
	if (!id->pd)
		id->pd = attr->pd;
	id->srq = srq;
	return 0;
}

int rdma_create_srq(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_srq_init_attr *attr)
{
	struct ibv_srq_init_attr_ex ax;
	int rc;

	if (!attr)
		return cm_fail(EINVAL);
	memset(&ax, 0, sizeof(ax));
	memcpy(&ax, attr, sizeof(*attr));
	ax.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD;
	ax.srq_type = IBV_SRQT_BASIC;
	ax.pd = pd ? pd : id ? id->pd : NULL;
	rc = rdma_create_srq_ex(id, &ax);
	memcpy(attr, &ax, sizeof(*attr));
	return rc;
}

void rdma_destroy_srq(struct rdma_cm_id *id)
{
	if (!to_id(id) || !id->srq)
		return;
	ibv_destroy_srq(id->srq);
	id->srq = NULL;
}

void rdma_destroy_qp(struct rdma_cm_id *id)
{
	if (!to_id(id))
		return;
	if (id->qp)
		ibv_destroy_qp(id->qp);
	id->qp = NULL;
	destroy_cqs(id);
}

int rdma_init_qp_attr(struct rdma_cm_id *id, struct ibv_qp_attr *qp_attr, int *qp_attr_mask)
{
	struct cm_id *c = to_id(id);

	if (!c || !qp_attr || !qp_attr_mask || !c->dev)
		return cm_fail(EINVAL);
	if (is_ud(c)) {
		/* A UD QP: its port, P_Key and rdma_cm's Q_Key in INIT; then
		 * RTR and RTS (sending from PSN 0) take nothing of the peer. */
		enum ibv_qp_state st = qp_attr->qp_state;

		memset(qp_attr, 0, sizeof(*qp_attr));
		qp_attr->qp_state = st;
		switch (st) {
		case IBV_QPS_INIT:
			qp_attr->port_num = id->port_num ? id->port_num : 1;
			qp_attr->qkey = RDMA_UDP_QKEY;
			*qp_attr_mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY;
			return 0;
		case IBV_QPS_RTR:
			*qp_attr_mask = IBV_QP_STATE;
			return 0;
		case IBV_QPS_RTS:
			*qp_attr_mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
			return 0;
		default:
			return cm_fail(EINVAL);
		}
	}
	switch (qp_attr->qp_state) {
	case IBV_QPS_INIT:
		memset(qp_attr, 0, sizeof(*qp_attr));
		qp_attr->qp_state = IBV_QPS_INIT;
		qp_attr->pkey_index = 0;
		qp_attr->port_num = id->port_num ? id->port_num : 1;
		qp_attr->qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
		*qp_attr_mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
		return 0;
	case IBV_QPS_RTR:
		if (!c->remote_qpn)
			return cm_fail(EINVAL); /* no peer yet */
		memset(qp_attr, 0, sizeof(*qp_attr));
		qp_attr->qp_state = IBV_QPS_RTR;
		qp_attr->path_mtu = c->dev->mtu;
		qp_attr->dest_qp_num = c->remote_qpn;
		if (c->path_mtu)
			qp_attr->path_mtu = (enum ibv_mtu)c->path_mtu;
		qp_attr->rq_psn = c->rq_psn;
		qp_attr->max_dest_rd_atomic = c->dev->max_dest_rd_atom;
		qp_attr->min_rnr_timer = 12;
		qp_attr->ah_attr.is_global = 1;
		qp_attr->ah_attr.grh.dgid = id->route.addr.addr.ibaddr.dgid;
		qp_attr->ah_attr.grh.hop_limit = 64;
		qp_attr->ah_attr.grh.traffic_class = c->tos;
		qp_attr->ah_attr.port_num = id->port_num;
		*qp_attr_mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
		return 0;
	case IBV_QPS_RTS:
		if (!c->remote_qpn)
			return cm_fail(EINVAL);
		memset(qp_attr, 0, sizeof(*qp_attr));
		qp_attr->qp_state = IBV_QPS_RTS;
		qp_attr->sq_psn = c->sq_psn;
		qp_attr->timeout = c->ack_timeout;
		qp_attr->retry_cnt = 7;
		qp_attr->rnr_retry = 7;
		qp_attr->max_rd_atomic = c->dev->max_rd_atom;
		*qp_attr_mask = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				IBV_QP_MAX_QP_RD_ATOMIC;
		return 0;
	default:
		return cm_fail(EINVAL);
	}
}

/* ---- connections ---- */

int rdma_connect(struct rdma_cm_id *id, struct rdma_conn_param *conn_param)
{
	struct cm_id *c = to_id(id);
	char body[512];
	struct jbuf b;

	if (!c || !c->dev || !c->remote[0] || c->request)
		return cm_fail(EINVAL); /* resolve the address and route first */
	if (!id->qp && (!conn_param || !conn_param->qp_num))
		return cm_fail(EINVAL); /* a QP: rdma_create_qp's, or the program's own number in conn_param */
	if (conn_param && conn_param->private_data_len > (is_ud(c) ? MAX_PDATA_SIDR_REQ : MAX_PDATA_REQ))
		return cm_fail(EINVAL);
	jb_init(&b, body, sizeof(body));
	jb_raw(&b, "{");
	jb_u64(&b, "channel", channel_handle(c));
	jb_u64(&b, "cookie", c->cookie);
	if (is_ud(c)) {
		/* A service ID resolution: ESTABLISHED brings the listener's
		 * UD QP number, Q_Key and address (event->param.ud). */
		jb_bool(&b, "ud", 1);
		jb_u64(&b, "qpn", id->qp ? id->qp->qp_num : conn_param->qp_num);
	} else if (id->qp) {
		jb_u64(&b, "qp", id->qp->handle);
	} else {
		/* The program moves its QP itself: CONNECT_RESPONSE, then
		 * rdma_init_qp_attr and rdma_establish. */
		jb_u64(&b, "qpn", conn_param->qp_num);
		c->ext_qpn = conn_param->qp_num;
	}
	jb_str(&b, "remote", c->remote);
	jb_u64(&b, "port", be16toh(*port_of(&id->route.addr.dst_addr)));
	jb_u64(&b, "ack_timeout", c->ack_timeout); /* the QP's in RTS, as rdma_init_qp_attr says */
	if (conn_param)
		hex(&b, "private_data", conn_param->private_data, conn_param->private_data_len);
	jb_raw(&b, "}");
	if (b.err)
		return cm_fail(EINVAL);
	if (!*port_of(&id->route.addr.src_addr))
		*port_of(&id->route.addr.src_addr) = htobe16(ephemeral_port());
	if (call(VRDMA_OP_CM_CONNECT, body, NULL, NULL))
		return -1;
	return complete(c);
}

int rdma_establish(struct rdma_cm_id *id)
{
	struct cm_id *c = to_id(id);
	char body[48];

	if (!c || id->qp)
		return cm_fail(EINVAL); /* as rdma-core: only for an ID without a QP */
	if (!c->ext_qpn || !c->connected || c->request || c->established)
		return cm_fail(EINVAL); /* after the CONNECT_RESPONSE of a connect, once */
	snprintf(body, sizeof(body), "{\"qp\":%u}", c->qp_handle);
	if (call(VRDMA_OP_CM_ESTABLISH, body, NULL, NULL))
		return -1;
	c->established = 1;
	return 0;
}

int rdma_listen(struct rdma_cm_id *id, int backlog)
{
	struct cm_id *c = to_id(id);
	struct json_doc d = { 0 };
	struct sockaddr *src;
	char *reply = NULL;
	uint16_t port;
	int tries;

	(void)backlog; /* the agent queues requests per listener */
	if (!c || c->listen_handle || c->request || id->qp)
		return cm_fail(EINVAL);
	src = &id->route.addr.src_addr;
	if (!src->sa_family)
		src->sa_family = AF_INET;
	port = be16toh(*port_of(src));
	for (tries = 0;; tries++) {
		char body[256];
		struct jbuf b;
		uint16_t p = port ? port : ephemeral_port();

		jb_init(&b, body, sizeof(body));
		jb_raw(&b, "{");
		jb_u64(&b, "channel", channel_handle(c));
		jb_str(&b, "adapter", c->dev ? c->dev->name : "");
		jb_u64(&b, "port", p);
		jb_u64(&b, "cookie", c->cookie);
		if (is_ud(c))
			jb_bool(&b, "ud", 1); /* the UDP port space, its own */
		if (c->host_bound)
			jb_str(&b, "host_port", "addr"); /* the host's port: required */
		else if (!c->dev)
			jb_str(&b, "host_port", "any"); /* the host's port too, in the host's network */
		jb_raw(&b, "}");
		if (call(VRDMA_OP_CM_LISTEN, body, &reply, NULL) == 0) {
			*port_of(src) = htobe16(p);
			break;
		}
		if (errno == EEXIST)
			errno = EADDRINUSE;
		if (errno == EINVAL && c->host_bound)
			errno = EADDRNOTAVAIL; /* a host address outside the host's network */
		if (port || errno != EADDRINUSE || tries >= 16)
			return -1;
	}
	if (json_parse(&d, reply, (int)strlen(reply)) || json_get_u32(&d, 0, "handle", &c->listen_handle) ||
	    !c->listen_handle) {
		json_free(&d);
		free(reply);
		return cm_fail(EIO);
	}
	json_free(&d);
	free(reply);
	return 0;
}

int rdma_get_request(struct rdma_cm_id *listen, struct rdma_cm_id **id)
{
	struct cm_id *c = to_id(listen);
	struct rdma_cm_event *ev;

	if (!c || !c->sync || !id)
		return cm_fail(EINVAL);
	if (listen->event) {
		rdma_ack_cm_event(listen->event);
		listen->event = NULL;
	}
	if (rdma_get_cm_event(listen->channel, &ev))
		return -1;
	if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
		int e = ev->event == RDMA_CM_EVENT_REJECTED ? ECONNREFUSED : ev->status < 0 ? -ev->status : EINVAL;

		listen->event = ev;
		return cm_fail(e);
	}
	if (c->qp_init_attr) {
		struct ibv_qp_init_attr attr = *c->qp_init_attr;

		if (rdma_create_qp(ev->id, listen->pd, &attr)) {
			int e = errno;

			rdma_reject(ev->id, NULL, 0);
			listen->event = ev;
			return cm_fail(e);
		}
	}
	*id = ev->id;
	ev->id->event = ev;
	return 0;
}

int rdma_accept(struct rdma_cm_id *id, struct rdma_conn_param *conn_param)
{
	struct cm_id *c = to_id(id);
	char body[640];
	struct jbuf b;
	char *reply = NULL;

	if (!c || !c->request || c->answered)
		return cm_fail(EINVAL); /* a CONNECT_REQUEST's ID, once */
	if (!id->qp && (!conn_param || !conn_param->qp_num))
		return cm_fail(EINVAL); /* a QP: rdma_create_qp's, or the program's own number in conn_param */
	if (conn_param && conn_param->private_data_len > (is_ud(c) ? MAX_PDATA_SIDR_REP : MAX_PDATA_REP))
		return cm_fail(EINVAL);
	jb_init(&b, body, sizeof(body));
	jb_raw(&b, "{");
	jb_u64(&b, "listener", c->listener);
	jb_u64(&b, "id", c->req);
	if (is_ud(c)) {
		/* The SIDR REP: the UD QP's number (the program's own QP's
		 * if it has no id->qp); no event follows here. */
		jb_u64(&b, "qpn", id->qp ? id->qp->qp_num : conn_param->qp_num);
	} else if (id->qp) {
		jb_u64(&b, "qp", id->qp->handle);
	} else {
		jb_u64(&b, "qpn", conn_param->qp_num); /* moved to RTS by the program */
		c->ext_qpn = conn_param->qp_num;
	}
	jb_u64(&b, "channel", channel_handle(c));
	jb_u64(&b, "ack_timeout", c->ack_timeout);
	if (conn_param)
		hex(&b, "private_data", conn_param->private_data, conn_param->private_data_len);
	jb_raw(&b, "}");
	if (b.err)
		return cm_fail(EINVAL);
	if (call(VRDMA_OP_ACCEPT_REQUEST, body, &reply, NULL))
		return -1;
	free(reply);
	c->answered = 1;
	return is_ud(c) ? 0 : complete(c);
}

int rdma_reject(struct rdma_cm_id *id, const void *private_data, uint8_t private_data_len)
{
	struct cm_id *c = to_id(id);
	char body[512];
	struct jbuf b;

	if (!c || !c->request || c->answered)
		return cm_fail(EINVAL);
	if (private_data_len > MAX_PDATA_REJ)
		return cm_fail(EINVAL);
	jb_init(&b, body, sizeof(body));
	jb_raw(&b, "{");
	jb_u64(&b, "listener", c->listener);
	jb_u64(&b, "id", c->req);
	jb_str(&b, "reason", "rejected by the listener (rdma_reject)");
	hex(&b, "private_data", private_data, private_data_len);
	jb_raw(&b, "}");
	if (b.err)
		return cm_fail(EINVAL);
	if (call(VRDMA_OP_REJECT_REQUEST, body, NULL, NULL))
		return -1;
	c->answered = 1;
	return 0;
}

int rdma_reject_ece(struct rdma_cm_id *id, const void *private_data, uint8_t private_data_len)
{
	return rdma_reject(id, private_data, private_data_len);
}

int rdma_disconnect(struct rdma_cm_id *id)
{
	struct cm_id *c = to_id(id);
	char body[48];

	if (!c || !c->connected)
		return cm_fail(EINVAL); /* not connected */
	if (id->qp) {
		/* As rdma-core: the QP goes to ERR first, flushing its work
		 * requests, whatever the peer did. */
		struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };

		ibv_modify_qp(id->qp, &a, IBV_QP_STATE);
	}
	snprintf(body, sizeof(body), "{\"qp\":%u}", c->qp_handle);
	if (call(VRDMA_OP_CM_DISCONNECT, body, NULL, NULL))
		return -1;
	return complete(c);
}

int rdma_notify(struct rdma_cm_id *id, enum ibv_event_type event)
{
	(void)event; /* the agent knows when a connection is established */
	return to_id(id) ? 0 : cm_fail(EINVAL);
}

int rdma_migrate_id(struct rdma_cm_id *id, struct rdma_event_channel *channel)
{
	struct cm_id *c = to_id(id);
	struct rdma_event_channel *old;
	int was_sync;

	if (!c || (channel && !to_channel(channel)))
		return cm_fail(EINVAL);
	if (c->listen_handle || c->connected || (c->request && c->answered))
		return cm_fail(EOPNOTSUPP); /* the agent keeps a listen's or a connection's channel */
	pthread_mutex_lock(&cm_mu);
	while (c->events_out > 0)
		pthread_cond_wait(&cm_acked, &cm_mu);
	pthread_mutex_unlock(&cm_mu);
	old = id->channel;
	was_sync = c->sync;
	if (!channel) {
		channel = rdma_create_event_channel();
		if (!channel)
			return -1;
		c->sync = 1;
	} else {
		c->sync = 0;
	}
	id->channel = channel;
	if (was_sync)
		rdma_destroy_event_channel(old);
	return 0;
}

__be16 rdma_get_src_port(struct rdma_cm_id *id)
{
	return to_id(id) ? *port_of(&id->route.addr.src_addr) : 0;
}

__be16 rdma_get_dst_port(struct rdma_cm_id *id)
{
	return to_id(id) ? *port_of(&id->route.addr.dst_addr) : 0;
}

int rdma_set_option(struct rdma_cm_id *id, int level, int optname, void *optval, size_t optlen)
{
	struct cm_id *c = to_id(id);

	if (!c || !optval)
		return cm_fail(EINVAL);
	if (level != RDMA_OPTION_ID)
		return cm_fail(ENOSYS); /* RDMA_OPTION_IB_PATH: RoCE paths come from the agent */
	switch (optname) {
	case RDMA_OPTION_ID_TOS:
		if (optlen != sizeof(uint8_t))
			return cm_fail(EINVAL);
		c->tos = *(uint8_t *)optval;
		return 0;
	case RDMA_OPTION_ID_REUSEADDR:
	case RDMA_OPTION_ID_AFONLY:
		return optlen == sizeof(int) ? 0 : cm_fail(EINVAL);
	case RDMA_OPTION_ID_ACK_TIMEOUT:
		if (optlen != sizeof(uint8_t) || *(uint8_t *)optval > 31)
			return cm_fail(EINVAL); /* ibv_qp_attr.timeout has 5 bits */
		c->ack_timeout = *(uint8_t *)optval;
		return 0;
	}
	return cm_fail(ENOSYS);
}

/* ---- events ---- */

/* path_rec fills id's route with one path, as rdma_cm's RoCE route is. */
static void fill_route(struct cm_id *c)
{
	struct ibv_sa_path_rec *p = c->id.route.path_rec;

	if (!p) {
		p = calloc(1, sizeof(*p));
		if (!p)
			return;
		c->id.route.path_rec = p;
	}
	memset(p, 0, sizeof(*p));
	p->sgid = c->id.route.addr.addr.ibaddr.sgid;
	p->dgid = c->id.route.addr.addr.ibaddr.dgid;
	p->pkey = htobe16(0xffff);
	p->mtu = (uint8_t)c->dev->mtu;
	p->mtu_selector = 2;
	p->hop_limit = 64;
	p->traffic_class = c->tos;
	p->reversible = 1;
	p->numb_path = 1;
	p->packet_life_time = 14;
	c->id.route.num_paths = 1;
}

/* mtu_enum is the enum ibv_mtu of a path MTU in bytes; 0 for none. */
static int mtu_enum(uint32_t bytes)
{
	switch (bytes) {
	case 256:
		return IBV_MTU_256;
	case 512:
		return IBV_MTU_512;
	case 1024:
		return IBV_MTU_1024;
	case 2048:
		return IBV_MTU_2048;
	case 4096:
		return IBV_MTU_4096;
	}
	return 0;
}

/* make_event turns one agent event into an rdma_cm_event for the ID it
 * concerns; NULL when no live ID is its (an event of a destroyed ID,
 * dropped as the kernel drops them) or it is malformed. */
static struct cm_event *make_event(const char *text, int len)
{
	struct json_doc d = { 0 };
	struct cm_event *e = NULL;
	struct cm_id *c = NULL, *owner;
	char adapter[32] = "", gid[64] = "", pd[2 * PDATA_MAX + 1] = "", local_ip[64] = "", peer_ip[64] = "";
	union ibv_gid rgid;
	uint64_t cookie = 0;
	uint32_t listener = 0, req = 0, qp = 0, rqpn = 0, port = 0, sq_psn = 0, rq_psn = 0, mtu = 0, qkey = 0;
	int type, status = 0, npd = 0;

	memset(&rgid, 0, sizeof(rgid));
	if (json_parse(&d, text, len) || json_get_int(&d, 0, "event", &type))
		goto out;
	json_get_int(&d, 0, "status", &status);
	json_get_u64(&d, 0, "cookie", &cookie);
	json_get_u32(&d, 0, "listener", &listener);
	json_get_u32(&d, 0, "id", &req);
	json_get_u32(&d, 0, "qp", &qp);
	json_get_u32(&d, 0, "remote_qpn", &rqpn);
	json_get_u32(&d, 0, "port", &port);
	json_get_u32(&d, 0, "sq_psn", &sq_psn);
	json_get_u32(&d, 0, "rq_psn", &rq_psn);
	json_get_u32(&d, 0, "mtu", &mtu);
	json_get_u32(&d, 0, "qkey", &qkey);
	json_get_str(&d, 0, "adapter", adapter, sizeof(adapter));
	json_get_str(&d, 0, "local_ip", local_ip, sizeof(local_ip));
	json_get_str(&d, 0, "peer_ip", peer_ip, sizeof(peer_ip));
	if (json_get_str(&d, 0, "remote_gid", gid, sizeof(gid)) == 0 && gid[0])
		inet_pton(AF_INET6, gid, rgid.raw);
	if (json_get_str(&d, 0, "private_data", pd, sizeof(pd)) == 0 && pd[0])
		npd = 0; /* decoded below, into the event */
	e = calloc(1, sizeof(*e));
	if (!e)
		goto out;
	if (pd[0]) {
		npd = unhex(pd, e->pdata, sizeof(e->pdata));
		if (npd < 0)
			npd = 0;
	}
	e->ev.event = (enum rdma_cm_event_type)type;
	e->ev.status = status;

	pthread_mutex_lock(&cm_mu);
	switch (type) {
	case RDMA_CM_EVENT_CONNECT_REQUEST: {
		struct cm_id *l = find_cookie(cookie);
		struct cm_dev *dv = dev_by_name(adapter);
		struct rdma_event_channel *lch;
		void *lctx;
		enum rdma_port_space lps;
		enum ibv_qp_type lqpt;
		int lsync;

		if (!l || !l->listen_handle || !dv)
			break;
		/* The request's ID is made without the lock (a synchronous
		 * one opens a channel with the agent); the listener is looked
		 * up again after, in case it went meanwhile. */
		lch = l->id.channel;
		lctx = l->id.context;
		lps = l->id.ps;
		lqpt = l->id.qp_type;
		lsync = l->sync;
		pthread_mutex_unlock(&cm_mu);
		c = new_id(lsync ? NULL : lch, lctx, lps, lqpt);
		pthread_mutex_lock(&cm_mu);
		if (!c)
			break;
		c->request = 1;
		c->listener = listener;
		c->req = req;
		l = find_cookie(cookie);
		if (!l || !l->listen_handle) {
			pthread_mutex_unlock(&cm_mu);
			rdma_destroy_id(&c->id); /* unanswered: the dialer is rejected */
			pthread_mutex_lock(&cm_mu);
			c = NULL;
			break;
		}
		c->remote_qpn = rqpn;
		c->sq_psn = sq_psn & 0xffffff;
		c->rq_psn = rq_psn & 0xffffff;
		c->path_mtu = mtu_enum(mtu);
		c->id.pd = l->id.pd; /* the listener's, else the device's (use_dev), as rdma-core's */
		use_dev(c, dv);
		set_local(c, dv, l->id.route.addr.src_addr.sa_family, htobe16((uint16_t)port));
		set_remote(c, &rgid, l->id.route.addr.src_addr.sa_family, 0);
		if (local_ip[0] && peer_ip[0]) {
			/* By the host's address: the ones the dialer used. */
			set_ip(&c->id.route.addr.src_storage, local_ip, htobe16((uint16_t)port));
			set_ip(&c->id.route.addr.dst_storage, peer_ip, 0);
		}
		fill_route(c);
		e->ev.listen_id = &l->id;
		owner = l;
		goto found;
	}
	case RDMA_CM_EVENT_ESTABLISHED:
		if (listener) {
			for (struct cm_id *x = ids; x; x = x->next)
				if (x->request && x->listener == listener && x->req == req)
					c = x;
		} else {
			c = find_cookie(cookie);
		}
		if (c) {
			c->connected = 1;
			c->qp_handle = qp;
			c->remote_qpn = rqpn;
			if (!listener && gid[0])
				c->id.route.addr.addr.ibaddr.dgid = rgid; /* resolved by a host's address before anyone listened */
		}
		break;
	case RDMA_CM_EVENT_CONNECT_RESPONSE:
		c = find_cookie(cookie);
		if (c) {
			c->connected = 1;
			c->qp_handle = qp;
			c->remote_qpn = rqpn;
			c->sq_psn = sq_psn & 0xffffff;
			c->rq_psn = rq_psn & 0xffffff;
			c->path_mtu = mtu_enum(mtu);
		}
		break;
	case RDMA_CM_EVENT_DISCONNECTED:
	case RDMA_CM_EVENT_TIMEWAIT_EXIT:
		for (struct cm_id *x = ids; x; x = x->next)
			if (x->qp_handle && x->qp_handle == qp)
				c = x;
		break;
	default:
		c = find_cookie(cookie);
		if (c && type == RDMA_CM_EVENT_ADDR_RESOLVED) {
			struct cm_dev *dv = dev_by_name(adapter);
			__be16 sport = *port_of(&c->id.route.addr.src_addr);
			int fam = c->id.route.addr.dst_addr.sa_family;

			if (!dv) {
				e->ev.event = RDMA_CM_EVENT_ADDR_ERROR;
				e->ev.status = -ENODEV;
				break;
			}
			use_dev(c, dv);
			set_local(c, dv, fam, sport ? sport : htobe16(ephemeral_port()));
			if (local_ip[0]) /* a host's address: dialed from this host's */
				set_ip(&c->id.route.addr.src_storage, local_ip, *port_of(&c->id.route.addr.src_addr));
			c->id.route.addr.addr.ibaddr.dgid = rgid;
		} else if (c && type == RDMA_CM_EVENT_ROUTE_RESOLVED && c->dev) {
			fill_route(c);
		}
		break;
	}
	if (!c)
		goto unlock;
	owner = c;
found:
	e->ev.id = &c->id;
	e->owner = owner;
	owner->events_out++;
	if (is_ud(c)) {
		/* A UD ID's events carry param.ud: the private data and, in
		 * the ESTABLISHED of a connect (the SIDR REP), the listener's
		 * UD QP, its Q_Key and the address handle attributes to send
		 * to it with. */
		struct rdma_ud_param *u = &e->ev.param.ud;

		if (npd > 0) {
			u->private_data = e->pdata;
			u->private_data_len = (uint8_t)npd;
		}
		struct ibv_qp *attach = NULL;

		if (type == RDMA_CM_EVENT_ESTABLISHED || type == RDMA_CM_EVENT_MULTICAST_JOIN) {
			u->qp_num = rqpn;
			u->qkey = qkey;
			u->ah_attr.is_global = 1;
			u->ah_attr.grh.dgid = rgid;
			u->ah_attr.grh.hop_limit = 64;
			u->ah_attr.grh.traffic_class = c->tos;
			u->ah_attr.port_num = c->id.port_num ? c->id.port_num : 1;
		}
		if (type == RDMA_CM_EVENT_MULTICAST_JOIN || type == RDMA_CM_EVENT_MULTICAST_ERROR) {
			/* A join's events carry its context; the QP attaches
			 * to the group now (rdma-core's ucma_process_join). */
			struct cm_mc *mc = find_mc(c, &rgid, NULL);

			u->private_data = mc ? mc->context : NULL;
			u->private_data_len = 0;
			if (type == RDMA_CM_EVENT_MULTICAST_JOIN && mc && !mc->send_only && !mc->attached && c->id.qp) {
				attach = c->id.qp;
				mc->attached = 1;
			}
		}
		pthread_mutex_unlock(&cm_mu);
		if (attach) {
			int err = ibv_attach_mcast(attach, &rgid, 0);

			if (err) {
				e->ev.event = RDMA_CM_EVENT_MULTICAST_ERROR;
				e->ev.status = -err;
				pthread_mutex_lock(&cm_mu);
				struct cm_mc *mc = find_mc(c, &rgid, NULL);
				if (mc)
					mc->attached = 0;
				pthread_mutex_unlock(&cm_mu);
			}
		}
		json_free(&d);
		return e;
	}
	if (npd > 0) {
		e->ev.param.conn.private_data = e->pdata;
		e->ev.param.conn.private_data_len = (uint8_t)npd;
	}
	e->ev.param.conn.responder_resources = c->dev ? c->dev->max_dest_rd_atom : 0;
	e->ev.param.conn.initiator_depth = c->dev ? c->dev->max_rd_atom : 0;
	e->ev.param.conn.retry_count = 7;
	e->ev.param.conn.rnr_retry_count = 7;
	e->ev.param.conn.qp_num = c->remote_qpn;
	pthread_mutex_unlock(&cm_mu);
	if (type == RDMA_CM_EVENT_REJECTED && c->id.qp) {
		struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };

		ibv_modify_qp(c->id.qp, &a, IBV_QP_STATE); /* as rdma-core does */
	}
	json_free(&d);
	return e;
unlock:
	pthread_mutex_unlock(&cm_mu);
out:
	free(e);
	json_free(&d);
	return NULL;
}

int rdma_get_cm_event(struct rdma_event_channel *channel, struct rdma_cm_event **event)
{
	struct cm_channel *ch = to_channel(channel);
	char *buf;

	if (channel && ((struct cm_channel *)channel)->magic == CHANNEL_DEAD) {
		/* Destroyed by another thread just before this call: had the
		 * call come a moment earlier, it would be blocked in its recv
		 * for good (below); it waits as that reader does. A program's
		 * event thread that loops back for the next event while its
		 * main thread tears down (rping's cm_thread) then waits for the
		 * exit instead of failing it with EBADF. */
		for (;;)
			pause();
	}
	if (!ch || !event)
		return cm_fail(EINVAL);
	buf = malloc(EVENT_MAX);
	if (!buf)
		return cm_fail(ENOMEM);
	for (;;) {
		struct cm_event *e;
		ssize_t n = recv(ch->ch.fd, buf, EVENT_MAX, MSG_TRUNC);

		if (n < 0 && errno == EINTR)
			continue;
		if ((n <= 0) && ((struct cm_channel *)channel)->magic == CHANNEL_DEAD) {
			free(buf);
			for (;;)
				pause(); /* destroyed under this reader: as the kernel's, it never returns */
		}
		if (n < 0) {
			int err = errno; /* EAGAIN on a non-blocking fd, as the kernel's */

			free(buf);
			return cm_fail(err);
		}
		if (n == 0) {
			free(buf);
			return cm_fail(ENODEV); /* the agent closed the channel: it is gone */
		}
		if (n > EVENT_MAX)
			continue; /* not an event of the agent's */
		e = make_event(buf, (int)n);
		if (!e)
			continue;
		free(buf);
		*event = &e->ev;
		return 0;
	}
}

int rdma_ack_cm_event(struct rdma_cm_event *event)
{
	struct cm_event *e = (struct cm_event *)event;

	if (!e)
		return cm_fail(EINVAL);
	pthread_mutex_lock(&cm_mu);
	if (e->owner && e->owner->events_out > 0)
		e->owner->events_out--;
	pthread_cond_broadcast(&cm_acked);
	pthread_mutex_unlock(&cm_mu);
	free(e);
	return 0;
}

const char *rdma_event_str(enum rdma_cm_event_type event)
{
	static const char *const names[] = {
		[RDMA_CM_EVENT_ADDR_RESOLVED] = "RDMA_CM_EVENT_ADDR_RESOLVED",
		[RDMA_CM_EVENT_ADDR_ERROR] = "RDMA_CM_EVENT_ADDR_ERROR",
		[RDMA_CM_EVENT_ROUTE_RESOLVED] = "RDMA_CM_EVENT_ROUTE_RESOLVED",
		[RDMA_CM_EVENT_ROUTE_ERROR] = "RDMA_CM_EVENT_ROUTE_ERROR",
		[RDMA_CM_EVENT_CONNECT_REQUEST] = "RDMA_CM_EVENT_CONNECT_REQUEST",
		[RDMA_CM_EVENT_CONNECT_RESPONSE] = "RDMA_CM_EVENT_CONNECT_RESPONSE",
		[RDMA_CM_EVENT_CONNECT_ERROR] = "RDMA_CM_EVENT_CONNECT_ERROR",
		[RDMA_CM_EVENT_UNREACHABLE] = "RDMA_CM_EVENT_UNREACHABLE",
		[RDMA_CM_EVENT_REJECTED] = "RDMA_CM_EVENT_REJECTED",
		[RDMA_CM_EVENT_ESTABLISHED] = "RDMA_CM_EVENT_ESTABLISHED",
		[RDMA_CM_EVENT_DISCONNECTED] = "RDMA_CM_EVENT_DISCONNECTED",
		[RDMA_CM_EVENT_DEVICE_REMOVAL] = "RDMA_CM_EVENT_DEVICE_REMOVAL",
		[RDMA_CM_EVENT_MULTICAST_JOIN] = "RDMA_CM_EVENT_MULTICAST_JOIN",
		[RDMA_CM_EVENT_MULTICAST_ERROR] = "RDMA_CM_EVENT_MULTICAST_ERROR",
		[RDMA_CM_EVENT_ADDR_CHANGE] = "RDMA_CM_EVENT_ADDR_CHANGE",
		[RDMA_CM_EVENT_TIMEWAIT_EXIT] = "RDMA_CM_EVENT_TIMEWAIT_EXIT",
	};

	if ((unsigned)event < sizeof(names) / sizeof(names[0]) && names[event])
		return names[event];
	return "UNKNOWN EVENT";
}

/* ---- endpoints (rdma_create_ep: synchronous IDs) ---- */

/* ---- Multicast ---- */

/* mcast_gid is the GID of the multicast group at address a, as rdma_cm
 * gives it on RoCE (an IPv4 group's IPv4-mapped address, an IPv6 group's
 * own); -1 when a is not a multicast address. */
static int mcast_gid(const struct sockaddr *a, union ibv_gid *g)
{
	memset(g, 0, sizeof(*g));
	if (a->sa_family == AF_INET) {
		const uint8_t *ip = (const uint8_t *)&((const struct sockaddr_in *)a)->sin_addr;

		if ((ip[0] & 0xf0) != 0xe0)
			return -1;
		g->raw[10] = g->raw[11] = 0xff;
		memcpy(g->raw + 12, ip, 4);
		return 0;
	}
	if (a->sa_family == AF_INET6 && ((const struct sockaddr_in6 *)a)->sin6_addr.s6_addr[0] == 0xff) {
		memcpy(g->raw, &((const struct sockaddr_in6 *)a)->sin6_addr, 16);
		return 0;
	}
	return -1;
}

/* find_mc is c's join of the group with GID g; with prev, also the link
 * that points to it. Called with cm_mu held. */
static struct cm_mc *find_mc(struct cm_id *c, const union ibv_gid *g, struct cm_mc ***prev)
{
	for (struct cm_mc **p = &c->mcs; *p; p = &(*p)->next) {
		if (!memcmp(&(*p)->mgid, g, sizeof(*g))) {
			if (prev)
				*prev = p;
			return *p;
		}
	}
	return NULL;
}

/* join asks the agent to join c to the group at addr (cm-join):
 * MULTICAST_JOIN follows on c's channel. */
static int join(struct cm_id *c, struct sockaddr *addr, void *context, int send_only)
{
	char body[256], ip[INET6_ADDRSTRLEN];
	struct cm_mc *mc;
	union ibv_gid g;
	struct jbuf b;
	socklen_t n = addr_len(addr);

	if (!n || mcast_gid(addr, &g))
		return cm_fail(EINVAL); /* not a multicast group's address */
	if (!c->dev)
		return cm_fail(EINVAL); /* rdma_bind_addr or rdma_resolve_addr first, as rdma-core asks */
	mc = calloc(1, sizeof(*mc));
	if (!mc)
		return cm_fail(ENOMEM);
	memcpy(&mc->addr, addr, n);
	mc->mgid = g;
	mc->context = context;
	mc->send_only = send_only;
	pthread_mutex_lock(&cm_mu);
	if (find_mc(c, &g, NULL)) {
		pthread_mutex_unlock(&cm_mu);
		free(mc);
		return cm_fail(EADDRINUSE); /* joined already, as the kernel says */
	}
	mc->next = c->mcs;
	c->mcs = mc;
	pthread_mutex_unlock(&cm_mu);
	if (addr->sa_family == AF_INET)
		inet_ntop(AF_INET, &((struct sockaddr_in *)addr)->sin_addr, ip, sizeof(ip));
	else
		inet_ntop(AF_INET6, &((struct sockaddr_in6 *)addr)->sin6_addr, ip, sizeof(ip));
	jb_init(&b, body, sizeof(body));
	jb_raw(&b, "{");
	jb_u64(&b, "channel", channel_handle(c));
	jb_u64(&b, "cookie", c->cookie);
	jb_str(&b, "adapter", c->dev->name);
	jb_str(&b, "group", ip);
	jb_raw(&b, "}");
	if (b.err || call(VRDMA_OP_CM_JOIN, body, NULL, NULL)) {
		int err = b.err ? EINVAL : errno;
		struct cm_mc **p;

		pthread_mutex_lock(&cm_mu);
		if (find_mc(c, &g, &p) == mc)
			*p = mc->next;
		pthread_mutex_unlock(&cm_mu);
		free(mc);
		return cm_fail(err);
	}
	return complete(c);
}

int rdma_join_multicast(struct rdma_cm_id *id, struct sockaddr *addr, void *context)
{
	struct cm_id *c = to_id(id);

	if (!c || !addr)
		return cm_fail(EINVAL);
	return join(c, addr, context, 0);
}

int rdma_join_multicast_ex(struct rdma_cm_id *id, struct rdma_cm_join_mc_attr_ex *attr, void *context)
{
	struct cm_id *c = to_id(id);
	const uint32_t need = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;

	if (!c || !attr || (attr->comp_mask & need) != need || attr->comp_mask & ~need || !attr->addr)
		return cm_fail(EINVAL);
	switch (attr->join_flags) {
	case RDMA_MC_JOIN_FLAG_FULLMEMBER:
		return join(c, attr->addr, context, 0);
	case RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER:
		return join(c, attr->addr, context, 1); /* sends to the group, is not attached to it */
	}
	return cm_fail(EINVAL);
}

int rdma_leave_multicast(struct rdma_cm_id *id, struct sockaddr *addr)
{
	struct cm_id *c = to_id(id);
	struct cm_mc *mc, **p;
	union ibv_gid g;
	int attached;

	if (!c || !addr || !addr_len(addr) || mcast_gid(addr, &g))
		return cm_fail(EINVAL);
	pthread_mutex_lock(&cm_mu);
	mc = find_mc(c, &g, &p);
	if (!mc) {
		pthread_mutex_unlock(&cm_mu);
		return cm_fail(EADDRNOTAVAIL); /* not joined, as librdmacm says */
	}
	*p = mc->next;
	attached = mc->attached;
	pthread_mutex_unlock(&cm_mu);
	if (attached && c->id.qp)
		ibv_detach_mcast(c->id.qp, &g, 0);
	free(mc);
	return 0;
}

int rdma_create_ep(struct rdma_cm_id **id, struct rdma_addrinfo *res, struct ibv_pd *pd,
		   struct ibv_qp_init_attr *qp_init_attr)
{
	struct rdma_cm_id *cid;
	struct cm_id *c;

	if (!id || !res)
		return cm_fail(EINVAL);
	if (rdma_create_id(NULL, &cid, NULL, (enum rdma_port_space)res->ai_port_space))
		return -1;
	c = to_id(cid);
	if (res->ai_flags & RAI_PASSIVE) {
		if (res->ai_src_addr && rdma_bind_addr(cid, res->ai_src_addr))
			goto err;
		if (pd)
			cid->pd = pd;
		if (qp_init_attr) {
			c->qp_init_attr = malloc(sizeof(*qp_init_attr));
			if (!c->qp_init_attr) {
				errno = ENOMEM;
				goto err;
			}
			*c->qp_init_attr = *qp_init_attr;
			c->qp_init_attr->qp_type = (enum ibv_qp_type)res->ai_qp_type;
		}
		*id = cid;
		return 0;
	}
	if (rdma_resolve_addr(cid, res->ai_src_addr, res->ai_dst_addr, 2000) || rdma_resolve_route(cid, 2000))
		goto err;
	if (qp_init_attr) {
		qp_init_attr->qp_type = (enum ibv_qp_type)res->ai_qp_type;
		if (rdma_create_qp(cid, pd, qp_init_attr))
			goto err;
	}
	*id = cid;
	return 0;
err: {
	int e = errno;

	rdma_destroy_ep(cid);
	errno = e;
	return -1;
}
}

void rdma_destroy_ep(struct rdma_cm_id *id)
{
	if (!to_id(id))
		return;
	if (id->qp)
		rdma_destroy_qp(id);
	rdma_destroy_id(id);
}
