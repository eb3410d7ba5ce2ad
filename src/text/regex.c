/* regex.c - thin PCRE2 wrapper: UTF/UCP/MULTILINE compilation with JIT, empty matches skipped. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/regex.h"

#include <pcre2.h>
#include <stdlib.h>

#include "text/unicode.h"
#include "util/log.h"

struct regex {
  pcre2_code *code;
};

struct regex_ctx {
  pcre2_match_data *md;
  pcre2_match_context *mctx;
  pcre2_jit_stack *stack;
};

struct regex_ctx *regex_ctx_create(void) {
  struct regex_ctx *c = calloc(1, sizeof *c);
  if (!c)
    return NULL;
  c->md = pcre2_match_data_create(1, NULL);
  c->mctx = pcre2_match_context_create(NULL);
  /* Patterns like \s+(?!\S) backtrack over long whitespace runs: give JIT a stack that grows
   * to 4 MiB instead of the 32 KiB default. */
  c->stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, NULL);
  if (!c->md || !c->mctx || !c->stack) {
    regex_ctx_free(c);
    return NULL;
  }
  pcre2_jit_stack_assign(c->mctx, NULL, c->stack);
  return c;
}

void regex_ctx_free(struct regex_ctx *c) {
  if (!c)
    return;
  if (c->md)
    pcre2_match_data_free(c->md);
  if (c->mctx)
    pcre2_match_context_free(c->mctx);
  if (c->stack)
    pcre2_jit_stack_free(c->stack);
  free(c);
}

struct regex *regex_compile(const char *pattern, size_t len) {
  int errcode;
  PCRE2_SIZE erroff;
  pcre2_code *code = pcre2_compile((PCRE2_SPTR)pattern, len, PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE,
                                   &errcode, &erroff, NULL);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(errcode, msg, sizeof msg);
    ERR("bad pre-tokenizer regex at offset %zu: %s", (size_t)erroff, (const char *)msg);
    return NULL;
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE); /* failure only means slower interpretation */
  struct regex *r = malloc(sizeof *r);
  if (!r) {
    pcre2_code_free(code);
    ERR("out of memory");
    return NULL;
  }
  r->code = code;
  return r;
}

void regex_free(struct regex *r) {
  if (!r)
    return;
  pcre2_code_free(r->code);
  free(r);
}

int regex_find(const struct regex *r, struct regex_ctx *c, const char *s, size_t len,
               size_t start, size_t *ms, size_t *me) {
  while (start <= len) {
    int rc = pcre2_match(r->code, (PCRE2_SPTR)s, len, start, PCRE2_NO_UTF_CHECK, c->md, c->mctx);
    if (rc == PCRE2_ERROR_NOMATCH)
      return 0;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      return ERR("regex match failed: %s", (const char *)msg);
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
    if (ov[1] > ov[0]) {
      *ms = ov[0];
      *me = ov[1];
      return 1;
    }
    /* An empty match splits nothing (HF drops empty pieces): retry one character later. */
    if (ov[0] >= len)
      return 0;
    start = ov[0] + (size_t)unicode_utf8_len((unsigned char)s[ov[0]]);
  }
  return 0;
}
