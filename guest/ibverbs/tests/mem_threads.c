// SPDX-License-Identifier: Apache-2.0
/*
 * mem_threads: registration and deregistration against threads that use
 * the memory beside a region (docs/verbs-compat.md "Memory registration").
 *
 * A region starts and ends inside pages it shares with neighbours. Two
 * writer threads each own a counter on those edge pages, one before the
 * region and one after it: each reads its counter back before every write
 * and wants the value it wrote last (a write the adoption copied too early
 * is lost; a page given back empty reads zero). A reader thread watches
 * two constant words beside the region, which must never read anything
 * else. Meanwhile the main thread registers and deregisters the region,
 * ITERS times. The program has a SIGSEGV handler of its own, installed
 * before its first registration, which must never be called for the
 * library's doing; a child then checks that a fault of its own still
 * reaches it. Driven by internal/verbsabi's TestSecurityDropinMemoryThreads.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

#define ITERS 400
#define PAGES 17	  /* the region's pages, the first and last shared */
#define EDGE 256	  /* bytes of the first and last page outside the region */
#define SENTINEL 0x5eed5eed5eed5eedull

struct writer {
	_Atomic uint64_t *ctr;
	uint64_t writes, lost, zeros, first_got, first_want;
};

static atomic_int stop, running;
static _Atomic uint64_t *sent[2];
static uint64_t reads, bad_reads, first_bad;
static volatile sig_atomic_t forked_child;

static void *write_loop(void *arg)
{
	struct writer *w = arg;
	uint64_t v = 0;

	atomic_fetch_add(&running, 1);
	while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
		uint64_t got = atomic_load_explicit(w->ctr, memory_order_relaxed);

		if (got != v) {
			if (w->lost + w->zeros == 0) {
				w->first_got = got;
				w->first_want = v;
			}
			if (got == 0)
				w->zeros++;
			else
				w->lost++;
		}
		v = got + 1; /* go on from what is there */
		atomic_store_explicit(w->ctr, v, memory_order_relaxed);
		w->writes++;
	}
	return NULL;
}

static void *read_loop(void *arg)
{
	(void)arg;
	atomic_fetch_add(&running, 1);
	while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
		for (int i = 0; i < 2; i++) {
			uint64_t got = atomic_load_explicit(sent[i], memory_order_relaxed);

			if (got != SENTINEL && bad_reads++ == 0)
				first_bad = got;
		}
		reads++;
	}
	return NULL;
}

/* program_segv is the program's own handler: the library's page
 * protection must never reach it; a child's real fault must. */
static void program_segv(int sig, siginfo_t *si, void *uc)
{
	static const char msg[] = "FAIL program-handler: the program's SIGSEGV handler ran in the parent\n";

	(void)sig, (void)si, (void)uc;
	if (forked_child)
		_exit(42);
	if (write(1, msg, sizeof(msg) - 1) < 0)
		_exit(4);
	_exit(3);
}

static int count_maps(void)
{
	FILE *f = fopen("/proc/self/maps", "r");
	int n = 0, c;

	while (f && (c = getc(f)) != EOF)
		n += c == '\n';
	if (f)
		fclose(f);
	return n;
}

/* A handler the program installs after the library's, calling the one it
 * replaced (the library's) as well-behaved handlers do; the library, which
 * puts its own back in front at its next registration, must not then
 * call it again in a loop. Each call writes a byte to chain_pipe. */
static struct sigaction replaced;
static int chain_pipe = -1;

static void later_segv(int sig, siginfo_t *si, void *uc)
{
	if (write(chain_pipe, "c", 1) < 0)
		_exit(6);
	if (replaced.sa_flags & SA_SIGINFO)
		replaced.sa_sigaction(sig, si, uc);
	else if (replaced.sa_handler != SIG_DFL && replaced.sa_handler != SIG_IGN)
		replaced.sa_handler(sig);
}

/* chain_loop_child runs in a child: later_segv over the library's
 * handler, a registration, then a real fault. */
static void chain_loop_child(void)
{
	struct sigaction sa;
	struct ibv_device **list;
	struct ibv_context *c;
	struct ibv_pd *p;
	struct ibv_mr *mr;
	long page = sysconf(_SC_PAGESIZE);
	unsigned char *buf = mmap(NULL, 2 * (size_t)page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	int n;

	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = later_segv;
	sa.sa_flags = SA_SIGINFO | SA_NODEFER;
	sigaction(SIGSEGV, &sa, &replaced);
	list = ibv_get_device_list(&n);
	c = list && n > 0 ? ibv_open_device(list[0]) : NULL;
	p = c ? ibv_alloc_pd(c) : NULL;
	mr = p ? ibv_reg_mr(p, buf + 10, 100, IBV_ACCESS_LOCAL_WRITE) : NULL;
	if (!mr || ibv_dereg_mr(mr))
		_exit(7);
	mprotect(buf + page, (size_t)page, PROT_READ);
	*(volatile unsigned char *)(buf + page) = 1;
	_exit(5);
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(void)
{
	long page = sysconf(_SC_PAGESIZE);
	struct ibv_device **list;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct sigaction sa;
	struct writer w[2];
	pthread_t th[3];
	unsigned char *base, *region;
	size_t len = (size_t)PAGES * (size_t)page - 2 * EDGE;
	int n, iters = 0, kept = 1, status = 0;
	double t0, t;
	pid_t pid;

	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = program_segv;
	sa.sa_flags = SA_SIGINFO;
	sigaction(SIGSEGV, &sa, NULL);

	list = ibv_get_device_list(&n);
	ctx = list && n > 0 ? ibv_open_device(list[0]) : NULL;
	pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	CHECK("setup", pd, "errno %d", errno);
	if (!pd)
		return 1;

	/* One page more than the region's, unregistered, so that the
	 * region's last page has an anonymous neighbour as on a heap. */
	base = mmap(NULL, (size_t)(PAGES + 1) * (size_t)page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (base == MAP_FAILED)
		return 1;
	region = base + EDGE;
	memset(region, 0xab, len);
	w[0] = (struct writer){ .ctr = (_Atomic uint64_t *)base };
	w[1] = (struct writer){ .ctr = (_Atomic uint64_t *)(region + len + EDGE - 8) };
	sent[0] = (_Atomic uint64_t *)(base + 64);
	sent[1] = (_Atomic uint64_t *)(region + len + 64);
	atomic_store(sent[0], SENTINEL);
	atomic_store(sent[1], SENTINEL);

	/* The cost of a pair alone, for comparison. */
	t0 = now();
	for (int i = 0; i < 100; i++) {
		struct ibv_mr *mr = ibv_reg_mr(pd, region, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);

		if (!mr || ibv_dereg_mr(mr)) {
			printf("FAIL reg-alone: errno %d\n", errno);
			return 1;
		}
	}
	printf("# alone: %.1f us a registration and deregistration\n", (now() - t0) / 100 * 1e6);

	pthread_create(&th[0], NULL, write_loop, &w[0]);
	pthread_create(&th[1], NULL, write_loop, &w[1]);
	pthread_create(&th[2], NULL, read_loop, NULL);
	while (atomic_load(&running) < 3)
		sched_yield();

	t0 = now();
	for (; iters < ITERS; iters++) {
		struct ibv_mr *mr = ibv_reg_mr(pd, region, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);

		if (!mr) {
			printf("FAIL reg: iteration %d: errno %d\n", iters, errno);
			failed = 1;
			break;
		}
		region[iters % len] = (unsigned char)iters;
		if (ibv_dereg_mr(mr)) {
			printf("FAIL dereg: iteration %d: errno %d\n", iters, errno);
			failed = 1;
			break;
		}
		if (region[iters % len] != (unsigned char)iters)
			kept = 0;
	}
	t = now() - t0;
	atomic_store(&stop, 1);
	for (int i = 0; i < 3; i++)
		pthread_join(th[i], NULL);

	printf("# %d registrations and deregistrations of %zu bytes in %.3f s (%.1f us a pair); writes %lu and "
	       "%lu, reads %lu\n",
	       iters, len, t, iters ? t / iters * 1e6 : 0, (unsigned long)w[0].writes, (unsigned long)w[1].writes,
	       (unsigned long)reads);
	CHECK("threads-loop", iters == ITERS, "%d of %d", iters, ITERS);
	CHECK("threads-region-kept", kept, "the region's own bytes changed across reg/dereg");
	for (int i = 0; i < 2; i++) {
		char name[64];

		snprintf(name, sizeof(name), "threads-no-lost-write-%s", i ? "after" : "before");
		CHECK(name, w[i].lost == 0, "%lu writes lost of %lu (first: read %lu, wrote %lu)", (unsigned long)w[i].lost,
		      (unsigned long)w[i].writes, (unsigned long)w[i].first_got, (unsigned long)w[i].first_want);
		snprintf(name, sizeof(name), "threads-no-zero-%s", i ? "after" : "before");
		CHECK(name, w[i].zeros == 0, "%lu reads of zero (first after writing %lu)", (unsigned long)w[i].zeros,
		      (unsigned long)w[i].first_want);
	}
	CHECK("threads-neighbours-constant", bad_reads == 0, "%lu reads of %lu saw 0x%lx", (unsigned long)bad_reads,
	      (unsigned long)reads, (unsigned long)first_bad);

	/* Pages given back stay a mapping of their own (the kernel merges no
	 * moved pages with their neighbours): two more lines in
	 * /proc/self/maps at most per range, however often it is registered
	 * again. Ten ranges, ten times each. */
	{
		size_t big = 256 * (size_t)page;
		unsigned char *heap = mmap(NULL, big, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		int before, after, ok = 1;

		memset(heap, 7, big);
		before = count_maps();
		for (int i = 0; i < 100 && ok; i++) {
			unsigned char *p = heap + 100 + (size_t)(i % 10) * 2 * (size_t)page;
			struct ibv_mr *mr = ibv_reg_mr(pd, p, 3000, IBV_ACCESS_LOCAL_WRITE);

			ok = mr && !ibv_dereg_mr(mr);
		}
		after = count_maps();
		printf("# mappings: %d before 10 ranges registered and deregistered 10 times each, %d after\n", before,
		       after);
		CHECK("dereg-mappings-bounded", ok && after <= before + 2 * 10, "ok %d; %d mappings before, %d after", ok,
		      before, after);
		for (size_t i = 0; i < big; i++)
			if (heap[i] != 7) {
				CHECK("dereg-mappings-kept", 0, "byte %zu is %d", i, heap[i]);
				break;
			}
	}

	/* A fault that is the program's own still reaches its handler: on a
	 * page the library never moved, and on one it moved a moment ago. */
	for (int i = 0; i < 2; i++) {
		unsigned char *p = i ? base + page : base + PAGES * page;
		char name[64];

		fflush(stdout);
		t0 = now();
		pid = fork();
		if (pid == 0) {
			forked_child = 1;
			mprotect(p, (size_t)page, PROT_READ);
			*(volatile unsigned char *)p = 1;
			_exit(5);
		}
		waitpid(pid, &status, 0);
		t = now() - t0;
		snprintf(name, sizeof(name), "threads-program-handler-chained-%s", i ? "moved" : "unmoved");
		/* Not retried until a time-out: the page is not writable. */
		CHECK(name, WIFEXITED(status) && WEXITSTATUS(status) == 42 && t < 0.5, "child status 0x%x after %.3f s",
		      status, t);
	}

	/* A handler installed after the library's, chaining to it: a real
	 * fault goes through each handler once, then kills the program as
	 * the default action does. */
	{
		int fds[2];
		char buf[64];
		ssize_t got;

		if (pipe(fds))
			return 1;
		fflush(stdout);
		pid = fork();
		if (pid == 0) {
			close(fds[0]);
			chain_pipe = fds[1];
			forked_child = 0;
			chain_loop_child();
		}
		close(fds[1]);
		waitpid(pid, &status, 0);
		got = read(fds[0], buf, sizeof(buf));
		close(fds[0]);
		CHECK("threads-handler-chain-no-loop", WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV && got == 1,
		      "child status 0x%x, the later handler called %zd times", status, got);
	}

	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	return failed;
}
