/* fuzz_chat_context.c - fuzz target: arbitrary bytes as a chat-template context through
 * jinja_context_parse (the number-literal scan beside cJSON) and a render that visits every value
 * (printing, tojson, iteration), under small limits. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja_render.h"

static const char template_src[] =
    "{% for k, v in messages.items() if messages is mapping %}{{ k }}={{ v }};{% endfor %}"
    "{{ messages }}|{{ messages | tojson }}|{{ tools | tojson(indent=2) }}|"
    "{% for m in messages if messages is iterable %}{{ m.role if m is mapping }}{{ m | string }}{% endfor %}"
    "{{ n + 1 if n is number }}{{ n | int }}{{ n | float }}{{ n is integer }}";

static const char *const seed_contexts[] = {
    "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"n\": 1.0}",
    "{\"messages\": {\"a\": [1, 2e3, -0, 0.5, 12345678901234567890]}, \"tools\": [{\"x\": null}], \"n\": -0}",
    "{\"messages\": \"str \\\" 1.0 \\\\\", \"tools\": {\"\\u00fc\": [true, false, {}]}, \"n\": 1E400}",
};

void fuzz_seeds(void (*add)(const uint8_t *, size_t)) {
  for (size_t i = 0; i < sizeof seed_contexts / sizeof seed_contexts[0]; i++)
    add((const uint8_t *)seed_contexts[i], strlen(seed_contexts[i]));
}

int fuzz_one(const uint8_t *data, size_t size) {
  cJSON *ctx = jinja_context_parse((const char *)data, size);
  if (!ctx)
    return 0;
  const struct jinja_limits limits = {.max_steps = 20000, .max_output = 1 << 16};
  size_t len = 0;
  char *err = NULL;
  char *out = jinja_render(template_src, ctx, &limits, &len, &err);
  if ((out == NULL) == (err == NULL))
    abort();
  free(out);
  free(err);
  cJSON_Delete(ctx);
  return 0;
}
