/* SPDX-License-Identifier: Apache-2.0 */
/* The C tests' check: prints "ok NAME" or "FAIL NAME: why" (what the Go
 * side reads), and remembers a failure for main's exit status. */
#ifndef VRDMA_TESTS_CHECK_H
#define VRDMA_TESTS_CHECK_H

#include <stdio.h>

static int failed;

#define CHECK(name, cond, ...)                     \
	do {                                       \
		if (cond) {                        \
			printf("ok %s\n", name);   \
		} else {                           \
			printf("FAIL %s: ", name); \
			printf(__VA_ARGS__);       \
			printf("\n");              \
			failed = 1;                \
		}                                  \
		fflush(stdout);                    \
	} while (0)

#endif
