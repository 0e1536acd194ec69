// SPDX-License-Identifier: Apache-2.0
/*
 * The session with the host agent (wire-local.md §1): a SOCK_SEQPACKET
 * Unix socket, one request at a time under the session's lock, replies
 * matched by sequence number, descriptors in SCM_RIGHTS.
 */
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "vrdma.h"

/* How long a command may take before the agent is declared stuck. The
 * commands the library sends never block in the agent (§1.5), so this is
 * only a guard against a hung agent: errors, not hangs. */
#define CALL_TIMEOUT_MS 30000

/* The socket of the agent the system runs (contrib/vrdmad.service). */
#define SYSTEM_SOCKET "/run/vrdma/vrdmad.sock"

static int is_socket(const char *path)
{
	struct stat st;

	return stat(path, &st) == 0 && S_ISSOCK(st.st_mode);
}

void vrdma_socket_path(char *buf, size_t n)
{
	const char *s = getenv("VRDMA_SOCKET");
	const char *x;

	if (s && *s) {
		snprintf(buf, n, "%s", s);
	} else if (geteuid() == 0) {
		snprintf(buf, n, "%s", SYSTEM_SOCKET);
	} else if ((x = getenv("XDG_RUNTIME_DIR")) && *x) {
		snprintf(buf, n, "%s/vrdma/vrdmad.sock", x);
	} else {
		const char *t = getenv("TMPDIR");

		snprintf(buf, n, "%s/vrdma-%u/vrdmad.sock", t && *t ? t : "/tmp", (unsigned)getuid());
	}
	/* A user without an agent of their own uses the system's (as
	 * internal/locations.Socket does). */
	if (!(s && *s) && !is_socket(buf) && is_socket(SYSTEM_SOCKET))
		snprintf(buf, n, "%s", SYSTEM_SOCKET);
}

int vrdma_session_open(struct vrdma_session *s, const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd, sz = 2 << 20;

	memset(s, 0, sizeof(*s));
	s->fd = -1;
	pthread_mutex_init(&s->mu, NULL);
	if (strlen(path) >= sizeof(sa.sun_path)) {
		errno = ENAMETOOLONG;
		return -1;
	}
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	/* §1.1: a message must fit the sender's buffer whole. */
	if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &sz, sizeof(sz)))
		(void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		int e = errno;

		close(fd);
		errno = e;
		return -1;
	}
	s->buf = malloc(VRDMA_MAX_MESSAGE);
	if (!s->buf) {
		close(fd);
		errno = ENOMEM;
		return -1;
	}
	s->fd = fd;
	return 0;
}

int vrdma_errno(const char *code, const char *field, int op)
{
	int handle = field && (!strcmp(field, "handle") || !strcmp(field, "pd") || !strcmp(field, "send_cq") ||
			       !strcmp(field, "recv_cq") || !strcmp(field, "qp") || !strcmp(field, "listener"));

	if (!strcmp(code, VRDMA_CODE_INVALID_ARGUMENT))
		return EINVAL;
	if (!strcmp(code, VRDMA_CODE_NOT_FOUND))
		return op == VRDMA_OP_ATTACH ? ENODEV : handle ? EINVAL : ENOENT;
	if (!strcmp(code, VRDMA_CODE_LIMIT_EXCEEDED))
		return ENOMEM;
	if (!strcmp(code, VRDMA_CODE_BAD_STATE)) {
		/* An object still in use. */
		if (op == VRDMA_OP_DEALLOC_PD || op == VRDMA_OP_DESTROY_CQ || op == VRDMA_OP_DESTROY_SRQ ||
		    op == VRDMA_OP_DEREG_MR || op == VRDMA_OP_CLOSE_XRCD)
			return EBUSY;
		return EINVAL;
	}
	if (!strcmp(code, VRDMA_CODE_ALREADY_EXISTS))
		return op == VRDMA_OP_ATTACH ? EBUSY : EEXIST;
	if (!strcmp(code, VRDMA_CODE_PERMISSION_DENIED))
		return op == VRDMA_OP_ATTACH ? EACCES : EPERM;
	if (!strcmp(code, VRDMA_CODE_UNAVAILABLE))
		return op == VRDMA_OP_MODIFY_QP ? EHOSTUNREACH : EAGAIN;
	if (!strcmp(code, VRDMA_CODE_REFUSED))
		return ECONNREFUSED;
	return EIO;
}

void vrdma_msg_header_put(unsigned char *buf, int op, uint32_t seq, uint32_t len)
{
	struct vrdma_msg_header h = { .magic = { 'V', 'R' }, .version = VRDMA_ABI_VERSION };

	h.op = htole16((uint16_t)op);
	h.seq = htole32(seq);
	h.len = htole32(len);
	memcpy(buf, &h, sizeof(h));
}

int vrdma_msg_response(const unsigned char *buf, size_t n, struct vrdma_msg_header *h)
{
	if (n < sizeof(*h))
		return -1;
	memcpy(h, buf, sizeof(*h));
	h->op = le16toh(h->op);
	h->seq = le32toh(h->seq);
	h->len = le32toh(h->len);
	if (h->magic[0] != 'V' || h->magic[1] != 'R' || h->len != n - sizeof(*h) ||
	    !(h->flags & VRDMA_MSG_FLAG_RESPONSE))
		return -1;
	return 0;
}

static void close_fds(int *fds, int n)
{
	for (int i = 0; i < n; i++)
		if (fds[i] >= 0)
			close(fds[i]);
}

static void kill_session(struct vrdma_session *s)
{
	if (s->fd >= 0)
		close(s->fd);
	s->fd = -1;
	s->dead = 1;
}


static int call_locked(struct vrdma_session *s, int op, const char *body, int sendfd, struct vrdma_reply *r)
{
	size_t blen = strlen(body);
	unsigned char hdr[VRDMA_MSG_HEADER_SIZE];
	struct iovec iov[2];
	struct msghdr mh = { .msg_iov = iov, .msg_iovlen = 2 };
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} sctl;
	uint32_t seq;
	long deadline;
	ssize_t n;

	if (s->dead || s->fd < 0) {
		errno = EIO;
		return -1;
	}
	if (blen + VRDMA_MSG_HEADER_SIZE > VRDMA_MAX_MESSAGE) {
		errno = E2BIG;
		return -1;
	}
	seq = ++s->seq;
	vrdma_msg_header_put(hdr, op, seq, (uint32_t)blen);
	iov[0] = (struct iovec){ hdr, sizeof(hdr) };
	iov[1] = (struct iovec){ (void *)body, blen };
	if (sendfd >= 0) {
		struct cmsghdr *c;

		memset(&sctl, 0, sizeof(sctl));
		mh.msg_control = sctl.buf;
		mh.msg_controllen = sizeof(sctl.buf);
		c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &sendfd, sizeof(int));
	}
	do
		n = sendmsg(s->fd, &mh, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n < 0) {
		kill_session(s);
		errno = EIO;
		return -1;
	}
	deadline = (long)(vrdma_now_ns() / 1000000u) + CALL_TIMEOUT_MS;
	for (;;) {
		union {
			char buf[CMSG_SPACE(4 * sizeof(int))];
			struct cmsghdr align;
		} ctl;
		struct iovec riov = { s->buf, VRDMA_MAX_MESSAGE };
		struct msghdr rh = { .msg_iov = &riov, .msg_iovlen = 1, .msg_control = ctl.buf,
				     .msg_controllen = sizeof(ctl.buf) };
		struct pollfd pfd = { .fd = s->fd, .events = POLLIN };
		struct vrdma_msg_header rhdr;
		int fds[4], nfds = 0, pr;
		long left = deadline - (long)(vrdma_now_ns() / 1000000u);
		struct cmsghdr *c;

		if (left <= 0) {
			kill_session(s);
			errno = ETIMEDOUT;
			return -1;
		}
		pr = poll(&pfd, 1, (int)left);
		if (pr < 0 && errno == EINTR)
			continue;
		if (pr <= 0)
			continue; /* the deadline check above ends it */
		n = recvmsg(s->fd, &rh, MSG_CMSG_CLOEXEC);
		if (n < 0 && errno == EINTR)
			continue;
		for (c = CMSG_FIRSTHDR(&rh); c; c = CMSG_NXTHDR(&rh, c)) {
			if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
				int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));

				for (int i = 0; i < k; i++) {
					int fd;

					memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
					if (nfds < 4)
						fds[nfds++] = fd;
					else
						close(fd);
				}
			}
		}
		if (n <= 0 || (rh.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
			/* End of the connection (the agent exited) or a lost message. */
			close_fds(fds, nfds);
			kill_session(s);
			errno = EIO;
			return -1;
		}
		if (vrdma_msg_response((const unsigned char *)s->buf, (size_t)n, &rhdr)) {
			close_fds(fds, nfds);
			kill_session(s);
			errno = EIO;
			return -1;
		}
		if (rhdr.seq != seq) {
			close_fds(fds, nfds); /* an answer to a request nobody waits for */
			continue;
		}
		memset(r, 0, sizeof(*r));
		r->root = -1;
		if (json_parse(&r->doc, s->buf + VRDMA_MSG_HEADER_SIZE, (int)(n - VRDMA_MSG_HEADER_SIZE))) {
			close_fds(fds, nfds);
			errno = EIO;
			return -1;
		}
		/* The doc points into s->buf, which the lock keeps until the
		 * caller frees the reply: copy the text. */
		{
			char *text = malloc((size_t)(n - VRDMA_MSG_HEADER_SIZE) + 1);

			if (!text) {
				json_free(&r->doc);
				close_fds(fds, nfds);
				errno = ENOMEM;
				return -1;
			}
			memcpy(text, s->buf + VRDMA_MSG_HEADER_SIZE, (size_t)(n - VRDMA_MSG_HEADER_SIZE));
			text[n - VRDMA_MSG_HEADER_SIZE] = 0;
			r->doc.text = text;
		}
		r->root = 0;
		memcpy(r->fds, fds, sizeof(int) * (size_t)nfds);
		r->nfds = nfds;
		if (rhdr.flags & VRDMA_MSG_FLAG_ERROR) {
			char field[64] = "";

			r->is_error = 1;
			json_get_str(&r->doc, 0, "code", r->code, sizeof(r->code));
			json_get_str(&r->doc, 0, "field", field, sizeof(field));
			json_get_str(&r->doc, 0, "message", r->message, sizeof(r->message));
			r->err = vrdma_errno(r->code, field, op);
			close_fds(r->fds, r->nfds);
			r->nfds = 0;
		}
		return 0;
	}
}

int vrdma_call(struct vrdma_session *s, int op, const char *body, struct vrdma_reply *r)
{
	int rc;

	pthread_mutex_lock(&s->mu);
	rc = call_locked(s, op, body, -1, r);
	pthread_mutex_unlock(&s->mu);
	return rc;
}

int vrdma_call_fd(struct vrdma_session *s, int op, const char *body, int fd, struct vrdma_reply *r)
{
	int rc;

	pthread_mutex_lock(&s->mu);
	rc = call_locked(s, op, body, fd, r);
	pthread_mutex_unlock(&s->mu);
	return rc;
}

void vrdma_reply_free(struct vrdma_reply *r)
{
	close_fds(r->fds, r->nfds);
	r->nfds = 0;
	free((void *)r->doc.text);
	r->doc.text = NULL;
	json_free(&r->doc);
}
