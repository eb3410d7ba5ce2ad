/* jinja_render.c - one render: JSON context -> Jinja values, then lex, parse and evaluate the
 * template inside one bounded arena. */
#include "text/jinja_render.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja_eval.h"
#include "text/jinja_lexer.h"
#include "text/jinja_parser.h"
#include "text/jinja_value.h"
#include "text/unicode.h"

/* A number literal kept as text by jinja_context_parse: json.loads's rule, a fraction or an
 * exponent makes a float, anything else an int. */
static struct jinja_value from_literal(const char *s) {
  if (strpbrk(s, ".eE"))
    return jinja_float(strtod(s, NULL));
  errno = 0;
  long long v = strtoll(s, NULL, 10);
  if (errno == ERANGE) /* beyond 64 bits: Python would keep an exact big int */
    return jinja_float(strtod(s, NULL));
  return jinja_int(v);
}

static int hex4(const char *s, uint32_t *v) {
  *v = 0;
  for (int i = 0; i < 4; i++) {
    char c = s[i];
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0)
      return 0;
    *v = *v * 16 + (uint32_t)d;
  }
  return 1;
}

/* A JSON string literal kept as text by jinja_context_parse (one holding \u0000, which a C
 * string would cut short): decoded here with its length. cJSON has already validated it. */
static struct jinja_value from_json_string(struct jinja_state *st, const char *lit) {
  size_t n = strlen(lit);
  char *o = jinja_alloc(st, n + 1);
  size_t k = 0;
  for (size_t i = 1; i + 1 < n;) {
    if (lit[i] != '\\') {
      o[k++] = lit[i++];
      continue;
    }
    char c = lit[i + 1];
    i += 2;
    uint32_t cp;
    switch (c) {
    case 'b': o[k++] = '\b'; continue;
    case 'f': o[k++] = '\f'; continue;
    case 'n': o[k++] = '\n'; continue;
    case 'r': o[k++] = '\r'; continue;
    case 't': o[k++] = '\t'; continue;
    case 'u':
      if (i + 4 > n || !hex4(lit + i, &cp))
        jinja_fail(st, "bad \\u escape in the context JSON");
      i += 4;
      if (cp >= 0xD800 && cp < 0xDC00 && i + 6 <= n && lit[i] == '\\' && lit[i + 1] == 'u') {
        uint32_t lo;
        if (hex4(lit + i + 2, &lo) && lo >= 0xDC00 && lo < 0xE000) {
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          i += 6;
        }
      }
      k += (size_t)unicode_utf8_encode(cp, o + k);
      continue;
    default: o[k++] = c; continue; /* \" \\ \/ */
    }
  }
  return jinja_str_n(st, o, k);
}

/* JSON -> value. Numbers without a fraction or exponent become ints, as json.loads makes them.
 * cJSON keeps only a double, so unless jinja_context_parse kept the literal, an integral value
 * within +-2^53 is taken for an int. */
static struct jinja_value from_json(struct jinja_state *st, const cJSON *j, int depth) {
  if (depth > JINJA_MAX_DEPTH)
    jinja_fail(st, "context JSON nests too deeply");
  if (cJSON_IsNull(j))
    return jinja_none();
  if (cJSON_IsRaw(j) && j->valuestring && j->valuestring[0] == '"')
    return from_json_string(st, j->valuestring);
  if (cJSON_IsRaw(j) && j->valuestring)
    return from_literal(j->valuestring);
  if (cJSON_IsBool(j))
    return jinja_bool(cJSON_IsTrue(j));
  if (cJSON_IsNumber(j)) {
    double d = j->valuedouble;
    if (d == floor(d) && fabs(d) < 9007199254740992.0 && !(d == 0 && signbit(d)))
      return jinja_int((int64_t)d);
    return jinja_float(d);
  }
  if (cJSON_IsString(j))
    return jinja_str(st, j->valuestring ? j->valuestring : "");
  if (cJSON_IsArray(j)) {
    struct jinja_value l = jinja_list_new(st, (size_t)cJSON_GetArraySize(j), 0);
    size_t i = 0;
    for (const cJSON *c = j->child; c && i < l.u.l->n; c = c->next)
      l.u.l->items[i++] = from_json(st, c, depth + 1);
    l.u.l->n = i;
    return l;
  }
  if (cJSON_IsObject(j)) {
    struct jinja_value d = jinja_dict_new(st);
    /* Small objects drop duplicate keys as json.loads does (the last value wins); large ones are
     * appended as they come, so a hostile context cannot make this quadratic. */
    int dedupe = cJSON_GetArraySize(j) <= 256;
    for (const cJSON *c = j->child; c; c = c->next) {
      struct jinja_value key = jinja_str(st, c->string ? c->string : "");
      struct jinja_value val = from_json(st, c, depth + 1);
      if (dedupe)
        jinja_dict_set(st, d.u.d, key, val);
      else
        jinja_dict_append(st, d.u.d, key, val);
    }
    return d;
  }
  return jinja_none();
}

char *jinja_render(const char *template_src, const cJSON *context, const struct jinja_limits *limits,
                   size_t *out_len, char **err) {
  return jinja_render_at(template_src, context, limits, out_len, err, NULL);
}

char *jinja_render_at(const char *template_src, const cJSON *context, const struct jinja_limits *limits,
                      size_t *out_len, char **err, struct jinja_error_loc *loc) {
  *err = NULL;
  *out_len = 0;
  if (loc)
    loc->line = loc->col = 0;
  struct jinja_state st;
  memset(&st, 0, sizeof(st));
  st.at = SIZE_MAX;
  st.max_steps = limits->max_steps;
  struct jinja_buf out;
  jinja_buf_init(&out, &st, 1, limits->max_output);
  /* Everything below allocates from st's arena (the output from the heap buffer), so an error
   * that longjmps back here only has to release those two. */
  if (setjmp(st.on_error)) {
    /* Read through volatile: these were changed by callees after setjmp. */
    free(((volatile struct jinja_buf *)&out)->data);
    jinja_state_release(&st);
    char *msg = ((volatile struct jinja_state *)&st)->err;
    *err = msg ? msg : strdup("template error");
    if (loc) {
      loc->line = ((volatile struct jinja_state *)&st)->err_line;
      loc->col = ((volatile struct jinja_state *)&st)->err_col;
    }
    return NULL;
  }
  if (!template_src)
    jinja_fail(&st, "no template");
  size_t num_tokens;
  struct jinja_token *toks = jinja_lex(&st, template_src, strlen(template_src), &num_tokens);
  struct jinja_node *root = jinja_parse(&st, toks, num_tokens);

  st.at = SIZE_MAX; /* context errors have no place in the template */
  struct jinja_frame *globals = jinja_alloc(&st, sizeof(*globals));
  memset(globals, 0, sizeof(*globals));
  if (context && cJSON_IsObject(context)) {
    /* Later duplicates shadow earlier ones (lookups scan from the end), so no search is needed. */
    for (const cJSON *c = context->child; c; c = c->next)
      if (c->string)
        jinja_frame_push(&st, globals, jinja_str(&st, c->string).u.s->data, from_json(&st, c, 0));
  } else if (context && !cJSON_IsNull(context)) {
    jinja_fail(&st, "the template context must be a JSON object");
  }

  /* The context's own variables stay in this frame; template-level sets go to a child frame, so
   * strftime_now reads the date_string the caller passed. */
  struct jinja_frame *top = jinja_alloc(&st, sizeof(*top));
  memset(top, 0, sizeof(*top));
  top->parent = globals;
  struct jinja_eval ev = {
      .st = &st, .out = &out, .frame = top, .globals = globals, .filter_input = jinja_undefined(NULL)};
  jinja_eval_render(&ev, root);

  char *result = out.data ? out.data : calloc(1, 1);
  *out_len = out.len;
  jinja_state_release(&st);
  if (!result)
    *err = strdup("out of memory");
  return result;
}

/* The number literals of TEXT in document order, as [start, end) offsets; strings are skipped. */
struct number_spans {
  size_t *start, *end; /* (n) */
  size_t n, cap;
};

static int spans_push(struct number_spans *sp, size_t a, size_t b) {
  if (sp->n == sp->cap) {
    size_t cap = sp->cap ? sp->cap * 2 : 64;
    size_t *s = realloc(sp->start, cap * sizeof(size_t));
    if (!s)
      return -1;
    sp->start = s;
    size_t *e = realloc(sp->end, cap * sizeof(size_t));
    if (!e)
      return -1;
    sp->end = e;
    sp->cap = cap;
  }
  sp->start[sp->n] = a;
  sp->end[sp->n] = b;
  sp->n++;
  return 0;
}

/* Walks numbers in document order; keeps as raw text every literal whose int/float kind the
 * double alone would get wrong (1.0, 1e3, -0, integers beyond 2^53). */
static int keep_literals(cJSON *j, const char *text, const struct number_spans *sp, size_t *next,
                         const struct number_spans *ss, size_t *snext) {
  for (; j; j = j->next) {
    if (j->string)
      (*snext)++; /* the member's key */
    if (cJSON_IsString(j)) {
      if (*snext >= ss->n)
        return -1;
      size_t a = ss->start[*snext], b = ss->end[*snext];
      (*snext)++;
      if (memmem(text + a, b - a, "\\u0000", 6)) {
        char *lit = malloc(b - a + 1);
        if (!lit)
          return -1;
        memcpy(lit, text + a, b - a);
        lit[b - a] = 0;
        cJSON_free(j->valuestring);
        j->type = cJSON_Raw;
        j->valuestring = lit;
      }
    }
    if (cJSON_IsNumber(j)) {
      if (*next >= sp->n)
        return -1;
      size_t a = sp->start[*next], b = sp->end[*next];
      (*next)++;
      int is_float_literal =
          memchr(text + a, '.', b - a) || memchr(text + a, 'e', b - a) || memchr(text + a, 'E', b - a);
      double d = j->valuedouble;
      /* Below 2^53 a double holds every integer; 2^53 itself may be 2^53 + 1 rounded. */
      int heuristic_int = d == floor(d) && fabs(d) < 9007199254740992.0 && !(d == 0 && signbit(d));
      if (is_float_literal == heuristic_int) {
        char *lit = malloc(b - a + 1);
        if (!lit)
          return -1;
        memcpy(lit, text + a, b - a);
        lit[b - a] = 0;
        j->type = cJSON_Raw;
        j->valuestring = lit;
      }
    }
    if (j->child && keep_literals(j->child, text, sp, next, ss, snext) != 0)
      return -1;
  }
  return 0;
}

cJSON *jinja_context_parse(const char *text, size_t len) {
  cJSON *root = cJSON_ParseWithLength(text, len);
  if (!root)
    return NULL;
  struct number_spans sp = {0}, ss = {0}; /* numbers, strings (keys included) */
  int ok = 1;
  for (size_t i = 0; i < len && ok;) {
    char c = text[i];
    if (c == '"') {
      size_t a = i;
      for (i++; i < len && text[i] != '"'; i++)
        if (text[i] == '\\')
          i++;
      i++;
      ok = spans_push(&ss, a, i < len ? i : len) == 0;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      size_t a = i;
      while (i < len && strchr("0123456789+-.eE", text[i]) && text[i])
        i++;
      ok = spans_push(&sp, a, i) == 0;
    } else {
      i++;
    }
  }
  size_t next = 0, snext = 0;
  /* cJSON visits numbers and strings in the order they appear; should the scan disagree,
   * values stay as cJSON gives them. */
  if (ok)
    keep_literals(root, text, &sp, &next, &ss, &snext);
  free(sp.start);
  free(sp.end);
  free(ss.start);
  free(ss.end);
  return root;
}
