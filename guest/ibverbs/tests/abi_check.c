// SPDX-License-Identifier: Apache-2.0
/*
 * abi_check: the drop-in's answers to bad arguments and to the verbs it does
 * not implement, and its device-level verbs, through the real
 * <infiniband/verbs.h>. Run as a workload of a VM with at least one
 * adapter (VRDMA_VM); it prints "ok NAME" or "FAIL NAME: why" per check and
 * exits 1 if any failed. Driven by internal/verbsabi (TestVerbsABIBadArgs).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

int ibv_query_gid_type(struct ibv_context *context, uint8_t port_num, unsigned int index, int *type);
void verbs_register_driver_34(const void *ops);
int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size);

#include "check.h"

int main(void)
{
	struct ibv_device **list;
	struct ibv_context *ctx;
	struct ibv_port_attr port;
	struct ibv_device_attr dattr;
	struct ibv_device_attr_ex xattr;
	struct ibv_gid_entry ge;
	union ibv_gid gid;
	__be16 pkey;
	int n = -1, rc, type = -1;
	char buf[64];
	void *p;

	list = ibv_get_device_list(&n);
	CHECK("device-list", list && n >= 1, "list %p n %d errno %d", (void *)list, n, errno);
	if (!list || n < 1)
		return 1;
	CHECK("device-list-null-terminated", list[n] == NULL, "list[%d] = %p", n, (void *)list[n]);

	errno = 0;
	CHECK("open-null", ibv_open_device(NULL) == NULL && errno == ENODEV, "errno %d", errno);
	{
		struct ibv_device fake;

		memset(&fake, 0, sizeof(fake));
		errno = 0;
		CHECK("open-foreign-device", ibv_open_device(&fake) == NULL && errno == ENODEV, "errno %d", errno);
		errno = 0;
		CHECK("name-foreign-device", ibv_get_device_name(&fake) == NULL && errno == EINVAL, "errno %d", errno);
	}

	ctx = ibv_open_device(list[0]);
	CHECK("open", ctx != NULL, "errno %d", errno);
	if (!ctx)
		return 1;
	CHECK("context-device", ctx->device == list[0], "device %p", (void *)ctx->device);

	rc = ibv_query_port(ctx, 1, &port);
	CHECK("query-port", rc == 0 && port.state == IBV_PORT_ACTIVE && port.link_layer == IBV_LINK_LAYER_ETHERNET,
	      "rc %d state %d link_layer %d", rc, port.state, port.link_layer);
	rc = ibv_query_port(ctx, 2, &port);
	CHECK("query-port-2", rc == EINVAL, "rc %d", rc);
	rc = ibv_query_port(ctx, 0, &port);
	CHECK("query-port-0", rc == EINVAL, "rc %d", rc);

	rc = ibv_query_device(ctx, &dattr);
	CHECK("query-device", rc == 0 && dattr.phys_port_cnt == 1 && dattr.max_qp > 0, "rc %d", rc);
	rc = ibv_query_device(ctx, NULL);
	CHECK("query-device-null", rc == EINVAL, "rc %d", rc);
	rc = ibv_query_device_ex(ctx, NULL, &xattr);
	CHECK("query-device-ex", rc == 0 && xattr.orig_attr.max_qp == dattr.max_qp &&
					 xattr.orig_attr.node_guid == dattr.node_guid,
	      "rc %d", rc);
	{
		struct ibv_query_device_ex_input in = { .comp_mask = 1 };

		rc = ibv_query_device_ex(ctx, &in, &xattr);
		CHECK("query-device-ex-comp-mask", rc == EINVAL, "rc %d", rc);
	}
	CHECK("device-guid", ibv_get_device_guid(list[0]) == dattr.node_guid, "guid mismatch");

	rc = ibv_query_gid(ctx, 1, 0, &gid);
	CHECK("query-gid", rc == 0 && gid.raw[0] != 0, "rc %d", rc);
	{
		union ibv_gid empty = { .raw = { 1 } }, zero = { .raw = { 0 } };

		/* Entries 1..15 of the 16 are empty: a zero GID, as uverbs reads one. */
		rc = ibv_query_gid(ctx, 1, 1, &empty);
		CHECK("query-gid-index-1-empty", rc == 0 && !memcmp(&empty, &zero, sizeof(zero)), "rc %d errno %d", rc, errno);
		errno = 0;
		rc = ibv_query_gid(ctx, 1, 16, &empty);
		CHECK("query-gid-past-table", rc == -1 && errno == EINVAL, "rc %d errno %d", rc, errno);
	}
	errno = 0;
	rc = ibv_query_gid(ctx, 1, -1, &gid);
	CHECK("query-gid-index-negative", rc == -1 && errno == EINVAL, "rc %d errno %d", rc, errno);
	errno = 0;
	rc = ibv_query_gid(ctx, 2, 0, &gid);
	CHECK("query-gid-port-2", rc == -1 && errno == EINVAL, "rc %d errno %d", rc, errno);
	rc = ibv_query_gid_ex(ctx, 1, 0, &ge, 0);
	CHECK("query-gid-ex", rc == 0 && ge.gid_type == IBV_GID_TYPE_ROCE_V2 && ge.port_num == 1 &&
				      !memcmp(&ge.gid, &gid, sizeof(gid)),
	      "rc %d type %u", rc, ge.gid_type);
	rc = ibv_query_gid_ex(ctx, 1, 0, &ge, 1);
	CHECK("query-gid-ex-flags", rc == EINVAL, "rc %d", rc);
	rc = ibv_query_gid_ex(ctx, 1, 5, &ge, 0);
	CHECK("query-gid-ex-empty", rc == ENODATA, "rc %d", rc);
	rc = ibv_query_gid_ex(ctx, 1, 16, &ge, 0);
	CHECK("query-gid-ex-index", rc == EINVAL, "rc %d", rc);
	rc = ibv_query_gid_type(ctx, 1, 0, &type);
	CHECK("query-gid-type", rc == 0 && type == 1, "rc %d type %d", rc, type);
	{
		struct ibv_gid_entry tbl[4];
		ssize_t k = ibv_query_gid_table(ctx, tbl, 4, 0);

		CHECK("query-gid-table", k == 1 && tbl[0].gid_type == IBV_GID_TYPE_ROCE_V2, "k %zd", k);
		k = ibv_query_gid_table(ctx, tbl, 0, 0);
		CHECK("query-gid-table-too-small", k == -EINVAL, "k %zd", k);
	}

	rc = ibv_query_pkey(ctx, 1, 0, &pkey);
	CHECK("query-pkey", rc == 0 && pkey == htobe16(0xffff), "rc %d pkey %x", rc, pkey);
	errno = 0;
	rc = ibv_query_pkey(ctx, 1, 1, &pkey);
	CHECK("query-pkey-index-1", rc == -1 && errno == EINVAL, "rc %d errno %d", rc, errno);

	rc = ibv_read_sysfs_file(list[0]->ibdev_path, "node_type", buf, sizeof(buf));
	CHECK("sysfs-node-type", rc > 0 && !strcmp(buf, "1: CA"), "rc %d buf %s", rc, buf);
	errno = 0;
	rc = ibv_read_sysfs_file(list[0]->ibdev_path, "no_such_file", buf, sizeof(buf));
	CHECK("sysfs-missing", rc == -1 && errno == ENOENT, "rc %d errno %d", rc, errno);
	rc = ibv_read_sysfs_file("/proc/self", "comm", buf, sizeof(buf));
	CHECK("sysfs-real-file", rc > 0 && !strcmp(buf, "abi_check"), "rc %d buf %s", rc, buf);

	/* A verb on a pointer it did not make: EINVAL. */
	errno = 0;
	p = ibv_create_srq(NULL, NULL);
	CHECK("create-srq-bad-args", p == NULL && errno == EINVAL, "p %p errno %d", p, errno);
	errno = 0;
	p = ibv_open_xrcd(ctx, NULL);
	CHECK("open-xrcd-bad-args", p == NULL && errno == EINVAL, "p %p errno %d", p, errno);
	rc = ibv_attach_mcast(NULL, NULL, 0);
	CHECK("attach-mcast-bad-args", rc == EINVAL, "rc %d", rc);
	verbs_register_driver_34(NULL);
	CHECK("register-driver-noop", 1, " ");

	CHECK("wc-status-str", !strcmp(ibv_wc_status_str(IBV_WC_WR_FLUSH_ERR), "Work Request Flushed Error"), "%s",
	      ibv_wc_status_str(IBV_WC_WR_FLUSH_ERR));
	CHECK("port-state-str", !strcmp(ibv_port_state_str(IBV_PORT_ACTIVE), "active"), " ");
	CHECK("rate-to-mbps", ibv_rate_to_mbps(IBV_RATE_100_GBPS) == 103125 && ibv_rate_to_mult(IBV_RATE_10_GBPS) == 4,
	      " ");

	errno = 0;
	rc = ibv_close_device((struct ibv_context *)&port);
	CHECK("close-foreign", rc == -1 && errno == EINVAL, "rc %d errno %d", rc, errno);
	rc = ibv_close_device(ctx);
	CHECK("close", rc == 0, "rc %d", rc);
	ibv_free_device_list(list);
	return failed;
}
