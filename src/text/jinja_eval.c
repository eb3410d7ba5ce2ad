/* jinja_eval.c - walks a parsed chat template: statements, expressions, scopes, loops, macros and
 * Python operator semantics, counting steps and nesting so untrusted templates stay bounded. */
#include "text/jinja_eval.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "text/jinja_filters.h"
#include "text/jinja_methods.h"
#include "text/jinja_string.h"

enum { JINJA_FLOW_NORMAL, JINJA_FLOW_BREAK, JINJA_FLOW_CONTINUE };

static struct jinja_value eval(struct jinja_eval *ev, const struct jinja_node *n);
static int exec_body(struct jinja_eval *ev, const struct jinja_node *body);

static const char *msg(struct jinja_state *st, const char *fmt, const char *a, const char *b) {
  size_t n = strlen(fmt) + strlen(a) + (b ? strlen(b) : 0) + 1;
  char *s = jinja_alloc(st, n);
  snprintf(s, n, fmt, a, b ? b : "");
  return s;
}

/* Jinja2's object_type_repr: "None" or "dict object". */
static const char *type_repr(struct jinja_state *st, struct jinja_value v) {
  if (v.type == JINJA_NONE)
    return "None";
  if (v.type == JINJA_STRING && v.markup)
    return "markupsafe.Markup object";
  return msg(st, "%s object", jinja_type_name(v), NULL);
}

static struct jinja_value undef_attr(struct jinja_eval *ev, struct jinja_value obj, const char *name) {
  return jinja_undefined(msg(ev->st, "'%s' has no attribute '%s'", type_repr(ev->st, obj), name));
}

static struct jinja_value undef_element(struct jinja_eval *ev, struct jinja_value obj,
                                        struct jinja_value key) {
  struct jinja_buf b;
  jinja_buf_init(&b, ev->st, 0, JINJA_MAX_OUTPUT);
  jinja_buf_adds(&b, type_repr(ev->st, obj));
  jinja_buf_adds(&b, " has no element ");
  jinja_write_repr(&b, key);
  return jinja_undefined(jinja_buf_value(&b).u.s->data);
}

void jinja_frame_set(struct jinja_state *st, struct jinja_frame *f, const char *name,
                     struct jinja_value v) {
  for (size_t i = 0; i < f->n; i++)
    if (!strcmp(f->names[i], name)) {
      f->vals[i] = v;
      return;
    }
  jinja_frame_push(st, f, name, v);
}

void jinja_frame_push(struct jinja_state *st, struct jinja_frame *f, const char *name,
                      struct jinja_value v) {
  if (f->n == f->cap) {
    size_t cap = f->cap ? f->cap * 2 : 8;
    const char **names = jinja_alloc(st, cap * sizeof(*names));
    struct jinja_value *vals = jinja_alloc(st, cap * sizeof(*vals));
    if (f->n) {
      memcpy(names, f->names, f->n * sizeof(*names));
      memcpy(vals, f->vals, f->n * sizeof(*vals));
    }
    f->names = names;
    f->vals = vals;
    f->cap = cap;
  }
  f->names[f->n] = name;
  f->vals[f->n] = v;
  f->n++;
}

static struct jinja_frame *frame_new(struct jinja_state *st, struct jinja_frame *parent) {
  struct jinja_frame *f = jinja_alloc(st, sizeof(*f));
  memset(f, 0, sizeof(*f));
  f->parent = parent;
  return f;
}

static struct jinja_value callable_new(struct jinja_eval *ev, enum jinja_callable_kind kind,
                                       const char *name, struct jinja_value self) {
  struct jinja_callable *c = jinja_alloc(ev->st, sizeof(*c));
  memset(c, 0, sizeof(*c));
  c->kind = kind;
  c->name = name;
  c->self = self;
  c->caller = jinja_undefined(NULL);
  struct jinja_value v = {.type = JINJA_CALLABLE};
  v.u.c = c;
  return v;
}

static const char *const jinja_globals[] = {"range",        "dict",   "namespace", "raise_exception",
                                            "strftime_now", "joiner", NULL};

static struct jinja_value lookup(struct jinja_eval *ev, const char *name) {
  for (struct jinja_frame *f = ev->frame; f; f = f->parent) {
    jinja_charge(ev->st,
                 f->n * 4); /* frames are short; a context with huge numbers of keys is charged */
    for (size_t i = f->n; i-- > 0;)
      if (!strcmp(f->names[i], name))
        return f->vals[i];
  }
  for (int i = 0; jinja_globals[i]; i++)
    if (!strcmp(jinja_globals[i], name))
      return callable_new(ev, JINJA_FN_GLOBAL, jinja_globals[i], jinja_none());
  return jinja_undefined(msg(ev->st, "'%s' is undefined", name, NULL));
}

const struct jinja_value *jinja_arg(const struct jinja_args *a, size_t i, const char *name) {
  if (name)
    for (size_t k = 0; k < a->num_kw; k++)
      if (!strcmp(a->kwnames[k], name))
        return &a->kw[k];
  if (i < a->n)
    return &a->pos[i];
  return NULL;
}

int64_t jinja_arg_int(struct jinja_eval *ev, const struct jinja_value *v, int64_t def) {
  if (!v || v->type == JINJA_NONE)
    return def;
  if (v->type == JINJA_INT)
    return v->u.i;
  if (v->type == JINJA_BOOL)
    return v->u.b;
  jinja_fail(ev->st, "'%s' object cannot be interpreted as an integer", jinja_type_name(*v));
}

int jinja_arg_bool(const struct jinja_value *v, int def) { return v ? jinja_truthy(*v) : def; }

const char *jinja_arg_str(struct jinja_eval *ev, const struct jinja_value *v, const char *what) {
  if (!v || v->type != JINJA_STRING)
    jinja_fail(ev->st, "%s must be a string", what);
  return v->u.s->data;
}

struct jinja_value *jinja_eval_iterate(struct jinja_eval *ev, struct jinja_value v, size_t *n) {
  struct jinja_state *st = ev->st;
  switch (v.type) {
  case JINJA_UNDEFINED:
    *n = 0;
    return NULL;
  case JINJA_LIST:
    *n = v.u.l->n;
    return v.u.l->items;
  case JINJA_DICT:
    *n = v.u.d->n;
    return v.u.d->keys;
  case JINJA_STRING: {
    const char *s = v.u.s->data;
    jinja_charge(st, v.u.s->len * 16);
    size_t len = v.u.s->len, count = jinja_utf8_len(s, len), pos = 0;
    struct jinja_value *items = count ? jinja_alloc(st, count * sizeof(*items)) : NULL;
    for (size_t i = 0; i < count; i++) {
      size_t next = pos + jinja_utf8_offset(s + pos, len - pos, 1);
      items[i] = jinja_str_n(st, s + pos, next - pos);
      pos = next;
    }
    *n = count;
    return items;
  }
  default:
    jinja_fail(st, "'%s' object is not iterable", jinja_type_name(v));
  }
}

static struct jinja_value loop_attr(struct jinja_eval *ev, struct jinja_value obj, const char *name) {
  const struct jinja_loop *l = obj.u.loop;
  int64_t i = (int64_t)l->index0, len = (int64_t)l->length;
  if (!strcmp(name, "index"))
    return jinja_int(i + 1);
  if (!strcmp(name, "index0"))
    return jinja_int(i);
  if (!strcmp(name, "revindex"))
    return jinja_int(len - i);
  if (!strcmp(name, "revindex0"))
    return jinja_int(len - i - 1);
  if (!strcmp(name, "first"))
    return jinja_bool(i == 0);
  if (!strcmp(name, "last"))
    return jinja_bool(i == len - 1);
  if (!strcmp(name, "length"))
    return jinja_int(len);
  if (!strcmp(name, "depth"))
    return jinja_int(l->depth);
  if (!strcmp(name, "depth0"))
    return jinja_int(l->depth - 1);
  if (!strcmp(name, "previtem"))
    return i > 0 ? l->items[i - 1] : jinja_undefined("there is no previous item");
  if (!strcmp(name, "nextitem"))
    return i + 1 < len ? l->items[i + 1] : jinja_undefined("there is no next item");
  if (!strcmp(name, "cycle") || !strcmp(name, "changed"))
    return callable_new(ev, JINJA_FN_METHOD, !strcmp(name, "cycle") ? "cycle" : "changed", obj);
  return undef_attr(ev, obj, name);
}

struct jinja_value jinja_eval_getattr(struct jinja_eval *ev, struct jinja_value obj, const char *name) {
  const char *unsafe = jinja_method_unsafe(obj, name);
  if (unsafe) {
    size_t n = strlen(name) + 64;
    char *why = jinja_alloc(ev->st, n);
    snprintf(why, n, "access to attribute '%s' of '%s' object is unsafe.", name, unsafe);
    return jinja_undefined(why);
  }
  switch (obj.type) {
  case JINJA_UNDEFINED:
    jinja_check_defined(ev->st, obj);
    return jinja_undefined(msg(ev->st, "'%s' has no attribute '%s'", "Undefined", name));
  case JINJA_DICT:
    /* Python attributes win over keys for obj.name (d.items is the method). */
    if (jinja_method_exists(obj, name))
      return callable_new(ev, JINJA_FN_METHOD, name, obj);
    /* fallthrough */
  case JINJA_NAMESPACE: {
    jinja_charge(ev->st, obj.u.d->n * 16);
    struct jinja_value *v = jinja_dict_gets(obj.u.d, name);
    return v ? *v : undef_attr(ev, obj, name);
  }
  case JINJA_LOOP:
    return loop_attr(ev, obj, name);
  default:
    if (jinja_method_exists(obj, name))
      return callable_new(ev, JINJA_FN_METHOD, name, obj);
    return undef_attr(ev, obj, name);
  }
}

/* Python slice bounds for a sequence of LEN items (PySlice_AdjustIndices). */
static void slice_bounds(struct jinja_eval *ev, const struct jinja_value *sv, size_t len, int64_t *start,
                         int64_t *stop, int64_t *step) {
  int64_t n = (int64_t)len;
  *step = 1;
  if (sv[2].type == JINJA_INT || sv[2].type == JINJA_BOOL)
    *step = sv[2].type == JINJA_BOOL ? sv[2].u.b : sv[2].u.i;
  else if (sv[2].type != JINJA_NONE && sv[2].type != JINJA_UNDEFINED)
    jinja_fail(ev->st, "slice indices must be integers or None or have an __index__ method");
  if (*step == 0)
    jinja_fail(ev->st, "slice step cannot be zero");
  int64_t def_start = *step < 0 ? n - 1 : 0, def_stop = *step < 0 ? -1 : n;
  for (int k = 0; k < 2; k++) {
    int64_t *out = k == 0 ? start : stop;
    struct jinja_value v = sv[k];
    if (v.type == JINJA_NONE || v.type == JINJA_UNDEFINED) {
      *out = k == 0 ? def_start : def_stop;
      continue;
    }
    if (v.type != JINJA_INT && v.type != JINJA_BOOL)
      jinja_fail(ev->st, "slice indices must be integers or None or have an __index__ method");
    int64_t x = v.type == JINJA_BOOL ? v.u.b : v.u.i;
    if (x < 0) {
      x += n;
      if (x < 0)
        x = *step < 0 ? -1 : 0;
    } else if (x >= n) {
      x = *step < 0 ? n - 1 : n;
    }
    *out = x;
  }
}

static struct jinja_value do_slice(struct jinja_eval *ev, struct jinja_value obj,
                                   const struct jinja_value *sv) {
  struct jinja_state *st = ev->st;
  size_t count;
  struct jinja_value *items;
  if (obj.type == JINJA_STRING)
    items = jinja_eval_iterate(ev, obj, &count);
  else if (obj.type == JINJA_LIST && !obj.u.l->view) {
    items = obj.u.l->items;
    count = obj.u.l->n;
  } else { /* Jinja2 turns the TypeError into an undefined naming the slice */
    jinja_check_defined(st, obj);
    struct jinja_buf b;
    jinja_buf_init(&b, st, 0, JINJA_MAX_OUTPUT);
    jinja_buf_adds(&b, type_repr(st, obj));
    jinja_buf_adds(&b, " has no element slice(");
    for (int k = 0; k < 3; k++) {
      if (k)
        jinja_buf_adds(&b, ", ");
      jinja_write_repr(&b, sv[k].type == JINJA_UNDEFINED ? jinja_none() : sv[k]);
    }
    jinja_buf_adds(&b, ")");
    return jinja_undefined(jinja_buf_value(&b).u.s->data);
  }
  int64_t start, stop, step;
  slice_bounds(ev, sv, count, &start, &stop, &step);
  size_t m = 0;
  if (step > 0 && stop > start)
    m = (size_t)((stop - start + step - 1) / step);
  else if (step < 0 && stop < start)
    m = (size_t)((start - stop + (-step) - 1) / (-step));
  if (obj.type == JINJA_STRING) {
    struct jinja_buf b;
    jinja_buf_init(&b, st, 0, JINJA_MAX_OUTPUT);
    for (size_t k = 0; k < m; k++) {
      const struct jinja_str *c = items[start + (int64_t)k * step].u.s;
      jinja_buf_add(&b, c->data, c->len);
    }
    return jinja_buf_value(&b);
  }
  struct jinja_value out = jinja_list_new(st, m, obj.u.l->is_tuple);
  for (size_t k = 0; k < m; k++)
    out.u.l->items[k] = items[start + (int64_t)k * step];
  return out;
}

struct jinja_value jinja_eval_getitem(struct jinja_eval *ev, struct jinja_value obj,
                                      struct jinja_value key) {
  jinja_check_defined(ev->st, obj);
  switch (obj.type) {
  case JINJA_DICT:
  case JINJA_NAMESPACE: {
    jinja_charge(ev->st, obj.u.d->n * 16);
    struct jinja_value *v = jinja_dict_get(obj.u.d, key);
    if (v)
      return *v;
    if (key.type == JINJA_STRING) {
      if (obj.type == JINJA_DICT && jinja_method_exists(obj, key.u.s->data))
        return callable_new(ev, JINJA_FN_METHOD, key.u.s->data, obj);
      return undef_attr(ev, obj, key.u.s->data);
    }
    return undef_element(ev, obj, key);
  }
  case JINJA_LIST:
  case JINJA_STRING:
    if ((key.type == JINJA_INT || key.type == JINJA_BOOL) && obj.type == JINJA_LIST && obj.u.l->view)
      return undef_element(ev, obj, key); /* dict views cannot be indexed */
    if (key.type == JINJA_INT || key.type == JINJA_BOOL) {
      int64_t i = key.type == JINJA_BOOL ? key.u.b : key.u.i;
      if (obj.type == JINJA_LIST) {
        int64_t n = (int64_t)obj.u.l->n;
        if (i < 0)
          i += n;
        if (i < 0 || i >= n)
          return undef_element(ev, obj, key);
        return obj.u.l->items[i];
      }
      const char *s = obj.u.s->data;
      size_t len = obj.u.s->len;
      jinja_charge(ev->st, len);
      int64_t n = (int64_t)jinja_utf8_len(s, len);
      if (i < 0)
        i += n;
      if (i < 0 || i >= n)
        return undef_element(ev, obj, key);
      size_t a = jinja_utf8_offset(s, len, (size_t)i);
      size_t b = a + jinja_utf8_offset(s + a, len - a, 1);
      return jinja_str_n(ev->st, s + a, b - a);
    }
    if (key.type == JINJA_STRING)
      return jinja_eval_getattr(ev, obj, key.u.s->data);
    return undef_element(ev, obj, key);
  case JINJA_LOOP:
    if (key.type == JINJA_STRING)
      return loop_attr(ev, obj, key.u.s->data);
    return undef_element(ev, obj, key);
  default:
    if (key.type == JINJA_STRING)
      return jinja_eval_getattr(ev, obj, key.u.s->data);
    return undef_element(ev, obj, key);
  }
}

/* Renders BODY into a fresh buffer and returns the text. */
static struct jinja_value capture(struct jinja_eval *ev, const struct jinja_node *body) {
  struct jinja_buf b, *saved = ev->out;
  jinja_buf_init(&b, ev->st, 0, JINJA_MAX_OUTPUT);
  ev->out = &b;
  exec_body(ev, body);
  ev->out = saved;
  return jinja_buf_value(&b);
}

static struct jinja_value call_macro(struct jinja_eval *ev, const struct jinja_callable *c,
                                     const struct jinja_args *a) {
  struct jinja_state *st = ev->st;
  const struct jinja_node *m = c->node;
  if (++st->depth > JINJA_MAX_DEPTH)
    jinja_fail(st, "template nesting exceeds the limit of %d", JINJA_MAX_DEPTH);
  struct jinja_frame *f = frame_new(st, c->closure);
  struct jinja_frame *saved = ev->frame;
  ev->frame = f;
  for (size_t i = 0; i < m->num_kwargs; i++) {
    const char *pname = m->kwnames[i];
    const struct jinja_value *v = NULL;
    for (size_t k = 0; k < a->num_kw; k++)
      if (!strcmp(a->kwnames[k], pname))
        v = &a->kw[k];
    if (i < a->n)
      v = &a->pos[i];
    struct jinja_value val;
    if (v)
      val = *v;
    else if (m->kwargs[i])
      val = eval(ev, m->kwargs[i]);
    else
      val = jinja_undefined(msg(st, "parameter '%s' was not provided", pname, NULL));
    jinja_frame_set(st, f, pname, val);
  }
  size_t extra = a->n > m->num_kwargs ? a->n - m->num_kwargs : 0;
  struct jinja_value varargs = jinja_list_new(st, extra, 1);
  for (size_t i = 0; i < extra; i++)
    varargs.u.l->items[i] = a->pos[m->num_kwargs + i];
  jinja_frame_set(st, f, "varargs", varargs);
  struct jinja_value kwargs = jinja_dict_new(st);
  for (size_t k = 0; k < a->num_kw; k++) {
    int known = 0;
    for (size_t i = 0; i < m->num_kwargs; i++)
      known |= !strcmp(a->kwnames[k], m->kwnames[i]);
    if (!known)
      jinja_dict_set(st, kwargs.u.d, jinja_str(st, a->kwnames[k]), a->kw[k]);
  }
  jinja_frame_set(st, f, "kwargs", kwargs);
  if (c->caller.type == JINJA_CALLABLE)
    jinja_frame_set(st, f, "caller", c->caller);
  int saved_loops = ev->loop_depth;
  ev->loop_depth = 0;
  struct jinja_value out = capture(ev, m->body);
  ev->loop_depth = saved_loops;
  ev->frame = saved;
  st->depth--;
  return out;
}

/* strftime_now(fmt), formatted like Python's datetime.strftime. The time is, in order:
 * $SOURCE_DATE_EPOCH (UTC) when set; the day named by the context's date_string ("26 Jul 2024",
 * the variable Llama templates read for today's date), so that one render states one date and
 * is reproducible; otherwise the local time now. */
static struct jinja_value strftime_now(struct jinja_eval *ev, const struct jinja_value *fmt) {
  if (!fmt || fmt->type != JINJA_STRING)
    jinja_fail(ev->st, "strftime_now() argument must be str");
  time_t now = time(NULL);
  struct tm tm;
  memset(&tm, 0, sizeof tm);
  const char *epoch = getenv("SOURCE_DATE_EPOCH");
  struct jinja_value *ds = NULL;
  for (size_t i = 0; ev->globals && i < ev->globals->n; i++)
    if (!strcmp(ev->globals->names[i], "date_string"))
      ds = &ev->globals->vals[i];
  const char *end = NULL;
  if (epoch && *epoch) {
    now = (time_t)strtoll(epoch, NULL, 10);
    gmtime_r(&now, &tm);
  } else if (ds && ds->type == JINJA_STRING && (end = strptime(ds->u.s->data, "%d %b %Y", &tm)) &&
             !*end) {
    time_t t = timegm(&tm); /* fills in the weekday and day of the year */
    gmtime_r(&t, &tm);
  } else {
    localtime_r(&now, &tm);
  }
  char tmp[512];
  size_t n = fmt->u.s->len ? strftime(tmp, sizeof tmp, fmt->u.s->data, &tm) : 0;
  return jinja_str_n(ev->st, tmp, n);
}

static struct jinja_value call_global(struct jinja_eval *ev, const char *name,
                                      const struct jinja_args *a) {
  struct jinja_state *st = ev->st;
  if (!strcmp(name, "raise_exception")) {
    const struct jinja_value *m = jinja_arg(a, 0, "message");
    jinja_fail_msg(st, m ? jinja_to_str(st, *m).u.s->data : "");
  }
  if (!strcmp(name, "strftime_now"))
    return strftime_now(ev, jinja_arg(a, 0, "format"));
  if (!strcmp(name, "joiner")) {
    const struct jinja_value *sep = jinja_arg(a, 0, "sep");
    return callable_new(ev, JINJA_FN_JOINER, "joiner",
                        sep ? jinja_to_str(st, *sep) : jinja_str(st, ", "));
  }
  if (!strcmp(name, "range")) {
    int64_t v[3] = {0, 0, 1};
    if (a->n < 1 || a->n > 3)
      jinja_fail(st, "range expected at least 1 argument, got %zu", a->n);
    for (size_t i = 0; i < a->n; i++) {
      if (a->pos[i].type != JINJA_INT && a->pos[i].type != JINJA_BOOL)
        jinja_fail(st, "'%s' object cannot be interpreted as an integer", jinja_type_name(a->pos[i]));
      v[a->n == 1 ? 1 : i] = a->pos[i].type == JINJA_BOOL ? a->pos[i].u.b : a->pos[i].u.i;
    }
    if (v[2] == 0)
      jinja_fail(st, "range() arg 3 must not be zero");
    int64_t count = 0;
    if (v[2] > 0 && v[1] > v[0])
      count = (v[1] - v[0] + v[2] - 1) / v[2];
    else if (v[2] < 0 && v[1] < v[0])
      count = (v[0] - v[1] - v[2] - 1) / (-v[2]);
    if (count > 100000) /* the sandbox's MAX_RANGE */
      jinja_fail(st, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    struct jinja_value l = jinja_list_new(st, (size_t)count, 0);
    for (int64_t i = 0; i < count; i++)
      l.u.l->items[i] = jinja_int(v[0] + i * v[2]);
    return l;
  }
  /* dict(**kw) and namespace(mapping?, **kw) */
  struct jinja_value d = jinja_dict_new(st);
  if (a->n >= 1 && (a->pos[0].type == JINJA_DICT || a->pos[0].type == JINJA_NAMESPACE))
    for (size_t i = 0; i < a->pos[0].u.d->n; i++) /* a mapping's keys are already distinct */
      jinja_dict_append(st, d.u.d, a->pos[0].u.d->keys[i], a->pos[0].u.d->vals[i]);
  else if (a->n >= 1)
    jinja_fail(st, "%s() positional argument must be a mapping", name);
  for (size_t k = 0; k < a->num_kw; k++)
    jinja_dict_set(st, d.u.d, jinja_str(st, a->kwnames[k]), a->kw[k]);
  if (!strcmp(name, "namespace"))
    d.type = JINJA_NAMESPACE;
  return d;
}

static struct jinja_value call_loop(struct jinja_eval *ev, struct jinja_loop *l, const struct jinja_args *a);

struct jinja_value jinja_eval_call(struct jinja_eval *ev, struct jinja_value fn,
                                   const struct jinja_args *a) {
  jinja_check_defined(ev->st, fn);
  if (fn.type == JINJA_LOOP)
    return call_loop(ev, fn.u.loop, a);
  if (fn.type != JINJA_CALLABLE)
    jinja_fail(ev->st, "'%s' object is not callable", jinja_type_name(fn));
  const struct jinja_callable *c = fn.u.c;
  switch (c->kind) {
  case JINJA_FN_GLOBAL:
    return call_global(ev, c->name, a);
  case JINJA_FN_METHOD:
    if (c->self.type == JINJA_LOOP && !strcmp(c->name, "changed")) { /* loop.changed(*values) */
      struct jinja_loop *l = c->self.u.loop;
      struct jinja_value now = jinja_list_new(ev->st, a->n, 1);
      for (size_t i = 0; i < a->n; i++)
        now.u.l->items[i] = a->pos[i];
      int changed = !l->changed_called || !jinja_equal(now, l->last_changed);
      l->last_changed = now;
      l->changed_called = 1;
      return jinja_bool(changed);
    }
    if (c->self.type == JINJA_LOOP) { /* loop.cycle(a, b, ...) */
      if (a->n == 0)
        jinja_fail(ev->st, "no items for cycling given");
      return a->pos[c->self.u.loop->index0 % a->n];
    }
    return jinja_method_call(ev, c->self, c->name, a);
  case JINJA_FN_MACRO:
    return call_macro(ev, c, a);
  case JINJA_FN_JOINER:
    if (!fn.u.c->used) {
      fn.u.c->used = 1;
      return jinja_str(ev->st, "");
    }
    return c->self;
  }
  return jinja_undefined(NULL);
}

static void eval_args(struct jinja_eval *ev, const struct jinja_node *n, struct jinja_args *a) {
  a->n = n->num_args;
  a->pos = n->num_args ? jinja_alloc(ev->st, n->num_args * sizeof(struct jinja_value)) : NULL;
  for (size_t i = 0; i < n->num_args; i++)
    a->pos[i] = eval(ev, n->args[i]);
  a->num_kw = n->num_kwargs;
  a->kwnames = n->kwnames;
  a->kw = n->num_kwargs ? jinja_alloc(ev->st, n->num_kwargs * sizeof(struct jinja_value)) : NULL;
  for (size_t i = 0; i < n->num_kwargs; i++)
    a->kw[i] = eval(ev, n->kwargs[i]);
}

static _Noreturn void bad_operands(struct jinja_eval *ev, const char *op, struct jinja_value a,
                                   struct jinja_value b) {
  jinja_check_defined(ev->st, a);
  jinja_check_defined(ev->st, b);
  jinja_fail(ev->st, "unsupported operand type(s) for %s: '%s' and '%s'", op, jinja_type_name(a),
             jinja_type_name(b));
}

static struct jinja_value repeat(struct jinja_eval *ev, struct jinja_value seq, int64_t times) {
  struct jinja_state *st = ev->st;
  if (times < 0)
    times = 0;
  if (seq.type == JINJA_STRING) {
    size_t len = seq.u.s->len;
    if (len == 0 || times == 0)
      return jinja_str(st, "");
    if ((uint64_t)times > JINJA_MAX_OUTPUT / len)
      jinja_fail(st, "template output exceeded the limit of %u bytes", JINJA_MAX_OUTPUT);
    size_t total = len * (size_t)times;
    jinja_charge(st, total);
    struct jinja_value r = {.type = JINJA_STRING};
    struct jinja_str *s = jinja_alloc(st, sizeof(*s) + total + 1);
    s->len = total;
    memcpy(s->data, seq.u.s->data, len);
    for (size_t have = len; have < total;) { /* doubling copies */
      size_t k = have < total - have ? have : total - have;
      memcpy(s->data + have, s->data, k);
      have += k;
    }
    s->data[total] = 0;
    r.u.s = s;
    return r;
  }
  size_t n = seq.u.l->n;
  if (n && (uint64_t)times > JINJA_MAX_OUTPUT / n)
    jinja_fail(st, "template exceeded the memory limit");
  struct jinja_value l = jinja_list_new(st, n * (size_t)times, seq.u.l->is_tuple);
  for (int64_t i = 0; i < times; i++)
    for (size_t k = 0; k < n; k++)
      l.u.l->items[(size_t)i * n + k] = seq.u.l->items[k];
  return l;
}

static struct jinja_value arith(struct jinja_eval *ev, int op, struct jinja_value a,
                                struct jinja_value b) {
  struct jinja_state *st = ev->st;
  static const char *names[] = {"", "+", "-", "*", "/", "//", "%", "**"};
  if (op == JINJA_OP_CONCAT) {
    struct jinja_buf buf;
    jinja_buf_init(&buf, st, 0, JINJA_MAX_OUTPUT);
    jinja_write_str(&buf, a);
    jinja_write_str(&buf, b);
    return jinja_buf_value(&buf);
  }
  if (jinja_is_number(a) && jinja_is_number(b)) {
    int ints = a.type != JINJA_FLOAT && b.type != JINJA_FLOAT;
    if (ints && op != JINJA_OP_DIV) {
      int64_t x = a.type == JINJA_BOOL ? a.u.b : a.u.i, y = b.type == JINJA_BOOL ? b.u.b : b.u.i, r = 0;
      int overflow = 0;
      switch (op) {
      case JINJA_OP_ADD:
        overflow = __builtin_add_overflow(x, y, &r);
        break;
      case JINJA_OP_SUB:
        overflow = __builtin_sub_overflow(x, y, &r);
        break;
      case JINJA_OP_MUL:
        overflow = __builtin_mul_overflow(x, y, &r);
        break;
      case JINJA_OP_FLOORDIV:
      case JINJA_OP_MOD:
        if (y == 0)
          jinja_fail(st, "integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) {
          overflow = 1;
          break;
        }
        {
          int64_t q = x / y, m = x % y;
          if (m != 0 && ((m < 0) != (y < 0))) {
            q--;
            m += y;
          }
          r = op == JINJA_OP_FLOORDIV ? q : m;
        }
        break;
      case JINJA_OP_POW:
        if (y < 0)
          return jinja_float(pow((double)x, (double)y));
        /* by squaring; past int64 is an error (Python would make a big int) */
        r = 1;
        for (int64_t base = x, e = y; e > 0 && !overflow; e >>= 1) {
          if (e & 1)
            overflow = __builtin_mul_overflow(r, base, &r);
          if (e > 1 && !overflow)
            overflow = __builtin_mul_overflow(base, base, &base);
        }
        break;
      }
      if (overflow)
        jinja_fail(st, "integer overflow in '%s': the result is beyond 64-bit integers (pagoda's templates have no big ints)", names[op]);
      return jinja_int(r);
    }
    double x = jinja_as_double(a), y = jinja_as_double(b);
    switch (op) {
    case JINJA_OP_ADD:
      return jinja_float(x + y);
    case JINJA_OP_SUB:
      return jinja_float(x - y);
    case JINJA_OP_MUL:
      return jinja_float(x * y);
    case JINJA_OP_DIV:
      if (y == 0)
        jinja_fail(st, "division by zero");
      return jinja_float(x / y);
    case JINJA_OP_FLOORDIV:
      if (y == 0)
        jinja_fail(st, "float floor division by zero");
      return jinja_float(floor(x / y));
    case JINJA_OP_MOD: {
      if (y == 0)
        jinja_fail(st, "float modulo");
      double m = fmod(x, y);
      if (m != 0 && ((m < 0) != (y < 0)))
        m += y;
      return jinja_float(m);
    }
    case JINJA_OP_POW:
      return jinja_float(pow(x, y));
    }
  }
  if (op == JINJA_OP_ADD && a.type == JINJA_STRING && b.type == JINJA_STRING) {
    if (a.markup != b.markup) { /* Markup + str escapes the str */
      if (!a.markup)
        a = jinja_html_escape(ev, a);
      else
        b = jinja_html_escape(ev, b);
    }
    int markup = a.markup;
    struct jinja_buf buf;
    jinja_buf_init(&buf, st, 0, JINJA_MAX_OUTPUT);
    jinja_buf_add(&buf, a.u.s->data, a.u.s->len);
    jinja_buf_add(&buf, b.u.s->data, b.u.s->len);
    struct jinja_value r = jinja_buf_value(&buf);
    r.markup = markup;
    return r;
  }
  if (op == JINJA_OP_ADD && a.type == JINJA_LIST && b.type == JINJA_LIST &&
      a.u.l->is_tuple == b.u.l->is_tuple) {
    struct jinja_value l = jinja_list_new(st, a.u.l->n + b.u.l->n, a.u.l->is_tuple);
    for (size_t i = 0; i < a.u.l->n; i++)
      l.u.l->items[i] = a.u.l->items[i];
    for (size_t i = 0; i < b.u.l->n; i++)
      l.u.l->items[a.u.l->n + i] = b.u.l->items[i];
    return l;
  }
  if (op == JINJA_OP_MOD && a.type == JINJA_STRING) /* an Undefined argument formats as '' */
    return jinja_string_percent(ev, a, b);
  if (op == JINJA_OP_MUL) {
    if ((a.type == JINJA_STRING || a.type == JINJA_LIST) &&
        (b.type == JINJA_INT || b.type == JINJA_BOOL))
      return repeat(ev, a, b.type == JINJA_BOOL ? b.u.b : b.u.i);
    if ((b.type == JINJA_STRING || b.type == JINJA_LIST) &&
        (a.type == JINJA_INT || a.type == JINJA_BOOL))
      return repeat(ev, b, a.type == JINJA_BOOL ? a.u.b : a.u.i);
  }
  if (op == JINJA_OP_ADD && a.type == JINJA_STRING && b.type != JINJA_UNDEFINED) {
    jinja_fail(st, "can only concatenate str (not \"%s\") to str", jinja_type_name(b));
  }
  bad_operands(ev, names[op], a, b);
}

static int contains(struct jinja_eval *ev, struct jinja_value container, struct jinja_value item) {
  switch (container.type) {
  case JINJA_STRING:
    if (item.type != JINJA_STRING) {
      jinja_check_defined(ev->st, item);
      jinja_fail(ev->st, "'in <string>' requires string as left operand, not %s", jinja_type_name(item));
    }
    if (item.u.s->len == 0)
      return 1;
    jinja_charge(ev->st, container.u.s->len);
    return memmem(container.u.s->data, container.u.s->len, item.u.s->data, item.u.s->len) != NULL;
  case JINJA_LIST:
    jinja_charge(ev->st, container.u.l->n * 16);
    for (size_t i = 0; i < container.u.l->n; i++)
      if (jinja_equal(container.u.l->items[i], item))
        return 1;
    return 0;
  case JINJA_DICT:
  case JINJA_NAMESPACE:
    jinja_charge(ev->st, container.u.d->n * 16);
    return jinja_dict_get(container.u.d, item) != NULL;
  case JINJA_UNDEFINED: /* Python falls back on Undefined.__iter__, which is empty */
    return 0;
  default:
    jinja_fail(ev->st, "argument of type '%s' is not iterable", jinja_type_name(container));
  }
}

static struct jinja_value compare(struct jinja_eval *ev, int op, struct jinja_value a,
                                  struct jinja_value b) {
  if (a.type == JINJA_LIST && b.type == JINJA_LIST)
    jinja_charge(ev->st, (a.u.l->n < b.u.l->n ? a.u.l->n : b.u.l->n) * 16);
  switch (op) {
  case JINJA_OP_EQ:
    return jinja_bool(jinja_equal(a, b));
  case JINJA_OP_NE:
    return jinja_bool(!jinja_equal(a, b));
  case JINJA_OP_IN:
    return jinja_bool(contains(ev, b, a));
  case JINJA_OP_NOTIN:
    return jinja_bool(!contains(ev, b, a));
  default: {
    int c = jinja_compare(ev->st, a, b);
    return jinja_bool(op == JINJA_OP_LT   ? c < 0
                      : op == JINJA_OP_LE ? c <= 0
                      : op == JINJA_OP_GT ? c > 0
                                          : c >= 0);
  }
  }
}

static struct jinja_value eval(struct jinja_eval *ev, const struct jinja_node *n) {
  struct jinja_state *st = ev->st;
  size_t saved_at = st->at;
  st->at = n->pos;
  jinja_step(st);
  if (++st->depth > JINJA_MAX_DEPTH)
    jinja_fail(st, "template nesting exceeds the limit of %d", JINJA_MAX_DEPTH);
  struct jinja_value r;
  switch (n->kind) {
  case JINJA_N_CONST:
    r = n->value;
    break;
  case JINJA_N_NAME:
    r = lookup(ev, n->name);
    break;
  case JINJA_N_GETATTR:
    r = jinja_eval_getattr(ev, eval(ev, n->a), n->name);
    break;
  case JINJA_N_GETITEM: {
    struct jinja_value obj = eval(ev, n->a);
    if (n->b->kind == JINJA_N_SLICE) {
      struct jinja_value sv[3];
      sv[0] = n->b->a ? eval(ev, n->b->a) : jinja_none();
      sv[1] = n->b->b ? eval(ev, n->b->b) : jinja_none();
      sv[2] = n->b->c ? eval(ev, n->b->c) : jinja_none();
      r = do_slice(ev, obj, sv);
    } else {
      r = jinja_eval_getitem(ev, obj, eval(ev, n->b));
    }
    break;
  }
  case JINJA_N_CALL: {
    struct jinja_value fn = eval(ev, n->a);
    struct jinja_args a;
    eval_args(ev, n, &a);
    r = jinja_eval_call(ev, fn, &a);
    break;
  }
  case JINJA_N_FILTER: {
    struct jinja_value in = n->a ? eval(ev, n->a) : ev->filter_input;
    struct jinja_args a;
    eval_args(ev, n, &a);
    r = jinja_filter_apply(ev, n->name, in, &a);
    break;
  }
  case JINJA_N_TEST: {
    struct jinja_value v = eval(ev, n->a);
    struct jinja_args a;
    eval_args(ev, n, &a);
    int t = jinja_test_apply(ev, n->name, v, &a);
    r = jinja_bool(n->op ? !t : t);
    break;
  }
  case JINJA_N_UNARY: {
    struct jinja_value v = eval(ev, n->a);
    jinja_check_defined(st, v);
    if (v.type == JINJA_INT)
      r = n->op == '-' ? (v.u.i == INT64_MIN ? jinja_float(9.2233720368547758e18) : jinja_int(-v.u.i))
                       : v;
    else if (v.type == JINJA_BOOL)
      r = jinja_int(n->op == '-' ? -v.u.b : v.u.b);
    else if (v.type == JINJA_FLOAT)
      r = jinja_float(n->op == '-' ? -v.u.f : v.u.f);
    else
      jinja_fail(st, "bad operand type for unary %c: '%s'", n->op, jinja_type_name(v));
    break;
  }
  case JINJA_N_BINARY: {
    struct jinja_value a = eval(ev, n->a);
    struct jinja_value b = eval(ev, n->b);
    r = arith(ev, n->op, a, b);
    break;
  }
  case JINJA_N_COMPARE: {
    struct jinja_value a = eval(ev, n->a);
    struct jinja_value b = eval(ev, n->b);
    r = compare(ev, n->op, a, b);
    break;
  }
  case JINJA_N_AND: {
    struct jinja_value a = eval(ev, n->a);
    r = jinja_truthy(a) ? eval(ev, n->b) : a;
    break;
  }
  case JINJA_N_OR: {
    struct jinja_value a = eval(ev, n->a);
    r = jinja_truthy(a) ? a : eval(ev, n->b);
    break;
  }
  case JINJA_N_NOT:
    r = jinja_bool(!jinja_truthy(eval(ev, n->a)));
    break;
  case JINJA_N_COND:
    if (jinja_truthy(eval(ev, n->a)))
      r = eval(ev, n->b);
    else
      r = n->c ? eval(ev, n->c)
               : jinja_undefined(
                     "the inline if-expression evaluated to false and no else section was defined.");
    break;
  case JINJA_N_LIST:
  case JINJA_N_TUPLE:
    r = jinja_list_new(st, n->num_args, n->kind == JINJA_N_TUPLE);
    for (size_t i = 0; i < n->num_args; i++)
      r.u.l->items[i] = eval(ev, n->args[i]);
    break;
  case JINJA_N_DICT:
    r = jinja_dict_new(st);
    for (size_t i = 0; i < n->num_args; i++) {
      struct jinja_value k = eval(ev, n->args[i]);
      if (k.type == JINJA_LIST && !k.u.l->is_tuple)
        jinja_fail(st, "unhashable type: 'list'");
      if (k.type == JINJA_DICT)
        jinja_fail(st, "unhashable type: 'dict'");
      jinja_dict_set(st, r.u.d, k, eval(ev, n->kwargs[i]));
    }
    break;
  default:
    jinja_fail(st, "cannot evaluate this expression");
  }
  st->depth--;
  st->at = saved_at;
  return r;
}

/* Binds an assignment target (name or tuple of names) in frame F. */
static void assign(struct jinja_eval *ev, struct jinja_frame *f, const struct jinja_node *target,
                   struct jinja_value v) {
  struct jinja_state *st = ev->st;
  if (target->kind == JINJA_N_NAME) {
    jinja_frame_set(st, f, target->name, v);
  } else if (target->kind == JINJA_N_NSREF) {
    struct jinja_value ns = lookup(ev, target->name);
    if (ns.type != JINJA_NAMESPACE)
      jinja_fail(st, "cannot assign attribute on non-namespace object");
    jinja_dict_set(st, ns.u.d, jinja_str(st, target->attr), v);
  } else if (target->kind == JINJA_N_TUPLE) {
    size_t count;
    struct jinja_value *items = jinja_eval_iterate(ev, v, &count);
    if (count < target->num_args)
      jinja_fail(st, "not enough values to unpack (expected %zu, got %zu)", target->num_args, count);
    if (count > target->num_args)
      jinja_fail(st, "too many values to unpack (expected %zu)", target->num_args);
    for (size_t i = 0; i < count; i++)
      assign(ev, f, target->args[i], items[i]);
  } else {
    jinja_fail(st, "cannot assign to this target");
  }
}

/* Runs the for node N over SEQ at DEPTH in the frame OUTER (the current frame, or for a
 * recursive loop(...) call the frame the loop was started in). */
static int exec_for_seq(struct jinja_eval *ev, const struct jinja_node *n, struct jinja_value seq, int depth,
                        struct jinja_frame *outer) {
  struct jinja_state *st = ev->st;
  size_t count;
  struct jinja_value *items = jinja_eval_iterate(ev, seq, &count);
  if (n->c) { /* {% for x in xs if cond %}: filter first, so loop.length counts what is kept */
    struct jinja_value *kept = count ? jinja_alloc(st, count * sizeof(*kept)) : NULL;
    size_t m = 0;
    struct jinja_frame *f = frame_new(st, outer);
    for (size_t i = 0; i < count; i++) {
      f->n = 0;
      assign(ev, f, n->a, items[i]);
      ev->frame = f;
      int keep = jinja_truthy(eval(ev, n->c));
      ev->frame = outer;
      if (keep)
        kept[m++] = items[i];
    }
    items = kept;
    count = m;
  }
  if (count == 0) {
    if (n->else_body) {
      ev->frame = frame_new(st, outer);
      exec_body(ev, n->else_body);
      ev->frame = outer;
    }
    return JINJA_FLOW_NORMAL;
  }
  struct jinja_loop *loop = jinja_alloc(st, sizeof(*loop));
  loop->items = items;
  loop->length = count;
  loop->depth = depth;
  loop->changed_called = 0;
  loop->node = n;
  loop->outer = outer;
  struct jinja_value loopv = {.type = JINJA_LOOP};
  loopv.u.loop = loop;
  ev->loop_depth++;
  /* Each iteration is its own scope: a {% set %} inside does not survive to the next one. The
   * frame's storage is reused, so a long loop does not grow the arena per iteration. */
  struct jinja_frame *f = frame_new(st, outer);
  for (size_t i = 0; i < count; i++) {
    jinja_step(st);
    loop->index0 = i;
    f->n = 0;
    assign(ev, f, n->a, items[i]);
    jinja_frame_set(st, f, "loop", loopv);
    ev->frame = f;
    int flow = exec_body(ev, n->body);
    ev->frame = outer;
    if (flow == JINJA_FLOW_BREAK)
      break;
  }
  ev->loop_depth--;
  return JINJA_FLOW_NORMAL;
}

static int exec_for(struct jinja_eval *ev, const struct jinja_node *n) {
  return exec_for_seq(ev, n, eval(ev, n->b), 1, ev->frame);
}

/* loop(items) inside a `recursive` for: the loop again over ITEMS, one level deeper; returns
 * its output (a str: transformers renders without autoescape). */
static struct jinja_value call_loop(struct jinja_eval *ev, struct jinja_loop *l, const struct jinja_args *a) {
  struct jinja_state *st = ev->st;
  if (!l->node || !l->node->op)
    jinja_fail(st, "The loop must have the 'recursive' marker to be called recursively.");
  if (a->n != 1 || a->num_kw)
    jinja_fail(st, "loop() takes exactly one argument, the items to recurse into");
  if (++st->depth > JINJA_MAX_DEPTH)
    jinja_fail(st, "template nesting exceeds the limit of %d", JINJA_MAX_DEPTH);
  struct jinja_buf b, *saved_out = ev->out;
  struct jinja_frame *saved_frame = ev->frame;
  jinja_buf_init(&b, st, 0, JINJA_MAX_OUTPUT);
  ev->out = &b;
  exec_for_seq(ev, l->node, a->pos[0], l->depth + 1, l->outer);
  ev->out = saved_out;
  ev->frame = saved_frame;
  st->depth--;
  return jinja_buf_value(&b);
}

static int exec_stmt(struct jinja_eval *ev, const struct jinja_node *n) {
  struct jinja_state *st = ev->st;
  st->at = n->pos;
  jinja_step(st);
  switch (n->kind) {
  case JINJA_N_TEXT:
    jinja_buf_add(ev->out, n->value.u.s->data, n->value.u.s->len);
    return JINJA_FLOW_NORMAL;
  case JINJA_N_OUTPUT: {
    struct jinja_value v = eval(ev, n->a);
    if (v.type == JINJA_CALLABLE && v.u.c->kind == JINJA_FN_MACRO) {
      jinja_buf_adds(ev->out, "<Macro '");
      jinja_buf_adds(ev->out, v.u.c->name);
      jinja_buf_adds(ev->out, "'>");
    } else {
      jinja_write_str(ev->out, v);
    }
    return JINJA_FLOW_NORMAL;
  }
  case JINJA_N_BODY:
    return exec_body(ev, n);
  case JINJA_N_IF:
    if (jinja_truthy(eval(ev, n->a)))
      return exec_body(ev, n->body);
    return n->else_body ? exec_body(ev, n->else_body) : JINJA_FLOW_NORMAL;
  case JINJA_N_FOR:
    return exec_for(ev, n);
  case JINJA_N_SET:
    assign(ev, ev->frame, n->a, eval(ev, n->b));
    return JINJA_FLOW_NORMAL;
  case JINJA_N_SET_BLOCK: {
    struct jinja_value v = capture(ev, n->body);
    if (n->b) {
      struct jinja_value saved = ev->filter_input;
      ev->filter_input = v;
      v = eval(ev, n->b);
      ev->filter_input = saved;
    }
    assign(ev, ev->frame, n->a, v);
    return JINJA_FLOW_NORMAL;
  }
  case JINJA_N_FILTER_BLOCK: {
    struct jinja_value saved = ev->filter_input;
    ev->filter_input = capture(ev, n->body);
    struct jinja_value v = eval(ev, n->b);
    ev->filter_input = saved;
    jinja_write_str(ev->out, v);
    return JINJA_FLOW_NORMAL;
  }
  case JINJA_N_MACRO: {
    struct jinja_value m = callable_new(ev, JINJA_FN_MACRO, n->name, jinja_none());
    m.u.c->node = n;
    m.u.c->closure = ev->frame;
    jinja_frame_set(st, ev->frame, n->name, m);
    return JINJA_FLOW_NORMAL;
  }
  case JINJA_N_CALL_BLOCK: {
    struct jinja_value caller = callable_new(ev, JINJA_FN_MACRO, "caller", jinja_none());
    caller.u.c->node = n;
    caller.u.c->closure = ev->frame;
    struct jinja_value fn = eval(ev, n->a->a);
    struct jinja_args a;
    eval_args(ev, n->a, &a);
    if (fn.type == JINJA_CALLABLE && fn.u.c->kind == JINJA_FN_MACRO) {
      struct jinja_callable copy = *fn.u.c;
      copy.caller = caller;
      struct jinja_value fn2 = {.type = JINJA_CALLABLE};
      fn2.u.c = &copy;
      jinja_write_str(ev->out, jinja_eval_call(ev, fn2, &a));
    } else {
      jinja_write_str(ev->out, jinja_eval_call(ev, fn, &a));
    }
    return JINJA_FLOW_NORMAL;
  }
  case JINJA_N_WITH: {
    struct jinja_frame *outer = ev->frame, *f = frame_new(st, outer);
    for (size_t i = 0; i < n->num_kwargs; i++)
      jinja_frame_set(st, f, n->kwnames[i], eval(ev, n->kwargs[i]));
    ev->frame = f;
    int flow = exec_body(ev, n->body);
    ev->frame = outer;
    return flow;
  }
  case JINJA_N_BREAK:
    return ev->loop_depth ? JINJA_FLOW_BREAK : JINJA_FLOW_NORMAL;
  case JINJA_N_CONTINUE:
    return ev->loop_depth ? JINJA_FLOW_CONTINUE : JINJA_FLOW_NORMAL;
  default:
    jinja_fail(st, "cannot execute this statement");
  }
}

static int exec_body(struct jinja_eval *ev, const struct jinja_node *body) {
  struct jinja_state *st = ev->st;
  if (++st->depth > JINJA_MAX_DEPTH)
    jinja_fail(st, "template nesting exceeds the limit of %d", JINJA_MAX_DEPTH);
  int flow = JINJA_FLOW_NORMAL;
  for (size_t i = 0; i < body->num_args && flow == JINJA_FLOW_NORMAL; i++)
    flow = exec_stmt(ev, body->args[i]);
  st->depth--;
  return flow;
}

void jinja_eval_render(struct jinja_eval *ev, const struct jinja_node *body) { exec_body(ev, body); }
