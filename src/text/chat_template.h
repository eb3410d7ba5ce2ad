/* chat_template.h - a Jinja subset interpreter for chat templates, configured as HF transformers
 * configures Jinja2 (trim_blocks, lstrip_blocks, loopcontrols, tojson without ASCII escaping). */
#ifndef PAGODA_CHAT_TEMPLATE_H
#define PAGODA_CHAT_TEMPLATE_H

#include <cjson/cJSON.h>
#include <stddef.h>

/* Renders TEMPLATE_SRC with the variables of CONTEXT (a JSON object: messages, tools,
 * add_generation_prompt, bos_token, eos_token, ...). Returns the rendering (malloc'd, free with
 * free(); *out_len its length) or NULL with *err set to a malloc'd message (the template's own
 * text for raise_exception). Bounded: runaway loops or output end with an error, never a hang. */
char *chat_template_render(const char *template_src, const cJSON *context, size_t *out_len,
                           char **err);
/* chat_template_render that also gives where an error is: *LINE and *COL (1-based) of the
 * template construct that failed, 0 when unknown (LINE/COL may be NULL). */
char *chat_template_render_loc(const char *template_src, const cJSON *context, size_t *out_len,
                               char **err, int *line, int *col);

#endif
