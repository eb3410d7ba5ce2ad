/* chat_template.c - chat_template_render: the public entry point, a render under the default limits. */
#include "text/chat_template.h"

#include "text/jinja_render.h"
#include "text/jinja_value.h"

char *chat_template_render(const char *template_src, const cJSON *context, size_t *out_len, char **err) {
  const struct jinja_limits limits = {.max_steps = JINJA_MAX_STEPS, .max_output = JINJA_MAX_OUTPUT};
  return jinja_render(template_src, context, &limits, out_len, err);
}
