#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# check-exports.sh SYSLIB OURS: fails unless OURS exports every symbol of
# SYSLIB in the same version node (default or compat alike).
set -eu
syms() {
	objdump -T "$1" | awk '$0 ~ / D[FO] / && $0 !~ /\*UND\*/ && $0 !~ /\*ABS\*/ { print $(NF-1), $NF }' | sort -u
}
missing=$(syms "$1" | comm -23 - "$(t=$(mktemp); syms "$2" >"$t"; echo "$t")")
if [ -n "$missing" ]; then
	echo "check-exports: $2 lacks these exports of $1:" >&2
	echo "$missing" >&2
	exit 1
fi
echo "check-exports: all $(syms "$1" | wc -l) exports of $1 present"
