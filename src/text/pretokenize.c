/* pretokenize.c - splitting with HF's delimiter behaviors over a double-buffered piece list. */
#include "text/pretokenize.h"

#include <stdlib.h>
#include <string.h>

#include "text/unicode.h"
#include "util/log.h"

const char *const pretokenize_gpt2_pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

void piece_list_free(struct piece_list *l) {
  free(l->p);
  text_buf_free(&l->buf);
  memset(l, 0, sizeof *l);
}

void pretokenizer_free(struct pretokenizer *p) {
  for (int i = 0; i < p->n; i++) {
    regex_free(p->steps[i].re);
    free(p->steps[i].lit);
  }
  free(p->steps);
  p->steps = NULL;
  p->n = 0;
}

int pretokenizer_add(struct pretokenizer *p, struct pretokenize_step step) {
  struct pretokenize_step *s = realloc(p->steps, (size_t)(p->n + 1) * sizeof *s);
  if (!s)
    return ERR("out of memory");
  p->steps = s;
  p->steps[p->n++] = step;
  return 0;
}

/* Room for one more element in the malloc'd array V holding NUM_ITEMS of *CAP elements of SIZE bytes: V while it
 * has room, else V reallocated to twice the capacity (64 at first; *CAP updated); NULL, V left as it was, when out
 * of memory. */
static void *grow(void *v, int num_items, int *cap, size_t size) {
  if (num_items < *cap)
    return v;
  int new_cap = *cap ? *cap * 2 : 64;
  void *nv = realloc(v, (size_t)new_cap * size);
  if (nv)
    *cap = new_cap;
  return nv;
}

/* Room for one more piece in L; -1 (error set) when out of memory. */
static int reserve_piece(struct piece_list *l) {
  struct piece *p = grow(l->p, l->n, &l->cap, sizeof *p);
  if (!p)
    return ERR("out of memory");
  l->p = p;
  return 0;
}

static int push_piece(struct piece_list *l, const char *s, size_t len, int at_origin) {
  if (!len)
    return 0; /* HF drops empty pieces */
  if (reserve_piece(l))
    return -1;
  struct piece *pc = &l->p[l->n++];
  pc->off = (uint32_t)l->buf.len;
  pc->len = (uint32_t)len;
  pc->at_origin = (uint8_t)at_origin;
  return text_buf_append(&l->buf, s, len) ? ERR("out of memory") : 0;
}

/* Spans of one piece with their "is delimiter" flag, before the behavior is applied. */
struct pretokenize_span {
  size_t s, e;
  int match;
};

void pretokenize_scratch_free(struct pretokenize_scratch *s) {
  free(s->spans);
  text_buf_free(&s->buf);
  memset(s, 0, sizeof *s);
}

static int span_push(struct pretokenize_scratch *l, size_t s, size_t e, int match) {
  if (e <= s)
    return 0;
  struct pretokenize_span *v = grow(l->spans, l->n, &l->cap, sizeof *v);
  if (!v)
    return ERR("out of memory");
  l->spans = v;
  l->spans[l->n++] = (struct pretokenize_span){s, e, match};
  return 0;
}

typedef int (*char_pred)(uint32_t cp);

/* Finds the delimiter spans of S for step ST (regex, literal, or a per-character predicate). */
static int find_spans(const struct pretokenize_step *st, struct regex_ctx *rc, const char *s,
                      size_t len, struct pretokenize_scratch *sp) {
  sp->n = 0;
  size_t prev = 0;
  if (st->re) {
    size_t pos = 0, ms, me;
    for (;;) {
      int f = regex_find(st->re, rc, s, len, pos, &ms, &me);
      if (f < 0)
        return -1;
      if (!f)
        break;
      if (span_push(sp, prev, ms, 0) || span_push(sp, ms, me, 1))
        return -1;
      prev = pos = me;
    }
  } else if (st->kind == PRETOKENIZE_SPLIT) {
    while (st->lit_len && prev < len) {
      const char *hit = memmem(s + prev, len - prev, st->lit, st->lit_len);
      if (!hit)
        break;
      size_t ms = (size_t)(hit - s);
      if (span_push(sp, prev, ms, 0) || span_push(sp, ms, ms + st->lit_len, 1))
        return -1;
      prev = ms + st->lit_len;
    }
  } else {
    char_pred pred = st->kind == PRETOKENIZE_DIGITS       ? unicode_is_numeric
                     : st->kind == PRETOKENIZE_PUNCTUATION ? unicode_is_punct
                                                           : unicode_is_whitespace;
    const uint8_t *p = (const uint8_t *)s;
    for (size_t i = 0; i < len;) {
      uint32_t cp;
      int l = unicode_utf8_decode(p + i, len - i, &cp);
      if (!l)
        l = 1, cp = UNICODE_REPLACEMENT;
      if (pred(cp)) {
        if (span_push(sp, prev, i, 0) || span_push(sp, i, i + (size_t)l, 1))
          return -1;
        prev = i + (size_t)l;
      }
      i += (size_t)l;
    }
  }
  if (span_push(sp, prev, len, 0))
    return -1;
  if (st->invert)
    for (int i = 0; i < sp->n; i++)
      sp->spans[i].match = !sp->spans[i].match;
  return 0;
}

/* Applies BEHAVIOR to the spans in place (as HF's NormalizedString::split does). */
static void apply_behavior(enum split_behavior b, struct pretokenize_scratch *sp) {
  int n = 0, prev_match = 0;
  switch (b) {
  case SPLIT_REMOVED:
    for (int i = 0; i < sp->n; i++)
      if (!sp->spans[i].match)
        sp->spans[n++] = sp->spans[i];
    break;
  case SPLIT_ISOLATED:
    n = sp->n;
    break;
  case SPLIT_MERGED_WITH_PREVIOUS:
    for (int i = 0; i < sp->n; i++) {
      struct pretokenize_span cur = sp->spans[i];
      if (cur.match && !prev_match && n > 0)
        sp->spans[n - 1].e = cur.e;
      else
        sp->spans[n++] = cur;
      prev_match = cur.match;
    }
    break;
  case SPLIT_MERGED_WITH_NEXT: {
    /* Right to left: a delimiter joins the piece after it; then restore the order. */
    int w = sp->n;
    for (int i = sp->n - 1; i >= 0; i--) {
      struct pretokenize_span cur = sp->spans[i];
      if (cur.match && !prev_match && w < sp->n)
        sp->spans[w].s = cur.s;
      else
        sp->spans[--w] = cur;
      prev_match = cur.match;
    }
    n = sp->n - w;
    memmove(sp->spans, sp->spans + w, (size_t)n * sizeof *sp->spans);
    break;
  }
  case SPLIT_CONTIGUOUS:
    for (int i = 0; i < sp->n; i++) {
      struct pretokenize_span cur = sp->spans[i];
      if (n > 0 && cur.match == prev_match)
        sp->spans[n - 1].e = cur.e;
      else
        sp->spans[n++] = cur;
      prev_match = cur.match;
    }
    break;
  }
  sp->n = n;
}

static int split_piece(const struct pretokenize_step *st, struct regex_ctx *rc, const char *s,
                       size_t len, int at_origin, enum split_behavior b, struct piece_list *out,
                       struct pretokenize_scratch *sp) {
  if (find_spans(st, rc, s, len, sp))
    return -1;
  apply_behavior(b, sp);
  for (int i = 0; i < sp->n; i++)
    if (push_piece(out, s + sp->spans[i].s, sp->spans[i].e - sp->spans[i].s, at_origin && sp->spans[i].s == 0))
      return -1;
  return 0;
}

/* Pushes S as a piece written in the GPT-2 byte alphabet (what HF's ByteLevel does to the
 * text, so that later steps and the BPE model see the same characters as in HF). */
static int push_byte_level(struct piece_list *l, const char *s, size_t len, int at_origin) {
  if (!len)
    return 0;
  size_t before = l->buf.len;
  if (text_buf_reserve(&l->buf, len * 2))
    return ERR("out of memory");
  for (size_t i = 0; i < len; i++)
    l->buf.len += (size_t)unicode_utf8_encode(unicode_byte_to_cp((uint8_t)s[i]), l->buf.data + l->buf.len);
  size_t n = l->buf.len - before;
  l->buf.len = before;
  /* push_piece appends from the buffer's end: hand it the bytes just written in place. */
  if (reserve_piece(l))
    return -1;
  l->p[l->n++] = (struct piece){(uint32_t)before, (uint32_t)n, (uint8_t)at_origin};
  l->buf.len = before + n;
  return 0;
}

static int apply_step(const struct pretokenize_step *st, struct regex_ctx *rc,
                      const struct piece_list *in, struct piece_list *out, struct pretokenize_scratch *sp) {
  struct text_buf *scratch = &sp->buf;
  out->n = 0;
  out->buf.len = 0;
  for (int i = 0; i < in->n; i++) {
    const char *s = in->buf.data + in->p[i].off;
    size_t len = in->p[i].len;
    int origin = in->p[i].at_origin;
    switch (st->kind) {
    case PRETOKENIZE_SPLIT:
      if (split_piece(st, rc, s, len, origin, st->behavior, out, sp))
        return -1;
      break;
    case PRETOKENIZE_DIGITS:
      if (split_piece(st, rc, s, len, origin, st->individual ? SPLIT_ISOLATED : SPLIT_CONTIGUOUS,
                      out, sp))
        return -1;
      break;
    case PRETOKENIZE_PUNCTUATION:
      if (split_piece(st, rc, s, len, origin, st->behavior, out, sp))
        return -1;
      break;
    case PRETOKENIZE_WHITESPACE:
      if (split_piece(st, rc, s, len, origin, SPLIT_REMOVED, out, sp))
        return -1;
      break;
    case PRETOKENIZE_WHITESPACE_SPLIT:
      if (split_piece(st, rc, s, len, origin, SPLIT_REMOVED, out, sp))
        return -1;
      break;
    case PRETOKENIZE_BYTE_LEVEL:
      scratch->len = 0;
      if (st->add_prefix_space && s[0] != ' ' && text_buf_append(scratch, " ", 1))
        return ERR("out of memory");
      if (text_buf_append(scratch, s, len))
        return ERR("out of memory");
      if (st->re) {
        if (find_spans(st, rc, scratch->data, scratch->len, sp))
          return -1;
      } else {
        sp->n = 0;
        if (span_push(sp, 0, scratch->len, 0))
          return -1;
      }
      for (int k = 0; k < sp->n; k++)
        if (push_byte_level(out, scratch->data + sp->spans[k].s, sp->spans[k].e - sp->spans[k].s,
                            origin && sp->spans[k].s == 0))
          return -1;
      break;
    case PRETOKENIZE_METASPACE: {
      scratch->len = 0;
      int starts = len >= (size_t)st->repl_len && !memcmp(s, st->repl, (size_t)st->repl_len);
      int pre = st->prepend == PREPEND_ALWAYS || (st->prepend == PREPEND_FIRST && origin);
      if (pre && !starts && s[0] != ' ' && text_buf_append(scratch, st->repl, (size_t)st->repl_len))
        return ERR("out of memory");
      for (size_t j = 0; j < len; j++) {
        int rc2 = s[j] == ' ' ? text_buf_append(scratch, st->repl, (size_t)st->repl_len)
                              : text_buf_append(scratch, s + j, 1);
        if (rc2)
          return ERR("out of memory");
      }
      if (!st->split) {
        if (push_piece(out, scratch->data, scratch->len, origin))
          return -1;
        break;
      }
      /* Split before each replacement character (MergedWithNext). */
      size_t start = 0;
      for (size_t j = 1; j + (size_t)st->repl_len <= scratch->len; j++) {
        if (!memcmp(scratch->data + j, st->repl, (size_t)st->repl_len)) {
          if (push_piece(out, scratch->data + start, j - start, origin && start == 0))
            return -1;
          start = j;
          j += (size_t)st->repl_len - 1;
        }
      }
      if (push_piece(out, scratch->data + start, scratch->len - start, origin && start == 0))
        return -1;
      break;
    }
    }
  }
  return 0;
}

int pretokenizer_apply(const struct pretokenizer *p, struct regex_ctx *rc, const char *in,
                       size_t len, int at_origin, struct piece_list *out, struct piece_list *tmp,
                       struct pretokenize_scratch *scratch) {
  out->n = 0;
  out->buf.len = 0;
  if (push_piece(out, in, len, at_origin))
    return -1;
  for (int i = 0; i < p->n; i++) {
    if (apply_step(&p->steps[i], rc, out, tmp, scratch))
      return -1;
    struct piece_list t = *out;
    *out = *tmp;
    *tmp = t;
  }
  return 0;
}
