/* jinja_methods.c - the Python methods of str, dict and list values that chat templates call
 * (message.content.strip(), tool.items(), ...), and the ones the immutable sandbox refuses. */
#include "text/jinja_methods.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "text/jinja_filters.h"
#include "text/jinja_string.h"

static const char *const str_methods[] = {
    "upper",      "lower",    "strip",      "lstrip",  "rstrip",     "split",   "rsplit",
    "startswith", "endswith", "replace",    "title",   "capitalize", "find",    "rfind",
    "count",      "join",     "splitlines", "isdigit", "isalpha",    "isalnum", "isspace",
    "isupper",    "islower",  "format",     "index",   NULL};
static const char *const dict_methods[] = {"items", "keys", "values", "get", NULL};
static const char *const list_methods[] = {"index", "count", NULL};

static int in_list(const char *const *list, const char *name) {
  for (int i = 0; list[i]; i++)
    if (!strcmp(list[i], name))
      return 1;
  return 0;
}

const char *jinja_method_unsafe(struct jinja_value self, const char *name) {
  static const char *const list_mutators[] = {"append", "extend", "insert",  "pop", "remove",
                                              "clear",  "sort",   "reverse", NULL};
  static const char *const dict_mutators[] = {"pop", "popitem", "update", "setdefault", "clear", NULL};
  if (self.type == JINJA_LIST && !self.u.l->is_tuple && !self.u.l->view && in_list(list_mutators, name))
    return "list";
  if (self.type == JINJA_DICT && in_list(dict_mutators, name))
    return "dict";
  return NULL;
}

int jinja_method_exists(struct jinja_value self, const char *name) {
  switch (self.type) {
  case JINJA_STRING:
    return in_list(str_methods, name);
  case JINJA_DICT:
    return in_list(dict_methods, name);
  case JINJA_LIST: /* dict views have no index/count */
    return !self.u.l->view && in_list(list_methods, name);
  default:
    return 0;
  }
}

struct jinja_value jinja_method_call(struct jinja_eval *ev, struct jinja_value self, const char *name,
                                     const struct jinja_args *a) {
  struct jinja_state *st = ev->st;
  const struct jinja_value *a0 = jinja_arg(a, 0, NULL), *a1 = jinja_arg(a, 1, NULL);
#define IS(x) (!strcmp(name, x))
  if (self.type == JINJA_DICT) {
    if (IS("items")) {
      struct jinja_value l = jinja_filter_items(ev, self);
      l.u.l->view = JINJA_VIEW_ITEMS;
      return l;
    }
    if (IS("keys") || IS("values")) {
      struct jinja_value l = jinja_list_new(st, self.u.d->n, 0);
      for (size_t i = 0; i < self.u.d->n; i++)
        l.u.l->items[i] = IS("keys") ? self.u.d->keys[i] : self.u.d->vals[i];
      l.u.l->view = IS("keys") ? JINJA_VIEW_KEYS : JINJA_VIEW_VALUES;
      return l;
    }
    if (IS("get")) {
      if (!a0)
        jinja_fail(st, "get expected at least 1 argument, got 0");
      jinja_charge(st, self.u.d->n * 16);
      struct jinja_value *v = jinja_dict_get(self.u.d, *a0);
      return v ? *v : a1 ? *a1 : jinja_none();
    }
  } else if (self.type == JINJA_LIST) {
    if (!a0)
      jinja_fail(st, "%s() takes exactly one argument (0 given)", name);
    jinja_charge(st, self.u.l->n * 16);
    int64_t count = 0;
    for (size_t i = 0; i < self.u.l->n; i++)
      if (jinja_equal(self.u.l->items[i], *a0)) {
        if (IS("index"))
          return jinja_int((int64_t)i);
        count++;
      }
    if (IS("index"))
      jinja_fail(st, "list.index(x): x not in list");
    return jinja_int(count);
  } else if (self.type == JINJA_STRING) {
    const char *s = self.u.s->data;
    size_t n = self.u.s->len;
    if (IS("upper"))
      return jinja_string_case(ev, self, JINJA_CASE_UPPER);
    if (IS("lower"))
      return jinja_string_case(ev, self, JINJA_CASE_LOWER);
    if (IS("title"))
      return jinja_string_case(ev, self, JINJA_CASE_PY_TITLE);
    if (IS("capitalize"))
      return jinja_string_case(ev, self, JINJA_CASE_CAPITALIZE);
    if (IS("strip"))
      return jinja_string_strip(ev, self, a0, 3);
    if (IS("lstrip"))
      return jinja_string_strip(ev, self, a0, 1);
    if (IS("rstrip"))
      return jinja_string_strip(ev, self, a0, 2);
    if (IS("split"))
      return jinja_string_split(ev, self, jinja_arg(a, 0, "sep"),
                                jinja_arg_int(ev, jinja_arg(a, 1, "maxsplit"), -1));
    if (IS("rsplit"))
      return jinja_string_rsplit(ev, self, jinja_arg(a, 0, "sep"),
                                 jinja_arg_int(ev, jinja_arg(a, 1, "maxsplit"), -1));
    if (IS("startswith"))
      return jinja_bool(jinja_string_affix(ev, self, a0, 0));
    if (IS("endswith"))
      return jinja_bool(jinja_string_affix(ev, self, a0, 1));
    if (IS("replace"))
      return jinja_string_replace(ev, self, a0, a1, jinja_arg_int(ev, jinja_arg(a, 2, "count"), -1));
    if (IS("find") || IS("rfind") || IS("index") || IS("count")) {
      if (!a0 || a0->type != JINJA_STRING)
        jinja_fail(st, "must be str, not %s", a0 ? jinja_type_name(*a0) : "nothing");
      const char *sub = a0->u.s->data;
      size_t k = a0->u.s->len;
      jinja_charge(st, n);
      int64_t found = -1, count = 0;
      if (k == 0) {
        found = IS("rfind") ? (int64_t)n : 0;
      } else {
        size_t i = 0;
        while (i + k <= n) {
          const char *hit = memmem(s + i, n - i, sub, k);
          if (!hit)
            break;
          size_t pos = (size_t)(hit - s);
          if (found < 0 || IS("rfind"))
            found = (int64_t)pos;
          count++;
          if (IS("find") || IS("index"))
            break;
          jinja_step(st); /* one step per match */
          jinja_charge(st, k);
          i = pos + (IS("count") ? k : 1);
        }
      }
      if (IS("count"))
        return jinja_int(k == 0 ? (int64_t)jinja_utf8_len(s, n) + 1 : count);
      if (found < 0 && IS("index"))
        jinja_fail(st, "substring not found");
      return jinja_int(found < 0 ? -1 : (int64_t)jinja_utf8_len(s, (size_t)found));
    }
    if (IS("join")) {
      if (!a0)
        jinja_fail(st, "jinja_string_join() takes exactly one argument (0 given)");
      return jinja_string_join(ev, *a0, s, n, NULL);
    }
    if (IS("splitlines")) {
      struct jinja_value *parts = jinja_alloc(st, (n + 1) * sizeof(*parts));
      size_t np = 0, i = 0;
      while (i < n) {
        size_t brk, e = jinja_line_end(s, i, n, &brk);
        parts[np++] = jinja_str_n(st, s + i, e - i);
        i = e + brk;
      }
      return jinja_list_from(ev->st, parts, np);
    }
    if (IS("isdigit") || IS("isalpha") || IS("isalnum") || IS("isspace")) {
      if (n == 0)
        return jinja_bool(0);
      for (size_t i = 0; i < n;) {
        int32_t c = jinja_string_next(s, n, &i);
        utf8proc_category_t k = utf8proc_category(c);
        int digit = k == UTF8PROC_CATEGORY_ND,
            alpha = k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
        int ok = IS("isdigit")   ? digit
                 : IS("isalpha") ? alpha
                 : IS("isalnum") ? digit || alpha
                                 : jinja_string_isspace(c);
        if (!ok)
          return jinja_bool(0);
      }
      return jinja_bool(1);
    }
    if (IS("isupper") || IS("islower")) {
      struct jinja_args none = {0};
      return jinja_bool(jinja_test_apply(ev, IS("isupper") ? "upper" : "lower", self, &none));
    }
    if (IS("format"))
      return jinja_string_format(ev, self, a);
  }
#undef IS
  jinja_fail(st, "'%s' object has no attribute '%s'", jinja_type_name(self), name);
}
