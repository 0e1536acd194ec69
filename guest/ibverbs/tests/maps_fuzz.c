// SPDX-License-Identifier: Apache-2.0
/*
 * maps_fuzz: feeds inputs, as the text of /proc/self/maps, to maps.c, the
 * library's reader of it (mem.c's check of what ibv_reg_mr adopts).
 * Driven by guest's FuzzCMaps, which builds it with
 * -fsanitize=address,undefined where gcc has them: it reads inputs from
 * stdin, each a 4-byte little-endian length and that many bytes, and
 * answers one byte "k" per input it survived. Each input is copied into a
 * buffer of exactly its size and the terminating NUL the reader is given
 * (vrdma_read_maps ends its text with one), so that a read past it is a
 * sanitizer report, not a silent success. Every line is parsed; every
 * range a line names, and ranges around and inside it, is checked as
 * memory to adopt and as adopted memory (of the first line's file and of
 * no file), with a reason buffer of 256 bytes and of 1; the huge page of
 * each mapping's ends and middle is asked with the text as smaps too; an
 * answer outside the reader's contract aborts.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../vrdma.h"

#define MAXLINES 32

static void check(const char *maps, const struct vrdma_maps_file *f, uintptr_t s, uintptr_t e, uint64_t goff)
{
	char why[256], tiny[1];

	for (int want = 0; want < 2; want++) {
		int rc = vrdma_maps_check(maps, f, s, e, want, goff, why, sizeof(why));

		if ((rc != 0 && rc != EFAULT && rc != EINVAL) || !memchr(why, 0, sizeof(why)))
			abort();
		rc = vrdma_maps_check(maps, f, s, e, want, goff, tiny, sizeof(tiny));
		if ((rc != 0 && rc != EFAULT && rc != EINVAL) || tiny[0])
			abort();
	}
	(void)vrdma_maps_ours(maps, f, s, e, goff);
}

static void exercise(const char *maps)
{
	struct vrdma_mapline m[MAXLINES];
	struct vrdma_maps_file files[2] = { { 0, 0, 0 }, { 0, 0, 0 } };
	int n = 0;

	for (const char *l = maps; *l && n < MAXLINES;) {
		const char *nl = strchr(l, '\n');

		if (vrdma_parse_mapline(l, &m[n]) == 0) {
			if (!memchr(m[n].perms, 0, sizeof(m[n].perms)) || !memchr(m[n].path, 0, sizeof(m[n].path)))
				abort();
			n++;
		}
		l = nl ? nl + 1 : l + strlen(l);
	}
	if (n > 0)
		files[1] = (struct vrdma_maps_file){ m[0].major, m[0].minor, m[0].inode };
	for (int k = 0; k < 2; k++) {
		const struct vrdma_maps_file *f = &files[k];

		check(maps, f, 0, UINTPTR_MAX, 0);
		check(maps, f, 0x1000, 0x2000, 0);
		for (int i = 0; i < n; i++) {
			check(maps, f, m[i].start, m[i].end, m[i].offset);
			check(maps, f, m[i].start - 4096, m[i].end + 4096, m[i].offset - 4096);
			check(maps, f, m[i].start + 1, m[i].end - 1, m[i].offset + 1);
			if (i + 1 < n)
				check(maps, f, m[i].start, m[i + 1].end, m[i].offset);
		}
	}
	/* The text as smaps too (its KernelPageSize lines, if any): a page
	 * size is 0 or a power of two of at most 1 GiB. */
	for (int i = 0; i < n; i++) {
		for (int j = 0; j < 3; j++) {
			uintptr_t a = j == 0 ? m[i].start : j == 1 ? m[i].end - 1 : m[i].start + (m[i].end - m[i].start) / 2;
			uintptr_t ps = vrdma_huge_page(maps, maps, a);

			if ((ps & (ps - 1)) || ps > ((uintptr_t)1 << 30) || vrdma_huge_page(maps, NULL, a))
				abort();
		}
	}
}

int main(void)
{
	unsigned char lenb[4];

	while (fread(lenb, 1, 4, stdin) == 4) {
		uint32_t n = (uint32_t)lenb[0] | (uint32_t)lenb[1] << 8 | (uint32_t)lenb[2] << 16 | (uint32_t)lenb[3] << 24;
		char *text = malloc((size_t)n + 1);

		if (!text || fread(text, 1, n, stdin) != n)
			return 2;
		text[n] = 0;
		exercise(text);
		free(text);
		fputc('k', stdout);
		fflush(stdout);
	}
	return 0;
}
