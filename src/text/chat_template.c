/* chat_template.c - chat_template_render: the public entry point, a render under the default limits. */
#include "text/chat_template.h"

#include "text/jinja_render.h"
#include "text/jinja_value.h"

char *chat_template_render(const char *template_src, const cJSON *context, size_t *out_len, char **err) {
  const struct jinja_limits limits = {.max_steps = JINJA_MAX_STEPS, .max_output = JINJA_MAX_OUTPUT};
  return jinja_render(template_src, context, &limits, out_len, err);
}

char *chat_template_render_loc(const char *template_src, const cJSON *context, size_t *out_len,
                               char **err, int *line, int *col) {
  const struct jinja_limits limits = {.max_steps = JINJA_MAX_STEPS, .max_output = JINJA_MAX_OUTPUT};
  struct jinja_error_loc loc = {0, 0};
  char *out = jinja_render_at(template_src, context, &limits, out_len, err, &loc);
  if (line) *line = out ? 0 : loc.line;
  if (col) *col = out ? 0 : loc.col;
  return out;
}
