/* jinja_string.c - Python's str operations on UTF-8 strings for the chat-template interpreter:
 * Unicode case mapping (utf8proc plus SpecialCasing), strip, split, replace, join, printf-style %
 * and str.format. */
#include "text/jinja_string.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

static struct jinja_value str_of(struct jinja_eval *ev, struct jinja_value v) {
  return jinja_to_str(ev->st, v);
}

/* Python's str.isspace for one code point. */
int jinja_string_isspace(int32_t c) {
  if (c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f) || c == 0x85)
    return 1;
  if (c < 0x80)
    return 0;
  utf8proc_category_t k = utf8proc_category(c);
  return k == UTF8PROC_CATEGORY_ZS || k == UTF8PROC_CATEGORY_ZL || k == UTF8PROC_CATEGORY_ZP;
}

/* Decodes the next code point at S[*i] (invalid bytes read as themselves). */
int32_t jinja_string_next(const char *s, size_t n, size_t *i) {
  utf8proc_int32_t cp;
  utf8proc_ssize_t k =
      utf8proc_iterate((const utf8proc_uint8_t *)s + *i, (utf8proc_ssize_t)(n - *i), &cp);
  if (k <= 0) {
    cp = (unsigned char)s[*i];
    k = 1;
  }
  *i += (size_t)k;
  return cp;
}

void jinja_string_put(struct jinja_buf *b, int32_t cp) {
  utf8proc_uint8_t u[4];
  utf8proc_ssize_t k = utf8proc_encode_char(cp, u);
  if (k > 0)
    jinja_buf_add(b, (const char *)u, (size_t)k);
}

int jinja_string_is_cased(int32_t c) { return utf8proc_toupper(c) != c || utf8proc_tolower(c) != c; }

enum { MAP_UPPER, MAP_LOWER, MAP_TITLE };

/* Appends C case-mapped as Python does: utf8proc's one-to-one mappings plus the full (one-to-many)
 * mappings of Unicode's SpecialCasing that Python applies unconditionally. */
static void put_case(struct jinja_buf *b, int32_t c, int map) {
  static const struct {
    int32_t cp;
    const char *upper, *title, *lower;
  } special[] = {
      {0x00DF, "SS", "Ss", NULL},               /* sharp s */
      {0x0130, NULL, NULL, "i\xcc\x87"},        /* capital I with dot above */
      {0x0149, "\xca\xbcN", "\xca\xbcN", NULL}, /* n preceded by apostrophe */
      {0xFB00, "FF", "Ff", NULL},
      {0xFB01, "FI", "Fi", NULL},
      {0xFB02, "FL", "Fl", NULL},
      {0xFB03, "FFI", "Ffi", NULL},
      {0xFB04, "FFL", "Ffl", NULL},
      {0xFB05, "ST", "St", NULL},
      {0xFB06, "ST", "St", NULL},
  };
  for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) {
    if (special[i].cp != c)
      continue;
    const char *r = map == MAP_UPPER   ? special[i].upper
                    : map == MAP_TITLE ? special[i].title
                                       : special[i].lower;
    if (r) {
      jinja_buf_adds(b, r);
      return;
    }
  }
  jinja_string_put(b, map == MAP_UPPER   ? utf8proc_toupper(c)
                      : map == MAP_TITLE ? utf8proc_totitle(c)
                                         : utf8proc_tolower(c));
}

struct jinja_value jinja_string_case(struct jinja_eval *ev, struct jinja_value v, int mode) {
  v = str_of(ev, v);
  const char *s = v.u.s->data;
  size_t n = v.u.s->len, i = 0;
  struct jinja_buf b;
  jinja_buf_init(&b, ev->st, 0, JINJA_MAX_OUTPUT);
  int first = 1, prev_cased = 0, word_start = 1;
  while (i < n) {
    int32_t c = jinja_string_next(s, n, &i);
    int map = MAP_LOWER;
    switch (mode) {
    case JINJA_CASE_UPPER:
      map = MAP_UPPER;
      break;
    case JINJA_CASE_LOWER:
      break;
    case JINJA_CASE_CAPITALIZE:
      map = first ? MAP_TITLE : MAP_LOWER;
      break;
    case JINJA_CASE_PY_TITLE:
      map = prev_cased ? MAP_LOWER : MAP_TITLE;
      prev_cased = jinja_string_is_cased(c);
      break;
    case JINJA_CASE_TITLE_WORDS: { /* Jinja2's title: word[0].upper() + word[1:].lower(), words split at
                                -, space, ( { [ < */
      int sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || jinja_string_isspace(c);
      map = sep ? -1 : word_start ? MAP_UPPER : MAP_LOWER;
      word_start = sep;
      break;
    }
    }
    first = 0;
    if (map < 0)
      jinja_string_put(&b, c);
    else
      put_case(&b, c, map);
  }
  return jinja_buf_value(&b);
}

static int in_chars(const char *cs, size_t cn, int32_t cp) {
  for (size_t j = 0; j < cn;)
    if (jinja_string_next(cs, cn, &j) == cp)
      return 1;
  return 0;
}

/* str.strip/lstrip/rstrip (WHICH: 1 left, 2 right, 3 both) with CHARS (NULL: whitespace). */
struct jinja_value jinja_string_strip(struct jinja_eval *ev, struct jinja_value v,
                                      const struct jinja_value *chars, int which) {
  v = str_of(ev, v);
  const char *s = v.u.s->data;
  size_t n = v.u.s->len, a = 0, e = n;
  const char *cs = NULL;
  size_t cn = 0;
  if (chars && chars->type == JINJA_STRING) {
    cs = chars->u.s->data;
    cn = chars->u.s->len;
  }
#define IN_SET(cp) (cs ? in_chars(cs, cn, (cp)) : jinja_string_isspace(cp))
  if (which & 1)
    while (a < e) {
      size_t k = a;
      int32_t c = jinja_string_next(s, e, &k);
      if (!IN_SET(c))
        break;
      a = k;
    }
  if (which & 2)
    while (e > a) {
      size_t k = e - 1;
      while (k > a && ((unsigned char)s[k] & 0xC0) == 0x80)
        k--;
      size_t t = k;
      int32_t c = jinja_string_next(s, e, &t);
      if (!IN_SET(c))
        break;
      e = k;
    }
#undef IN_SET
  return jinja_str_n(ev->st, s + a, e - a);
}

struct jinja_value jinja_string_split(struct jinja_eval *ev, struct jinja_value v,
                                      const struct jinja_value *sep, int64_t maxsplit) {
  struct jinja_state *st = ev->st;
  const char *s = v.u.s->data;
  size_t n = v.u.s->len;
  struct jinja_value *parts = jinja_alloc(st, (n + 2) * sizeof(*parts));
  size_t np = 0;
  if (!sep || sep->type == JINJA_NONE) {
    size_t i = 0;
    for (;;) {
      while (i < n) { /* skip whitespace */
        size_t k = i;
        if (!jinja_string_isspace(jinja_string_next(s, n, &k)))
          break;
        i = k;
      }
      if (i >= n)
        break;
      if (maxsplit >= 0 && (int64_t)np >= maxsplit) {
        parts[np++] = jinja_str_n(st, s + i, n - i); /* the rest, trailing whitespace kept */
        break;
      }
      size_t start = i;
      while (i < n) {
        size_t k = i;
        if (jinja_string_isspace(jinja_string_next(s, n, &k)))
          break;
        i = k;
      }
      parts[np++] = jinja_str_n(st, s + start, i - start);
      jinja_step(st);
    }
    return jinja_list_from(ev->st, parts, np);
  }
  if (sep->type != JINJA_STRING)
    jinja_fail(st, "must be str or None, not %s", jinja_type_name(*sep));
  size_t sl = sep->u.s->len;
  if (sl == 0)
    jinja_fail(st, "empty separator");
  jinja_charge(st, n);
  size_t i = 0;
  for (;;) {
    const char *hit =
        (maxsplit < 0 || (int64_t)np < maxsplit) ? memmem(s + i, n - i, sep->u.s->data, sl) : NULL;
    if (!hit) {
      parts[np++] = jinja_str_n(st, s + i, n - i);
      break;
    }
    parts[np++] = jinja_str_n(st, s + i, (size_t)(hit - (s + i)));
    jinja_step(st);
    i = (size_t)(hit - s) + sl;
  }
  return jinja_list_from(ev->st, parts, np);
}

/* str.rsplit: like split, but at most MAXSPLIT cuts counted from the right. */
struct jinja_value jinja_string_rsplit(struct jinja_eval *ev, struct jinja_value v,
                                       const struct jinja_value *sep, int64_t maxsplit) {
  if (maxsplit < 0)
    return jinja_string_split(ev, v, sep, -1);
  struct jinja_state *st = ev->st;
  const char *s = v.u.s->data;
  size_t n = v.u.s->len, np = 0, e = n;
  jinja_charge(st, n);
  struct jinja_value *parts = jinja_alloc(st, (n + 2) * sizeof(*parts));
  int ws = !sep || sep->type == JINJA_NONE;
  if (!ws && (sep->type != JINJA_STRING || sep->u.s->len == 0))
    jinja_fail(st, sep->type != JINJA_STRING ? "must be str or None" : "empty separator");
  for (;;) {
    if (ws) {
      while (e > 0 && jinja_string_isspace((unsigned char)s[e - 1]))
        e--;
      if (e == 0)
        break;
      if ((int64_t)np >= maxsplit) {
        parts[np++] = jinja_str_n(st, s, e); /* the rest, leading whitespace kept */
        break;
      }
      size_t b = e;
      while (b > 0 && !jinja_string_isspace((unsigned char)s[b - 1]))
        b--;
      parts[np++] = jinja_str_n(st, s + b, e - b);
      e = b;
    } else {
      size_t sl = sep->u.s->len;
      size_t hit = SIZE_MAX;
      if ((int64_t)np < maxsplit)
        for (size_t p = e >= sl ? e - sl + 1 : 0; p-- > 0;) {
          jinja_charge(st, sl); /* each candidate may compare up to sl bytes */
          if (memcmp(s + p, sep->u.s->data, sl) == 0) {
            hit = p;
            break;
          }
        }
      if (hit == SIZE_MAX) {
        parts[np++] = jinja_str_n(st, s, e);
        break;
      }
      parts[np++] = jinja_str_n(st, s + hit + sl, e - hit - sl);
      e = hit;
    }
    jinja_step(st);
  }
  struct jinja_value l = jinja_list_new(st, np, 0);
  for (size_t i = 0; i < np; i++)
    l.u.l->items[i] = parts[np - 1 - i];
  return l;
}

struct jinja_value jinja_string_replace(struct jinja_eval *ev, struct jinja_value v,
                                        const struct jinja_value *old, const struct jinja_value *new,
                                        int64_t count) {
  v = str_of(ev, v);
  struct jinja_value o = str_of(ev, old ? *old : jinja_str(ev->st, ""));
  struct jinja_value w = str_of(ev, new ? *new : jinja_str(ev->st, ""));
  const char *s = v.u.s->data;
  size_t n = v.u.s->len, ol = o.u.s->len, i = 0;
  struct jinja_buf b;
  jinja_buf_init(&b, ev->st, 0, JINJA_MAX_OUTPUT);
  int64_t done = 0;
  if (ol == 0) { /* Python inserts NEW between every character and at both ends */
    while (count < 0 || done < count) {
      jinja_buf_add(&b, w.u.s->data, w.u.s->len);
      done++;
      if (i >= n)
        break;
      size_t k = i;
      jinja_string_next(s, n, &k);
      jinja_buf_add(&b, s + i, k - i);
      i = k;
    }
    jinja_buf_add(&b, s + i, n - i);
    return jinja_buf_value(&b);
  }
  jinja_charge(ev->st, n);
  while (i < n && (count < 0 || done < count)) {
    const char *hit = memmem(s + i, n - i, o.u.s->data, ol);
    if (!hit)
      break;
    jinja_buf_add(&b, s + i, (size_t)(hit - (s + i)));
    jinja_buf_add(&b, w.u.s->data, w.u.s->len);
    i = (size_t)(hit - s) + ol;
    done++;
    jinja_step(ev->st);
  }
  jinja_buf_add(&b, s + i, n - i);
  return jinja_buf_value(&b);
}

int jinja_string_affix(struct jinja_eval *ev, struct jinja_value v, const struct jinja_value *arg,
                       int ends) {
  if (!arg)
    jinja_fail(ev->st, "%s() takes at least 1 argument (0 given)", ends ? "endswith" : "startswith");
  if (arg->type == JINJA_LIST && arg->u.l->is_tuple) {
    for (size_t i = 0; i < arg->u.l->n; i++)
      if (jinja_string_affix(ev, v, &arg->u.l->items[i], ends))
        return 1;
    return 0;
  }
  if (arg->type != JINJA_STRING)
    jinja_fail(ev->st, "%s first arg must be str or a tuple of str, not %s",
               ends ? "endswith" : "startswith", jinja_type_name(*arg));
  size_t n = v.u.s->len, k = arg->u.s->len;
  if (k > n)
    return 0;
  return memcmp(v.u.s->data + (ends ? n - k : 0), arg->u.s->data, k) == 0;
}

struct jinja_value jinja_string_join(struct jinja_eval *ev, struct jinja_value seq, const char *sep,
                                     size_t sep_len, const struct jinja_value *attribute) {
  size_t n;
  struct jinja_value *items = jinja_eval_iterate(ev, seq, &n);
  struct jinja_buf b;
  jinja_buf_init(&b, ev->st, 0, JINJA_MAX_OUTPUT);
  for (size_t i = 0; i < n; i++) {
    if (i)
      jinja_buf_add(&b, sep, sep_len);
    struct jinja_value it = items[i];
    if (attribute)
      it = jinja_eval_getitem(ev, it, *attribute);
    jinja_write_str(&b, it);
  }
  return jinja_buf_value(&b);
}

/* Python's printf-style str % args for the conversions templates use (s r d i f F e E g G x X o c %),
 * with flags, width and precision; a tuple supplies several arguments. */
struct jinja_value jinja_string_percent(struct jinja_eval *ev, struct jinja_value fmt,
                                        struct jinja_value args) {
  struct jinja_state *st = ev->st;
  const struct jinja_value *argv = &args;
  size_t argc = 1, next = 0;
  /* Python takes any non-tuple with __getitem__ (list, dict, Undefined) for a mapping: a
   * single argument that may also go unused. */
  int mapping = (args.type == JINJA_LIST && !args.u.l->is_tuple) || args.type == JINJA_DICT ||
                args.type == JINJA_UNDEFINED;
  if (args.type == JINJA_LIST && args.u.l->is_tuple) {
    argv = args.u.l->items;
    argc = args.u.l->n;
  }
  const char *s = fmt.u.s->data;
  size_t n = fmt.u.s->len;
  struct jinja_buf b;
  jinja_buf_init(&b, st, 0, JINJA_MAX_OUTPUT);
  for (size_t i = 0; i < n; i++) {
    if (s[i] != '%') {
      jinja_buf_add(&b, s + i, 1);
      continue;
    }
    char spec[32];
    size_t k = 0;
    spec[k++] = '%';
    i++;
    while (i < n && s[i] && strchr("-+ #0", s[i]) && k < 8)
      spec[k++] = s[i++];
    while (i < n && s[i] >= '0' && s[i] <= '9' && k < 16)
      spec[k++] = s[i++];
    if (i < n && s[i] == '.') {
      spec[k++] = s[i++];
      while (i < n && s[i] >= '0' && s[i] <= '9' && k < 24)
        spec[k++] = s[i++];
    }
    if (i >= n)
      jinja_fail(st, "incomplete format");
    spec[k] = 0;
    {
      const char *w = spec + 1;
      while (w < spec + k && strchr("-+ #0", *w))
        w++;
      const char *dot = memchr(spec, '.', k);
      if ((w < spec + k && *w != '.' && strtol(w, NULL, 10) > 100000) ||
          (dot && strtol(dot + 1, NULL, 10) > 100000))
        jinja_fail(st, "format width or precision is too large");
    }
    char conv = s[i];
    if (conv == '%') {
      jinja_buf_add(&b, "%", 1);
      continue;
    }
    if (next >= argc)
      jinja_fail(st, "not enough arguments for format string");
    struct jinja_value v = argv[next++];
    char out[512];
    if (strchr("diouxXc", conv)) {
      if (!jinja_is_number(v))
        jinja_fail(st, "%%%c format: a real number is required, not %s", conv, jinja_type_name(v));
      long long x = v.type == JINJA_FLOAT  ? (long long)v.u.f
                    : v.type == JINJA_BOOL ? v.u.b
                                           : (long long)v.u.i;
      spec[k++] = 'l';
      spec[k++] = 'l';
      spec[k++] = conv == 'i' || conv == 'u' ? 'd' : conv == 'c' ? 'd' : conv;
      spec[k] = 0;
      if (conv == 'c') {
        jinja_string_put(&b, (int32_t)x);
        continue;
      }
      snprintf(out, sizeof out, spec, x);
      jinja_buf_adds(&b, out);
    } else if (strchr("fFeEgG", conv)) {
      if (!jinja_is_number(v))
        jinja_fail(st, "must be real number, not %s", jinja_type_name(v));
      spec[k++] = conv;
      spec[k] = 0;
      snprintf(out, sizeof out, spec, jinja_as_double(v));
      jinja_buf_adds(&b, out);
    } else if (conv == 's' || conv == 'r' || conv == 'a') {
      struct jinja_buf t;
      jinja_buf_init(&t, st, 0, JINJA_MAX_OUTPUT);
      if (conv == 's')
        jinja_write_str(&t, v);
      else
        jinja_write_repr(&t, v);
      spec[k] = 0;
      /* Width and precision count code points; '-' pads on the right. */
      int left = strchr(spec, '-') != NULL;
      const char *w = spec + 1;
      while (*w && strchr("-+ #0", *w))
        w++;
      long width = strtol(w, NULL, 10);
      const char *dot = strchr(spec, '.');
      size_t len = t.len;
      if (dot) {
        long prec = strtol(dot + 1, NULL, 10);
        len = jinja_utf8_offset(t.data ? t.data : "", t.len, (size_t)(prec < 0 ? 0 : prec));
      }
      long cps = (long)jinja_utf8_len(t.data ? t.data : "", len);
      if (width > 100000)
        jinja_fail(st, "format width is too large");
      for (long p = cps; !left && p < width; p++)
        jinja_buf_add(&b, " ", 1);
      jinja_buf_add(&b, t.data ? t.data : "", len);
      for (long p = cps; left && p < width; p++)
        jinja_buf_add(&b, " ", 1);
    } else {
      jinja_fail(st, "unsupported format character '%c' (0x%x)", conv, (unsigned char)conv);
    }
  }
  if (next < argc && !mapping)
    jinja_fail(st, "not all arguments converted during string formatting");
  return jinja_buf_value(&b);
}

/* str.format with positional {} / {0} and named {name} fields (no format specs). */
struct jinja_value jinja_string_format(struct jinja_eval *ev, struct jinja_value self,
                                       const struct jinja_args *a) {
  struct jinja_state *st = ev->st;
  const char *s = self.u.s->data;
  size_t n = self.u.s->len, auto_idx = 0;
  struct jinja_buf b;
  jinja_buf_init(&b, st, 0, JINJA_MAX_OUTPUT);
  for (size_t i = 0; i < n; i++) {
    if ((s[i] == '{' || s[i] == '}') && i + 1 < n && s[i + 1] == s[i]) {
      jinja_buf_add(&b, s + i, 1);
      i++;
      continue;
    }
    if (s[i] != '{') {
      jinja_buf_add(&b, s + i, 1);
      continue;
    }
    const char *close = memchr(s + i, '}', n - i);
    if (!close)
      jinja_fail(st, "Single '{' encountered in format string");
    size_t flen = (size_t)(close - (s + i + 1));
    char field[128];
    if (flen >= sizeof field)
      jinja_fail(st, "format field is too long");
    memcpy(field, s + i + 1, flen);
    field[flen] = 0;
    char *colon = strchr(field, ':');
    if (colon)
      *colon = 0;
    const struct jinja_value *v;
    if (field[0] == 0) {
      v = auto_idx < a->n ? &a->pos[auto_idx] : NULL;
      auto_idx++;
    } else if (field[0] >= '0' && field[0] <= '9') {
      size_t k = (size_t)atoi(field);
      v = k < a->n ? &a->pos[k] : NULL;
    } else {
      v = jinja_arg(a, SIZE_MAX, field);
    }
    if (!v)
      jinja_fail(st, "Replacement index %s out of range for positional args tuple",
                 field[0] ? field : "0");
    if (!colon || !colon[1]) {
      jinja_write_str(&b, *v);
    } else { /* [[fill]align][width][.precision][type] */
      const char *f = colon + 1;
      char fill = ' ', align = 0;
      if (f[0] && (f[1] == '<' || f[1] == '>' || f[1] == '^')) {
        fill = f[0];
        align = f[1];
        f += 2;
      } else if (f[0] == '<' || f[0] == '>' || f[0] == '^') {
        align = *f++;
      }
      long width = strtol(f, (char **)&f, 10), prec = -1;
      if (*f == '.')
        prec = strtol(f + 1, (char **)&f, 10);
      char type = *f;
      if (width > 100000 || prec > 100000)
        jinja_fail(st, "format width or precision is too large");
      struct jinja_buf t;
      jinja_buf_init(&t, st, 0, JINJA_MAX_OUTPUT);
      if (type == 'f' || type == 'e' || type == 'g' || type == '%') {
        char tmp[512], spec8[32];
        double x = jinja_as_double(*v) * (type == '%' ? 100 : 1);
        snprintf(spec8, sizeof spec8, "%%.%ld%c", prec < 0 ? 6 : prec, type == '%' ? 'f' : type);
        snprintf(tmp, sizeof tmp, spec8, x);
        jinja_buf_adds(&t, tmp);
        if (type == '%')
          jinja_buf_add(&t, "%", 1);
      } else {
        jinja_write_str(&t, *v);
        if (prec >= 0 && v->type == JINJA_STRING)
          t.len = jinja_utf8_offset(t.data ? t.data : "", t.len, (size_t)prec);
      }
      if (!align)
        align = v->type == JINJA_STRING ? '<' : '>';
      long cps = (long)jinja_utf8_len(t.data ? t.data : "", t.len), pad = width > cps ? width - cps : 0;
      long left = align == '>' ? pad : align == '^' ? pad / 2 : 0;
      for (long k = 0; k < left; k++)
        jinja_buf_add(&b, &fill, 1);
      jinja_buf_add(&b, t.data ? t.data : "", t.len);
      for (long k = left; k < pad; k++)
        jinja_buf_add(&b, &fill, 1);
    }
    i += flen + 1;
  }
  return jinja_buf_value(&b);
}

size_t jinja_line_end(const char *s, size_t i, size_t n, size_t *brk) {
  for (; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '\n' || c == '\v' || c == '\f' || (c >= 0x1C && c <= 0x1E)) {
      *brk = 1;
      return i;
    }
    if (c == '\r') {
      *brk = i + 1 < n && s[i + 1] == '\n' ? 2 : 1;
      return i;
    }
    if (c == 0xC2 && i + 1 < n && (unsigned char)s[i + 1] == 0x85) {
      *brk = 2;
      return i;
    }
    if (c == 0xE2 && i + 2 < n && (unsigned char)s[i + 1] == 0x80 &&
        ((unsigned char)s[i + 2] == 0xA8 || (unsigned char)s[i + 2] == 0xA9)) {
      *brk = 3;
      return i;
    }
  }
  *brk = 0;
  return n;
}
