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

/* Where a render error is in the template: 1-based line and column (in code points, after
 * Jinja2's \r\n -> \n normalization) of the token or expression being lexed, parsed or
 * evaluated; 0 and 0 when the error has no place there (a bad context, a limit at the start).
 * For runtime errors this is the innermost expression being evaluated. */
struct jinja_error_loc {
  int line, col;
};

/* jinja_render that also reports where an error is (LOC may be NULL). The message stays
 * Jinja2's own text, so callers that show it byte for byte (raise_exception) are unaffected;
 * callers add the place, e.g. "t.jinja:3:14: unexpected '}'". */
char *jinja_render_at(const char *template_src, const cJSON *context, const struct jinja_limits *limits,
                      size_t *out_len, char **err, struct jinja_error_loc *loc);

/* Parses a context (TEXT, LEN bytes) with cJSON, keeping json.loads's int/float distinction that
 * a double loses: literals such as 1.0, 2e3, -0 and integers beyond 2^53 stay as cJSON raw
 * items holding their text, which the renderer reads back as Python would. Free with
 * cJSON_Delete; NULL when TEXT is not JSON. */
cJSON *jinja_context_parse(const char *text, size_t len);

#endif
