// SPDX-License-Identifier: Apache-2.0
/*
 * abi_golden: runs internal/abi's golden vectors (internal/abi/testdata/golden)
 * through the drop-in's own encoders and decoders: wqe.h's WQE writers and
 * CQE reader, session.c's message header, layout.c's reply checks and
 * json.c. Driven by guest/golden_test.go (TestCGoldenVectors), which sends
 * one request per line on stdin and compares each answer line with the
 * vector:
 *
 *	send STRIDE WR_ID OPCODE FLAGS IMM RADDR RKEY COMPARE SWAP INLINE NSGE [ADDR LEN LKEY]...
 *		ibv_post_send's WQE (wqe_send_from_wr) into a zeroed slot of
 *		STRIDE bytes; FLAGS is a comma list of signaled, solicited,
 *		fence, inline or "-"; INLINE the inline bytes in hex or "-".
 *		-> "slot HEX" or "err ERRNO"
 *	recv STRIDE WR_ID NSGE [ADDR LEN LKEY]...	-> "slot HEX"
 *	cqe HEX		-> "wc WR_ID QP_NUM OPCODE STATUS WITH_IMM BYTE_LEN IMM SRC_QP VENDOR_ERR"
 *	reqhdr OP SEQ LEN	-> "hdr HEX" (vrdma_msg_header_put)
 *	reply HEX	a whole response message -> "reply OP SEQ FLAGS" and then
 *		"error CODE ERRNO", "hello CAPS", "qp LAYOUT... CAPS..." or
 *		"invalid" (the layout checks refused it)
 * Numbers are decimal or 0x hex, answers decimal; "bad" answers a line it
 * cannot read.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../ring.h"
#include "../vrdma.h"
#include "../wqe.h"

static char *tok(char **p)
{
	return strsep(p, " \n");
}

static int num(char **p, uint64_t *v)
{
	char *t = tok(p), *end;

	if (!t || !*t)
		return -1;
	*v = strtoull(t, &end, 0);
	return *end ? -1 : 0;
}

static int unhex(const char *s, unsigned char *out, size_t cap, size_t *n)
{
	size_t l = strlen(s);

	if (l % 2 || l / 2 > cap)
		return -1;
	for (size_t i = 0; i < l / 2; i++) {
		unsigned int b;

		if (sscanf(s + 2 * i, "%2x", &b) != 1)
			return -1;
		out[i] = (unsigned char)b;
	}
	*n = l / 2;
	return 0;
}

static void hexout(const char *what, const unsigned char *b, size_t n)
{
	printf("%s ", what);
	for (size_t i = 0; i < n; i++)
		printf("%02x", b[i]);
	printf("\n");
}

static int sges(char **p, struct ibv_sge *sg, uint64_t n)
{
	for (uint64_t i = 0; i < n; i++) {
		uint64_t a, l, k;

		if (num(p, &a) || num(p, &l) || num(p, &k))
			return -1;
		sg[i] = (struct ibv_sge){ .addr = a, .length = (uint32_t)l, .lkey = (uint32_t)k };
	}
	return 0;
}

static unsigned int send_flags(const char *s)
{
	unsigned int f = 0;

	if (strstr(s, "signaled"))
		f |= IBV_SEND_SIGNALED;
	if (strstr(s, "solicited"))
		f |= IBV_SEND_SOLICITED;
	if (strstr(s, "fence"))
		f |= IBV_SEND_FENCE;
	if (strstr(s, "inline"))
		f |= IBV_SEND_INLINE;
	return f;
}

static int do_send(char *p)
{
	static unsigned char slot[VRDMA_MAX_STRIDE] __attribute__((aligned(64)));
	static unsigned char inl[VRDMA_MAX_INLINE];
	struct ibv_sge sg[VRDMA_MAX_SGE];
	struct ibv_send_wr wr;
	struct ibv_qp_cap caps;
	uint64_t stride, wrid, op, imm, raddr, rkey, cmp, swp, n;
	char *flags, *inline_hex;
	size_t inl_len = 0;
	int rc;

	memset(&wr, 0, sizeof(wr));
	if (num(&p, &stride) || num(&p, &wrid) || num(&p, &op) || !(flags = tok(&p)) || num(&p, &imm) ||
	    num(&p, &raddr) || num(&p, &rkey) || num(&p, &cmp) || num(&p, &swp) || !(inline_hex = tok(&p)) ||
	    num(&p, &n) || stride > sizeof(slot) || stride < VRDMA_SEND_HDR || n > VRDMA_MAX_SGE || sges(&p, sg, n))
		return -1;
	/* The QP's caps as the agent makes them for this stride (NewQPLayout). */
	caps = (struct ibv_qp_cap){ .max_send_sge = (uint32_t)((stride - VRDMA_SEND_HDR) / VRDMA_SGE_SIZE),
				    .max_inline_data = (uint32_t)(stride - VRDMA_SEND_HDR) };
	if (caps.max_send_sge > VRDMA_MAX_SGE)
		caps.max_send_sge = VRDMA_MAX_SGE;
	if (caps.max_inline_data > VRDMA_MAX_INLINE)
		caps.max_inline_data = VRDMA_MAX_INLINE;
	wr.wr_id = wrid;
	wr.opcode = (enum ibv_wr_opcode)op;
	wr.send_flags = send_flags(flags);
	wr.imm_data = htobe32((uint32_t)imm); /* verbs: network order */
	if (op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
		wr.wr.atomic.remote_addr = raddr;
		wr.wr.atomic.rkey = (uint32_t)rkey;
		wr.wr.atomic.compare_add = cmp;
		wr.wr.atomic.swap = swp;
	} else {
		wr.wr.rdma.remote_addr = raddr;
		wr.wr.rdma.rkey = (uint32_t)rkey;
	}
	if (strcmp(inline_hex, "-")) {
		if (unhex(inline_hex, inl, sizeof(inl), &inl_len) || n)
			return -1;
		sg[0] = (struct ibv_sge){ .addr = (uintptr_t)inl, .length = (uint32_t)inl_len };
		n = 1;
	}
	wr.num_sge = (int)n;
	wr.sg_list = n ? sg : NULL;
	memset(slot, 0, stride);
	rc = wqe_send_from_wr(slot, &wr, &caps);
	if (rc)
		printf("err %d\n", rc);
	else
		hexout("slot", slot, stride);
	return 0;
}

static int do_recv(char *p)
{
	static unsigned char slot[VRDMA_MAX_STRIDE] __attribute__((aligned(64)));
	struct ibv_sge sg[VRDMA_MAX_SGE];
	struct ibv_recv_wr wr;
	uint64_t stride, wrid, n;

	if (num(&p, &stride) || num(&p, &wrid) || num(&p, &n) || stride > sizeof(slot) || n > VRDMA_MAX_SGE ||
	    VRDMA_RECV_HDR + n * VRDMA_SGE_SIZE > stride || sges(&p, sg, n))
		return -1;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = wrid;
	wr.num_sge = (int)n;
	wr.sg_list = sg;
	memset(slot, 0, stride);
	wqe_recv_from_wr(slot, &wr);
	hexout("slot", slot, stride);
	return 0;
}

static int do_cqe(char *p)
{
	static unsigned char slot[VRDMA_CQE_SIZE] __attribute__((aligned(64)));
	struct ibv_wc wc;
	char *h = tok(&p);
	size_t n;

	if (!h || unhex(h, slot, sizeof(slot), &n) || n != VRDMA_CQE_SIZE)
		return -1;
	cqe_to_wc(slot, &wc);
	printf("wc %llu %u %d %d %d %u %u %u %u\n", (unsigned long long)wc.wr_id, wc.qp_num, (int)wc.opcode,
	       (int)wc.status, !!(wc.wc_flags & IBV_WC_WITH_IMM), wc.byte_len, be32toh(wc.imm_data), wc.src_qp,
	       wc.vendor_err);
	return 0;
}

static int do_reqhdr(char *p)
{
	unsigned char hdr[VRDMA_MSG_HEADER_SIZE];
	uint64_t op, seq, len;

	if (num(&p, &op) || num(&p, &seq) || num(&p, &len))
		return -1;
	vrdma_msg_header_put(hdr, (int)op, (uint32_t)seq, (uint32_t)len);
	hexout("hdr", hdr, sizeof(hdr));
	return 0;
}

static int do_reply(char *p)
{
	static unsigned char msg[VRDMA_MAX_MESSAGE];
	struct vrdma_msg_header h;
	struct json_doc d;
	char *hx = tok(&p);
	size_t n;

	if (!hx || unhex(hx, msg, sizeof(msg), &n) || vrdma_msg_response(msg, n, &h))
		return -1;
	if (json_parse(&d, (const char *)msg + VRDMA_MSG_HEADER_SIZE, (int)(n - VRDMA_MSG_HEADER_SIZE)))
		return -1;
	printf("reply %u %u %u ", h.op, h.seq, h.flags);
	if (h.flags & VRDMA_MSG_FLAG_ERROR) {
		char code[32] = "", field[64] = "";

		json_get_str(&d, 0, "code", code, sizeof(code));
		json_get_str(&d, 0, "field", field, sizeof(field));
		printf("error %s %d\n", code, vrdma_errno(code, field, h.op));
	} else if (h.op == VRDMA_OP_HELLO) {
		uint64_t caps = 0;

		json_get_u64(&d, 0, "caps", &caps);
		printf("hello %llu\n", (unsigned long long)caps);
	} else if (h.op == VRDMA_OP_CREATE_QP) {
		struct vrdma_qp_layout l;
		struct ibv_qp_cap c;

		if (vrdma_qp_layout(&d, 0, &l, &c))
			printf("invalid\n");
		else
			printf("qp %u %u %u %u %u %u %u %u %u %u %u %u\n", l.sq_entries, l.sq_stride, l.rq_entries,
			       l.rq_stride, l.sq_offset, l.rq_offset, l.size, c.max_send_wr, c.max_recv_wr,
			       c.max_send_sge, c.max_recv_sge, c.max_inline_data);
	} else {
		printf("other\n");
	}
	json_free(&d);
	return 0;
}

/* vrdma_warn is device.c's; this program links session.c without it. */
void vrdma_warn(const char *fmt, ...)
{
	(void)fmt;
}

int main(void)
{
	static char line[2 * VRDMA_MAX_MESSAGE + 64];

	while (fgets(line, sizeof(line), stdin)) {
		char *p = line, *cmd = tok(&p);
		int rc = -1;

		if (!cmd)
			continue;
		if (!strcmp(cmd, "send"))
			rc = do_send(p);
		else if (!strcmp(cmd, "recv"))
			rc = do_recv(p);
		else if (!strcmp(cmd, "cqe"))
			rc = do_cqe(p);
		else if (!strcmp(cmd, "reqhdr"))
			rc = do_reqhdr(p);
		else if (!strcmp(cmd, "reply"))
			rc = do_reply(p);
		if (rc)
			printf("bad\n");
		fflush(stdout);
	}
	return 0;
}
