// SPDX-License-Identifier: Apache-2.0
/*
 * Adopting a program's pages into guest memory, for memory regions
 * (verbs-abi.md §4, wire-local.md §4.6 and §9).
 *
 * A region's pages [s, e) are copied into free guest memory at offset g and
 * the guest memfd is mapped over them (MAP_SHARED|MAP_FIXED, offset g): the
 * program keeps its addresses and contents, and the agent sees the same
 * pages in the guest memory it maps. The write-protection of the range,
 * the copy and the mmap run in one assembly block with signals blocked,
 * so that nothing, not even a stack frame of this library, changes the
 * pages between the copy and the mmap; other threads' writes meanwhile
 * wait in segv_wait and are made again on the new mapping. Adopted pages
 * are MADV_DONTFORK, so that a child of fork does not share them with the
 * parent; in the child they are mapped again, private copies of the guest
 * memory's pages (vrdma_forget_memory), as a kernel that copies pinned
 * pages at fork gives. A registration inside a run
 * of adopted pages reuses it once /proc/self/maps confirms the mapping is
 * still ours (the program may have unmapped and mapped again). When the
 * last region of a run is deregistered, the pages are given back: a
 * private anonymous mapping elsewhere is filled from the guest memory and
 * moved over them (mremap), the range write-protected for the copy, again
 * in one block (a stack buffer's frame survives), and the guest memory is
 * free for the next registration.
 *
 * A registration across two or more runs needs them to be one: runs that
 * are neighbours both in the program's addresses and in guest memory are
 * merged (merge_runs). So that neighbours are, a range right after or
 * before a run takes the guest memory right after or before the run's
 * when it is free (a run of its own still: its pages go back when its
 * last region goes).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <stdint.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "vrdma.h"

struct run {
	uintptr_t va;  /* page-aligned start */
	size_t len;    /* bytes, whole pages */
	uint64_t goff; /* guest offset of va */
	int refs;      /* registered regions inside it */
	int into;      /* merged into run into-1 (its regions count there); 0: not */
};

struct extent {
	uint64_t off, len;
};

static pthread_mutex_t mem_mu = PTHREAD_MUTEX_INITIALIZER;
static struct run *runs; /* +guarded by mem_mu */
static int nruns, capruns;
static struct extent *freel; /* free guest memory, sorted by offset; +guarded by mem_mu */
static int nfree, capfree;
static int free_init;

void vrdma_forget_memory(int mem_fd)
{
	long page = sysconf(_SC_PAGESIZE);

	/* The parent's runs are absent here (MADV_DONTFORK): each becomes a
	 * private mapping of its guest pages, written once per page so that
	 * the copy is taken now and later writes of the parent or the agent
	 * do not show through. The parent's heap and stack on those pages
	 * stay whole in the child. */
	for (int i = 0; mem_fd >= 0 && i < nruns; i++) {
		struct run *r = &runs[i];

		if (mmap((void *)r->va, r->len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, mem_fd,
			 (off_t)r->goff) == MAP_FAILED)
			continue;
		for (size_t off = 0; off < r->len; off += (size_t)page) {
			volatile unsigned char *b = (volatile unsigned char *)(r->va + off);

			*b = *b;
		}
	}
	pthread_mutex_init(&mem_mu, NULL);
	runs = NULL; /* the parent's */
	nruns = capruns = 0;
	freel = NULL;
	nfree = capfree = 0;
	free_init = 0;
}

/* A fork waits for a registration or deregistration in another thread to
 * end: the child must not inherit pages write-protected for a move, nor
 * a run half made (its handler, vrdma_forget_memory, makes mem_mu anew). */
static void fork_prepare(void)
{
	pthread_mutex_lock(&mem_mu);
}

static void fork_parent(void)
{
	pthread_mutex_unlock(&mem_mu);
}

__attribute__((constructor)) static void mem_fork_handler(void)
{
	(void)pthread_atfork(fork_prepare, fork_parent, NULL);
}

static int extent_insert(int i, uint64_t off, uint64_t len)
{
	if (nfree == capfree) {
		int cap = capfree ? capfree * 2 : 16;
		struct extent *n = realloc(freel, (size_t)cap * sizeof(*n));

		if (!n)
			return -1;
		freel = n;
		capfree = cap;
	}
	memmove(freel + i + 1, freel + i, (size_t)(nfree - i) * sizeof(*freel));
	freel[i] = (struct extent){ off, len };
	nfree++;
	return 0;
}

/* free_list_init makes the free list the whole guest memory, once. */
static int free_list_init(struct vrdma_vm *vm)
{
	if (free_init)
		return 0;
	free_init = 1;
	return extent_insert(0, 0, vm->mem_size & ~(uint64_t)(sysconf(_SC_PAGESIZE) - 1));
}

/* guest_alloc takes len bytes (whole pages) of guest memory, first fit. */
static int guest_alloc(struct vrdma_vm *vm, uint64_t len, uint64_t *off)
{
	if (free_list_init(vm))
		return -1;
	for (int i = 0; i < nfree; i++) {
		if (freel[i].len >= len) {
			*off = freel[i].off;
			freel[i].off += len;
			freel[i].len -= len;
			if (freel[i].len == 0) {
				memmove(freel + i, freel + i + 1, (size_t)(nfree - i - 1) * sizeof(*freel));
				nfree--;
			}
			return 0;
		}
	}
	return -1;
}

/* guest_take_at takes [off, off+len) of guest memory if all of it is free:
 * how a run grows in place. */
static int guest_take_at(uint64_t off, uint64_t len)
{
	for (int i = 0; i < nfree; i++) {
		struct extent *x = &freel[i];

		if (off < x->off || off + len > x->off + x->len)
			continue;
		if (off == x->off) {
			x->off += len;
			x->len -= len;
			if (x->len == 0) {
				memmove(freel + i, freel + i + 1, (size_t)(nfree - i - 1) * sizeof(*freel));
				nfree--;
			}
			return 0;
		}
		if (off + len == x->off + x->len) {
			x->len -= len;
			return 0;
		}
		/* In the middle: split the extent in two. */
		{
			uint64_t tail_off = off + len, tail_len = x->off + x->len - tail_off;

			if (extent_insert(i + 1, tail_off, tail_len))
				return -1;
			freel[i].len = off - freel[i].off;
		}
		return 0;
	}
	return -1;
}

static void guest_free(uint64_t off, uint64_t len)
{
	int i = 0;

	while (i < nfree && freel[i].off < off)
		i++;
	if (i > 0 && freel[i - 1].off + freel[i - 1].len == off) {
		freel[i - 1].len += len;
		if (i < nfree && off + len == freel[i].off) {
			freel[i - 1].len += freel[i].len;
			memmove(freel + i, freel + i + 1, (size_t)(nfree - i - 1) * sizeof(*freel));
			nfree--;
		}
		return;
	}
	if (i < nfree && off + len == freel[i].off) {
		freel[i].off = off;
		freel[i].len += len;
		return;
	}
	(void)extent_insert(i, off, len); /* on ENOMEM the extent is lost, not reused */
}

/* maps_id is the guest memfd's identity in /proc/self/maps; 0 or -1. */
static int maps_id(struct vrdma_vm *vm, struct vrdma_maps_file *id)
{
	struct stat st;

	if (fstat(vm->mem_fd, &st))
		return -1;
	*id = (struct vrdma_maps_file){ major(st.st_dev), minor(st.st_dev), st.st_ino };
	return 0;
}

/*
 * check_range walks the mappings over [s, e) (vrdma_maps_check). With
 * want_ours, every byte must be the guest memfd at the guest offset
 * goff + (va - s); otherwise every byte must be private read-write memory.
 * 0, or an errno: EFAULT where nothing is mapped, EINVAL where the memory
 * cannot be adopted (why says which).
 */
static int check_range(struct vrdma_vm *vm, uintptr_t s, uintptr_t e, int want_ours, uint64_t goff, char *why,
		       size_t whylen)
{
	struct vrdma_maps_file id;
	char *maps;
	int rc;

	if (maps_id(vm, &id))
		return EIO;
	maps = vrdma_read_maps();
	if (!maps)
		return ENOMEM;
	rc = vrdma_maps_check(maps, &id, s, e, want_ours, goff, why, whylen);
	free(maps);
	return rc;
}

#if defined(__x86_64__)
/*
 * Moving pages under running threads. The kernel replaces a mapping
 * atomically for the program's other threads (mmap MAP_FIXED and mremap
 * MREMAP_FIXED run under the mm's write lock: an access sees the old
 * mapping or the new one, never a hole), so what can lose a byte is a
 * write to the old pages after they were copied, and what can show zeros
 * is a new mapping filled after it is in place. So a move write-protects
 * the range first, copies, and puts the new mapping in place already
 * filled, in one assembly block (the range may hold this thread's own
 * stack frame). A thread that writes there meanwhile faults; segv_wait, the
 * library's SIGSEGV handler, sees the address in the range being moved
 * and waits on a futex for the move to end, then returns: the write is
 * made again, on the new mapping. Faults that are not ours go to the
 * handler installed before (chained). Readers are never stopped.
 */
struct ksigaction { /* the kernel's struct sigaction on x86-64 */
	void *handler;
	unsigned long flags;
	void (*restorer)(void);
	uint64_t mask;
};

void vrdma_sigreturn(void) __attribute__((visibility("hidden")));
__asm__(".text\n\t.p2align 4\n\t.globl vrdma_sigreturn\n\t.hidden vrdma_sigreturn\n\t.type vrdma_sigreturn,@function\n"
	"vrdma_sigreturn:\n\tmovq $15, %rax\n\tsyscall\n\t.size vrdma_sigreturn,.-vrdma_sigreturn\n");

#ifndef SA_RESTORER
#define SA_RESTORER 0x04000000
#endif

/* The move in progress: moving is odd while [moving_s, moving_e) is
 * write-protected; each move adds 2. */
static uint32_t moving;
static uintptr_t moving_s, moving_e;

/* The last moves' ranges: a fault taken during a move can reach the
 * handler after the move ended (the faulting thread preempted between the
 * fault and the signal). A late fault in one of them is retried when the
 * page is writable now (MADV_POPULATE_WRITE, Linux 5.14, succeeds without
 * writing; EINVAL on a page that is not) or, on kernels without it, until
 * a second after the move. */
#define RECENT 8
#define RECENT_NS 1000000000LL
static struct {
	uintptr_t s, e;
	int64_t until;
} recent[RECENT];
static unsigned recent_next;

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
static uintptr_t page_size;	    /* for the handler: sysconf is not async-signal-safe */
static int populate_write;	    /* MADV_POPULATE_WRITE works (1) or not (-1); 0: not known yet */
static struct ksigaction prev_segv; /* the handler segv_wait chains to */
static void *chaining[8];	    /* siginfos being passed on, against loops */


static long ksigaction(int sig, const struct ksigaction *act, struct ksigaction *old)
{
	return syscall(SYS_rt_sigaction, sig, act, old, sizeof(uint64_t));
}

/* chain gives a fault that is not ours to the handler before ours; with
 * none (or with ours reached again through it), the default action. */
static void chain(int sig, siginfo_t *si, void *uc)
{
	struct ksigaction p = prev_segv;
	int slot = -1;

	for (int i = 0; i < 8; i++)
		if (__atomic_load_n(&chaining[i], __ATOMIC_ACQUIRE) == si)
			p.handler = SIG_DFL; /* its handler called ours again */
	if (p.handler == SIG_IGN && si->si_code <= 0)
		return; /* an ignored kill(SIGSEGV) */
	if (p.handler == SIG_DFL || p.handler == SIG_IGN) {
		struct ksigaction dfl = { .handler = SIG_DFL };

		ksigaction(sig, &dfl, NULL);
		if (si->si_code <= 0) /* sent, not a fault: send it again, pending until we return */
			syscall(SYS_tgkill, getpid(), syscall(SYS_gettid), sig);
		return; /* a fault: the access faults again, with the default action */
	}
	for (int i = 0; i < 8 && slot < 0; i++) {
		void *none = NULL;

		if (__atomic_compare_exchange_n(&chaining[i], &none, si, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
			slot = i;
	}
	if (p.flags & SA_SIGINFO)
		((void (*)(int, siginfo_t *, void *))p.handler)(sig, si, uc);
	else
		((void (*)(int))p.handler)(sig);
	if (slot >= 0)
		__atomic_store_n(&chaining[slot], NULL, __ATOMIC_RELEASE);
}

static void segv_wait(int sig, siginfo_t *si, void *uc)
{
	uintptr_t a = (uintptr_t)si->si_addr;
	int saved = errno;

	if (si->si_code == SEGV_ACCERR) {
		for (;;) {
			uint32_t m = __atomic_load_n(&moving, __ATOMIC_ACQUIRE);

			if (!(m & 1) || a < __atomic_load_n(&moving_s, __ATOMIC_RELAXED) ||
			    a >= __atomic_load_n(&moving_e, __ATOMIC_RELAXED))
				break;
			syscall(SYS_futex, &moving, FUTEX_WAIT_PRIVATE, m, NULL, NULL, 0);
			if (__atomic_load_n(&moving, __ATOMIC_ACQUIRE) != m) {
				errno = saved;
				return; /* moved: write again */
			}
		}
		for (int i = 0; i < RECENT; i++) {
			int64_t until = __atomic_load_n(&recent[i].until, __ATOMIC_ACQUIRE);
			uintptr_t pg = __atomic_load_n(&page_size, __ATOMIC_RELAXED);

			if (a < __atomic_load_n(&recent[i].s, __ATOMIC_ACQUIRE) ||
			    a >= __atomic_load_n(&recent[i].e, __ATOMIC_ACQUIRE) || !pg)
				continue;
			if (__atomic_load_n(&populate_write, __ATOMIC_RELAXED) > 0
				    ? syscall(SYS_madvise, a & ~(pg - 1), pg, MADV_POPULATE_WRITE) == 0
				    : (int64_t)vrdma_now_ns() < until) {
				errno = saved;
				return; /* writable now: the fault was a move's */
			}
			break; /* the program's own: write-protected still */
		}
	}
	chain(sig, si, uc);
	errno = saved;
}

/* own_segv installs segv_wait unless it is the handler already (the
 * program may have installed one since: it becomes the one chained to).
 * The raw system call: a library that interposes sigaction to keep its
 * own handler (UCX does) must not leave the moves unguarded. 0 or an
 * errno. +checklocks:mem_mu */
static int own_segv(void)
{
	struct ksigaction cur, ours = {
		.handler = (void *)segv_wait,
		.flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART | SA_RESTORER,
		.restorer = vrdma_sigreturn,
	};

	if (!populate_write) {
		/* On a page known writable (this variable's): EINVAL is an
		 * old kernel, where it also means not writable. */
		uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);

		__atomic_store_n(&page_size, pg, __ATOMIC_RELAXED);
		__atomic_store_n(&populate_write,
				 madvise((void *)((uintptr_t)&populate_write & ~(pg - 1)), pg, MADV_POPULATE_WRITE) ? -1 : 1,
				 __ATOMIC_RELAXED);
	}
	if (ksigaction(SIGSEGV, NULL, &cur))
		return errno;
	if (cur.handler == (void *)segv_wait)
		return 0;
	prev_segv = cur;
	return ksigaction(SIGSEGV, &ours, NULL) ? errno : 0;
}

/* move_begin and move_end bracket a move of [s, e), signals blocked in
 * this thread (old holds its mask). +checklocks:mem_mu */
static int move_begin(uintptr_t s, uintptr_t e, sigset_t *old)
{
	sigset_t all;
	int rc = own_segv();

	if (rc)
		return rc;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, old);
	__atomic_store_n(&moving_s, s, __ATOMIC_RELAXED);
	__atomic_store_n(&moving_e, e, __ATOMIC_RELAXED);
	__atomic_add_fetch(&moving, 1, __ATOMIC_ACQ_REL);
	return 0;
}

static void move_end(uintptr_t s, uintptr_t e, const sigset_t *old)
{
	unsigned i = recent_next++ % RECENT;

	/* A recent entry first, so that a late fault finds one or the other. */
	__atomic_store_n(&recent[i].until, 0, __ATOMIC_RELEASE);
	__atomic_store_n(&recent[i].s, s, __ATOMIC_RELEASE);
	__atomic_store_n(&recent[i].e, e, __ATOMIC_RELEASE);
	__atomic_store_n(&recent[i].until, (int64_t)vrdma_now_ns() + RECENT_NS, __ATOMIC_RELEASE);
	__atomic_add_fetch(&moving, 1, __ATOMIC_ACQ_REL);
	syscall(SYS_futex, &moving, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
	pthread_sigmask(SIG_SETMASK, old, NULL);
}

/* protect_copy_map write-protects [addr, addr+len), copies it to dst, and
 * maps fd at offset off over it, shared and fixed, in one block that
 * writes no memory but dst: not even its own stack. With sparse, len is
 * whole 4 KiB pages and only the pages that hold a nonzero byte are
 * copied (dst must read zeros: a hole of the file); reading a page the
 * program never touched maps the kernel's zero page and allocates
 * nothing. On a failure the range is made writable again. The raw result
 * of the failed call or of mmap. */
static long protect_copy_map(void *addr, size_t len, void *dst, int fd, uint64_t off, int sparse)
{
	/* Every operand in a register of its own: rep movs and scas move
	 * rdi, rsi and rcx, and syscall clobbers rcx and r11; rbx is the
	 * sparse copy's page offset. */
	register long r10 __asm__("r10") = MAP_SHARED | MAP_FIXED;
	register long r8 __asm__("r8") = fd;
	register long r9 __asm__("r9") = (long)off;
	register void *r12 __asm__("r12") = addr;
	register size_t r13 __asm__("r13") = len;
	register void *r14 __asm__("r14") = dst;
	register long r15 __asm__("r15") = sparse;
	long ret;

	__asm__ volatile("mov %%r12, %%rdi\n\t"
			 "mov %%r13, %%rsi\n\t"
			 "mov %[ro], %%edx\n\t"
			 "mov $10, %%eax\n\t" /* mprotect */
			 "syscall\n\t"
			 "cmp $-4095, %%rax\n\t"
			 "jae 2f\n\t"
			 "test %%r15, %%r15\n\t"
			 "jnz 5f\n\t"
			 "mov %%r14, %%rdi\n\t"
			 "mov %%r12, %%rsi\n\t"
			 "mov %%r13, %%rcx\n\t"
			 "rep movsb\n\t"
			 "jmp 6f\n"
			 "5:\n\t" /* sparse: page by page */
			 "xor %%ebx, %%ebx\n"
			 "7:\n\t"
			 "cmp %%r13, %%rbx\n\t"
			 "jae 6f\n\t"
			 "lea (%%r12,%%rbx), %%rdi\n\t"
			 "mov $512, %%ecx\n\t"
			 "xor %%eax, %%eax\n\t"
			 "repe scasq\n\t" /* ZF: every quadword zero */
			 "je 8f\n\t"
			 "lea (%%r12,%%rbx), %%rsi\n\t"
			 "lea (%%r14,%%rbx), %%rdi\n\t"
			 "mov $512, %%ecx\n\t"
			 "rep movsq\n"
			 "8:\n\t"
			 "add $4096, %%rbx\n\t"
			 "jmp 7b\n"
			 "6:\n\t"
			 "mov %%r12, %%rdi\n\t"
			 "mov %%r13, %%rsi\n\t"
			 "mov %[rw], %%edx\n\t"
			 "mov $9, %%eax\n\t" /* mmap */
			 "syscall\n\t"
			 "cmp $-4095, %%rax\n\t"
			 "jb 3f\n"
			 "2:\n\t"
			 "mov %%rax, %%r15\n\t"
			 "mov %%r12, %%rdi\n\t"
			 "mov %%r13, %%rsi\n\t"
			 "mov %[rw], %%edx\n\t"
			 "mov $10, %%eax\n\t"
			 "syscall\n\t"
			 "mov %%r15, %%rax\n"
			 "3:"
			 : "=a"(ret), "+r"(r15)
			 : "r"(r12), "r"(r13), "r"(r14), "r"(r10), "r"(r8), "r"(r9), [ro] "i"(PROT_READ),
			   [rw] "i"(PROT_READ | PROT_WRITE)
			 : "rbx", "rdi", "rsi", "rcx", "rdx", "r11", "memory", "cc");
	return ret;
}

/* protect_copy_move write-protects [addr, addr+len), copies len bytes from
 * src into the private anonymous mapping tmp, and moves tmp over the range
 * (mremap, fixed), in one block that writes no memory but tmp. On a
 * failure the range is made writable again. The raw result of the failed
 * call or of mremap. */
static long protect_copy_move(void *addr, size_t len, const void *src, void *tmp)
{
	register long r10 __asm__("r10") = MREMAP_MAYMOVE | MREMAP_FIXED;
	register void *r8 __asm__("r8") = addr;
	register void *r12 __asm__("r12") = addr;
	register size_t r13 __asm__("r13") = len;
	register const void *r14 __asm__("r14") = src;
	register void *r15 __asm__("r15") = tmp;
	long ret;

	__asm__ volatile("mov %%r12, %%rdi\n\t"
			 "mov %%r13, %%rsi\n\t"
			 "mov %[ro], %%edx\n\t"
			 "mov $10, %%eax\n\t" /* mprotect */
			 "syscall\n\t"
			 "cmp $-4095, %%rax\n\t"
			 "jae 2f\n\t"
			 "mov %%r15, %%rdi\n\t"
			 "mov %%r14, %%rsi\n\t"
			 "mov %%r13, %%rcx\n\t"
			 "rep movsb\n\t"
			 "mov %%r15, %%rdi\n\t"
			 "mov %%r13, %%rsi\n\t"
			 "mov %%r13, %%rdx\n\t"
			 "mov $25, %%eax\n\t" /* mremap */
			 "syscall\n\t"
			 "cmp $-4095, %%rax\n\t"
			 "jb 3f\n"
			 "2:\n\t"
			 "mov %%rax, %%r9\n\t"
			 "mov %%r12, %%rdi\n\t"
			 "mov %%r13, %%rsi\n\t"
			 "mov %[rw], %%edx\n\t"
			 "mov $10, %%eax\n\t"
			 "syscall\n\t"
			 "mov %%r9, %%rax\n"
			 "3:"
			 : "=a"(ret)
			 : "r"(r12), "r"(r13), "r"(r14), "r"(r15), "r"(r10), "r"(r8), [ro] "i"(PROT_READ),
			   [rw] "i"(PROT_READ | PROT_WRITE)
			 : "rdi", "rsi", "rcx", "rdx", "r9", "r11", "memory", "cc");
	return ret;
}
#endif

/* ours_bytes counts the bytes of [s, e) still mapped from the guest memfd
 * at goff + (va - s) (vrdma_maps_ours). */
static uint64_t ours_bytes(struct vrdma_vm *vm, uintptr_t s, uintptr_t e, uint64_t goff)
{
	struct vrdma_maps_file id;
	char *maps;
	uint64_t n;

	if (maps_id(vm, &id) || !(maps = vrdma_read_maps()))
		return e - s; /* unknown: assume all */
	n = vrdma_maps_ours(maps, &id, s, e, goff);
	free(maps);
	return n;
}

/* adopt_at copies and maps [s, e) onto guest offset goff, other threads'
 * writes there held off meanwhile; 0 or an errno. With on_demand (an
 * IBV_ACCESS_ON_DEMAND region), the guest memory is emptied first (a hole
 * of the memfd, which allocates nothing) and only pages that hold data
 * are copied: the others are populated when the program, the device or a
 * prefetch first touches them. +checklocks:mem_mu */
static int adopt_at(struct vrdma_vm *vm, uintptr_t s, uintptr_t e, uint64_t goff, int on_demand)
{
#if defined(__x86_64__)
	sigset_t old;
	long r;
	int rc;

	on_demand = on_demand && sysconf(_SC_PAGESIZE) == 4096 &&
		    fallocate(vm->mem_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)goff, (off_t)(e - s)) == 0;
	rc = move_begin(s, e, &old);
	if (rc)
		return rc;
	r = protect_copy_map((void *)s, e - s, (char *)vm->mem + goff, vm->mem_fd, goff, on_demand);
	move_end(s, e, &old);
	if (r < 0 && r > -4096)
		return (int)-r;
	(void)madvise((void *)s, e - s, MADV_DONTFORK);
	return 0;
#else
	(void)vm, (void)s, (void)e, (void)goff, (void)on_demand;
	return EOPNOTSUPP; /* the copy-and-map block exists for x86-64 only */
#endif
}

/* give_back makes [s, e), adopted at guest offset goff, private anonymous
 * memory again with the same contents, other threads' writes there held
 * off meanwhile and their reads never seeing anything else; 0 or an
 * errno (the pages still adopted). +checklocks:mem_mu */
static int give_back(struct vrdma_vm *vm, uintptr_t s, uintptr_t e, uint64_t goff)
{
#if defined(__x86_64__)
	void *tmp = mmap(NULL, e - s, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	sigset_t old;
	long r;
	int rc;

	if (tmp == MAP_FAILED)
		return errno;
	rc = move_begin(s, e, &old);
	if (rc) {
		munmap(tmp, e - s);
		return rc;
	}
	r = protect_copy_move((void *)s, e - s, (char *)vm->mem + goff, tmp);
	move_end(s, e, &old);
	if (r < 0 && r > -4096) {
		munmap(tmp, e - s);
		return (int)-r;
	}
	return 0;
#else
	(void)vm, (void)s, (void)e, (void)goff;
	return EOPNOTSUPP;
#endif
}

/* live returns the run a region's run index i counts in now (following
 * merges). +checklocks:mem_mu */
static int live(int i)
{
	while (i >= 0 && i < nruns && runs[i].into)
		i = runs[i].into - 1;
	return i;
}

/* merge_runs makes the runs that [s, e) overlaps one run when there are
 * several and they are neighbours both in the program's addresses and in
 * guest memory, each still mapped from it: the first (lowest) takes the
 * others' pages and regions. Otherwise it changes nothing (the caller
 * then refuses the registration, saying why). +checklocks:mem_mu */
static void merge_runs(struct vrdma_vm *vm, uintptr_t s, uintptr_t e)
{
	int idx[64], n = 0;
	char why[256];

	for (int i = 0; i < nruns && n < 64; i++)
		if (runs[i].len && s < runs[i].va + runs[i].len && e > runs[i].va)
			idx[n++] = i;
	if (n < 2 || n == 64)
		return;
	for (int a = 1; a < n; a++) /* by address */
		for (int b = a; b > 0 && runs[idx[b]].va < runs[idx[b - 1]].va; b--) {
			int t = idx[b];

			idx[b] = idx[b - 1];
			idx[b - 1] = t;
		}
	for (int k = 0; k < n; k++) {
		struct run *r = &runs[idx[k]];

		if (k > 0 && (r->va != runs[idx[k - 1]].va + runs[idx[k - 1]].len ||
			      r->goff != runs[idx[k - 1]].goff + runs[idx[k - 1]].len))
			return;
		if (check_range(vm, r->va, r->va + r->len, 1, r->goff, why, sizeof(why)))
			return;
	}
	for (int k = 1; k < n; k++) {
		struct run *first = &runs[idx[0]], *r = &runs[idx[k]];

		first->len += r->len;
		first->refs += r->refs;
		r->len = 0;
		r->refs = 0;
		r->into = idx[0] + 1;
	}
}

/* neighbour_goff finds guest memory for new pages [s, e) right after or
 * right before a run that ends at s or starts at e, and takes it; 0 or -1
 * for none free. +checklocks:mem_mu */
static int neighbour_goff(uintptr_t s, uintptr_t e, uint64_t *goff)
{
	for (int i = 0; i < nruns; i++) {
		struct run *r = &runs[i];

		if (r->len && r->va + r->len == s && guest_take_at(r->goff + r->len, e - s) == 0) {
			*goff = r->goff + r->len;
			return 0;
		}
		if (r->len && r->va == e && r->goff >= e - s && guest_take_at(r->goff - (e - s), e - s) == 0) {
			*goff = r->goff - (e - s);
			return 0;
		}
	}
	return -1;
}

/* grow_run extends run i, which [s, e) overlaps in part, to cover it: the
 * pages before and after it are adopted onto the guest memory right
 * before and after the run's, which must be free (the run stays one
 * block in guest memory, as its regions' guest addresses need), and must
 * touch no other run. 0, or an errno with why. +checklocks:mem_mu */
static int grow_run(struct vrdma_vm *vm, int i, uintptr_t s, uintptr_t e, int on_demand, char *why, size_t whylen)
{
	struct run *rn = &runs[i];
	uintptr_t rs = rn->va, re = rn->va + rn->len;
	uint64_t pre = s < rs ? rs - s : 0, post = e > re ? e - re : 0;
	int rc;

	for (int j = 0; j < nruns; j++) {
		if (j != i && runs[j].len && s < runs[j].va + runs[j].len && e > runs[j].va) {
			snprintf(why, whylen, "it also overlaps [0x%lx, 0x%lx): runs that are not neighbours in guest memory too cannot be joined",
				 (unsigned long)runs[j].va, (unsigned long)(runs[j].va + runs[j].len));
			return EINVAL;
		}
	}
	if (check_range(vm, rs, re, 1, rn->goff, why, whylen))
		return EINVAL;
	if ((pre && check_range(vm, s, rs, 0, 0, why, whylen)) || (post && check_range(vm, re, e, 0, 0, why, whylen)))
		return EINVAL;
	if (pre > rn->goff || (pre && guest_take_at(rn->goff - pre, pre))) {
		snprintf(why, whylen, "the guest memory before the run's is in use: register the whole range first");
		return EINVAL;
	}
	if (post && guest_take_at(rn->goff + rn->len, post)) {
		if (pre)
			guest_free(rn->goff - pre, pre);
		snprintf(why, whylen, "the guest memory after the run's is in use: register the whole range first");
		return EINVAL;
	}
	if (pre && (rc = adopt_at(vm, s, rs, rn->goff - pre, on_demand))) {
		guest_free(rn->goff - pre, pre);
		if (post)
			guest_free(rn->goff + rn->len, post);
		snprintf(why, whylen, "mapping guest memory over its pages: %s", strerror(rc));
		return rc;
	}
	if (post && (rc = adopt_at(vm, re, e, rn->goff + rn->len, on_demand))) {
		guest_free(rn->goff + rn->len, post);
		if (pre) {
			/* The prefix is adopted: keep it in the run. */
			rn->va -= pre;
			rn->goff -= pre;
			rn->len += pre;
		}
		snprintf(why, whylen, "mapping guest memory over its pages: %s", strerror(rc));
		return rc;
	}
	rn->va -= pre;
	rn->goff -= pre;
	rn->len += pre + post;
	return 0;
}

/* huge_align widens [*s, *e) to whole huge pages where an end of it lies
 * in a huge-page mapping (MAP_HUGETLB, hugetlbfs): the kernel changes such
 * a mapping (write-protects it, maps the guest memory over it) only in
 * whole pages of its size. The pages adopted are the guest memory's
 * 4 KiB pages from then on, as every adopted page is; their contents are
 * the program's. smaps is read only when an end is in a huge-page mapping:
 * reading it walks every mapping's page tables, and its buffer, megabytes
 * in a large program, would come and go through the program's allocator
 * (and memory hooks, as UCX's) in the middle of a registration. */
static void huge_align(uintptr_t *s, uintptr_t *e)
{
	char *maps = vrdma_read_maps(), *smaps;
	uintptr_t hs, he;

	if (!maps)
		return;
	if (!vrdma_maps_huge(maps, *s) && !vrdma_maps_huge(maps, *e - 1)) {
		free(maps);
		return;
	}
	smaps = vrdma_read_proc("/proc/self/smaps");
	hs = vrdma_huge_page(maps, smaps, *s);
	he = vrdma_huge_page(maps, smaps, *e - 1);
	if (hs)
		*s &= ~(hs - 1);
	if (he && *e + (he - 1) > *e)
		*e = (*e + he - 1) & ~(he - 1);
	free(smaps);
	free(maps);
}

int vrdma_adopt(struct vrdma_vm *vm, void *addr, size_t length, int on_demand, uint64_t *guest, void **handle)
{
	uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
	uintptr_t a = (uintptr_t)addr, s, e;
	uint64_t goff;
	char why[1024];
	int rc, i;

	if (length == 0 || a + length < a)
		return EINVAL;
	s = a & ~(page - 1);
	e = (a + length + page - 1) & ~(page - 1);
	huge_align(&s, &e);
	pthread_mutex_lock(&mem_mu);
	merge_runs(vm, s, e);
	for (i = 0; i < nruns; i++) {
		struct run *rn = &runs[i];

		if (rn->len == 0 || s >= rn->va + rn->len || e <= rn->va)
			continue;
		if (s >= rn->va && e <= rn->va + rn->len) {
			if (!check_range(vm, s, e, 1, rn->goff + (s - rn->va), why, sizeof(why))) {
				rn->refs++;
				*guest = rn->goff + (a - rn->va);
				*handle = (void *)(uintptr_t)(i + 1);
				pthread_mutex_unlock(&mem_mu);
				return 0;
			}
			if (rn->refs > 0) {
				vrdma_warn("ibv_reg_mr(%p, %zu): %s while a memory region still uses them", addr,
					   length, why);
				pthread_mutex_unlock(&mem_mu);
				return EINVAL;
			}
			/* The program unmapped the run and mapped new memory there:
			 * forget it (its guest memory is not reused: the agent may
			 * still be copying into it for a region just deregistered). */
			rn->len = 0;
			continue;
		}
		rc = grow_run(vm, i, s, e, on_demand, why, sizeof(why));
		if (rc == 0) {
			rn = &runs[i];
			rn->refs++;
			*guest = rn->goff + (a - rn->va);
			*handle = (void *)(uintptr_t)(i + 1);
			pthread_mutex_unlock(&mem_mu);
			return 0;
		}
		vrdma_warn("ibv_reg_mr(%p, %zu): the range overlaps an earlier registration [0x%lx, 0x%lx) only in "
			   "part, and %s",
			   addr, length, (unsigned long)rn->va, (unsigned long)(rn->va + rn->len), why);
		pthread_mutex_unlock(&mem_mu);
		return rc;
	}
	rc = check_range(vm, s, e, 0, 0, why, sizeof(why));
	if (rc) {
		vrdma_warn("ibv_reg_mr(%p, %zu): %s", addr, length, why);
		pthread_mutex_unlock(&mem_mu);
		return rc;
	}
	if (free_list_init(vm) || (neighbour_goff(s, e, &goff) && guest_alloc(vm, e - s, &goff))) {
		vrdma_warn("ibv_reg_mr(%p, %zu): VM %s's guest memory (memSize, %llu bytes) has no %lu bytes free for "
			   "it: raise memSize",
			   addr, length, vm->name, (unsigned long long)vm->mem_size, (unsigned long)(e - s));
		pthread_mutex_unlock(&mem_mu);
		return ENOMEM;
	}
	if (nruns == capruns) {
		int cap = capruns ? capruns * 2 : 16;
		struct run *n = realloc(runs, (size_t)cap * sizeof(*n));

		if (!n) {
			guest_free(goff, e - s);
			pthread_mutex_unlock(&mem_mu);
			return ENOMEM;
		}
		runs = n;
		capruns = cap;
	}
	rc = adopt_at(vm, s, e, goff, on_demand);
	if (rc) {
		guest_free(goff, e - s);
		vrdma_warn("ibv_reg_mr(%p, %zu): mapping guest memory over the pages: %s", addr, length, strerror(rc));
		pthread_mutex_unlock(&mem_mu);
		return rc;
	}
	runs[nruns] = (struct run){ .va = s, .len = e - s, .goff = goff, .refs = 1 };
	*handle = (void *)(uintptr_t)(nruns + 1);
	nruns++;
	*guest = goff + (a - s);
	pthread_mutex_unlock(&mem_mu);
	return 0;
}

void vrdma_unadopt(struct vrdma_vm *vm, void *handle)
{
	int i = (int)(uintptr_t)handle - 1;
	struct run *rn;
	char why[1024];

	pthread_mutex_lock(&mem_mu);
	i = live(i);
	if (i < 0 || i >= nruns || runs[i].refs == 0) {
		pthread_mutex_unlock(&mem_mu);
		return;
	}
	rn = &runs[i];
	if (--rn->refs > 0 || rn->len == 0) {
		pthread_mutex_unlock(&mem_mu);
		return;
	}
	if (!check_range(vm, rn->va, rn->va + rn->len, 1, rn->goff, why, sizeof(why))) {
		/* Still the program's memory, adopted: give it back. */
		if (give_back(vm, rn->va, rn->va + rn->len, rn->goff)) {
			/* Still adopted, and consistent: keep the run (and its
			 * guest memory) for a later registration. */
			pthread_mutex_unlock(&mem_mu);
			return;
		}
		guest_free(rn->goff, rn->len);
	} else if (ours_bytes(vm, rn->va, rn->va + rn->len, rn->goff) == 0) {
		/* The program unmapped it (freed before dereg): nothing of it
		 * aliases the guest memory any more. */
		guest_free(rn->goff, rn->len);
	}
	/* Otherwise part of it is still mapped from guest memory at
	 * addresses the program changed: that guest memory is never reused. */
	rn->len = 0;
	pthread_mutex_unlock(&mem_mu);
}
