// SPDX-License-Identifier: Apache-2.0
/*
 * A small JSON reader and writer for the agent's message bodies
 * (wire-local.md §1.3). The reader tokenizes in the style of jsmn: one
 * pass, no allocation per value; the replies it reads come from the agent,
 * which the library trusts, but it still never reads past the text.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vrdma.h"

#define JSON_MAX_TOKENS 65536
#define JSON_MAX_DEPTH 32

static int add_tok(struct json_doc *d, enum json_type type, int start)
{
	if (d->n == d->cap) {
		int cap = d->cap ? d->cap * 2 : 64;
		struct json_tok *t;

		if (cap > JSON_MAX_TOKENS)
			return -1;
		t = realloc(d->t, (size_t)cap * sizeof(*t));
		if (!t)
			return -1;
		d->t = t;
		d->cap = cap;
	}
	d->t[d->n] = (struct json_tok){ .type = type, .start = start, .end = -1 };
	return d->n++;
}

static int is_space(char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* parse_value parses one value at *pos; returns its token or -1. */
static int parse_value(struct json_doc *d, int *pos, int depth)
{
	const char *s = d->text;
	int i = *pos, tok;

	while (i < d->len && is_space(s[i]))
		i++;
	if (i >= d->len || depth > JSON_MAX_DEPTH)
		return -1;
	if (s[i] == '{' || s[i] == '[') {
		char close = s[i] == '{' ? '}' : ']';
		int obj = s[i] == '{';

		tok = add_tok(d, obj ? JSON_OBJECT : JSON_ARRAY, i);
		if (tok < 0)
			return -1;
		i++;
		for (;;) {
			while (i < d->len && is_space(s[i]))
				i++;
			if (i >= d->len)
				return -1;
			if (s[i] == close && d->t[tok].size == 0) {
				i++;
				break;
			}
			if (obj) {
				int k;

				while (i < d->len && is_space(s[i]))
					i++;
				if (i >= d->len || s[i] != '"')
					return -1;
				k = parse_value(d, &i, depth + 1);
				if (k < 0)
					return -1;
				while (i < d->len && is_space(s[i]))
					i++;
				if (i >= d->len || s[i] != ':')
					return -1;
				i++;
			}
			if (parse_value(d, &i, depth + 1) < 0)
				return -1;
			d->t[tok].size++;
			while (i < d->len && is_space(s[i]))
				i++;
			if (i >= d->len)
				return -1;
			if (s[i] == ',') {
				i++;
				continue;
			}
			if (s[i] != close)
				return -1;
			i++;
			break;
		}
		d->t[tok].end = i;
	} else if (s[i] == '"') {
		tok = add_tok(d, JSON_STRING, i + 1);
		if (tok < 0)
			return -1;
		for (i++; i < d->len && s[i] != '"'; i++) {
			if ((unsigned char)s[i] < 0x20)
				return -1;
			if (s[i] == '\\') {
				i++;
				if (i >= d->len)
					return -1;
			}
		}
		if (i >= d->len)
			return -1;
		d->t[tok].end = i;
		i++;
	} else {
		int start = i;

		while (i < d->len && !is_space(s[i]) && s[i] != ',' && s[i] != '}' && s[i] != ']' &&
		       s[i] != ':')
			i++;
		if (i == start)
			return -1;
		tok = add_tok(d, JSON_PRIMITIVE, start);
		if (tok < 0)
			return -1;
		d->t[tok].end = i;
	}
	d->t[tok].next = d->n;
	*pos = i;
	return tok;
}

int json_parse(struct json_doc *d, const char *text, int len)
{
	int pos = 0;

	memset(d, 0, sizeof(*d));
	d->text = text;
	d->len = len;
	if (parse_value(d, &pos, 0) != 0)
		goto bad;
	while (pos < len && is_space(text[pos]))
		pos++;
	if (pos != len)
		goto bad;
	return 0;
bad:
	json_free(d);
	return -1;
}

void json_free(struct json_doc *d)
{
	free(d->t);
	d->t = NULL;
	d->n = d->cap = 0;
}

static int tok_eq(const struct json_doc *d, int tok, const char *key)
{
	const struct json_tok *t = &d->t[tok];
	size_t n = strlen(key);

	/* Member names are matched without regard to case (§1.3). */
	return t->type == JSON_STRING && (size_t)(t->end - t->start) == n &&
	       strncasecmp(d->text + t->start, key, n) == 0;
}

int json_get(const struct json_doc *d, int tok, const char *key)
{
	int i, k, found = -1;

	if (tok < 0 || tok >= d->n || d->t[tok].type != JSON_OBJECT)
		return -1;
	k = tok + 1;
	for (i = 0; i < d->t[tok].size; i++) {
		int v = d->t[k].next;

		if (tok_eq(d, k, key))
			found = v; /* the last one wins */
		k = d->t[v].next;
	}
	return found;
}

int json_elem(const struct json_doc *d, int tok, int idx)
{
	int i, k;

	if (tok < 0 || tok >= d->n || d->t[tok].type != JSON_ARRAY || idx < 0 || idx >= d->t[tok].size)
		return -1;
	k = tok + 1;
	for (i = 0; i < idx; i++)
		k = d->t[k].next;
	return k;
}

int json_u64(const struct json_doc *d, int tok, uint64_t *v)
{
	const struct json_tok *t;
	uint64_t x = 0;
	int i;

	if (tok < 0 || tok >= d->n)
		return -1;
	t = &d->t[tok];
	if (t->type != JSON_PRIMITIVE || t->end <= t->start)
		return -1;
	for (i = t->start; i < t->end; i++) {
		char c = d->text[i];

		if (c < '0' || c > '9' || x > (UINT64_MAX - (uint64_t)(c - '0')) / 10)
			return -1;
		x = x * 10 + (uint64_t)(c - '0');
	}
	*v = x;
	return 0;
}

int json_get_int(const struct json_doc *d, int tok, const char *key, int *v)
{
	const struct json_tok *t;
	uint64_t x = 0;
	int k = json_get(d, tok, key), neg, i;

	if (k < 0)
		return -1;
	t = &d->t[k];
	if (t->type != JSON_PRIMITIVE || t->end <= t->start)
		return -1;
	neg = d->text[t->start] == '-';
	if (t->end - t->start <= neg)
		return -1;
	for (i = t->start + neg; i < t->end; i++) {
		char c = d->text[i];

		if (c < '0' || c > '9')
			return -1;
		x = x * 10 + (uint64_t)(c - '0');
		if (x > (uint64_t)INT32_MAX + 1)
			return -1;
	}
	if (!neg && x > INT32_MAX)
		return -1;
	*v = neg ? (int)(-(int64_t)x) : (int)x;
	return 0;
}

int json_bool(const struct json_doc *d, int tok, int *v)
{
	const struct json_tok *t;

	if (tok < 0 || tok >= d->n)
		return -1;
	t = &d->t[tok];
	if (t->type != JSON_PRIMITIVE)
		return -1;
	if (t->end - t->start == 4 && !strncmp(d->text + t->start, "true", 4))
		*v = 1;
	else if (t->end - t->start == 5 && !strncmp(d->text + t->start, "false", 5))
		*v = 0;
	else
		return -1;
	return 0;
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

int json_str(const struct json_doc *d, int tok, char *buf, size_t n)
{
	const struct json_tok *t;
	size_t o = 0;
	int i;

	if (tok < 0 || tok >= d->n || n == 0)
		return -1;
	t = &d->t[tok];
	if (t->type != JSON_STRING)
		return -1;
	for (i = t->start; i < t->end; i++) {
		char c = d->text[i];

		if (c == '\\') {
			c = d->text[++i];
			switch (c) {
			case 'n': c = '\n'; break;
			case 't': c = '\t'; break;
			case 'r': c = '\r'; break;
			case 'b': c = '\b'; break;
			case 'f': c = '\f'; break;
			case 'u': {
				int k, cp = 0;

				if (i + 4 >= t->end)
					return -1;
				for (k = 1; k <= 4; k++) {
					int h = hexval(d->text[i + k]);

					if (h < 0)
						return -1;
					cp = cp * 16 + h;
				}
				i += 4;
				/* The agent's strings are ASCII; anything else becomes '?'. */
				c = cp < 0x80 ? (char)cp : '?';
				break;
			}
			default: break; /* \" \\ \/ */
			}
		}
		if (o + 1 >= n)
			return -1;
		buf[o++] = c;
	}
	buf[o] = 0;
	return 0;
}

int json_get_u64(const struct json_doc *d, int tok, const char *key, uint64_t *v)
{
	return json_u64(d, json_get(d, tok, key), v);
}

int json_get_u32(const struct json_doc *d, int tok, const char *key, uint32_t *v)
{
	uint64_t x;

	if (json_get_u64(d, tok, key, &x) || x > UINT32_MAX)
		return -1;
	*v = (uint32_t)x;
	return 0;
}

int json_get_str(const struct json_doc *d, int tok, const char *key, char *buf, size_t n)
{
	return json_str(d, json_get(d, tok, key), buf, n);
}

/* ---- writer ---- */

void jb_init(struct jbuf *b, char *p, size_t cap)
{
	b->p = p;
	b->cap = cap;
	b->len = 0;
	b->err = 0;
	if (cap)
		p[0] = 0;
}

void jb_raw(struct jbuf *b, const char *s)
{
	size_t n = strlen(s);

	if (b->err || b->len + n + 1 > b->cap) {
		b->err = 1;
		return;
	}
	memcpy(b->p + b->len, s, n + 1);
	b->len += n;
}

void jb_key(struct jbuf *b, const char *key)
{
	if (b->len > 0 && b->p[b->len - 1] != '{')
		jb_raw(b, ",");
	jb_raw(b, "\"");
	jb_raw(b, key);
	jb_raw(b, "\":");
}

void jb_u64(struct jbuf *b, const char *key, uint64_t v)
{
	char num[24];

	snprintf(num, sizeof(num), "%llu", (unsigned long long)v);
	jb_key(b, key);
	jb_raw(b, num);
}

void jb_bool(struct jbuf *b, const char *key, int v)
{
	jb_key(b, key);
	jb_raw(b, v ? "true" : "false");
}

void jb_str(struct jbuf *b, const char *key, const char *v)
{
	char esc[8];

	jb_key(b, key);
	jb_raw(b, "\"");
	for (; *v; v++) {
		unsigned char c = (unsigned char)*v;

		if (c == '"' || c == '\\') {
			esc[0] = '\\';
			esc[1] = (char)c;
			esc[2] = 0;
		} else if (c < 0x20) {
			snprintf(esc, sizeof(esc), "\\u%04x", c);
		} else {
			esc[0] = (char)c;
			esc[1] = 0;
		}
		jb_raw(b, esc);
	}
	jb_raw(b, "\"");
}
