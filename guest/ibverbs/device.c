// SPDX-License-Identifier: Apache-2.0
/*
 * Devices: the process's VM (env VRDMA_VM) and its adapters, which are the
 * devices vrdma0 ... of ibv_get_device_list; contexts and the query verbs.
 *
 * One session per process attaches the VM on the first ibv_get_device_list
 * (wire-local.md §9) and lives as long as the process: the devices it lists
 * stay valid after ibv_free_device_list, as rdma-core's do.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vrdma.h"

/* What follows struct ibv_device in a device: rdma-core's providers read
 * a struct verbs_device_ops there, which begins with the driver's name. */
struct vrdma_device_ops {
	const char *name;
};
static const struct vrdma_device_ops vrdma_device_ops = { .name = "vrdma" };

static pthread_mutex_t vm_mu = PTHREAD_MUTEX_INITIALIZER;
static struct vrdma_vm *the_vm;  /* +guarded by vm_mu; never freed */
static int vm_tried;             /* attach was attempted (success or not) */
static int vm_errno;             /* why there is no VM */

void vrdma_warn(const char *fmt, ...)
{
	va_list ap;

	if (getenv("VRDMA_QUIET"))
		return;
	fputs("libibverbs-vrdma: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

int vrdma_parse_gid(const char *s, union ibv_gid *gid)
{
	struct in_addr a4;

	memset(gid, 0, sizeof(*gid));
	if (!*s)
		return 0;
	if (inet_pton(AF_INET6, s, gid->raw) == 1)
		return 0;
	if (inet_pton(AF_INET, s, &a4) == 1) {
		gid->raw[10] = gid->raw[11] = 0xff;
		memcpy(gid->raw + 12, &a4, 4);
		return 0;
	}
	return -1;
}

void vrdma_format_gid(const union ibv_gid *gid, char *buf, size_t n)
{
	if (!inet_ntop(AF_INET6, gid->raw, buf, (socklen_t)n) && n)
		buf[0] = 0;
}

int vrdma_mtu_enum(uint32_t bytes)
{
	switch (bytes) {
	case 256: return IBV_MTU_256;
	case 512: return IBV_MTU_512;
	case 1024: return IBV_MTU_1024;
	case 2048: return IBV_MTU_2048;
	case 4096: return IBV_MTU_4096;
	}
	return 0;
}

uint32_t vrdma_mtu_bytes(int mtu)
{
	return mtu >= IBV_MTU_256 && mtu <= IBV_MTU_4096 ? 128u << mtu : 0;
}

/* parse_guid reads "xxxx:xxxx:xxxx:xxxx" into network order. */
static int parse_guid(const char *s, __be64 *guid)
{
	uint64_t v = 0;
	int digits = 0;

	for (; *s; s++) {
		int h;

		if (*s == ':')
			continue;
		if (*s >= '0' && *s <= '9')
			h = *s - '0';
		else if (*s >= 'a' && *s <= 'f')
			h = *s - 'a' + 10;
		else if (*s >= 'A' && *s <= 'F')
			h = *s - 'A' + 10;
		else
			return -1;
		v = v << 4 | (uint64_t)h;
		digits++;
	}
	if (digits != 16)
		return -1;
	*guid = htobe64(v);
	return 0;
}

/* adapter_body writes {"adapter":NAME}. */
static void adapter_body(const struct vrdma_device *d, char *buf, size_t n)
{
	struct jbuf b;

	jb_init(&b, buf, n);
	jb_raw(&b, "{");
	jb_str(&b, "adapter", d->adapter);
	jb_raw(&b, "}");
}

/* call_adapter runs a query op for d; 0 with r to free, or an errno. */
static int call_adapter(struct vrdma_device *d, int op, struct vrdma_reply *r)
{
	char body[64];

	if (!the_vm)
		return ENODEV;
	adapter_body(d, body, sizeof(body));
	if (vrdma_call(&the_vm->s, op, body, r))
		return errno;
	if (r->is_error) {
		int e = r->err;

		vrdma_reply_free(r);
		return e;
	}
	return 0;
}

static int fetch_device_attr(struct vrdma_device *d, struct ibv_device_attr *a)
{
	struct vrdma_reply r;
	const struct json_doc *j = &r.doc;
	char s[64];
	uint32_t u;
	int e = call_adapter(d, VRDMA_OP_QUERY_DEVICE, &r);

	if (e)
		return e;
	memset(a, 0, sizeof(*a));
	json_get_str(j, 0, "fw_ver", a->fw_ver, sizeof(a->fw_ver));
	if (json_get_str(j, 0, "node_guid", s, sizeof(s)) || parse_guid(s, &a->node_guid) ||
	    json_get_str(j, 0, "sys_image_guid", s, sizeof(s)) || parse_guid(s, &a->sys_image_guid) ||
	    json_get_u64(j, 0, "max_mr_size", &a->max_mr_size) ||
	    json_get_u64(j, 0, "page_size_cap", &a->page_size_cap) ||
	    json_get_u32(j, 0, "vendor_id", &a->vendor_id) ||
	    json_get_u32(j, 0, "vendor_part_id", &a->vendor_part_id) ||
	    json_get_u32(j, 0, "hw_ver", &a->hw_ver)) {
		vrdma_reply_free(&r);
		return EIO;
	}
#define INT_FIELD(name, field)                                            \
	do {                                                              \
		if (json_get_u32(j, 0, name, &u) || u > INT32_MAX) {      \
			vrdma_reply_free(&r);                             \
			return EIO;                                       \
		}                                                         \
		a->field = (int)u;                                        \
	} while (0)
	INT_FIELD("max_qp", max_qp);
	INT_FIELD("max_qp_wr", max_qp_wr);
	INT_FIELD("max_sge", max_sge);
	INT_FIELD("max_cq", max_cq);
	INT_FIELD("max_cqe", max_cqe);
	INT_FIELD("max_mr", max_mr);
	INT_FIELD("max_pd", max_pd);
	INT_FIELD("max_qp_rd_atom", max_qp_rd_atom);
	INT_FIELD("max_qp_init_rd_atom", max_qp_init_rd_atom);
	INT_FIELD("max_srq", max_srq);
#undef INT_FIELD
	/* SRQ sizes: an agent without the srq bit sends none and has no SRQs. */
	if (json_get_u32(j, 0, "max_srq_wr", &u) == 0 && u <= INT32_MAX)
		a->max_srq_wr = (int)u;
	if (json_get_u32(j, 0, "max_srq_sge", &u) == 0 && u <= INT32_MAX)
		a->max_srq_sge = (int)u;
	if (!a->max_srq_wr || !a->max_srq_sge)
		a->max_srq = 0;
	/* Address handles: an agent without the ud bit sends none. */
	if (json_get_u32(j, 0, "max_ah", &u) == 0 && u <= INT32_MAX)
		a->max_ah = (int)u;
	/* Memory windows: an agent without the mw bit sends none. */
	if (json_get_u32(j, 0, "max_mw", &u) == 0 && u <= INT32_MAX)
		a->max_mw = (int)u;
	/* Multicast: an agent without the mcast bit sends none. */
	if (json_get_u32(j, 0, "max_mcast_grp", &u) == 0 && u <= INT32_MAX)
		a->max_mcast_grp = (int)u;
	if (json_get_u32(j, 0, "max_mcast_qp_attach", &u) == 0 && u <= INT32_MAX)
		a->max_mcast_qp_attach = (int)u;
	if (json_get_u32(j, 0, "max_total_mcast_qp_attach", &u) == 0 && u <= INT32_MAX)
		a->max_total_mcast_qp_attach = (int)u;
	if (json_get_u32(j, 0, "phys_port_cnt", &u) || u > 255) {
		vrdma_reply_free(&r);
		return EIO;
	}
	a->phys_port_cnt = (uint8_t)u;
	json_get_str(j, 0, "atomic_cap", s, sizeof(s));
	a->atomic_cap = !strcmp(s, "ATOMIC_HCA") ? IBV_ATOMIC_HCA : !strcmp(s, "ATOMIC_GLOB") ? IBV_ATOMIC_GLOB
											  : IBV_ATOMIC_NONE;
	vrdma_reply_free(&r);
	/* What follows from the agent's rules rather than a member. */
	a->max_sge_rd = a->max_sge;
	a->max_res_rd_atom = a->max_qp * a->max_qp_rd_atom;
	a->max_pkeys = 1;
	/* It answers RNR NAKs when no receive is posted (wire-local.md §8);
	 * sys_image_guid is the VM's; PORT_ACTIVE comes on async_fd when the
	 * adapter is connected again (an agent with async-events); memory
	 * windows of type 1 and 2B (an agent with mw, which says max_mw); XRC
	 * (an agent with xrc). Not SRQ_RESIZE, N_NOTIFY_CQ: vrdma has none of
	 * them.
	 * CQ resize, rereg and solicited events have no flag: a device that
	 * lacks them says so with EOPNOTSUPP, as vrdma does before core-verbs. */
	a->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_SYS_IMAGE_GUID;
	if (the_vm && (the_vm->s.caps & VRDMA_CAP_ASYNC_EVENTS))
		a->device_cap_flags |= IBV_DEVICE_PORT_ACTIVE_EVENT;
	if (a->max_mw)
		a->device_cap_flags |= IBV_DEVICE_MEM_WINDOW | IBV_DEVICE_MEM_WINDOW_TYPE_2B;
	if (the_vm && (the_vm->s.caps & VRDMA_CAP_XRC))
		a->device_cap_flags |= IBV_DEVICE_XRC; /* XRC domains, SRQs and QPs (wire-local.md §4.18) */
	return 0;
}

/* fetch_port_attr reads the port's attributes, its GID (index 0) and, when
 * native is not NULL, the GID of native endpoints (index NATIVE_GID_INDEX:
 * all zero when the adapter has none). */
static int fetch_port_attr(struct vrdma_device *d, struct ibv_port_attr *p, union ibv_gid *gid, union ibv_gid *native)
{
	struct vrdma_reply r;
	const struct json_doc *j = &r.doc;
	char s[64];
	uint32_t u;
	int flags, i, e = call_adapter(d, VRDMA_OP_QUERY_PORT, &r);

	if (e)
		return e;
	memset(p, 0, sizeof(*p));
	json_get_str(j, 0, "state", s, sizeof(s));
	p->state = !strcmp(s, "PORT_ACTIVE")	   ? IBV_PORT_ACTIVE
		   : !strcmp(s, "PORT_DOWN")	   ? IBV_PORT_DOWN
		   : !strcmp(s, "PORT_INIT")	   ? IBV_PORT_INIT
		   : !strcmp(s, "PORT_ARMED")	   ? IBV_PORT_ARMED
		   : !strcmp(s, "PORT_ACTIVE_DEFER") ? IBV_PORT_ACTIVE_DEFER
						   : IBV_PORT_NOP;
	if (json_get_u32(j, 0, "max_mtu", &u) || !vrdma_mtu_enum(u))
		goto bad;
	p->max_mtu = (enum ibv_mtu)vrdma_mtu_enum(u);
	if (json_get_u32(j, 0, "active_mtu", &u) || !vrdma_mtu_enum(u))
		goto bad;
	p->active_mtu = (enum ibv_mtu)vrdma_mtu_enum(u);
	if (json_get_u32(j, 0, "gid_tbl_len", &u) || u > INT32_MAX)
		goto bad;
	p->gid_tbl_len = (int)u;
	json_get_str(j, 0, "link_layer", s, sizeof(s));
	p->link_layer = !strcmp(s, "Ethernet") ? IBV_LINK_LAYER_ETHERNET : IBV_LINK_LAYER_INFINIBAND;
	if (json_get_str(j, 0, "gid", s, sizeof(s)) || vrdma_parse_gid(s, gid))
		goto bad;
	if (native) {
		memset(native, 0, sizeof(*native));
		if (json_get_str(j, 0, "native_gid", s, sizeof(s)) == 0 && vrdma_parse_gid(s, native))
			goto bad;
	}
	flags = json_get(j, 0, "port_cap_flags");
	for (i = 0; json_elem(j, flags, i) >= 0; i++) {
		if (json_str(j, json_elem(j, flags, i), s, sizeof(s)))
			continue;
		if (!strcmp(s, "CM_SUP"))
			p->port_cap_flags |= IBV_PORT_CM_SUP;
		else if (!strcmp(s, "IP_BASED_GIDS"))
			p->port_cap_flags |= IBV_PORT_IP_BASED_GIDS;
	}
	vrdma_reply_free(&r);
	/* The agent's fixed rules (wire-local.md §5.2: a message above 2 GiB
	 * fails with LOC_LEN_ERR; one pkey, no LIDs on Ethernet). */
	p->max_msg_sz = 0x80000000u;
	p->pkey_tbl_len = 1;
	p->max_vl_num = 1;
	p->phys_state = p->state == IBV_PORT_ACTIVE ? 5 /* LinkUp */ : 3 /* Disabled */;
	/* A virtual link has no lanes: report the narrowest, slowest ones
	 * rather than a speed it does not have. */
	p->active_width = 1; /* 1X */
	p->active_speed = 1; /* 2.5 Gbps */
	return 0;
bad:
	vrdma_reply_free(&r);
	return EIO;
}

static struct vrdma_vm *attach(int *err)
{
	const char *name = getenv("VRDMA_VM");
	char path[256], body[160];
	struct vrdma_vm *vm;
	struct vrdma_reply r;
	struct jbuf b;
	struct stat st;
	int ads, i;

	if (!name || !*name) {
		vrdma_warn("VRDMA_VM is not set: no devices (run the program with VRDMA_VM=<vm name>, or "
			   "under vrdmactl exec)");
		*err = ENODEV;
		return NULL;
	}
	vm = calloc(1, sizeof(*vm));
	if (!vm) {
		*err = ENOMEM;
		return NULL;
	}
	vm->mem_fd = -1;
	vrdma_socket_path(path, sizeof(path));
	if (vrdma_session_open(&vm->s, path)) {
		*err = errno;
		vrdma_warn("no host agent at %s: %s (%s)", path, strerror(*err),
			   *err == EACCES ? "the socket is its group's: join the group (usermod -aG vrdma USER), or ask root" :
					     "is vrdmad running? VRDMA_SOCKET names another socket");
		free(vm);
		return NULL;
	}
	jb_init(&b, body, sizeof(body));
	jb_raw(&b, "{");
	jb_str(&b, "client", VRDMA_CLIENT);
	jb_u64(&b, "caps", vrdma_hello_caps());
	jb_raw(&b, "}");
	if (vrdma_call(&vm->s, VRDMA_OP_HELLO, body, &r))
		goto fail_errno;
	if (!r.is_error)
		json_get_u64(&r.doc, 0, "caps", &vm->s.caps);
	vrdma_reply_free(&r);

	jb_init(&b, body, sizeof(body));
	jb_raw(&b, "{");
	jb_str(&b, "vm", name);
	jb_raw(&b, "}");
	if (b.err) {
		*err = ENAMETOOLONG;
		goto fail;
	}
	if (vrdma_call(&vm->s, VRDMA_OP_ATTACH, body, &r))
		goto fail_errno;
	if (r.is_error) {
		*err = r.err;
		vrdma_warn("cannot attach VM %s: %s (%s)", name, r.message, r.code);
		vrdma_reply_free(&r);
		goto fail;
	}
	json_get_str(&r.doc, 0, "vm", vm->name, sizeof(vm->name));
	json_get_str(&r.doc, 0, "host", vm->host, sizeof(vm->host));
	json_bool(&r.doc, json_get(&r.doc, 0, "mem_locked"), &vm->mem_locked);
	json_bool(&r.doc, json_get(&r.doc, 0, "async_mode"), &vm->async_mode);
	if (json_get_u64(&r.doc, 0, "mem_size", &vm->mem_size) || vm->mem_size == 0 || r.nfds != 1 ||
	    fstat(r.fds[0], &st) || (uint64_t)st.st_size < vm->mem_size) {
		vrdma_warn("attach VM %s: the agent's reply is not usable (memory size or descriptor)", name);
		vrdma_reply_free(&r);
		*err = EIO;
		goto fail;
	}
	vm->mem = mmap(NULL, vm->mem_size, PROT_READ | PROT_WRITE, MAP_SHARED, r.fds[0], 0);
	if (vm->mem == MAP_FAILED) {
		*err = errno;
		vrdma_warn("attach VM %s: mapping %llu bytes of guest memory: %s", name,
			   (unsigned long long)vm->mem_size, strerror(errno));
		vrdma_reply_free(&r);
		goto fail;
	}
	(void)madvise(vm->mem, vm->mem_size, MADV_DONTFORK); /* see forget_parent */
	/* The memfd is kept: registering program memory maps it again over
	 * the program's pages (verbs.c). */
	vm->mem_fd = r.fds[0];
	r.fds[0] = -1;
	ads = json_get(&r.doc, 0, "adapters");
	for (i = 0; json_elem(&r.doc, ads, i) >= 0 && vm->ndev < VRDMA_MAX_ADAPTERS; i++) {
		int a = json_elem(&r.doc, ads, i);
		struct vrdma_device *d = calloc(1, sizeof(*d));
		uint64_t idx;
		char gid[64];

		if (!d)
			break;
		if (json_get_str(&r.doc, a, "name", d->adapter, sizeof(d->adapter)) ||
		    json_get_u64(&r.doc, a, "index", &idx) || idx > 99 ||
		    json_get_str(&r.doc, a, "gid", gid, sizeof(gid)) || vrdma_parse_gid(gid, &d->gid)) {
			free(d);
			continue;
		}
		d->index = (int)idx;
		json_get_str(&r.doc, a, "mac", d->mac, sizeof(d->mac));
		d->ops = &vrdma_device_ops;
		d->ibdev.node_type = IBV_NODE_CA;
		d->ibdev.transport_type = IBV_TRANSPORT_IB;
		snprintf(d->ibdev.name, sizeof(d->ibdev.name), "%s", d->adapter);
		snprintf(d->ibdev.dev_name, sizeof(d->ibdev.dev_name), "uverbs%d", d->index);
		snprintf(d->ibdev.dev_path, sizeof(d->ibdev.dev_path), "/sys/class/infiniband_verbs/uverbs%d",
			 d->index);
		snprintf(d->ibdev.ibdev_path, sizeof(d->ibdev.ibdev_path), "/sys/class/infiniband/%s", d->adapter);
		vm->devs[vm->ndev++] = d;
	}
	vrdma_reply_free(&r);
	the_vm = vm; /* call_adapter uses it */
	for (i = 0; i < vm->ndev; i++) {
		struct vrdma_device *d = vm->devs[i];
		int e = fetch_device_attr(d, &d->attr);

		if (e) {
			vrdma_warn("query-device %s: %s", d->adapter, strerror(e));
			continue;
		}
		d->node_guid = d->attr.node_guid;
		d->sys_image_guid = d->attr.sys_image_guid;
	}
	return vm;

fail_errno:
	*err = errno;
	vrdma_warn("host agent at %s: %s", path, strerror(errno));
fail:
	if (vm->s.fd >= 0)
		close(vm->s.fd);
	free(vm->s.buf);
	free(vm);
	return NULL;
}

struct vrdma_vm *vrdma_vm_get(void)
{
	struct vrdma_vm *vm;

	pthread_mutex_lock(&vm_mu);
	if (!vm_tried) {
		vm_tried = 1;
		if (!attach(&vm_errno))
			the_vm = NULL;
	}
	vm = the_vm;
	pthread_mutex_unlock(&vm_mu);
	if (!vm)
		errno = vm_errno ? vm_errno : ENODEV;
	return vm;
}

/*
 * fork: a child gets copies of the parent's session, guest memory and
 * objects, and may use none of them (rdma-core's children cannot use the
 * parent's contexts either): the agent serves the session's process, and
 * the guest memory and the rings are MADV_DONTFORK, so absent in the
 * child; registered pages become private copies there (mem.c), as on a
 * kernel that copies pinned pages at fork. The child forgets the rest
 * and closes its copies of the session's and the memory's descriptors, so
 * that the parent's session ends with the parent; its next
 * ibv_get_device_list opens a session of its own, which the agent joins to
 * the VM as another workload (wire-local.md §1.1). The parent's devices,
 * contexts and objects are then unknown to the library in the child, and
 * verbs on them fail with EINVAL. Locks another thread held at the fork
 * are made anew: what they guarded is forgotten with them.
 */
static void forget_parent(void)
{
	struct vrdma_vm *vm = the_vm;

	pthread_mutex_init(&vm_mu, NULL);
	vrdma_forget_memory(vm ? vm->mem_fd : -1);
	vrdma_forget_contexts();
	vrdma_forget_objects();
	vrdma_forget_direct();
	if (vm) {
		close(vm->s.fd);
		if (vm->mem_fd >= 0)
			close(vm->mem_fd);
	}
	the_vm = NULL;
	vm_tried = 0;
	vm_errno = 0;
}

__attribute__((constructor)) static void fork_handler(void)
{
	(void)pthread_atfork(NULL, NULL, forget_parent);
}

struct vrdma_device *vrdma_dev(struct ibv_device *dev)
{
	struct vrdma_vm *vm = the_vm;

	if (!dev || !vm)
		return NULL;
	for (int i = 0; i < vm->ndev; i++)
		if (&vm->devs[i]->ibdev == dev)
			return vm->devs[i];
	return NULL;
}

/* Contexts this library opened, so that a pointer from the program is
 * checked before it is used. */
static pthread_mutex_t ctx_mu = PTHREAD_MUTEX_INITIALIZER;
static struct vrdma_context **ctxs; /* +guarded by ctx_mu */
static int nctx, capctx;

void vrdma_forget_contexts(void)
{
	pthread_mutex_init(&ctx_mu, NULL);
	ctxs = NULL; /* the parent's; a realloc may have been under way */
	nctx = capctx = 0;
}

int vrdma_ctx_ok(struct ibv_context *c)
{
	int ok = 0;

	if (!c)
		return 0;
	pthread_mutex_lock(&ctx_mu);
	for (int i = 0; i < nctx; i++)
		if (&ctxs[i]->vctx.context == c)
			ok = 1;
	pthread_mutex_unlock(&ctx_mu);
	return ok;
}

struct ibv_device **ibv_get_device_list(int *num_devices)
{
	struct vrdma_vm *vm = vrdma_vm_get();
	int n = vm ? vm->ndev : 0;
	struct ibv_device **list = calloc((size_t)n + 1, sizeof(*list));

	if (!list) {
		errno = ENOMEM;
		return NULL;
	}
	for (int i = 0; i < n; i++)
		list[i] = &vm->devs[i]->ibdev;
	if (num_devices)
		*num_devices = n;
	return list;
}

void ibv_free_device_list(struct ibv_device **list)
{
	free(list);
}

const char *ibv_get_device_name(struct ibv_device *device)
{
	struct vrdma_device *d = vrdma_dev(device);

	if (!d) {
		errno = EINVAL;
		return NULL;
	}
	return d->ibdev.name;
}

__be64 ibv_get_device_guid(struct ibv_device *device)
{
	struct vrdma_device *d = vrdma_dev(device);

	if (!d) {
		errno = EINVAL;
		return 0;
	}
	return d->node_guid;
}

int ibv_get_device_index(struct ibv_device *device)
{
	struct vrdma_device *d = vrdma_dev(device);

	if (!d) {
		errno = EINVAL;
		return -1;
	}
	return d->index;
}

static int query_port_op(struct ibv_context *context, uint8_t port_num, struct ibv_port_attr *port_attr,
			 size_t port_attr_len)
{
	struct ibv_port_attr p;
	union ibv_gid gid;
	int e;

	if (!vrdma_ctx_ok(context) || !port_attr)
		return EINVAL;
	if (port_num != 1)
		return EINVAL;
	e = fetch_port_attr(to_vctx(context)->dev, &p, &gid, NULL);
	if (e)
		return e;
	memcpy(port_attr, &p, port_attr_len < sizeof(p) ? port_attr_len : sizeof(p));
	return 0;
}

/* odp_caps fills the on-demand paging capabilities of an agent with
 * capability odp: a region is on demand whatever reaches it, so every
 * operation of every transport vrdma has may target one (RC: SEND, RECV,
 * WRITE, READ, atomics, SRQ receives; UC: SEND, RECV, WRITE, SRQ
 * receives; UD: SEND, RECV, SRQ receives; XRC, from an agent with xrc:
 * SEND and the XRC SRQs' receives). Not IBV_ODP_SUPPORT_IMPLICIT:
 * the device reaches only guest memory, never the whole address space
 * (docs/verbs-compat.md). */
static void odp_caps(struct ibv_device_attr_ex *attr, size_t attr_size)
{
	if (attr_size < offsetof(struct ibv_device_attr_ex, odp_caps) + sizeof(attr->odp_caps))
		return;
	attr->odp_caps.general_caps = IBV_ODP_SUPPORT;
	attr->odp_caps.per_transport_caps.rc_odp_caps = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV |
							 IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ |
							 IBV_ODP_SUPPORT_ATOMIC | IBV_ODP_SUPPORT_SRQ_RECV;
	attr->odp_caps.per_transport_caps.uc_odp_caps = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV |
							 IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_SRQ_RECV;
	attr->odp_caps.per_transport_caps.ud_odp_caps = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV |
							 IBV_ODP_SUPPORT_SRQ_RECV;
	if (attr_size >= offsetof(struct ibv_device_attr_ex, xrc_odp_caps) + sizeof(attr->xrc_odp_caps) &&
	    (the_vm->s.caps & VRDMA_CAP_XRC))
		attr->xrc_odp_caps = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_SRQ_RECV;
}

static int query_device_ex_op(struct ibv_context *context, const struct ibv_query_device_ex_input *input,
			      struct ibv_device_attr_ex *attr, size_t attr_size)
{
	struct ibv_device_attr a;
	int e;

	if (!vrdma_ctx_ok(context) || !attr || attr_size < sizeof(attr->orig_attr))
		return EINVAL;
	if (input && input->comp_mask)
		return EINVAL;
	e = fetch_device_attr(to_vctx(context)->dev, &a);
	if (e)
		return e;
	memset(attr, 0, attr_size < sizeof(*attr) ? attr_size : sizeof(*attr));
	attr->orig_attr = a;
	if (attr_size >= offsetof(struct ibv_device_attr_ex, phys_port_cnt_ex) + sizeof(attr->phys_port_cnt_ex))
		attr->phys_port_cnt_ex = a.phys_port_cnt;
	/* As rdma-core fills it: the same flags, 64 bits wide. */
	if (attr_size >= offsetof(struct ibv_device_attr_ex, device_cap_flags_ex) + sizeof(attr->device_cap_flags_ex))
		attr->device_cap_flags_ex = (uint64_t)(unsigned int)a.device_cap_flags;
	if (the_vm->s.caps & VRDMA_CAP_ODP)
		odp_caps(attr, attr_size);
	return 0;
}

struct ibv_context *ibv_open_device(struct ibv_device *device)
{
	struct vrdma_device *d = vrdma_dev(device);
	struct vrdma_context *c;

	if (!d) {
		errno = ENODEV;
		return NULL;
	}
	if (the_vm->s.dead) {
		errno = EIO; /* the agent is gone: as uverbs after a disassociation */
		return NULL;
	}
	c = calloc(1, sizeof(*c));
	if (!c) {
		errno = ENOMEM;
		return NULL;
	}
	c->dev = d;
	c->vctx.sz = sizeof(c->vctx);
	c->vctx.query_port = query_port_op;
	c->vctx.query_device_ex = query_device_ex_op;
	c->vctx.context.device = &d->ibdev;
	/* No uverbs device behind it: cmd_fd is an empty memfd of its own, a
	 * valid descriptor for programs that dup or poll it, whose inode
	 * names the context to ibv_import_device. */
	c->vctx.context.cmd_fd = memfd_create("vrdma-context", MFD_CLOEXEC);
	/* async_fd is the agent's event socket for this adapter (events.c);
	 * an agent without one gets an fd that never becomes readable, so
	 * that programs may poll it all the same. */
	c->vctx.context.async_fd = vrdma_async_open(d);
	if (c->vctx.context.async_fd < 0)
		c->vctx.context.async_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (c->vctx.context.async_fd < 0) {
		int e = errno;

		free(c);
		errno = e;
		return NULL;
	}
	c->vctx.context.num_comp_vectors = 1;
	c->vctx.context.abi_compat = __VERBS_ABI_IS_EXTENDED;
	pthread_mutex_init(&c->vctx.context.mutex, NULL);
	vrdma_set_ops(c);
	pthread_mutex_lock(&ctx_mu);
	if (nctx == capctx) {
		int cap = capctx ? capctx * 2 : 8;
		struct vrdma_context **n = realloc(ctxs, (size_t)cap * sizeof(*n));

		if (!n) {
			pthread_mutex_unlock(&ctx_mu);
			close(c->vctx.context.async_fd);
			free(c);
			errno = ENOMEM;
			return NULL;
		}
		ctxs = n;
		capctx = cap;
	}
	ctxs[nctx++] = c;
	pthread_mutex_unlock(&ctx_mu);
	return &c->vctx.context;
}

/* ibv_import_device opens a second context on the adapter of the context
 * whose cmd_fd (a dup of it, as a program passes it) is cmd_fd; the new
 * context owns cmd_fd, as rdma-core's does. Only this process's contexts
 * are found: the agent's objects are a session's, one per process, so a
 * descriptor from another process gets EOPNOTSUPP, as a device that
 * cannot import answers. */
struct ibv_context *ibv_import_device(int cmd_fd)
{
	struct vrdma_device *d = NULL;
	struct ibv_context *c;
	struct stat want, st;

	if (fstat(cmd_fd, &want)) {
		errno = EBADF;
		return NULL;
	}
	pthread_mutex_lock(&ctx_mu);
	for (int i = 0; i < nctx && !d; i++)
		if (!fstat(ctxs[i]->vctx.context.cmd_fd, &st) && st.st_dev == want.st_dev && st.st_ino == want.st_ino)
			d = ctxs[i]->dev;
	pthread_mutex_unlock(&ctx_mu);
	if (!d) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	c = ibv_open_device(&d->ibdev);
	if (!c)
		return NULL;
	close(c->cmd_fd);
	c->cmd_fd = cmd_fd;
	return c;
}

int ibv_close_device(struct ibv_context *context)
{
	struct vrdma_context *c = NULL;
	int last;

	pthread_mutex_lock(&ctx_mu);
	for (int i = 0; i < nctx; i++) {
		if (&ctxs[i]->vctx.context == context) {
			c = ctxs[i];
			ctxs[i] = ctxs[--nctx];
			break;
		}
	}
	last = nctx == 0;
	pthread_mutex_unlock(&ctx_mu);
	if (!c) {
		errno = EINVAL;
		return -1;
	}
	if (last)
		vrdma_direct_idle(); /* the memcpy-direct reader stops if no grant is held */
	close(c->vctx.context.async_fd);
	if (c->vctx.context.cmd_fd >= 0)
		close(c->vctx.context.cmd_fd);
	pthread_mutex_destroy(&c->vctx.context.mutex);
	free(c);
	return 0;
}

int ibv_query_device(struct ibv_context *context, struct ibv_device_attr *device_attr)
{
	if (!vrdma_ctx_ok(context) || !device_attr)
		return EINVAL;
	return fetch_device_attr(to_vctx(context)->dev, device_attr);
}

/* The exported ibv_query_port takes rdma-core's old, shorter struct;
 * <infiniband/verbs.h> routes programs to the verbs_context op. */
#undef ibv_query_port
struct _compat_ibv_port_attr;
int ibv_query_port(struct ibv_context *context, uint8_t port_num, struct _compat_ibv_port_attr *port_attr);
int ibv_query_port(struct ibv_context *context, uint8_t port_num, struct _compat_ibv_port_attr *port_attr)
{
	return query_port_op(context, port_num, (struct ibv_port_attr *)port_attr,
			     offsetof(struct ibv_port_attr, port_cap_flags2));
}

/* NATIVE_GID_INDEX is the GID table entry of an adapter with native
 * endpoints that holds its host's RDMA uplink address (abi.NativeGIDIndex). */
#define NATIVE_GID_INDEX 1

/* query_gid fills entry for (port, index); an errno on failure. */
static int query_gid(struct ibv_context *context, uint32_t port_num, uint32_t index, struct ibv_gid_entry *e)
{
	static const union ibv_gid zero;
	struct ibv_port_attr p;
	union ibv_gid gid, native;
	int rc;

	if (!vrdma_ctx_ok(context) || !e)
		return EINVAL;
	if (port_num != 1)
		return EINVAL;
	rc = fetch_port_attr(to_vctx(context)->dev, &p, &gid, &native);
	if (rc)
		return rc;
	if (index >= (uint32_t)p.gid_tbl_len)
		return EINVAL;
	if (index == NATIVE_GID_INDEX && memcmp(&native, &zero, sizeof(zero)))
		gid = native; /* the address native endpoints reach the adapter at */
	else if (index > 0)
		return ENODATA; /* an empty entry */
	memset(e, 0, sizeof(*e));
	e->gid = gid;
	e->gid_index = index;
	e->port_num = port_num;
	/* RoCE v2: the agent's GIDs are IP addresses (IP_BASED_GIDS) and its
	 * packets UDP/4791 (docs/wire-rdma.md). */
	e->gid_type = IBV_GID_TYPE_ROCE_V2;
	return 0;
}

int ibv_query_gid(struct ibv_context *context, uint8_t port_num, int index, union ibv_gid *gid)
{
	struct ibv_gid_entry e;
	int rc;

	if (!gid || index < 0) {
		errno = EINVAL;
		return -1;
	}
	rc = query_gid(context, port_num, (uint32_t)index, &e);
	if (rc == ENODATA) {
		memset(gid, 0, sizeof(*gid)); /* as rdma-core reads an empty entry */
		return 0;
	}
	if (rc) {
		errno = rc;
		return -1;
	}
	*gid = e.gid;
	return 0;
}

int _ibv_query_gid_ex(struct ibv_context *context, uint32_t port_num, uint32_t gid_index,
		      struct ibv_gid_entry *entry, uint32_t flags, size_t entry_size)
{
	struct ibv_gid_entry e;
	int rc;

	if (flags || !entry || entry_size < sizeof(e))
		return EINVAL;
	rc = query_gid(context, port_num, gid_index, &e);
	if (rc)
		return rc;
	memcpy(entry, &e, sizeof(e));
	return 0;
}

ssize_t _ibv_query_gid_table(struct ibv_context *context, struct ibv_gid_entry *entries, size_t max_entries,
			     uint32_t flags, size_t entry_size)
{
	struct ibv_port_attr p;
	union ibv_gid gid;
	size_t n = 0;
	int rc;

	if (!vrdma_ctx_ok(context) || flags || (max_entries && !entries) || entry_size < sizeof(*entries))
		return -EINVAL;
	rc = fetch_port_attr(to_vctx(context)->dev, &p, &gid, NULL);
	if (rc)
		return -rc;
	for (uint32_t i = 0; i < (uint32_t)p.gid_tbl_len; i++) {
		struct ibv_gid_entry e;

		if (query_gid(context, 1, i, &e))
			continue; /* an empty entry */
		if (n == max_entries)
			return -EINVAL; /* as rdma-core: the table does not fit */
		memcpy((char *)entries + n * entry_size, &e, sizeof(e));
		n++;
	}
	return (ssize_t)n;
}

/* enum ibv_gid_type_sysfs of rdma-core's driver.h: 0 IB or RoCE v1, 1 RoCE v2. */
int ibv_query_gid_type(struct ibv_context *context, uint8_t port_num, unsigned int index, int *type);
int ibv_query_gid_type(struct ibv_context *context, uint8_t port_num, unsigned int index, int *type)
{
	struct ibv_gid_entry e;
	int rc;

	if (!type) {
		errno = EINVAL;
		return -1;
	}
	rc = query_gid(context, port_num, index, &e);
	if (rc) {
		errno = rc;
		return -1;
	}
	*type = 1;
	return 0;
}

int ibv_query_pkey(struct ibv_context *context, uint8_t port_num, int index, __be16 *pkey)
{
	if (!vrdma_ctx_ok(context) || !pkey || port_num != 1 || index != 0) {
		errno = EINVAL;
		return -1;
	}
	*pkey = htobe16(0xffff); /* the default partition, the only one */
	return 0;
}

int ibv_get_pkey_index(struct ibv_context *context, uint8_t port_num, __be16 pkey)
{
	if (!vrdma_ctx_ok(context) || port_num != 1) {
		errno = EINVAL;
		return -1;
	}
	if ((be16toh(pkey) & 0x7fff) != 0x7fff) {
		errno = ENOENT;
		return -1;
	}
	return 0;
}

/* virtual_sysfs answers the files of a device's ibdev_path, which exist
 * only for this library (there is no kernel device). */
static int virtual_sysfs(struct vrdma_device *d, const char *file, char *out, size_t n)
{
	char v[128];
	uint64_t g;

	if (!strcmp(file, "node_type")) {
		snprintf(v, sizeof(v), "1: CA");
	} else if (!strcmp(file, "node_guid") || !strcmp(file, "sys_image_guid")) {
		g = be64toh(!strcmp(file, "node_guid") ? d->node_guid : d->sys_image_guid);
		snprintf(v, sizeof(v), "%04x:%04x:%04x:%04x", (unsigned)(g >> 48) & 0xffff,
			 (unsigned)(g >> 32) & 0xffff, (unsigned)(g >> 16) & 0xffff, (unsigned)g & 0xffff);
	} else if (!strcmp(file, "fw_ver")) {
		snprintf(v, sizeof(v), "%s", d->attr.fw_ver);
	} else if (!strcmp(file, "hca_type")) {
		snprintf(v, sizeof(v), "vrdma");
	} else if (!strcmp(file, "board_id")) {
		snprintf(v, sizeof(v), "VRDMA_PVRDMA");
	} else if (!strcmp(file, "node_desc")) {
		snprintf(v, sizeof(v), "%s %s", the_vm->name, d->adapter);
	} else if (!strcmp(file, "ports/1/gid_attrs/types/0")) {
		snprintf(v, sizeof(v), "RoCE v2");
	} else if (!strcmp(file, "ports/1/link_layer")) {
		snprintf(v, sizeof(v), "Ethernet");
	} else {
		errno = ENOENT;
		return -1;
	}
	if (n == 0) {
		errno = EINVAL;
		return -1;
	}
	snprintf(out, n, "%s", v);
	return (int)strlen(out);
}

int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size)
{
	char *path;
	int fd, len;
	struct vrdma_vm *vm = the_vm;

	if (!dir || !file || !buf) {
		errno = EINVAL;
		return -1;
	}
	for (int i = 0; vm && i < vm->ndev; i++)
		if (!strcmp(dir, vm->devs[i]->ibdev.ibdev_path))
			return virtual_sysfs(vm->devs[i], file, buf, size);
	if (asprintf(&path, "%s/%s", dir, file) < 0) {
		errno = ENOMEM;
		return -1;
	}
	fd = open(path, O_RDONLY | O_CLOEXEC);
	free(path);
	if (fd < 0)
		return -1;
	len = (int)read(fd, buf, size);
	close(fd);
	if (len > 0) {
		if (buf[len - 1] == '\n')
			buf[--len] = '\0';
		else if ((size_t)len < size)
			buf[len] = '\0';
		else
			buf[size - 1] = '\0'; /* as rdma-core: the result is cut */
	}
	return len;
}

const char *ibv_get_sysfs_path(void)
{
	return "/sys";
}
