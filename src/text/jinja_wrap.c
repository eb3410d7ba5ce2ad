/* jinja_wrap.c - Jinja2's truncate and wordwrap filters (wordwrap is Python's textwrap.wrap
 * with expand_tabs=False and replace_whitespace=False, run on each line of the input). */
#include "text/jinja_wrap.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja_string.h"
#include "text/regex.h"

struct jinja_value jinja_truncate(struct jinja_eval *ev, struct jinja_value s, const struct jinja_args *a) {
  struct jinja_state *st = ev->st;
  int64_t length = jinja_arg_int(ev, jinja_arg(a, 0, "length"), 255);
  int killwords = jinja_arg_bool(jinja_arg(a, 1, "killwords"), 0);
  const struct jinja_value *endv = jinja_arg(a, 2, "end");
  const struct jinja_value *lw = jinja_arg(a, 3, "leeway");
  int64_t leeway = lw && lw->type != JINJA_NONE ? jinja_arg_int(ev, lw, 5) : 5; /* truncate.leeway */
  s = jinja_to_str(st, s);
  struct jinja_value end = endv ? jinja_to_str(st, *endv) : jinja_str(st, "...");
  int64_t n = (int64_t)jinja_utf8_len(s.u.s->data, s.u.s->len);
  int64_t end_n = (int64_t)jinja_utf8_len(end.u.s->data, end.u.s->len);
  if (length < end_n)
    jinja_fail(st, "expected length >= %lld, got %lld", (long long)end_n, (long long)length);
  if (leeway < 0)
    jinja_fail(st, "expected leeway >= 0, got %lld", (long long)leeway);
  if (n <= length + leeway)
    return s;
  size_t cut = jinja_utf8_offset(s.u.s->data, s.u.s->len, (size_t)(length - end_n));
  if (!killwords) { /* s[:cut].rsplit(" ", 1)[0] */
    size_t k = cut;
    while (k > 0 && s.u.s->data[k - 1] != ' ')
      k--;
    if (k > 0)
      cut = k - 1;
  }
  struct jinja_buf b;
  jinja_buf_init(&b, st, 0, JINJA_MAX_OUTPUT);
  jinja_buf_add(&b, s.u.s->data, cut);
  jinja_buf_add(&b, end.u.s->data, end.u.s->len);
  return jinja_buf_value(&b);
}

/* textwrap.TextWrapper.wordsep_re (break_on_hyphens) and wordsep_simple_re, in PCRE2 syntax
 * (Python's \Z is \z). \w and \d are PCRE2's Unicode classes, close to Python's. */
#define WS "[\\t\\n\\x0b\\x0c\\r ]"
#define NWS "[^\\t\\n\\x0b\\x0c\\r ]"
#define WP "[\\w!\"'&.,?]"
#define LT "[^\\d\\W]"
static const char wordsep[] = "(" WS "+|(?<=" WP ")-{2,}(?=\\w)|" NWS "+?(?:-(?:(?<=" LT "{2}-)|(?<=" LT "-" LT
                              "-))(?=" LT "-?" LT ")|(?=" WS "|\\z)|(?<=" WP ")(?=-{2,}\\w)))";
static const char wordsep_simple[] = WS "+";
static struct regex *re_hyphen, *re_simple;
static pthread_once_t re_once = PTHREAD_ONCE_INIT;

static void compile_res(void) {
  re_hyphen = regex_compile(wordsep, sizeof wordsep - 1);
  re_simple = regex_compile(wordsep_simple, sizeof wordsep_simple - 1);
}

struct chunk {
  size_t off, len; /* bytes in the string */
};

static size_t cps(const char *s, struct chunk c) {
  return jinja_utf8_len(s + c.off, c.len);
}

/* chunk.strip() == '' */
static int blank(const char *s, struct chunk c) {
  for (size_t i = c.off; i < c.off + c.len;)
    if (!jinja_string_isspace(jinja_string_next(s, c.off + c.len, &i)))
      return 0;
  return 1;
}

/* textwrap's _split: the matches of RE and the text between them, empty pieces dropped. Returns
 * a malloc'd array (*n), or NULL with *n = SIZE_MAX on failure. */
static struct chunk *split_chunks(const struct regex *re, const char *s, size_t off, size_t end, size_t *n) {
  struct chunk *v = NULL;
  size_t cnt = 0, cap = 0, pos = off, ms, me;
  struct regex_ctx *ctx = regex_ctx_create();
  int rc = ctx ? 1 : -1;
  while (rc == 1) {
    rc = pos < end ? regex_find(re, ctx, s + off, end - off, pos - off, &ms, &me) : 0;
    struct chunk piece[2] = {{pos, rc == 1 ? off + ms - pos : end - pos}, {off + ms, me - ms}};
    int k = rc == 1 ? 2 : rc == 0 ? 1 : 0;
    for (int j = 0; j < k; j++) {
      if (!piece[j].len)
        continue;
      if (cnt == cap) {
        cap = cap ? cap * 2 : 16;
        struct chunk *nv = realloc(v, cap * sizeof *v);
        if (!nv) {
          rc = -1;
          break;
        }
        v = nv;
      }
      v[cnt++] = piece[j];
    }
    if (rc == 1)
      pos = off + me;
  }
  regex_ctx_free(ctx);
  if (rc < 0) {
    free(v);
    *n = SIZE_MAX;
    return NULL;
  }
  *n = cnt;
  return v;
}

/* textwrap's _wrap_chunks for one paragraph, lines joined by WRAP into B (after a WRAP when
 * *FIRST_DONE). Works in the arena copies CH (n) and CUR (n). */
static void wrap_chunks(struct jinja_buf *b, const char *s, struct chunk *ch, size_t n, struct chunk *cur,
                        int64_t width, int break_long, int break_hyphens, struct jinja_value wrap) {
  size_t i = 0, lines = 0;
  while (i < n) {
    size_t ncur = 0, cur_len = 0;
    if (lines && blank(s, ch[i]))
      i++;
    while (i < n) {
      size_t l = cps(s, ch[i]);
      if (cur_len + l > (size_t)width)
        break;
      cur[ncur++] = ch[i++];
      cur_len += l;
    }
    if (i < n && cps(s, ch[i]) > (size_t)width) { /* _handle_long_word */
      size_t space_left = (size_t)width - cur_len;
      if (break_long) {
        size_t end = space_left, len = cps(s, ch[i]);
        if (break_hyphens && len > space_left) {
          size_t hyphen = SIZE_MAX, nonhyphen = 0, pos = ch[i].off, k = 0, first_nonhyphen = SIZE_MAX;
          for (; k < space_left; k++) {
            int32_t c = jinja_string_next(s, ch[i].off + ch[i].len, &pos);
            if (c == '-')
              hyphen = k;
            else if (first_nonhyphen == SIZE_MAX)
              first_nonhyphen = k;
          }
          nonhyphen = hyphen != SIZE_MAX && first_nonhyphen < hyphen;
          if (hyphen != SIZE_MAX && hyphen > 0 && nonhyphen)
            end = hyphen + 1;
        }
        size_t cut = jinja_utf8_offset(s + ch[i].off, ch[i].len, end);
        cur[ncur++] = (struct chunk){ch[i].off, cut};
        ch[i].off += cut;
        ch[i].len -= cut;
      } else if (ncur == 0) {
        cur[ncur++] = ch[i++];
      }
    }
    if (ncur && blank(s, cur[ncur - 1]))
      ncur--;
    if (ncur) {
      if (lines)
        jinja_buf_add(b, wrap.u.s->data, wrap.u.s->len);
      for (size_t k = 0; k < ncur; k++)
        jinja_buf_add(b, s + cur[k].off, cur[k].len);
      lines++;
    }
  }
}

struct jinja_value jinja_wordwrap(struct jinja_eval *ev, struct jinja_value v, const struct jinja_args *a) {
  struct jinja_state *st = ev->st;
  int64_t width = jinja_arg_int(ev, jinja_arg(a, 0, "width"), 79);
  int break_long = jinja_arg_bool(jinja_arg(a, 1, "break_long_words"), 1);
  const struct jinja_value *ws = jinja_arg(a, 2, "wrapstring");
  int break_hyphens = jinja_arg_bool(jinja_arg(a, 3, "break_on_hyphens"), 1);
  struct jinja_value wrap = ws && ws->type != JINJA_NONE ? jinja_to_str(st, *ws) : jinja_str(st, "\n");
  v = jinja_to_str(st, v);
  const char *s = v.u.s->data;
  size_t n = v.u.s->len;
  pthread_once(&re_once, compile_res);
  if (!re_hyphen || !re_simple)
    jinja_fail(st, "wordwrap: cannot compile its word-splitting pattern");
  struct jinja_buf b;
  jinja_buf_init(&b, st, 0, JINJA_MAX_OUTPUT);
  for (size_t i = 0, para = 0; i < n; para++) { /* s.splitlines() */
    size_t brk, e = jinja_line_end(s, i, n, &brk);
    if (width <= 0)
      jinja_fail(st, "invalid width %lld (must be > 0)", (long long)width);
    if (para)
      jinja_buf_add(&b, wrap.u.s->data, wrap.u.s->len);
    size_t nc;
    struct chunk *tmp = split_chunks(break_hyphens ? re_hyphen : re_simple, s, i, e, &nc);
    if (nc == SIZE_MAX)
      jinja_fail(st, "wordwrap: out of memory");
    struct chunk *ch = nc ? jinja_alloc(st, nc * sizeof *ch) : NULL, *cur = NULL;
    if (nc)
      memcpy(ch, tmp, nc * sizeof *ch);
    free(tmp);
    if (nc) {
      cur = jinja_alloc(st, nc * 2 * sizeof *cur);
      wrap_chunks(&b, s, ch, nc, cur, width, break_long, break_hyphens, wrap);
    }
    jinja_step(st);
    i = e + brk;
  }
  return jinja_buf_value(&b);
}
