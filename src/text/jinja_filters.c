/* jinja_filters.c - Jinja2's builtin filters and tests, and HF's tojson. */
#include "text/jinja_filters.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "text/jinja_methods.h"
#include "text/jinja_string.h"
#include "text/jinja_wrap.h"

/* ---- helpers ---- */

static struct jinja_value str_of(struct jinja_eval *ev, struct jinja_value v) {
  return jinja_to_str(ev->st, v);
}

/* Jinja2's make_attrgetter: "a.b" or "0" walks items; ints index sequences. */
static struct jinja_value get_path(struct jinja_eval *ev, struct jinja_value v,
                                   struct jinja_value attr) {
  if (attr.type != JINJA_STRING)
    return jinja_eval_getitem(ev, v, attr);
  const char *s = attr.u.s->data;
  while (1) {
    const char *dot = strchr(s, '.');
    size_t len = dot ? (size_t)(dot - s) : strlen(s);
    struct jinja_value key;
    char *endp;
    long long idx = len ? strtoll(s, &endp, 10) : 0;
    if (len && endp == s + len)
      key = jinja_int(idx);
    else
      key = jinja_str_n(ev->st, s, len);
    v = jinja_eval_getitem(ev, v, key);
    if (!dot)
      return v;
    s = dot + 1;
  }
}

/* Case-insensitive sort key (lowercased strings), as Jinja2's ignore_case. */
static struct jinja_value fold(struct jinja_eval *ev, struct jinja_value v, int case_sensitive) {
  if (!case_sensitive && v.type == JINJA_STRING)
    return jinja_string_case(ev, v, JINJA_CASE_LOWER);
  return v;
}

struct sort_item {
  struct jinja_value key, val;
};

static void sort_items(struct jinja_eval *ev, struct sort_item *it, size_t n, int reverse) {
  /* Stable merge sort (Python's sort is stable). */
  if (n < 2)
    return;
  struct sort_item *tmp = jinja_alloc(ev->st, n * sizeof(*tmp));
  for (size_t width = 1; width < n; width *= 2) {
    for (size_t lo = 0; lo < n; lo += 2 * width) {
      size_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
      size_t a = lo, b = mid, k = lo;
      while (a < mid && b < hi) {
        jinja_step(ev->st);
        /* Jinja2 sorts by one-item key lists, which compare equal items (even Undefined) by ==. */
        int c = jinja_equal(it[b].key, it[a].key) ? 0 : jinja_compare(ev->st, it[b].key, it[a].key);
        if (reverse ? c > 0 : c < 0)
          tmp[k++] = it[b++];
        else
          tmp[k++] = it[a++];
      }
      while (a < mid)
        tmp[k++] = it[a++];
      while (b < hi)
        tmp[k++] = it[b++];
    }
    memcpy(it, tmp, n * sizeof(*it));
  }
}

struct jinja_value jinja_filter_items(struct jinja_eval *ev, struct jinja_value v) {
  struct jinja_state *st = ev->st;
  if (v.type == JINJA_UNDEFINED)
    return jinja_list_new(st, 0, 0);
  if (v.type != JINJA_DICT && v.type != JINJA_NAMESPACE)
    jinja_fail(st, "Can only get item pairs from a mapping.");
  struct jinja_value l = jinja_list_new(st, v.u.d->n, 0);
  for (size_t i = 0; i < v.u.d->n; i++) {
    struct jinja_value t = jinja_list_new(st, 2, 1);
    t.u.l->items[0] = v.u.d->keys[i];
    t.u.l->items[1] = v.u.d->vals[i];
    l.u.l->items[i] = t;
  }
  return l;
}

/* The W spaces (none for W < 0) that an integer indent stands for, NUL-terminated; past 1000 fails with the message
 * TOO_LARGE. */
static const char *spaces(struct jinja_state *st, int64_t w, const char *too_large) {
  if (w < 0)
    w = 0;
  if (w > 1000)
    jinja_fail_msg(st, too_large);
  char *sp = jinja_alloc(st, (size_t)w + 1);
  memset(sp, ' ', (size_t)w);
  sp[w] = 0;
  return sp;
}

static struct jinja_value tojson(struct jinja_eval *ev, struct jinja_value v,
                                 const struct jinja_args *a) {
  struct jinja_state *st = ev->st;
  int ensure_ascii = jinja_arg_bool(jinja_arg(a, 0, "ensure_ascii"), 0);
  const struct jinja_value *ind = jinja_arg(a, 1, "indent");
  const struct jinja_value *seps = jinja_arg(a, 2, "separators");
  int sort_keys = jinja_arg_bool(jinja_arg(a, 3, "sort_keys"), 0);
  const char *indent = NULL;
  if (ind && ind->type != JINJA_NONE) {
    if (ind->type == JINJA_STRING) {
      indent = ind->u.s->data;
    } else {
      indent = spaces(st, jinja_arg_int(ev, ind, 0), "tojson indent is too large");
    }
  }
  const char *item_sep = indent ? "," : ", ", *key_sep = ": ";
  if (seps && seps->type != JINJA_NONE) {
    if (seps->type != JINJA_LIST || seps->u.l->n != 2 || seps->u.l->items[0].type != JINJA_STRING ||
        seps->u.l->items[1].type != JINJA_STRING)
      jinja_fail(st, "tojson separators must be a pair of strings");
    item_sep = seps->u.l->items[0].u.s->data;
    key_sep = seps->u.l->items[1].u.s->data;
  }
  struct jinja_buf b;
  jinja_buf_init(&b, st, 0, JINJA_MAX_OUTPUT);
  jinja_write_json(&b, v, indent, item_sep, key_sep, sort_keys);
  if (!ensure_ascii)
    return jinja_buf_value(&b);
  /* Non-ASCII only occurs inside JSON strings, so escaping it afterwards is exact. */
  struct jinja_buf e;
  jinja_buf_init(&e, st, 0, JINJA_MAX_OUTPUT);
  for (size_t i = 0; i < b.len;) {
    if ((unsigned char)b.data[i] < 0x80) {
      jinja_buf_add(&e, b.data + i, 1);
      i++;
      continue;
    }
    int32_t cp = jinja_string_next(b.data, b.len, &i);
    if (cp >= 0x10000) {
      cp -= 0x10000;
      jinja_buf_addf(&e, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
    } else {
      jinja_buf_addf(&e, "\\u%04x", cp);
    }
  }
  return jinja_buf_value(&e);
}

/* Python's int(F) for finite F; a result outside int64 (Python would make a big int) is an
 * error rather than a wrapped value. */
static struct jinja_value int_of_double(struct jinja_state *st, double f) {
  double t = trunc(f);
  if (t >= 9223372036854775808.0 || t < -9223372036854775808.0)
    jinja_fail(st, "int() of %.17g is beyond 64-bit integers (pagoda's templates have no big ints)", f);
  return jinja_int((int64_t)t);
}

static struct jinja_value indent(struct jinja_eval *ev, struct jinja_value v,
                                 const struct jinja_args *a) {
  struct jinja_state *st = ev->st;
  const struct jinja_value *w = jinja_arg(a, 0, "width");
  int first = jinja_arg_bool(jinja_arg(a, 1, "first"), 0),
      blank = jinja_arg_bool(jinja_arg(a, 2, "blank"), 0);
  struct jinja_value pad;
  if (w && w->type == JINJA_STRING) {
    pad = *w;
  } else {
    const char *sp = spaces(st, jinja_arg_int(ev, w, 4), "indent width is too large");
    pad = jinja_str_n(st, sp, strlen(sp));
  }
  v = str_of(ev, v);
  /* Jinja2: lines = (s + "\n").splitlines(); the first line as is, each later one after "\n"
   * (indented unless blank and not BLANK). */
  const char *s = v.u.s->data;
  size_t n = v.u.s->len;
  struct jinja_buf b;
  jinja_buf_init(&b, st, 0, JINJA_MAX_OUTPUT);
  if (first)
    jinja_buf_add(&b, pad.u.s->data, pad.u.s->len);
  size_t i = 0;
  for (int line_no = 0;; line_no++) {
    size_t brk;
    size_t e = jinja_line_end(s, i, n, &brk);
    if (line_no > 0) {
      jinja_buf_add(&b, "\n", 1);
      if (blank || e > i)
        jinja_buf_add(&b, pad.u.s->data, pad.u.s->len);
    }
    jinja_buf_add(&b, s + i, e - i);
    if (e >= n) /* the appended "\n" ends this last line */
      break;
    i = e + brk;
  }
  return jinja_buf_value(&b);
}

struct jinja_value jinja_html_escape(struct jinja_eval *ev, struct jinja_value v) {
  v = str_of(ev, v);
  struct jinja_buf b;
  jinja_buf_init(&b, ev->st, 0, JINJA_MAX_OUTPUT);
  for (size_t i = 0; i < v.u.s->len; i++) {
    char c = v.u.s->data[i];
    const char *r = c == '&'    ? "&amp;"
                    : c == '<'  ? "&lt;"
                    : c == '>'  ? "&gt;"
                    : c == '"'  ? "&#34;"
                    : c == '\'' ? "&#39;"
                                : NULL;
    if (r)
      jinja_buf_adds(&b, r);
    else
      jinja_buf_add(&b, &c, 1);
  }
  struct jinja_value r = jinja_buf_value(&b);
  r.markup = 1;
  return r;
}

/* Whether a number read from S ends at END as int() and float() want it: something was read and only
 * whitespace follows. */
static int read_whole(const char *s, const char *end) {
  if (end == s)
    return 0;
  while (*end == ' ' || *end == '\t' || *end == '\n')
    end++;
  return !*end;
}

/* Parses a Python int literal from a string (int("12")); 0 on failure. */
static int parse_int(const char *s, int base, int64_t *out) {
  while (*s == ' ' || *s == '\t' || *s == '\n')
    s++;
  char *end;
  long long v = strtoll(s, &end, base);
  if (!read_whole(s, end))
    return 0;
  *out = v;
  return 1;
}

static int parse_float(const char *s, double *out) {
  char *end;
  double v = strtod(s, &end);
  if (!read_whole(s, end))
    return 0;
  *out = v;
  return 1;
}

static struct jinja_value round_value(struct jinja_eval *ev, struct jinja_value v,
                                      const struct jinja_args *a) {
  int64_t prec = jinja_arg_int(ev, jinja_arg(a, 0, "precision"), 0);
  const struct jinja_value *m = jinja_arg(a, 1, "method");
  const char *method = m && m->type == JINJA_STRING ? m->u.s->data : "common";
  if (!jinja_is_number(v))
    jinja_fail(ev->st, "type %s doesn't define __round__ method", jinja_type_name(v));
  double x = jinja_as_double(v), p = pow(10.0, (double)prec), r;
  if (!strcmp(method, "common")) {
    if (v.type != JINJA_FLOAT)
      return jinja_int(v.type == JINJA_BOOL ? v.u.b : v.u.i);
    if (prec >= 0 &&
        prec < 300) { /* correctly rounded like Python's round(): printf rounds the exact binary value */
      char tmp[400];
      snprintf(tmp, sizeof tmp, "%.*f", (int)prec, x);
      r = strtod(tmp, NULL);
    } else {
      r = nearbyint(x * p) / p;
    }
  } else if (!strcmp(method, "ceil")) {
    r = ceil(x * p) / p;
  } else if (!strcmp(method, "floor")) {
    r = floor(x * p) / p;
  } else {
    jinja_fail(ev->st, "method must be common, ceil or floor");
  }
  return jinja_float(r);
}

/* select/reject/selectattr/rejectattr: keep items whose test result equals WANT. */
static struct jinja_value select_items(struct jinja_eval *ev, struct jinja_value seq,
                                       const struct jinja_args *a, int by_attr, int want) {
  struct jinja_state *st = ev->st;
  size_t n = 0;
  /* Jinja2 iterates only a truthy sequence here, so none | selectattr(...) is empty. */
  struct jinja_value *items = jinja_truthy(seq) ? jinja_eval_iterate(ev, seq, &n) : NULL;
  size_t first = 0;
  struct jinja_value attr = jinja_none();
  if (by_attr) {
    if (a->n < 1)
      jinja_fail(st, "Missing parameter for attribute name");
    attr = a->pos[0];
    first = 1;
  }
  const char *test = a->n > first ? jinja_arg_str(ev, &a->pos[first], "test name") : NULL;
  struct jinja_args targs = {0};
  if (test && a->n > first + 1) {
    targs.pos = a->pos + first + 1;
    targs.n = a->n - first - 1;
  }
  struct jinja_value out = jinja_list_new(st, n, 0);
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    struct jinja_value x = by_attr ? get_path(ev, items[i], attr) : items[i];
    int ok = test ? jinja_test_apply(ev, test, x, &targs) : jinja_truthy(x);
    if (ok == want)
      out.u.l->items[m++] = items[i];
  }
  out.u.l->n = m;
  out.u.l->view = JINJA_VIEW_GENERATOR;
  return out;
}

static struct jinja_value map_items(struct jinja_eval *ev, struct jinja_value seq,
                                    const struct jinja_args *a) {
  struct jinja_state *st = ev->st;
  size_t n = 0;
  struct jinja_value *items = jinja_truthy(seq) ? jinja_eval_iterate(ev, seq, &n) : NULL;
  struct jinja_value out = jinja_list_new(st, n, 0);
  const struct jinja_value *attribute = jinja_arg(a, SIZE_MAX, "attribute");
  if (attribute) {
    const struct jinja_value *def = jinja_arg(a, SIZE_MAX, "default");
    for (size_t i = 0; i < n; i++) {
      struct jinja_value x = get_path(ev, items[i], *attribute);
      if (x.type == JINJA_UNDEFINED && def)
        x = *def;
      out.u.l->items[i] = x;
    }
    out.u.l->view = JINJA_VIEW_GENERATOR;
    return out;
  }
  if (a->n < 1)
    jinja_fail(st, "map requires a filter argument");
  const char *filter = jinja_arg_str(ev, &a->pos[0], "filter name");
  struct jinja_args fargs = {
      .pos = a->pos + 1, .n = a->n - 1, .kwnames = a->kwnames, .kw = a->kw, .num_kw = a->num_kw};
  for (size_t i = 0; i < n; i++)
    out.u.l->items[i] = jinja_filter_apply(ev, filter, items[i], &fargs);
  out.u.l->view = JINJA_VIEW_GENERATOR;
  return out;
}

static struct jinja_value min_max(struct jinja_eval *ev, struct jinja_value seq,
                                  const struct jinja_args *a, int want_max) {
  size_t n;
  struct jinja_value *items = jinja_eval_iterate(ev, seq, &n);
  int cs = jinja_arg_bool(jinja_arg(a, 0, "case_sensitive"), 0);
  const struct jinja_value *attribute = jinja_arg(a, 1, "attribute");
  if (n == 0)
    return jinja_undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  struct jinja_value bk = fold(ev, attribute ? get_path(ev, items[0], *attribute) : items[0], cs);
  for (size_t i = 1; i < n; i++) {
    struct jinja_value k = fold(ev, attribute ? get_path(ev, items[i], *attribute) : items[i], cs);
    int c = jinja_compare(ev->st, k, bk);
    if (want_max ? c > 0 : c < 0) {
      best = i;
      bk = k;
    }
  }
  return items[best];
}

static struct jinja_value unique(struct jinja_eval *ev, struct jinja_value seq,
                                 const struct jinja_args *a) {
  size_t n;
  struct jinja_value *items = jinja_eval_iterate(ev, seq, &n);
  int cs = jinja_arg_bool(jinja_arg(a, 0, "case_sensitive"), 0);
  const struct jinja_value *attribute = jinja_arg(a, 1, "attribute");
  struct jinja_value out = jinja_list_new(ev->st, n, 0);
  struct jinja_value *keys = jinja_alloc(ev->st, (n + 1) * sizeof(*keys));
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    struct jinja_value k = fold(ev, attribute ? get_path(ev, items[i], *attribute) : items[i], cs);
    int seen = 0;
    for (size_t j = 0; j < m && !seen; j++) {
      jinja_step(ev->st);
      seen = jinja_equal(keys[j], k);
    }
    if (!seen) {
      keys[m] = k;
      out.u.l->items[m++] = items[i];
    }
  }
  out.u.l->n = m;
  return out;
}

/* ---- filters ---- */

static struct jinja_value filter_apply(struct jinja_eval *ev, const char *name, struct jinja_value in,
                                       const struct jinja_args *a);

struct jinja_value jinja_filter_apply(struct jinja_eval *ev, const char *name, struct jinja_value in,
                                      const struct jinja_args *a) {
  struct jinja_value r = filter_apply(ev, name, in, a);
  /* Markup methods return Markup: these filters work through them (soft_str keeps Markup). */
  if (in.type == JINJA_STRING && in.markup && r.type == JINJA_STRING &&
      (!strcmp(name, "trim") || !strcmp(name, "upper") || !strcmp(name, "lower") ||
       !strcmp(name, "capitalize") || !strcmp(name, "title") || !strcmp(name, "string")))
    r.markup = 1;
  return r;
}

static struct jinja_value filter_apply(struct jinja_eval *ev, const char *name, struct jinja_value in,
                                       const struct jinja_args *a) {
  struct jinja_state *st = ev->st;
  jinja_step(st);
#define IS(x) (!strcmp(name, x))
  if (IS("safe")) {
    struct jinja_value r = str_of(ev, in);
    r.markup = 1;
    return r;
  }
  if (IS("list") && in.type == JINJA_LIST && !in.u.l->is_tuple && !in.u.l->view)
    return in;
  if (IS("tojson"))
    return tojson(ev, in, a);
  if (IS("trim"))
    return jinja_string_strip(ev, in, jinja_arg(a, 0, "chars"), 3);
  if (IS("upper"))
    return jinja_string_case(ev, in, JINJA_CASE_UPPER);
  if (IS("lower"))
    return jinja_string_case(ev, in, JINJA_CASE_LOWER);
  if (IS("capitalize"))
    return jinja_string_case(ev, in, JINJA_CASE_CAPITALIZE);
  if (IS("title"))
    return jinja_string_case(ev, in, JINJA_CASE_TITLE_WORDS);
  if (IS("string"))
    return str_of(ev, in);
  if (IS("length") || IS("count")) {
    switch (in.type) {
    case JINJA_UNDEFINED:
      return jinja_int(0);
    case JINJA_STRING:
      jinja_charge(st, in.u.s->len);
      return jinja_int((int64_t)jinja_utf8_len(in.u.s->data, in.u.s->len));
    case JINJA_LIST:
      return jinja_int((int64_t)in.u.l->n);
    case JINJA_DICT:
    case JINJA_NAMESPACE:
      return jinja_int((int64_t)in.u.d->n);
    default:
      jinja_fail(st, "object of type '%s' has no len()", jinja_type_name(in));
    }
  }
  if (IS("default") || IS("d")) {
    const struct jinja_value *def = jinja_arg(a, 0, "default_value");
    int boolean = jinja_arg_bool(jinja_arg(a, 1, "boolean"), 0);
    if (in.type == JINJA_UNDEFINED || (boolean && !jinja_truthy(in)))
      return def ? *def : jinja_str(st, "");
    return in;
  }
  if (IS("first") || IS("last")) {
    size_t n;
    struct jinja_value *items = jinja_eval_iterate(ev, in, &n);
    if (n == 0)
      return jinja_undefined(IS("first") ? "No first item, sequence was empty."
                                         : "No last item, sequence was empty.");
    return IS("first") ? items[0] : items[n - 1];
  }
  if (IS("join")) {
    const struct jinja_value *d = jinja_arg(a, 0, "d");
    struct jinja_value sep = d ? str_of(ev, *d) : jinja_str(st, "");
    const struct jinja_value *attribute = jinja_arg(a, 1, "attribute");
    if (attribute && attribute->type == JINJA_NONE)
      attribute = NULL;
    return jinja_string_join(ev, in, sep.u.s->data, sep.u.s->len, attribute);
  }
  if (IS("items"))
    return jinja_filter_items(ev, in);
  if (IS("list")) {
    size_t n;
    struct jinja_value *items = jinja_eval_iterate(ev, in, &n);
    return jinja_list_from(ev->st, items, n);
  }
  if (IS("replace"))
    return jinja_string_replace(ev, in, jinja_arg(a, 0, "old"), jinja_arg(a, 1, "new"),
                                jinja_arg_int(ev, jinja_arg(a, 2, "count"), -1));
  /* Undefined's __int__, __float__, __abs__ and __round__ raise. */
  if (IS("int") || IS("float") || IS("abs") || IS("round"))
    jinja_check_defined(st, in);
  if (IS("int")) {
    int64_t def = jinja_arg_int(ev, jinja_arg(a, 0, "default"), 0),
            base = jinja_arg_int(ev, jinja_arg(a, 1, "base"), 10), r;
    double f;
    if (in.type == JINJA_INT)
      return in;
    if (in.type == JINJA_BOOL)
      return jinja_int(in.u.b);
    if (in.type == JINJA_FLOAT)
      return isfinite(in.u.f) ? int_of_double(st, in.u.f) : jinja_int(def);
    if (in.type == JINJA_STRING) {
      if (parse_int(in.u.s->data, (int)base, &r))
        return jinja_int(r);
      if (parse_float(in.u.s->data, &f) && isfinite(f))
        return int_of_double(st, f);
    }
    return jinja_int(def);
  }
  if (IS("float")) {
    const struct jinja_value *d = jinja_arg(a, 0, "default");
    double f;
    if (jinja_is_number(in))
      return jinja_float(jinja_as_double(in));
    if (in.type == JINJA_STRING && parse_float(in.u.s->data, &f))
      return jinja_float(f);
    return d ? *d : jinja_float(0.0);
  }
  if (IS("abs")) {
    if (in.type == JINJA_INT)
      return jinja_int(in.u.i < 0 ? -in.u.i : in.u.i);
    if (in.type == JINJA_BOOL)
      return jinja_int(in.u.b);
    if (in.type == JINJA_FLOAT)
      return jinja_float(fabs(in.u.f));
    jinja_fail(st, "bad operand type for abs(): '%s'", jinja_type_name(in));
  }
  if (IS("round"))
    return round_value(ev, in, a);
  if (IS("select"))
    return select_items(ev, in, a, 0, 1);
  if (IS("reject"))
    return select_items(ev, in, a, 0, 0);
  if (IS("selectattr"))
    return select_items(ev, in, a, 1, 1);
  if (IS("rejectattr"))
    return select_items(ev, in, a, 1, 0);
  if (IS("map"))
    return map_items(ev, in, a);
  if (IS("attr")) { /* Python attributes only: no fallback to dict keys */
    const char *attr = jinja_arg_str(ev, jinja_arg(a, 0, "name"), "attribute name");
    if (in.type == JINJA_DICT && !jinja_method_exists(in, attr))
      return jinja_undefined(NULL);
    return jinja_eval_getattr(ev, in, attr);
  }
  if (IS("unique"))
    return unique(ev, in, a);
  if (IS("min") || IS("max"))
    return min_max(ev, in, a, IS("max"));
  if (IS("reverse")) {
    if (in.type == JINJA_STRING) {
      size_t n;
      struct jinja_value *chars = jinja_eval_iterate(ev, in, &n);
      struct jinja_buf b;
      jinja_buf_init(&b, st, 0, JINJA_MAX_OUTPUT);
      for (size_t i = n; i-- > 0;)
        jinja_buf_add(&b, chars[i].u.s->data, chars[i].u.s->len);
      return jinja_buf_value(&b);
    }
    if (in.type != JINJA_LIST && in.type != JINJA_DICT && in.type != JINJA_UNDEFINED)
      jinja_fail(st, "argument must be iterable");
    size_t n;
    struct jinja_value *items = jinja_eval_iterate(ev, in, &n);
    struct jinja_value l = jinja_list_new(st, n, 0);
    for (size_t i = 0; i < n; i++)
      l.u.l->items[i] = items[n - 1 - i];
    return l;
  }
  if (IS("sort") || IS("dictsort")) {
    int dict = IS("dictsort");
    size_t n;
    struct jinja_value *items;
    if (dict) {
      jinja_check_defined(st, in); /* dictsort calls value.items(), which an Undefined refuses */
      struct jinja_value pairs = jinja_filter_items(ev, in);
      items = pairs.u.l->items;
      n = pairs.u.l->n;
    } else {
      items = jinja_eval_iterate(ev, in, &n);
    }
    int reverse = jinja_arg_bool(jinja_arg(a, dict ? 2 : 0, "reverse"), 0);
    int cs = jinja_arg_bool(jinja_arg(a, dict ? 0 : 1, "case_sensitive"), 0);
    const struct jinja_value *attribute = dict ? NULL : jinja_arg(a, 2, "attribute");
    const struct jinja_value *by = dict ? jinja_arg(a, 1, "by") : NULL;
    int by_value = by && by->type == JINJA_STRING && !strcmp(by->u.s->data, "value");
    struct sort_item *it = jinja_alloc(st, (n + 1) * sizeof(*it));
    for (size_t i = 0; i < n; i++) {
      struct jinja_value k = items[i];
      if (dict)
        k = k.u.l->items[by_value ? 1 : 0];
      else if (attribute)
        k = get_path(ev, k, *attribute);
      it[i].key = fold(ev, k, cs);
      it[i].val = items[i];
    }
    sort_items(ev, it, n, reverse);
    struct jinja_value l = jinja_list_new(st, n, 0);
    for (size_t i = 0; i < n; i++)
      l.u.l->items[i] = it[i].val;
    return l;
  }
  if (IS("sum")) {
    size_t n;
    struct jinja_value *items = jinja_eval_iterate(ev, in, &n);
    const struct jinja_value *attribute = jinja_arg(a, 0, "attribute");
    const struct jinja_value *start = jinja_arg(a, 1, "start");
    struct jinja_value acc = start ? *start : jinja_int(0);
    for (size_t i = 0; i < n; i++) {
      struct jinja_value x = attribute ? get_path(ev, items[i], *attribute) : items[i];
      jinja_check_defined(st, x);
      if (!jinja_is_number(acc) || !jinja_is_number(x))
        jinja_fail(st, "unsupported operand type(s) for +: '%s' and '%s'", jinja_type_name(acc),
                   jinja_type_name(x));
      if (acc.type == JINJA_FLOAT || x.type == JINJA_FLOAT)
        acc = jinja_float(jinja_as_double(acc) + jinja_as_double(x));
      else
        acc = jinja_int((int64_t)jinja_as_double(acc) + (int64_t)jinja_as_double(x));
    }
    return acc;
  }
  if (IS("indent")) {
    jinja_check_defined(st, in); /* Jinja2 appends "\n" to the value first */
    return indent(ev, in, a);
  }
  if (IS("wordcount")) {
    struct jinja_value s = str_of(ev, in);
    size_t i = 0, n = s.u.s->len;
    int64_t words = 0;
    int inword = 0;
    while (i < n) {
      int32_t c = jinja_string_next(s.u.s->data, n, &i);
      utf8proc_category_t k = utf8proc_category(c);
      int w = c == '_' || (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) ||
              (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO) || k == UTF8PROC_CATEGORY_MN ||
              k == UTF8PROC_CATEGORY_MC;
      if (w && !inword)
        words++;
      inword = w;
    }
    return jinja_int(words);
  }
  if ((IS("escape") || IS("e")) && in.type == JINJA_STRING && in.markup)
    return in;
  if (IS("escape") || IS("e") || IS("forceescape"))
    return jinja_html_escape(ev, in);
  if (IS("truncate"))
    return jinja_truncate(ev, in, a);
  if (IS("wordwrap"))
    return jinja_wordwrap(ev, in, a);
  if (IS("center")) {
    struct jinja_value s = str_of(ev, in);
    int64_t width = jinja_arg_int(ev, jinja_arg(a, 0, "width"), 80);
    int64_t len = (int64_t)jinja_utf8_len(s.u.s->data, s.u.s->len);
    if (width > JINJA_MAX_OUTPUT)
      jinja_fail(st, "center width is too large");
    if (width <= len)
      return s;
    int64_t pad = width - len, left = pad / 2 + (pad & width & 1);
    struct jinja_buf b;
    jinja_buf_init(&b, st, 0, JINJA_MAX_OUTPUT);
    for (int64_t i = 0; i < left; i++)
      jinja_buf_add(&b, " ", 1);
    jinja_buf_add(&b, s.u.s->data, s.u.s->len);
    for (int64_t i = 0; i < pad - left; i++)
      jinja_buf_add(&b, " ", 1);
    return jinja_buf_value(&b);
  }
  if (IS("batch")) {
    size_t n;
    struct jinja_value *items = jinja_eval_iterate(ev, in, &n);
    int64_t size = jinja_arg_int(ev, jinja_arg(a, 0, "linecount"), 1);
    const struct jinja_value *fill = jinja_arg(a, 1, "fill_with");
    if (size <= 0)
      jinja_fail(st, "batch size must be positive");
    size_t groups = (n + (size_t)size - 1) / (size_t)size;
    struct jinja_value out = jinja_list_new(st, groups, 0);
    for (size_t g = 0; g < groups; g++) {
      size_t start = g * (size_t)size, count = n - start < (size_t)size ? n - start : (size_t)size;
      struct jinja_value row = jinja_list_new(st, fill ? (size_t)size : count, 0);
      for (size_t k = 0; k < row.u.l->n; k++)
        row.u.l->items[k] = k < count ? items[start + k] : *fill;
      out.u.l->items[g] = row;
    }
    return out;
  }
  if (IS("format")) {
    if (in.type != JINJA_STRING)
      in = str_of(ev, in);
    struct jinja_value args = jinja_list_new(st, a->n, 1);
    for (size_t i = 0; i < a->n; i++)
      args.u.l->items[i] = a->pos[i];
    return jinja_string_percent(ev, in, args);
  }
  if (IS("pprint")) {
    struct jinja_buf b;
    jinja_buf_init(&b, st, 0, JINJA_MAX_OUTPUT);
    jinja_write_repr(&b, in);
    return jinja_buf_value(&b);
  }
#undef IS
  jinja_fail(st, "No filter named '%s'.", name);
}

/* ---- tests ---- */

int jinja_test_apply(struct jinja_eval *ev, const char *name, struct jinja_value v,
                     const struct jinja_args *a) {
  struct jinja_state *st = ev->st;
  const struct jinja_value *arg = a->n ? &a->pos[0] : NULL;
#define IS(x) (!strcmp(name, x))
  if (IS("defined"))
    return v.type != JINJA_UNDEFINED;
  if (IS("undefined"))
    return v.type == JINJA_UNDEFINED;
  if (IS("none"))
    return v.type == JINJA_NONE;
  if (IS("boolean"))
    return v.type == JINJA_BOOL;
  if (IS("true"))
    return v.type == JINJA_BOOL && v.u.b;
  if (IS("false"))
    return v.type == JINJA_BOOL && !v.u.b;
  if (IS("integer"))
    return v.type == JINJA_INT;
  if (IS("float"))
    return v.type == JINJA_FLOAT;
  if (IS("number"))
    return jinja_is_number(v);
  if (IS("string"))
    return v.type == JINJA_STRING;
  if (IS("mapping"))
    return v.type == JINJA_DICT;
  if (IS("iterable"))
    return v.type == JINJA_LIST || v.type == JINJA_DICT || v.type == JINJA_STRING ||
           v.type == JINJA_UNDEFINED;
  /* An Undefined has __len__, __getitem__ and __call__, so Jinja2 finds it a callable sequence. */
  if (IS("sequence"))
    return v.type == JINJA_LIST || v.type == JINJA_DICT || v.type == JINJA_STRING ||
           v.type == JINJA_UNDEFINED;
  if (IS("callable"))
    return v.type == JINJA_CALLABLE || v.type == JINJA_UNDEFINED;
  if (IS("escaped"))
    return 0;
  if (IS("lower") || IS("upper")) {
    if (v.type != JINJA_STRING)
      v = str_of(ev, v);
    /* Python: at least one cased character and no cased character of the other case. */
    int cased = 0;
    for (size_t i = 0; i < v.u.s->len;) {
      int32_t c = jinja_string_next(v.u.s->data, v.u.s->len, &i);
      if (!jinja_string_is_cased(c))
        continue;
      int is_upper = utf8proc_tolower(c) != c;
      if (IS("lower") ? is_upper : !is_upper)
        return 0;
      cased = 1;
    }
    return cased;
  }
  if (IS("divisibleby") && arg)
    jinja_check_defined(st, *arg);
  if ((IS("even") || IS("odd") || IS("divisibleby")) &&
      v.type == JINJA_FLOAT) { /* value % n as Python */
    double d = IS("divisibleby") ? (arg ? jinja_as_double(*arg) : 1) : 2;
    if (d == 0)
      jinja_fail(st, "float modulo");
    double m = fmod(v.u.f, d);
    if (m != 0 && ((m < 0) != (d < 0)))
      m += d;
    return IS("odd") ? m == 1 : m == 0;
  }
  if (IS("even") || IS("odd") || IS("divisibleby")) {
    jinja_check_defined(st, v);
    if (v.type != JINJA_INT && v.type != JINJA_BOOL)
      jinja_fail(st, "the '%s' test needs an integer", name);
    int64_t x = v.type == JINJA_BOOL ? v.u.b : v.u.i;
    if (IS("even"))
      return x % 2 == 0;
    if (IS("odd"))
      return x % 2 != 0;
    int64_t d = jinja_arg_int(ev, arg, 1);
    if (d == 0)
      jinja_fail(st, "integer division or modulo by zero");
    return x % d == 0;
  }
  if (IS("sameas")) {
    if (!arg)
      jinja_fail(st, "sameas needs an argument");
    if (v.type != arg->type)
      return 0;
    return jinja_equal(v, *arg) &&
           (v.type == JINJA_NONE || v.type == JINJA_BOOL || v.type == JINJA_INT || v.u.s == arg->u.s);
  }
  if (IS("filter") || IS("test")) {
    if (v.type != JINJA_STRING)
      return 0;
    static const char *filters[] = {
        "safe",   "tojson",    "trim",   "upper",      "lower",       "capitalize", "title",
        "string", "length",    "count",  "default",    "d",           "first",      "last",
        "join",   "items",     "list",   "replace",    "int",         "float",      "abs",
        "round",  "select",    "reject", "selectattr", "rejectattr",  "map",        "attr",
        "unique", "min",       "max",    "reverse",    "sort",        "dictsort",   "sum",
        "indent", "wordcount", "escape", "e",          "forceescape", "center",     "batch",
        "pprint", "format",    "truncate", "wordwrap", NULL};
    static const char *tests[] = {
        "defined", "undefined", "none",        "boolean",     "true",     "false",    "integer", "float",
        "number",  "string",    "mapping",     "iterable",    "sequence", "callable", "escaped", "lower",
        "upper",   "even",      "odd",         "divisibleby", "sameas",   "filter",   "test",    "eq",
        "equalto", "==",        "ne",          "!=",          "lt",       "lessthan", "<",       "le",
        "<=",      "gt",        "greaterthan", ">",           "ge",       ">=",       "in",      NULL};
    const char **list = IS("filter") ? filters : tests;
    for (int i = 0; list[i]; i++)
      if (!strcmp(list[i], v.u.s->data))
        return 1;
    return 0;
  }
  if (IS("in")) {
    if (!arg)
      jinja_fail(st, "the 'in' test needs an argument");
    if (arg->type == JINJA_STRING) {
      if (v.type != JINJA_STRING)
        jinja_fail(st, "'in <string>' requires string as left operand, not %s", jinja_type_name(v));
      jinja_charge(st, arg->u.s->len);
      return v.u.s->len == 0 || memmem(arg->u.s->data, arg->u.s->len, v.u.s->data, v.u.s->len) != NULL;
    }
    if (arg->type == JINJA_DICT || arg->type == JINJA_NAMESPACE) {
      jinja_charge(st, arg->u.d->n * 16);
      return jinja_dict_get(arg->u.d, v) != NULL;
    }
    size_t n;
    struct jinja_value *items = jinja_eval_iterate(ev, *arg, &n);
    for (size_t i = 0; i < n; i++)
      if (jinja_equal(items[i], v))
        return 1;
    return 0;
  }
  int op = 0;
  if (IS("eq") || IS("equalto") || IS("=="))
    op = 1;
  else if (IS("ne") || IS("!="))
    op = 2;
  else if (IS("lt") || IS("lessthan") || IS("<"))
    op = 3;
  else if (IS("le") || IS("<="))
    op = 4;
  else if (IS("gt") || IS("greaterthan") || IS(">"))
    op = 5;
  else if (IS("ge") || IS(">="))
    op = 6;
  if (op) {
    if (!arg)
      jinja_fail(st, "the '%s' test needs an argument", name);
    if (op == 1)
      return jinja_equal(v, *arg);
    if (op == 2)
      return !jinja_equal(v, *arg);
    int c = jinja_compare(st, v, *arg);
    return op == 3 ? c < 0 : op == 4 ? c <= 0 : op == 5 ? c > 0 : c >= 0;
  }
#undef IS
  jinja_fail(st, "No test named '%s'.", name);
}
