/* jinja_value.c - values of the chat-template interpreter: arena, Python str/repr/json forms,
 * truthiness, equality and ordering as Python defines them. */
#include "text/jinja_value.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#define JINJA_CHUNK_MIN (64u << 10)

void *jinja_alloc(struct jinja_state *st, size_t size) {
  if (size > JINJA_MAX_ARENA) /* also keeps the rounding below from wrapping */
    jinja_fail(st, "template exceeded the memory limit of %zu MiB", JINJA_MAX_ARENA >> 20);
  size = (size + 15) & ~(size_t)15;
  struct jinja_chunk *c = st->chunks;
  if (!c || c->cap - c->used < size) {
    size_t cap = size > JINJA_CHUNK_MIN ? size : JINJA_CHUNK_MIN;
    if (st->arena_bytes + cap > JINJA_MAX_ARENA)
      jinja_fail(st, "template exceeded the memory limit of %zu MiB", JINJA_MAX_ARENA >> 20);
    c = malloc(sizeof(*c) + cap);
    if (!c)
      jinja_fail(st, "out of memory while rendering the template");
    st->arena_bytes += cap;
    c->cap = cap;
    c->used = 0;
    c->next = st->chunks;
    st->chunks = c;
  }
  void *p = c->data + c->used;
  c->used += size;
  return p;
}

void jinja_state_release(struct jinja_state *st) {
  struct jinja_chunk *c = st->chunks;
  while (c) {
    struct jinja_chunk *next = c->next;
    free(c);
    c = next;
  }
  st->chunks = NULL;
  st->arena_bytes = 0;
}

static void locate(struct jinja_state *st) {
  if (!st->src || st->at > st->src_len)
    return;
  int line = 1, col = 1;
  for (size_t i = 0; i < st->at; i++) {
    unsigned char c = (unsigned char)st->src[i];
    if (c == '\n') {
      line++;
      col = 1;
    } else if ((c & 0xC0) != 0x80) {
      col++;
    }
  }
  st->err_line = line;
  st->err_col = col;
}

void jinja_fail(struct jinja_state *st, const char *fmt, ...) {
  if (!st->err) {
    locate(st);
    va_list ap;
    va_start(ap, fmt);
    char tmp[1024];
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    st->err = strdup(tmp);
  }
  longjmp(st->on_error, 1);
}

void jinja_fail_msg(struct jinja_state *st, const char *msg) {
  if (!st->err) {
    locate(st);
    st->err = strdup(msg);
  }
  longjmp(st->on_error, 1);
}

void jinja_step(struct jinja_state *st) {
  if (++st->steps > st->max_steps)
    jinja_fail(st, "template exceeded the limit of %ld evaluation steps", st->max_steps);
}

void jinja_charge(struct jinja_state *st, size_t work) {
  if (work < 64)
    return;
  st->steps += (long)(work >> 6);
  if (st->steps > st->max_steps)
    jinja_fail(st, "template exceeded the limit of %ld evaluation steps", st->max_steps);
}

void jinja_buf_init(struct jinja_buf *b, struct jinja_state *st, int heap, size_t limit) {
  b->st = st;
  b->data = NULL;
  b->len = b->cap = 0;
  b->limit = limit;
  b->heap = heap;
}

void jinja_buf_add(struct jinja_buf *b, const char *s, size_t n) {
  if (n == 0)
    return;
  jinja_charge(b->st, n);
  if (b->len + n > b->limit)
    jinja_fail(b->st, "template output exceeded the limit of %zu bytes", b->limit);
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 64;
    while (cap < b->len + n + 1)
      cap *= 2;
    char *d;
    if (b->heap) {
      d = realloc(b->data, cap);
      if (!d)
        jinja_fail(b->st, "out of memory while rendering the template");
    } else {
      d = jinja_alloc(b->st, cap);
      if (b->len)
        memcpy(d, b->data, b->len);
    }
    b->data = d;
    b->cap = cap;
  }
  memcpy(b->data + b->len, s, n);
  b->len += n;
  b->data[b->len] = 0;
}

void jinja_buf_adds(struct jinja_buf *b, const char *s) { jinja_buf_add(b, s, strlen(s)); }

void jinja_buf_addf(struct jinja_buf *b, const char *fmt, ...) {
  char tmp[128];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n > 0)
    jinja_buf_add(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

struct jinja_value jinja_buf_value(struct jinja_buf *b) {
  return jinja_str_n(b->st, b->data ? b->data : "", b->len);
}

struct jinja_value jinja_undefined(const char *why) {
  struct jinja_value v = {.type = JINJA_UNDEFINED};
  v.u.why = why;
  return v;
}
struct jinja_value jinja_none(void) {
  return (struct jinja_value){.type = JINJA_NONE};
}
struct jinja_value jinja_bool(int b) {
  struct jinja_value v = {.type = JINJA_BOOL};
  v.u.b = b != 0;
  return v;
}
struct jinja_value jinja_int(int64_t i) {
  struct jinja_value v = {.type = JINJA_INT};
  v.u.i = i;
  return v;
}
struct jinja_value jinja_float(double f) {
  struct jinja_value v = {.type = JINJA_FLOAT};
  v.u.f = f;
  return v;
}

struct jinja_value jinja_str_n(struct jinja_state *st, const char *s, size_t n) {
  jinja_charge(st, n);
  struct jinja_str *js = jinja_alloc(st, sizeof(*js) + n + 1);
  js->len = n;
  if (n)
    memcpy(js->data, s, n);
  js->data[n] = 0;
  struct jinja_value v = {.type = JINJA_STRING};
  v.u.s = js;
  return v;
}

struct jinja_value jinja_str(struct jinja_state *st, const char *s) {
  return jinja_str_n(st, s, strlen(s));
}

struct jinja_value jinja_list_new(struct jinja_state *st, size_t n, int is_tuple) {
  if (n > JINJA_MAX_ARENA / sizeof(struct jinja_value))
    jinja_fail(st, "template exceeded the memory limit of %zu MiB", JINJA_MAX_ARENA >> 20);
  jinja_charge(st, n * 16);
  struct jinja_list *l = jinja_alloc(st, sizeof(*l));
  l->n = n;
  l->is_tuple = is_tuple;
  l->view = 0;
  l->items = n ? jinja_alloc(st, n * sizeof(struct jinja_value)) : NULL;
  for (size_t i = 0; i < n; i++)
    l->items[i] = jinja_none();
  struct jinja_value v = {.type = JINJA_LIST};
  v.u.l = l;
  return v;
}

struct jinja_value jinja_list_from(struct jinja_state *st, const struct jinja_value *items, size_t n) {
  struct jinja_value l = jinja_list_new(st, n, 0);
  for (size_t i = 0; i < n; i++)
    l.u.l->items[i] = items[i];
  return l;
}

struct jinja_value jinja_dict_new(struct jinja_state *st) {
  struct jinja_dict *d = jinja_alloc(st, sizeof(*d));
  memset(d, 0, sizeof(*d));
  struct jinja_value v = {.type = JINJA_DICT};
  v.u.d = d;
  return v;
}

struct jinja_value *jinja_dict_get(struct jinja_dict *d, struct jinja_value key) {
  for (size_t i = 0; i < d->n; i++)
    if (jinja_equal(d->keys[i], key))
      return &d->vals[i];
  return NULL;
}

struct jinja_value *jinja_dict_gets(struct jinja_dict *d, const char *key) {
  size_t n = strlen(key);
  for (size_t i = 0; i < d->n; i++)
    if (d->keys[i].type == JINJA_STRING && d->keys[i].u.s->len == n &&
        memcmp(d->keys[i].u.s->data, key, n) == 0)
      return &d->vals[i];
  return NULL;
}

void jinja_dict_set(struct jinja_state *st, struct jinja_dict *d, struct jinja_value key,
                    struct jinja_value val) {
  struct jinja_value *slot = jinja_dict_get(d, key);
  if (slot) {
    *slot = val;
    return;
  }
  jinja_dict_append(st, d, key, val);
}

void jinja_dict_append(struct jinja_state *st, struct jinja_dict *d, struct jinja_value key,
                       struct jinja_value val) {
  if (d->n == d->cap) {
    size_t cap = d->cap ? d->cap * 2 : 4;
    struct jinja_value *k = jinja_alloc(st, cap * sizeof(*k));
    struct jinja_value *v = jinja_alloc(st, cap * sizeof(*v));
    if (d->n) {
      memcpy(k, d->keys, d->n * sizeof(*k));
      memcpy(v, d->vals, d->n * sizeof(*v));
    }
    d->keys = k;
    d->vals = v;
    d->cap = cap;
  }
  d->keys[d->n] = key;
  d->vals[d->n] = val;
  d->n++;
}

int jinja_truthy(struct jinja_value v) {
  switch (v.type) {
  case JINJA_UNDEFINED:
  case JINJA_NONE:
    return 0;
  case JINJA_BOOL:
    return v.u.b;
  case JINJA_INT:
    return v.u.i != 0;
  case JINJA_FLOAT:
    return v.u.f != 0.0;
  case JINJA_STRING:
    return v.u.s->len > 0;
  case JINJA_LIST:
    return v.u.l->n > 0;
  case JINJA_DICT:
    return v.u.d->n > 0;
  default:
    return 1;
  }
}

int jinja_is_number(struct jinja_value v) {
  return v.type == JINJA_INT || v.type == JINJA_FLOAT || v.type == JINJA_BOOL;
}

double jinja_as_double(struct jinja_value v) {
  switch (v.type) {
  case JINJA_BOOL:
    return v.u.b;
  case JINJA_INT:
    return (double)v.u.i;
  case JINJA_FLOAT:
    return v.u.f;
  default:
    return 0.0;
  }
}

static int equal_at(struct jinja_value a, struct jinja_value b, int depth);

int jinja_equal(struct jinja_value a, struct jinja_value b) { return equal_at(a, b, 0); }

/* Python ==; nesting deeper than JINJA_MAX_DEPTH compares unequal instead of exhausting the stack. */
static int equal_at(struct jinja_value a, struct jinja_value b, int depth) {
  if (depth > JINJA_MAX_DEPTH)
    return 0;
  if (jinja_is_number(a) && jinja_is_number(b)) {
    if (a.type != JINJA_FLOAT && b.type != JINJA_FLOAT) {
      int64_t x = a.type == JINJA_BOOL ? a.u.b : a.u.i;
      int64_t y = b.type == JINJA_BOOL ? b.u.b : b.u.i;
      return x == y;
    }
    return jinja_as_double(a) == jinja_as_double(b);
  }
  if (a.type != b.type)
    return 0;
  switch (a.type) {
  case JINJA_UNDEFINED:
  case JINJA_NONE:
    return 1;
  case JINJA_STRING:
    return a.u.s->len == b.u.s->len && memcmp(a.u.s->data, b.u.s->data, a.u.s->len) == 0;
  case JINJA_LIST:
    if (a.u.l->is_tuple != b.u.l->is_tuple || a.u.l->view != b.u.l->view || a.u.l->n != b.u.l->n)
      return 0;
    for (size_t i = 0; i < a.u.l->n; i++)
      if (!equal_at(a.u.l->items[i], b.u.l->items[i], depth + 1))
        return 0;
    return 1;
  case JINJA_DICT:
    if (a.u.d->n != b.u.d->n)
      return 0;
    for (size_t i = 0; i < a.u.d->n; i++) {
      struct jinja_value *o = jinja_dict_get(b.u.d, a.u.d->keys[i]);
      if (!o || !equal_at(a.u.d->vals[i], *o, depth + 1))
        return 0;
    }
    return 1;
  default:
    return a.u.d == b.u.d; /* identity for namespaces, callables, loops */
  }
}

const char *jinja_type_name(struct jinja_value v) {
  switch (v.type) {
  case JINJA_UNDEFINED:
    return "Undefined";
  case JINJA_NONE:
    return "NoneType";
  case JINJA_BOOL:
    return "bool";
  case JINJA_INT:
    return "int";
  case JINJA_FLOAT:
    return "float";
  case JINJA_STRING:
    return "str";
  case JINJA_LIST:
    if (v.u.l->view)
      return v.u.l->view == JINJA_VIEW_KEYS     ? "dict_keys"
             : v.u.l->view == JINJA_VIEW_VALUES ? "dict_values"
             : v.u.l->view == JINJA_VIEW_ITEMS  ? "dict_items"
                                                : "generator";
    return v.u.l->is_tuple ? "tuple" : "list";
  case JINJA_DICT:
    return "dict";
  case JINJA_NAMESPACE:
    return "Namespace";
  case JINJA_CALLABLE:
    return "function";
  case JINJA_LOOP:
    return "LoopContext";
  }
  return "object";
}

int jinja_compare(struct jinja_state *st, struct jinja_value a, struct jinja_value b) {
  if (jinja_is_number(a) && jinja_is_number(b)) {
    if (a.type != JINJA_FLOAT && b.type != JINJA_FLOAT) {
      int64_t x = a.type == JINJA_BOOL ? a.u.b : a.u.i;
      int64_t y = b.type == JINJA_BOOL ? b.u.b : b.u.i;
      return (x > y) - (x < y);
    }
    double x = jinja_as_double(a), y = jinja_as_double(b);
    return (x > y) - (x < y);
  }
  if (a.type == JINJA_STRING && b.type == JINJA_STRING) {
    size_t n = a.u.s->len < b.u.s->len ? a.u.s->len : b.u.s->len;
    int c = memcmp(a.u.s->data, b.u.s->data, n);
    if (c)
      return c;
    return (a.u.s->len > b.u.s->len) - (a.u.s->len < b.u.s->len);
  }
  if (a.type == JINJA_LIST && b.type == JINJA_LIST && a.u.l->is_tuple == b.u.l->is_tuple) {
    size_t n = a.u.l->n < b.u.l->n ? a.u.l->n : b.u.l->n;
    jinja_charge(st, n * 16);
    for (size_t i = 0; i < n; i++) {
      if (jinja_equal(a.u.l->items[i], b.u.l->items[i]))
        continue;
      if (++st->depth > JINJA_MAX_DEPTH)
        jinja_fail(st, "template nesting exceeds the limit of %d", JINJA_MAX_DEPTH);
      int c = jinja_compare(st, a.u.l->items[i], b.u.l->items[i]);
      st->depth--;
      return c;
    }
    return (a.u.l->n > b.u.l->n) - (a.u.l->n < b.u.l->n);
  }
  jinja_check_defined(st, a);
  jinja_check_defined(st, b);
  jinja_fail(st, "'<' not supported between instances of '%s' and '%s'", jinja_type_name(a),
             jinja_type_name(b));
}

void jinja_check_defined(struct jinja_state *st, struct jinja_value v) {
  if (v.type == JINJA_UNDEFINED && v.u.why)
    jinja_fail_msg(st, v.u.why);
}

void jinja_write_float(struct jinja_buf *b, double f) {
  if (isnan(f)) {
    jinja_buf_adds(b, "nan");
    return;
  }
  if (isinf(f)) {
    jinja_buf_adds(b, f < 0 ? "-inf" : "inf");
    return;
  }
  /* Shortest digits that read back to the same double, then Python's repr layout: positional
   * for exponents in [-4, 16), scientific otherwise. */
  char tmp[48];
  for (int p = 1; p <= 17; p++) {
    snprintf(tmp, sizeof tmp, "%.*e", p - 1, f);
    if (strtod(tmp, NULL) == f)
      break;
  }
  const char *s = tmp;
  if (*s == '-') {
    jinja_buf_add(b, "-", 1);
    s++;
  }
  char digits[24];
  int nd = 0;
  for (; *s && *s != 'e'; s++)
    if (*s >= '0' && *s <= '9' && nd < 20)
      digits[nd++] = *s;
  int exp = *s == 'e' ? atoi(s + 1) : 0;
  while (nd > 1 && digits[nd - 1] == '0')
    nd--;
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      for (int i = 0; i <= exp; i++)
        jinja_buf_add(b, i < nd ? &digits[i] : "0", 1);
      jinja_buf_add(b, ".", 1);
      if (nd > exp + 1)
        jinja_buf_add(b, digits + exp + 1, (size_t)(nd - exp - 1));
      else
        jinja_buf_add(b, "0", 1);
    } else {
      jinja_buf_add(b, "0.", 2);
      for (int i = 0; i < -exp - 1; i++)
        jinja_buf_add(b, "0", 1);
      jinja_buf_add(b, digits, (size_t)nd);
    }
  } else {
    jinja_buf_add(b, digits, 1);
    if (nd > 1) {
      jinja_buf_add(b, ".", 1);
      jinja_buf_add(b, digits + 1, (size_t)(nd - 1));
    }
    jinja_buf_addf(b, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
  }
}

/* Python's str.isprintable for one code point. */
static int jinja_printable(int32_t cp) {
  if (cp == ' ')
    return 1;
  switch (utf8proc_category(cp)) {
  case UTF8PROC_CATEGORY_CC:
  case UTF8PROC_CATEGORY_CF:
  case UTF8PROC_CATEGORY_CS:
  case UTF8PROC_CATEGORY_CO:
  case UTF8PROC_CATEGORY_CN:
  case UTF8PROC_CATEGORY_ZL:
  case UTF8PROC_CATEGORY_ZP:
  case UTF8PROC_CATEGORY_ZS:
    return 0;
  default:
    return 1;
  }
}

static void jinja_write_str_repr(struct jinja_buf *b, const char *s, size_t n) {
  char q = '\'';
  if (memchr(s, '\'', n) && !memchr(s, '"', n))
    q = '"';
  jinja_buf_add(b, &q, 1);
  size_t i = 0;
  while (i < n) {
    utf8proc_int32_t cp;
    utf8proc_ssize_t k =
        utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
    if (k <= 0) { /* invalid byte: Python would hold a surrogate escape; show it as \x.. */
      jinja_buf_addf(b, "\\x%02x", (unsigned char)s[i]);
      i++;
      continue;
    }
    if (cp == '\\' || cp == q) {
      jinja_buf_add(b, "\\", 1);
      jinja_buf_add(b, s + i, 1);
    } else if (cp == '\n') {
      jinja_buf_adds(b, "\\n");
    } else if (cp == '\r') {
      jinja_buf_adds(b, "\\r");
    } else if (cp == '\t') {
      jinja_buf_adds(b, "\\t");
    } else if (!jinja_printable(cp)) {
      if (cp < 0x100)
        jinja_buf_addf(b, "\\x%02x", cp);
      else if (cp < 0x10000)
        jinja_buf_addf(b, "\\u%04x", cp);
      else
        jinja_buf_addf(b, "\\U%08x", cp);
    } else {
      jinja_buf_add(b, s + i, (size_t)k);
    }
    i += (size_t)k;
  }
  jinja_buf_add(b, &q, 1);
}

static void jinja_write_dict_repr(struct jinja_buf *b, const struct jinja_dict *d) {
  jinja_buf_add(b, "{", 1);
  for (size_t i = 0; i < d->n; i++) {
    if (i)
      jinja_buf_add(b, ", ", 2);
    jinja_write_repr(b, d->keys[i]);
    jinja_buf_add(b, ": ", 2);
    jinja_write_repr(b, d->vals[i]);
  }
  jinja_buf_add(b, "}", 1);
}

void jinja_write_repr(struct jinja_buf *b, struct jinja_value v) {
  jinja_step(b->st);
  if (++b->st->depth > JINJA_MAX_DEPTH)
    jinja_fail(b->st, "template nesting exceeds the limit of %d", JINJA_MAX_DEPTH);
  switch (v.type) {
  case JINJA_STRING:
    if (v.markup)
      jinja_buf_adds(b, "Markup(");
    jinja_write_str_repr(b, v.u.s->data, v.u.s->len);
    if (v.markup)
      jinja_buf_adds(b, ")");
    break;
  case JINJA_UNDEFINED:
    jinja_buf_adds(b, "Undefined");
    break;
  case JINJA_LIST: {
    const struct jinja_list *l = v.u.l;
    int wrap = l->view && l->view != JINJA_VIEW_GENERATOR;
    if (wrap) {
      jinja_buf_adds(b, jinja_type_name(v));
      jinja_buf_add(b, "(", 1);
    }
    jinja_buf_add(b, l->is_tuple ? "(" : "[", 1);
    for (size_t i = 0; i < l->n; i++) {
      if (i)
        jinja_buf_add(b, ", ", 2);
      jinja_write_repr(b, l->items[i]);
    }
    if (l->is_tuple && l->n == 1)
      jinja_buf_add(b, ",", 1);
    jinja_buf_add(b, l->is_tuple ? ")" : "]", 1);
    if (wrap)
      jinja_buf_add(b, ")", 1);
    break;
  }
  case JINJA_DICT:
    jinja_write_dict_repr(b, v.u.d);
    break;
  case JINJA_NAMESPACE:
    jinja_buf_adds(b, "<Namespace ");
    jinja_write_dict_repr(b, v.u.d);
    jinja_buf_adds(b, ">");
    break;
  default:
    jinja_write_str(b, v);
  }
  b->st->depth--;
}

void jinja_write_str(struct jinja_buf *b, struct jinja_value v) {
  switch (v.type) {
  case JINJA_UNDEFINED:
    return;
  case JINJA_NONE:
    jinja_buf_adds(b, "None");
    return;
  case JINJA_BOOL:
    jinja_buf_adds(b, v.u.b ? "True" : "False");
    return;
  case JINJA_INT:
    jinja_buf_addf(b, "%lld", (long long)v.u.i);
    return;
  case JINJA_FLOAT:
    jinja_write_float(b, v.u.f);
    return;
  case JINJA_STRING:
    jinja_buf_add(b, v.u.s->data, v.u.s->len);
    return;
  case JINJA_CALLABLE:
    jinja_buf_adds(b, "<function>");
    return;
  case JINJA_LOOP: /* LoopContext.__repr__ */
    jinja_buf_addf(b, "<LoopContext %zu/%zu>", v.u.loop->index0 + 1, v.u.loop->length);
    return;
  default:
    jinja_write_repr(b, v);
  }
}

struct jinja_value jinja_to_str(struct jinja_state *st, struct jinja_value v) {
  if (v.type == JINJA_STRING)
    return v;
  struct jinja_buf b;
  jinja_buf_init(&b, st, 0, JINJA_MAX_OUTPUT);
  jinja_write_str(&b, v);
  return jinja_buf_value(&b);
}

static void jinja_write_json_str(struct jinja_buf *b, const char *s, size_t n) {
  jinja_buf_add(b, "\"", 1);
  size_t run = 0; /* start of the pending run of bytes copied verbatim */
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    const char *esc = NULL;
    char tmp[8];
    if (c == '"')
      esc = "\\\"";
    else if (c == '\\')
      esc = "\\\\";
    else if (c == '\n')
      esc = "\\n";
    else if (c == '\r')
      esc = "\\r";
    else if (c == '\t')
      esc = "\\t";
    else if (c == '\b')
      esc = "\\b";
    else if (c == '\f')
      esc = "\\f";
    else if (c < 0x20) {
      snprintf(tmp, sizeof tmp, "\\u%04x", c);
      esc = tmp;
    }
    if (esc) {
      jinja_buf_add(b, s + run, i - run);
      jinja_buf_adds(b, esc);
      run = i + 1;
    }
  }
  jinja_buf_add(b, s + run, n - run);
  jinja_buf_add(b, "\"", 1);
}

static void jinja_json_newline(struct jinja_buf *b, const char *indent, int level) {
  jinja_buf_add(b, "\n", 1);
  for (int i = 0; i < level; i++)
    jinja_buf_adds(b, indent);
}

static void jinja_write_json_at(struct jinja_buf *b, struct jinja_value v, const char *indent,
                                const char *item_sep, const char *key_sep, int sort_keys, int level) {
  struct jinja_state *st = b->st;
  jinja_step(st);
  if (++st->depth > JINJA_MAX_DEPTH)
    jinja_fail(st, "template nesting exceeds the limit of %d", JINJA_MAX_DEPTH);
  switch (v.type) {
  case JINJA_NONE:
    jinja_buf_adds(b, "null");
    break;
  case JINJA_BOOL:
    jinja_buf_adds(b, v.u.b ? "true" : "false");
    break;
  case JINJA_INT:
    jinja_buf_addf(b, "%lld", (long long)v.u.i);
    break;
  case JINJA_FLOAT:
    if (isnan(v.u.f))
      jinja_buf_adds(b, "NaN");
    else if (isinf(v.u.f))
      jinja_buf_adds(b, v.u.f < 0 ? "-Infinity" : "Infinity");
    else
      jinja_write_float(b, v.u.f);
    break;
  case JINJA_STRING:
    jinja_write_json_str(b, v.u.s->data, v.u.s->len);
    break;
  case JINJA_LIST: {
    const struct jinja_list *l = v.u.l;
    if (l->view)
      jinja_fail(st, "Object of type %s is not JSON serializable", jinja_type_name(v));
    if (l->n == 0) {
      jinja_buf_adds(b, "[]");
      break;
    }
    jinja_buf_add(b, "[", 1);
    for (size_t i = 0; i < l->n; i++) {
      if (i)
        jinja_buf_adds(b, item_sep);
      if (indent)
        jinja_json_newline(b, indent, level + 1);
      jinja_write_json_at(b, l->items[i], indent, item_sep, key_sep, sort_keys, level + 1);
    }
    if (indent)
      jinja_json_newline(b, indent, level);
    jinja_buf_add(b, "]", 1);
    break;
  }
  case JINJA_DICT: {
    const struct jinja_dict *d = v.u.d;
    if (d->n == 0) {
      jinja_buf_adds(b, "{}");
      break;
    }
    size_t *order = jinja_alloc(st, d->n * sizeof(size_t));
    for (size_t i = 0; i < d->n; i++)
      order[i] = i;
    if (sort_keys) /* insertion sort: dicts in templates are small */
      for (size_t i = 1; i < d->n; i++)
        for (size_t j = i; j > 0 && jinja_compare(st, d->keys[order[j - 1]], d->keys[order[j]]) > 0;
             j--) {
          size_t t = order[j];
          order[j] = order[j - 1];
          order[j - 1] = t;
        }
    jinja_buf_add(b, "{", 1);
    for (size_t k = 0; k < d->n; k++) {
      size_t i = order[k];
      if (k)
        jinja_buf_adds(b, item_sep);
      if (indent)
        jinja_json_newline(b, indent, level + 1);
      struct jinja_value key = d->keys[i];
      /* json.dumps turns int/float/bool/None keys into strings the way it prints them. */
      if (key.type == JINJA_STRING) {
        jinja_write_json_str(b, key.u.s->data, key.u.s->len);
      } else if (key.type == JINJA_INT || key.type == JINJA_FLOAT || key.type == JINJA_BOOL ||
                 key.type == JINJA_NONE) {
        jinja_buf_add(b, "\"", 1);
        jinja_write_json_at(b, key, NULL, item_sep, key_sep, 0, 0);
        jinja_buf_add(b, "\"", 1);
      } else {
        jinja_fail(st, "keys must be str, int, float, bool or None, not %s", jinja_type_name(key));
      }
      jinja_buf_adds(b, key_sep);
      jinja_write_json_at(b, d->vals[i], indent, item_sep, key_sep, sort_keys, level + 1);
    }
    if (indent)
      jinja_json_newline(b, indent, level);
    jinja_buf_add(b, "}", 1);
    break;
  }
  default:
    jinja_fail(st, "Object of type %s is not JSON serializable", jinja_type_name(v));
  }
  st->depth--;
}

void jinja_write_json(struct jinja_buf *b, struct jinja_value v, const char *indent,
                      const char *item_sep, const char *key_sep, int sort_keys) {
  jinja_write_json_at(b, v, indent, item_sep, key_sep, sort_keys, 0);
}

size_t jinja_utf8_len(const char *s, size_t n) {
  size_t c = 0;
  for (size_t i = 0; i < n; i++)
    if (((unsigned char)s[i] & 0xC0) != 0x80)
      c++;
  return c;
}

size_t jinja_utf8_offset(const char *s, size_t n, size_t i) {
  size_t pos = 0;
  while (pos < n && i > 0) {
    pos++;
    while (pos < n && ((unsigned char)s[pos] & 0xC0) == 0x80)
      pos++;
    i--;
  }
  return pos;
}
