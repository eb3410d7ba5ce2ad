/* normalize.c - the normalizer pipeline; Unicode forms and case mapping come from utf8proc. */
#include "text/normalize.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "text/unicode.h"
#include "util/log.h"

void normalizer_free(struct normalizer *n) {
  for (int i = 0; i < n->n; i++) {
    free(n->steps[i].a);
    free(n->steps[i].b);
    regex_free(n->steps[i].re);
  }
  free(n->steps);
  n->steps = NULL;
  n->n = 0;
}

int normalizer_add(struct normalizer *n, struct normalize_step step) {
  struct normalize_step *s = realloc(n->steps, (size_t)(n->n + 1) * sizeof *s);
  if (!s)
    return ERR("out of memory");
  n->steps = s;
  n->steps[n->n++] = step;
  return 0;
}

static int apply_unicode_form(int kind, const char *in, size_t len, struct text_buf *out) {
  size_t ascii = 0;
  while (ascii < len && !((unsigned char)in[ascii] & 0x80))
    ascii++;
  if (ascii == len) /* ASCII is the same in every normalization form */
    return text_buf_append(out, in, len) ? ERR("out of memory") : 0;
  int opts = UTF8PROC_STABLE;
  if (kind == NORMALIZE_NFC)
    opts |= UTF8PROC_COMPOSE;
  else if (kind == NORMALIZE_NFD)
    opts |= UTF8PROC_DECOMPOSE;
  else if (kind == NORMALIZE_NFKC)
    opts |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
  else
    opts |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
  utf8proc_uint8_t *res = NULL;
  utf8proc_ssize_t n = utf8proc_map((const utf8proc_uint8_t *)in, (utf8proc_ssize_t)len, &res,
                                    (utf8proc_option_t)opts);
  if (n < 0)
    return ERR("unicode normalization failed: %s", utf8proc_errmsg(n));
  int rc = text_buf_append(out, res, (size_t)n);
  free(res);
  return rc ? ERR("out of memory") : 0;
}

static int apply_step(const struct normalize_step *st, struct regex_ctx *rc, const char *in, size_t len,
                      struct text_buf *out) {
  const uint8_t *p = (const uint8_t *)in;
  switch (st->kind) {
  case NORMALIZE_NFC:
  case NORMALIZE_NFD:
  case NORMALIZE_NFKC:
  case NORMALIZE_NFKD:
    return apply_unicode_form(st->kind, in, len, out);
  case NORMALIZE_LOWERCASE:
  case NORMALIZE_STRIP_ACCENTS:
    for (size_t i = 0; i < len;) {
      uint32_t cp;
      int l = unicode_utf8_decode(p + i, len - i, &cp);
      if (!l)
        l = 1, cp = UNICODE_REPLACEMENT;
      i += (size_t)l;
      char enc[4];
      if (st->kind == NORMALIZE_LOWERCASE) {
        if (cp == 0x130) { /* the one full (two-character) lowercase mapping: i + U+0307 */
          if (text_buf_append(out, "i\xcc\x87", 3))
            return ERR("out of memory");
          continue;
        }
        cp = (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp);
      } else if (unicode_is_mark(cp)) {
        continue;
      }
      if (text_buf_append(out, enc, (size_t)unicode_utf8_encode(cp, enc)))
        return ERR("out of memory");
    }
    return 0;
  case NORMALIZE_PREPEND:
    if (len && text_buf_append(out, st->a, st->a_len))
      return ERR("out of memory");
    return text_buf_append(out, in, len) ? ERR("out of memory") : 0;
  case NORMALIZE_REPLACE: {
    size_t pos = 0;
    for (;;) {
      size_t ms, me;
      if (st->re) {
        int f = regex_find(st->re, rc, in, len, pos, &ms, &me);
        if (f < 0)
          return -1;
        if (!f)
          break;
      } else {
        const char *hit = st->a_len ? memmem(in + pos, len - pos, st->a, st->a_len) : NULL;
        if (!hit)
          break;
        ms = (size_t)(hit - in);
        me = ms + st->a_len;
      }
      if (text_buf_append(out, in + pos, ms - pos) || text_buf_append(out, st->b, st->b_len))
        return ERR("out of memory");
      pos = me;
    }
    return text_buf_append(out, in + pos, len - pos) ? ERR("out of memory") : 0;
  }
  case NORMALIZE_STRIP: {
    size_t s = 0, e = len;
    while (st->left && s < e) {
      uint32_t cp;
      int l = unicode_utf8_decode(p + s, e - s, &cp);
      if (!l || !unicode_is_whitespace(cp))
        break;
      s += (size_t)l;
    }
    while (st->right && e > s) {
      size_t b = e - 1;
      while (b > s && (p[b] & 0xC0) == 0x80)
        b--;
      uint32_t cp;
      int l = unicode_utf8_decode(p + b, e - b, &cp);
      if (!l || !unicode_is_whitespace(cp))
        break;
      e = b;
    }
    return text_buf_append(out, in + s, e - s) ? ERR("out of memory") : 0;
  }
  }
  return ERR("unknown normalizer step");
}

int normalizer_apply(const struct normalizer *n, struct regex_ctx *rc, const char *in, size_t len,
                     struct text_buf *out, struct text_buf *tmp) {
  out->len = 0;
  if (text_buf_append(out, in, len))
    return ERR("out of memory");
  for (int i = 0; i < n->n; i++) {
    tmp->len = 0;
    if (apply_step(&n->steps[i], rc, out->data, out->len, tmp))
      return -1;
    struct text_buf t = *out;
    *out = *tmp;
    *tmp = t;
  }
  return 0;
}
