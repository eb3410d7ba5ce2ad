/* tool_calls.c - tool calls in model output: Hermes/Qwen "<tool_call>{json}</tool_call>",
 * Llama 3.1 JSON ({"name", "parameters"}, optionally after <|python_tag|>, several joined by
 * ';') and Mistral "[TOOL_CALLS][{...}, ...]". The format follows the chat template's text. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

#include "server/server.h"

enum tool_format tool_format_from_template(const char *tmpl) {
  if (!tmpl)
    return TOOL_FMT_HERMES;
  if (strstr(tmpl, "[TOOL_CALLS]"))
    return TOOL_FMT_MISTRAL;
  if (strstr(tmpl, "<tool_call>"))
    return TOOL_FMT_HERMES;
  if (strstr(tmpl, "<|python_tag|>") || strstr(tmpl, "ipython"))
    return TOOL_FMT_LLAMA3;
  return TOOL_FMT_HERMES;
}

static const char *memfind(const char *h, size_t hl, const char *n) {
  size_t nl = strlen(n);
  for (size_t i = 0; i + nl <= hl; i++)
    if (!memcmp(h + i, n, nl))
      return h + i;
  return NULL;
}

static size_t skip_ws(const char *t, size_t len, size_t i) {
  while (i < len && (t[i] == ' ' || t[i] == '\n' || t[i] == '\r' || t[i] == '\t'))
    i++;
  return i;
}

/* Appends {id, type, function: {name, arguments}} for OBJ (with "name" and "arguments" or
 * "parameters") to CALLS. Returns 0, or -1 when OBJ is not a call. */
static int add_call(cJSON *calls, const cJSON *obj) {
  const cJSON *name = cJSON_GetObjectItemCaseSensitive(obj, "name");
  const cJSON *args = cJSON_GetObjectItemCaseSensitive(obj, "arguments");
  if (!args)
    args = cJSON_GetObjectItemCaseSensitive(obj, "parameters");
  if (!cJSON_IsString(name))
    return -1;
  char *arg_text = NULL;
  if (cJSON_IsString(args))
    arg_text = strdup(args->valuestring);
  else if (args)
    arg_text = cJSON_PrintUnformatted(args);
  else
    arg_text = strdup("{}");
  cJSON *c = cJSON_CreateObject();
  char id[32];
  snprintf(id, sizeof id, "call_%d", cJSON_GetArraySize(calls));
  cJSON_AddStringToObject(c, "id", id);
  cJSON_AddStringToObject(c, "type", "function");
  cJSON *fn = cJSON_AddObjectToObject(c, "function");
  cJSON_AddStringToObject(fn, "name", name->valuestring);
  cJSON_AddStringToObject(fn, "arguments", arg_text ? arg_text : "{}");
  cJSON_free(arg_text);
  cJSON_AddItemToArray(calls, c);
  return 0;
}

/* Parses one JSON value at T[*I]; advances *I past it. NULL when malformed. */
static cJSON *parse_at(const char *t, size_t len, size_t *i) {
  const char *end = NULL;
  cJSON *v = cJSON_ParseWithLengthOpts(t + *i, len - *i, &end, 0);
  if (v)
    *i = (size_t)(end - t);
  return v;
}

cJSON *tool_calls_parse(enum tool_format f, const char *text, size_t len, size_t *content_end) {
  *content_end = len;
  cJSON *calls = cJSON_CreateArray();
  if (f == TOOL_FMT_HERMES) {
    const char *p = memfind(text, len, "<tool_call>");
    if (p)
      *content_end = (size_t)(p - text);
    while (p) {
      size_t i = skip_ws(text, len, (size_t)(p - text) + strlen("<tool_call>"));
      cJSON *obj = parse_at(text, len, &i);
      /* Only a closed block is a call: one cut off (max_tokens) before </tool_call> is not. */
      size_t j = obj ? skip_ws(text, len, i) : len;
      if (obj && len - j >= 12 && !memcmp(text + j, "</tool_call>", 12))
        add_call(calls, obj);
      cJSON_Delete(obj);
      p = memfind(text + i, len - i, "<tool_call>");
    }
  } else if (f == TOOL_FMT_MISTRAL) {
    const char *p = memfind(text, len, "[TOOL_CALLS]");
    if (p) {
      *content_end = (size_t)(p - text);
      size_t i = skip_ws(text, len, (size_t)(p - text) + strlen("[TOOL_CALLS]"));
      cJSON *arr = parse_at(text, len, &i);
      const cJSON *it;
      if (cJSON_IsArray(arr))
        cJSON_ArrayForEach(it, arr) add_call(calls, it);
      else if (cJSON_IsObject(arr))
        add_call(calls, arr);
      cJSON_Delete(arr);
    }
  } else {
    size_t i = skip_ws(text, len, 0);
    if (len - i >= 14 && !memcmp(text + i, "<|python_tag|>", 14))
      i = skip_ws(text, len, i + 14);
    if (i < len && text[i] == '{') {
      size_t start = i;
      for (;;) {
        cJSON *obj = parse_at(text, len, &i);
        if (!obj || add_call(calls, obj)) {
          cJSON_Delete(obj);
          break;
        }
        cJSON_Delete(obj);
        i = skip_ws(text, len, i);
        if (i < len && text[i] == ';')
          i = skip_ws(text, len, i + 1);
        else
          break;
      }
      if (cJSON_GetArraySize(calls) > 0)
        *content_end = start;
    }
  }
  if (cJSON_GetArraySize(calls) == 0) {
    cJSON_Delete(calls);
    *content_end = len;
    return NULL;
  }
  return calls;
}

size_t tool_content_safe(enum tool_format f, const char *text, size_t len) {
  if (f == TOOL_FMT_LLAMA3) { /* a call is the whole output: hold back from its first '{' or tag */
    size_t i = skip_ws(text, len, 0);
    if (i == len)
      return 0;
    if (text[i] == '{' || text[i] == '<')
      return 0;
    return len;
  }
  const char *marker = f == TOOL_FMT_MISTRAL ? "[TOOL_CALLS]" : "<tool_call>";
  size_t ml = strlen(marker);
  const char *p = memfind(text, len, marker);
  if (p)
    return (size_t)(p - text);
  /* A tail that is a prefix of the marker may still become one. */
  for (size_t k = ml - 1; k > 0; k--)
    if (k <= len && !memcmp(text + len - k, marker, k))
      return len - k;
  return len;
}
