/* jinja_render.h - one bounded render of a chat template: JSON context in, text or message out. */
#ifndef PAGODA_JINJA_RENDER_H
#define PAGODA_JINJA_RENDER_H

#include <cjson/cJSON.h>
#include <stddef.h>

/* How much one render may do; chat_template_render uses JINJA_MAX_STEPS and JINJA_MAX_OUTPUT
 * (tests and the fuzz target use smaller ones to stay fast). */
struct jinja_limits {
  long max_steps;
  size_t max_output;
};

/* chat_template_render with explicit LIMITS: returns the malloc'd rendering (*out_len bytes)
 * or NULL with *err a malloc'd message. */
char *jinja_render(const char *template_src, const cJSON *context, const struct jinja_limits *limits,
                   size_t *out_len, char **err);

/* Parses a context (TEXT, LEN bytes) with cJSON, keeping json.loads's int/float distinction that
 * a double loses: literals such as 1.0, 2e3, -0 and integers beyond 2^53 stay as cJSON raw
 * items holding their text, which the renderer reads back as Python would. Free with
 * cJSON_Delete; NULL when TEXT is not JSON. */
cJSON *jinja_context_parse(const char *text, size_t len);

#endif
