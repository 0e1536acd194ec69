// SPDX-License-Identifier: Apache-2.0
/*
 * json_fuzz: feeds inputs to json.c's reader, the library's parser of every
 * agent reply and event (docs/wire-local.md §1.3). Driven by guest's
 * FuzzCJSON, which builds it with -fsanitize=address,undefined where gcc
 * has them: it reads inputs from stdin, each a 4-byte little-endian length
 * and that many bytes, and answers one byte "k" per input it survived. Each
 * input is copied into a buffer of exactly its size, so that a read past
 * the text is a sanitizer report (or a crash), not a silent success.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../vrdma.h"

static const char *keys[] = { "handle", "caps", "layout", "code", "field", "message", "adapters", "event", "" };

/* exercise calls every reader of json.c on every token of d. */
static void exercise(const struct json_doc *d)
{
	char buf[64];
	uint64_t u;
	uint32_t u32;
	int b, v;

	for (int t = 0; t < d->n; t++) {
		json_u64(d, t, &u);
		json_bool(d, t, &b);
		json_str(d, t, buf, sizeof(buf));
		json_str(d, t, buf, 1);
		for (int i = 0; i < 3; i++)
			json_elem(d, t, i);
		for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++) {
			json_get(d, t, keys[k]);
			json_get_u64(d, t, keys[k], &u);
			json_get_u32(d, t, keys[k], &u32);
			json_get_int(d, t, keys[k], &v);
			json_get_str(d, t, keys[k], buf, sizeof(buf));
		}
	}
	/* Out-of-range tokens are refused, never read. */
	json_get(d, -1, "handle");
	json_get(d, d->n, "handle");
	json_u64(d, -1, &u);
	json_elem(d, d->n + 5, 0);
}

int main(void)
{
	unsigned char lenb[4];

	while (fread(lenb, 1, 4, stdin) == 4) {
		uint32_t n = (uint32_t)lenb[0] | (uint32_t)lenb[1] << 8 | (uint32_t)lenb[2] << 16 | (uint32_t)lenb[3] << 24;
		char *text = malloc(n ? n : 1);
		struct json_doc d;

		if (!text || fread(text, 1, n, stdin) != n)
			return 2;
		memset(&d, 0, sizeof(d));
		if (json_parse(&d, text, (int)n) == 0)
			exercise(&d);
		json_free(&d);
		free(text);
		fputc('k', stdout);
		fflush(stdout);
	}
	return 0;
}
