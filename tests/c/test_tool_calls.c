/* test_tool_calls.c - the server's tool-call parser (src/server/tool_calls.c, compiled in here:
 * it belongs to the CLI, not libpagoda) on outputs written the way Qwen2.5/Hermes, Llama 3.1 and
 * Mistral models write calls; the format follows the shared chat templates; streaming holds back
 * exactly the text that may become a call. */
#include <cjson/cJSON.h>
#include <string.h>

#include "../../src/server/tool_calls.c"
#include "test_util.h"

static int check_call(cJSON *calls, int i, const char *name, const char *args_json) {
  cJSON *c = cJSON_GetArrayItem(calls, i);
  REQUIRE(c, "call %d exists", i);
  cJSON *fn = cJSON_GetObjectItem(c, "function");
  CHECK(!strcmp(cJSON_GetObjectItem(c, "type")->valuestring, "function"), "type");
  CHECK(!strcmp(cJSON_GetObjectItem(fn, "name")->valuestring, name), "name %s", cJSON_GetObjectItem(fn, "name")->valuestring);
  /* arguments is a JSON string; compare parsed */
  cJSON *got = cJSON_Parse(cJSON_GetObjectItem(fn, "arguments")->valuestring), *want = cJSON_Parse(args_json);
  CHECK(got && want && cJSON_Compare(got, want, 1), "arguments %s", cJSON_GetObjectItem(fn, "arguments")->valuestring);
  cJSON_Delete(got);
  cJSON_Delete(want);
  CHECK(cJSON_IsString(cJSON_GetObjectItem(c, "id")), "id");
  return 0;
}

static char *read_template(const char *name) {
  char rel[256];
  snprintf(rel, sizeof rel, "templates/%s", name);
  const char *p = test_shared_path(rel);
  size_t n;
  return p ? test_read_file(p, &n) : NULL;
}

int main(void) {
  size_t end;
  /* Hermes / Qwen2.5: content, then one or more <tool_call> blocks. */
  const char *h = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
                  "</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}\n</tool_call>";
  cJSON *calls = tool_calls_parse(TOOL_FMT_HERMES, h, strlen(h), &end);
  CHECK(calls && cJSON_GetArraySize(calls) == 2, "two hermes calls");
  if (calls) {
    check_call(calls, 0, "get_weather", "{\"city\":\"Paris\"}");
    check_call(calls, 1, "get_time", "{\"tz\":\"CET\"}");
  }
  CHECK(end == strlen("Let me check.\n"), "content ends before the call (%zu)", end);
  cJSON_Delete(calls);
  /* No call, or a malformed one: plain content. */
  const char *plain = "The weather is fine.";
  CHECK(!tool_calls_parse(TOOL_FMT_HERMES, plain, strlen(plain), &end) && end == strlen(plain), "no call");
  const char *broken = "<tool_call>{\"name\": \"f\", \"argu";
  CHECK(!tool_calls_parse(TOOL_FMT_HERMES, broken, strlen(broken), &end), "truncated call is no call");
  const char *unclosed = "Hi <tool_call>{\"name\": \"f\", \"arguments\": {}}"; /* cut before </tool_call> */
  CHECK(!tool_calls_parse(TOOL_FMT_HERMES, unclosed, strlen(unclosed), &end) && end == strlen(unclosed),
        "an unclosed call block is content");

  /* Llama 3.1: a JSON object with "parameters" (optionally after <|python_tag|>), ';'-joined. */
  const char *l = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}; "
                  "{\"name\": \"get_time\", \"parameters\": {}}";
  calls = tool_calls_parse(TOOL_FMT_LLAMA3, l, strlen(l), &end);
  CHECK(calls && cJSON_GetArraySize(calls) == 2 && end == 0, "two llama calls");
  if (calls) {
    check_call(calls, 0, "get_weather", "{\"city\":\"Paris\"}");
    check_call(calls, 1, "get_time", "{}");
  }
  cJSON_Delete(calls);
  const char *lt = "<|python_tag|>{\"name\": \"search\", \"parameters\": {\"q\": \"x\"}}";
  calls = tool_calls_parse(TOOL_FMT_LLAMA3, lt, strlen(lt), &end);
  CHECK(calls && cJSON_GetArraySize(calls) == 1, "python_tag call");
  cJSON_Delete(calls);
  const char *ljson = "{\"answer\": 42}"; /* JSON that is not a call stays content */
  CHECK(!tool_calls_parse(TOOL_FMT_LLAMA3, ljson, strlen(ljson), &end) && end == strlen(ljson), "not a call");

  /* Mistral: [TOOL_CALLS] then a JSON array. */
  const char *m = "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"abc123def\"}]";
  calls = tool_calls_parse(TOOL_FMT_MISTRAL, m, strlen(m), &end);
  CHECK(calls && cJSON_GetArraySize(calls) == 1 && end == 0, "mistral call");
  if (calls)
    check_call(calls, 0, "get_weather", "{\"city\":\"Paris\"}");
  cJSON_Delete(calls);

  /* Streaming: what may still become a marker is held back. */
  CHECK(tool_content_safe(TOOL_FMT_HERMES, "Hello <tool", 11) == 6, "partial marker held");
  CHECK(tool_content_safe(TOOL_FMT_HERMES, "Hello <b>", 9) == 9, "other tags pass");
  CHECK(tool_content_safe(TOOL_FMT_HERMES, h, strlen(h)) == strlen("Let me check.\n"), "stop at the marker");
  CHECK(tool_content_safe(TOOL_FMT_MISTRAL, "[TOOL_", 6) == 0, "mistral partial");
  CHECK(tool_content_safe(TOOL_FMT_LLAMA3, " {\"na", 5) == 0 && tool_content_safe(TOOL_FMT_LLAMA3, "Hi", 2) == 2,
        "llama: a leading brace is held");

  /* The format follows the chat template text (shared real templates). */
  char *q = read_template("Qwen-Qwen2.5-7B-Instruct.jinja");
  char *ll = read_template("meta-llama-Llama-3.1-8B-Instruct.jinja");
  char *mi = read_template("mistralai-Mistral-Nemo-Instruct-2407.jinja");
  if (q && ll && mi) {
    CHECK(tool_format_from_template(q) == TOOL_FMT_HERMES, "qwen -> hermes");
    CHECK(tool_format_from_template(ll) == TOOL_FMT_LLAMA3, "llama 3.1 -> json");
    CHECK(tool_format_from_template(mi) == TOOL_FMT_MISTRAL, "mistral -> [TOOL_CALLS]");
  }
  free(q);
  free(ll);
  free(mi);
  return test_finish("test_tool_calls");
}
