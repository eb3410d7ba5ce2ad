/* jinja_render.c - one render: JSON context -> Jinja values, then lex, parse and evaluate the
 * template inside one bounded arena. */
#include "text/jinja_render.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja_eval.h"
#include "text/jinja_lexer.h"
#include "text/jinja_parser.h"
#include "text/jinja_value.h"

/* JSON -> value. Numbers without a fraction or exponent become ints, as json.loads makes them;
 * cJSON keeps only a double, so an integral value within +-2^53 is taken for an int. */
static struct jinja_value from_json(struct jinja_state *st, const cJSON *j, int depth) {
  if (depth > JINJA_MAX_DEPTH)
    jinja_fail(st, "context JSON nests too deeply");
  if (cJSON_IsNull(j))
    return jinja_none();
  if (cJSON_IsBool(j))
    return jinja_bool(cJSON_IsTrue(j));
  if (cJSON_IsNumber(j)) {
    double d = j->valuedouble;
    if (d == floor(d) && fabs(d) <= 9007199254740992.0 && !(d == 0 && signbit(d)))
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
  *err = NULL;
  *out_len = 0;
  struct jinja_state st;
  memset(&st, 0, sizeof(st));
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
    return NULL;
  }
  if (!template_src)
    jinja_fail(&st, "no template");
  size_t n_tokens;
  struct jinja_token *toks = jinja_lex(&st, template_src, strlen(template_src), &n_tokens);
  struct jinja_node *root = jinja_parse(&st, toks, n_tokens);

  struct jinja_frame *globals = jinja_alloc(&st, sizeof(*globals));
  memset(globals, 0, sizeof(*globals));
  if (context && cJSON_IsObject(context)) {
    for (const cJSON *c = context->child; c; c = c->next)
      if (c->string)
        jinja_frame_set(&st, globals, jinja_str(&st, c->string).u.s->data, from_json(&st, c, 0));
  } else if (context && !cJSON_IsNull(context)) {
    jinja_fail(&st, "the template context must be a JSON object");
  }

  struct jinja_eval ev = {.st = &st, .out = &out, .frame = globals, .filter_input = jinja_undefined(NULL)};
  jinja_eval_render(&ev, root);

  char *result = out.data ? out.data : calloc(1, 1);
  *out_len = out.len;
  jinja_state_release(&st);
  if (!result)
    *err = strdup("out of memory");
  return result;
}
