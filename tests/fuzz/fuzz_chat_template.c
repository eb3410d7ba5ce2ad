/* fuzz_chat_template.c - fuzz target: arbitrary template source bytes rendered against a fixed
 * chat context under small limits; any input must end in a rendering or a message, never a
 * crash, hang or sanitizer report. Seeds are chat-template-shaped sources written for this file. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja_render.h"

static const char context_json[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
    " {\"role\": \"user\", \"content\": \"Hi \\u00fc \\u2713\"},"
    " {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"abcdefghi\", \"type\": "
    "\"function\","
    " \"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}}]},"
    " {\"role\": \"tool\", \"tool_call_id\": \"abcdefghi\", \"content\": \"18C\"},"
    " {\"role\": \"assistant\", \"content\": \"<think>t</think>It is 18C.\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": "
    "\"Weather\","
    " \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, "
    "\"required\": [\"city\"]}}}],"
    " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"n\": 2.5}";

static const char *const seed_templates[] = {
    "{{ bos_token }}{% for m in messages %}{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Roles must alternate') }}{% endif %}<start_of_turn>{{ 'model' if m.role == "
    "'assistant' else m.role }}\n"
    "{{ m.content | trim }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt "
    "%}<start_of_turn>model\n{% endif %}",
    "{% set ns = namespace(sys='', tool=false) %}{%- for m in messages if m.role == 'system' %}{% set "
    "ns.sys = m.content %}"
    "{% endfor %}{{ ns.sys }}{%- for m in messages %}{%- if m.role == 'assistant' and m.content is none "
    "%}"
    "{%- for c in m.tool_calls %}<call>{{ c.function.name }}\n{{ c.function.arguments | "
    "tojson(indent=2) }}</call>"
    "{%- endfor %}{%- elif m.role == 'assistant' %}{{ m.content.split('</think>')[-1] }}{% endif %}{% "
    "endfor %}",
    "{%- if tools is defined %}{% for t in tools %}{{ t | tojson(indent=4) }}\n\n{% endfor %}{% endif %}"
    "{%- for m in messages[1:] %}{{ '<|' ~ m.role ~ '|>' + (m.content or '') | trim }}{% endfor %}",
    "{%- macro ty(s) %}{% if s.type == 'string' %}str{% elif s.type is iterable %}Union[{% for t in "
    "s.type %}"
    "{{ ty({'type': t}) }}{{ ',' if not loop.last }}{% endfor %}]{% else %}Any{% endif %}{% endmacro %}"
    "{% for t in tools %}def {{ t.function.name }}({% for k, v in t.function.parameters.properties | "
    "items %}"
    "{{ k }}: {{ ty(v) }}{% endfor %}){% endfor %}",
    "{{ [1, 2, 3][::-1] }} {{ 'abc' * 2 }} {{ n // 1 }} {{ {'a': [1, (2,)]} }} {{ messages | "
    "selectattr('role', 'equalto', 'user')"
    " | map(attribute='content') | join(', ') }} {{ range(3) | list | sum }} {{ 'x' if n > 2 else 'y' "
    "}}",
    "{% raw %}{{ raw }}{% endraw %}{# c #}  {%- set x %}a{{ 1 }}{% endset -%} {{ x | upper }} {% filter "
    "lower %}AB{% endfilter %}"
    "{% macro w() %}[{{ caller() }}]{% endmacro %}{% call w() %}in{% endcall %}{% for i in range(5) "
    "%}{% if i == 3 %}"
    "{% break %}{% endif %}{{ loop.index }}{{ loop.cycle('a', 'b') }}{% else %}e{% endfor %}",
};

static cJSON *context;

void fuzz_seeds(void (*add)(const uint8_t *, size_t)) {
  for (size_t i = 0; i < sizeof seed_templates / sizeof seed_templates[0]; i++)
    add((const uint8_t *)seed_templates[i], strlen(seed_templates[i]));
}

int fuzz_one(const uint8_t *data, size_t size) {
  if (!context)
    context = cJSON_Parse(context_json);
  char *src = malloc(size + 1);
  if (!src)
    return 0;
  memcpy(src, data, size);
  src[size] = 0; /* a NUL inside ends the template early, as a C string would */
  const struct jinja_limits limits = {.max_steps = 20000, .max_output = 1 << 16};
  size_t len = 0;
  char *err = NULL;
  char *out = jinja_render(src, context, &limits, &len, &err);
  /* Exactly one of the two comes back. */
  if ((out == NULL) == (err == NULL))
    abort();
  if (out && len > limits.max_output)
    abort();
  free(out);
  free(err);
  free(src);
  return 0;
}
