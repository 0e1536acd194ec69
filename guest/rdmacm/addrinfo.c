// SPDX-License-Identifier: Apache-2.0
/*
 * rdma_getaddrinfo and rdma_freeaddrinfo: names and numbers through the
 * system's getaddrinfo, shaped as rdma_cm's address information (RC over
 * RDMA_PS_TCP unless the hints ask for UD).
 */
#define _GNU_SOURCE
#include <netdb.h>
#include <stdlib.h>
#include <string.h>

#include "rdmacm.h"

static int copy_addr(struct sockaddr **dst, socklen_t *len, const struct sockaddr *src, socklen_t n)
{
	*dst = malloc(n);
	if (!*dst)
		return cm_fail(ENOMEM);
	memcpy(*dst, src, n);
	*len = n;
	return 0;
}

int rdma_getaddrinfo(const char *node, const char *service, const struct rdma_addrinfo *hints,
		     struct rdma_addrinfo **res)
{
	static const struct rdma_addrinfo none;
	struct rdma_addrinfo *rai;
	struct addrinfo ah, *ai = NULL;
	int rc;

	if ((!node && !service && !hints) || !res)
		return cm_fail(EINVAL);
	if (!hints)
		hints = &none;
	if (hints->ai_family == AF_IB)
		return cm_fail(EAFNOSUPPORT); /* RoCE: IP addresses only */
	rai = calloc(1, sizeof(*rai));
	if (!rai)
		return cm_fail(ENOMEM);
	rai->ai_flags = hints->ai_flags & RAI_PASSIVE;
	rai->ai_port_space = hints->ai_port_space ? hints->ai_port_space : RDMA_PS_TCP;
	rai->ai_qp_type = hints->ai_qp_type ? hints->ai_qp_type :
			  rai->ai_port_space == RDMA_PS_UDP || rai->ai_port_space == RDMA_PS_IPOIB ? IBV_QPT_UD : IBV_QPT_RC;
	rai->ai_family = hints->ai_family;
	if (node || service) {
		memset(&ah, 0, sizeof(ah));
		ah.ai_family = hints->ai_family;
		ah.ai_flags = (hints->ai_flags & RAI_PASSIVE ? AI_PASSIVE : 0) |
			      (hints->ai_flags & RAI_NUMERICHOST ? AI_NUMERICHOST : 0);
		ah.ai_socktype = rai->ai_qp_type == IBV_QPT_UD ? SOCK_DGRAM : SOCK_STREAM;
		rc = getaddrinfo(node, service, &ah, &ai);
		if (rc) {
			rdma_freeaddrinfo(rai);
			return rc; /* an EAI_* code, as rdma-core (programs print it with gai_strerror) */
		}
		rai->ai_family = ai->ai_family;
		if (ai->ai_canonname) {
			char **name = hints->ai_flags & RAI_PASSIVE ? &rai->ai_src_canonname : &rai->ai_dst_canonname;

			*name = strdup(ai->ai_canonname);
		}
		if (hints->ai_flags & RAI_PASSIVE)
			rc = copy_addr(&rai->ai_src_addr, &rai->ai_src_len, ai->ai_addr, ai->ai_addrlen);
		else
			rc = copy_addr(&rai->ai_dst_addr, &rai->ai_dst_len, ai->ai_addr, ai->ai_addrlen);
		freeaddrinfo(ai);
		if (rc)
			goto err;
	} else if (hints->ai_dst_len && hints->ai_dst_addr) {
		if (copy_addr(&rai->ai_dst_addr, &rai->ai_dst_len, hints->ai_dst_addr, hints->ai_dst_len))
			goto err;
	}
	if (!rai->ai_src_len && hints->ai_src_len && hints->ai_src_addr &&
	    copy_addr(&rai->ai_src_addr, &rai->ai_src_len, hints->ai_src_addr, hints->ai_src_len))
		goto err;
	*res = rai;
	return 0;
err:
	rdma_freeaddrinfo(rai);
	return -1;
}

void rdma_freeaddrinfo(struct rdma_addrinfo *res)
{
	while (res) {
		struct rdma_addrinfo *next = res->ai_next;

		free(res->ai_src_addr);
		free(res->ai_dst_addr);
		free(res->ai_src_canonname);
		free(res->ai_dst_canonname);
		free(res->ai_route);
		free(res->ai_connect);
		free(res);
		res = next;
	}
}
