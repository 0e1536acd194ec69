// SPDX-License-Identifier: Apache-2.0
/*
 * The reader of /proc/self/maps (mem.c asks it whether pages can be
 * adopted, and whether adopted ones are still the guest memory's). The
 * parsing takes the text, so that a fuzz target feeds it anything
 * (tests/maps_fuzz.c, guest's FuzzCMaps): the file is the kernel's, but
 * its paths are any name a program gave a file it mapped.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "vrdma.h"

char *vrdma_read_proc(const char *path)
{
	size_t cap = 65536, len = 0;
	char *buf = malloc(cap);
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (!buf || fd < 0) {
		free(buf);
		if (fd >= 0)
			close(fd);
		return NULL;
	}
	for (;;) {
		ssize_t n;

		if (len + 4096 + 1 > cap) {
			char *b = realloc(buf, cap * 2);

			if (!b) {
				free(buf);
				close(fd);
				return NULL;
			}
			buf = b;
			cap *= 2;
		}
		n = read(fd, buf + len, cap - len - 1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		len += (size_t)n;
	}
	close(fd);
	buf[len] = 0;
	return buf;
}

char *vrdma_read_maps(void)
{
	return vrdma_read_proc("/proc/self/maps");
}

/* next_line returns the line after l's, or the text's end. */
static const char *next_line(const char *l)
{
	const char *nl = strchr(l, '\n');

	return nl ? nl + 1 : l + strlen(l);
}

int vrdma_parse_mapline(const char *l, struct vrdma_mapline *m)
{
	const char *nl = strchr(l, '\n');
	size_t len = nl ? (size_t)(nl - l) : strlen(l);
	char line[512];
	int n = 0;

	memset(m, 0, sizeof(*m));
	if (len >= sizeof(line))
		len = sizeof(line) - 1;
	memcpy(line, l, len);
	line[len] = 0;
	if (sscanf(line, "%lx-%lx %4s %lx %x:%x %lu%n", &m->start, &m->end, m->perms, &m->offset, &m->major,
		   &m->minor, &m->inode, &n) < 7)
		return -1;
	while (line[n] == ' ')
		n++;
	snprintf(m->path, sizeof(m->path), "%s", line + n);
	return 0;
}

static int is_file(const struct vrdma_mapline *m, const struct vrdma_maps_file *f)
{
	return m->inode == f->inode && m->major == f->major && m->minor == f->minor;
}

int vrdma_maps_check(const char *maps, const struct vrdma_maps_file *ours, uintptr_t s, uintptr_t e, int want_ours,
		     uint64_t goff, char *why, size_t whylen)
{
	uintptr_t at = s;
	int rc;

	snprintf(why, whylen, "address 0x%lx is not mapped", (unsigned long)s);
	for (const char *l = maps; *l && at < e; l = next_line(l)) {
		struct vrdma_mapline m;

		if (vrdma_parse_mapline(l, &m) || m.end <= at)
			continue;
		if (m.start > at) {
			snprintf(why, whylen, "address 0x%lx is not mapped", (unsigned long)at);
			return EFAULT;
		}
		if (want_ours) {
			if (!is_file(&m, ours) || m.perms[3] != 's' || m.offset + (at - m.start) != goff + (at - s)) {
				snprintf(why, whylen, "the pages at 0x%lx are no longer the adopted ones", (unsigned long)at);
				return EINVAL;
			}
		} else {
			if (m.perms[0] != 'r' || m.perms[1] != 'w') {
				snprintf(why, whylen, "the mapping at 0x%lx (%s) is not readable and writable", (unsigned long)at,
					 m.perms);
				return EINVAL;
			}
			/* Private memory: anonymous (heap, stack, mmap, private
			 * huge pages: "/anon_hugepage") or a file's private copy
			 * (a program's .data, a MAP_PRIVATE file mapping, of
			 * hugetlbfs too), whose pages are the process's own once
			 * written; not shared mappings, or devices. */
			int file_private = m.path[0] == '/' &&
					   (strncmp(m.path, "/dev/", 5) || !strncmp(m.path, "/dev/zero", 9));

			if (m.perms[3] != 'p' || (m.path[0] && m.path[0] != '[' && !file_private) ||
			    (m.path[0] == '[' && strcmp(m.path, "[heap]") && strncmp(m.path, "[stack", 6))) {
				snprintf(why, whylen,
					 "the mapping at 0x%lx (%s %s) is %s: only private memory (heap, stack, "
					 "anonymous mmap, a program's data, a MAP_PRIVATE file mapping) can be registered",
					 (unsigned long)at, m.perms, m.path[0] ? m.path : "anonymous",
					 m.perms[3] != 'p' ? "shared" : "a device's or the kernel's");
				return EINVAL;
			}
		}
		at = m.end;
	}
	rc = at >= e ? 0 : EFAULT;
	if (rc)
		snprintf(why, whylen, "address 0x%lx is not mapped", (unsigned long)at);
	return rc;
}

uint64_t vrdma_maps_ours(const char *maps, const struct vrdma_maps_file *ours, uintptr_t s, uintptr_t e, uint64_t goff)
{
	uint64_t n = 0;

	for (const char *l = maps; *l; l = next_line(l)) {
		struct vrdma_mapline m;
		uintptr_t a, b;

		if (vrdma_parse_mapline(l, &m) || m.end <= s || m.start >= e)
			continue;
		a = m.start > s ? m.start : s;
		b = m.end < e ? m.end : e;
		if (is_file(&m, ours) && m.offset + (a - m.start) == goff + (a - s))
			n += b - a;
	}
	return n;
}

int vrdma_maps_huge(const char *maps, uintptr_t a)
{
	for (const char *l = maps; *l; l = next_line(l)) {
		struct vrdma_mapline m;

		if (!vrdma_parse_mapline(l, &m) && m.start <= a && a < m.end)
			return strstr(m.path, "huge") != NULL;
	}
	return 0;
}

uintptr_t vrdma_huge_page(const char *maps, const char *smaps, uintptr_t a)
{
	int in = 0;

	if (!vrdma_maps_huge(maps, a) || !smaps)
		return 0;
	for (const char *l = smaps; *l; l = next_line(l)) {
		struct vrdma_mapline m;
		unsigned long kb;

		if (!vrdma_parse_mapline(l, &m)) {
			in = m.start <= a && a < m.end;
			continue;
		}
		if (in && sscanf(l, "KernelPageSize: %lu kB", &kb) == 1)
			return kb && kb <= (1UL << 30) && !(kb & (kb - 1)) ? (uintptr_t)kb << 10 : 0;
	}
	return 0;
}
