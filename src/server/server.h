/* server.h - `pagoda serve`: an OpenAI-compatible HTTP server (libmicrohttpd, one thread per
 * connection) in front of the async engine. Endpoints and fields: docs/http.md. */
#ifndef PAGODA_SERVER_H
#define PAGODA_SERVER_H

#include <stddef.h>

#include "pagoda.h"

struct server_config {
  const char *host;          /* bind address (default 127.0.0.1) */
  int port;                  /* 0: any free port (the log line names it) */
  const char *api_key;       /* NULL: no auth; else /v1 endpoints need "Authorization: Bearer KEY" */
  const char *model_name;    /* the served model id (default: the model path) */
  const char *chat_template; /* template text overriding the model's (NULL: the model's) */
  int max_waiting;           /* the async engine's waiting queue bound (429 beyond) */
  int grace_ms;              /* SIGINT/SIGTERM: running requests may finish this long */
  size_t max_body;           /* request bodies above this get 413 */
  int max_connections;       /* connection threads at most (one per open connection) */
};

/* Serves until SIGINT or SIGTERM, then shuts down gracefully. Returns the exit code (0 after a
 * clean shutdown, 1 when the engine or the socket could not start). */
int server_run(const struct pagoda_engine_params *ep, const struct server_config *cfg);

/* Tool-call output formats, picked from the chat template text. */
enum tool_format { TOOL_FMT_HERMES, TOOL_FMT_LLAMA3, TOOL_FMT_MISTRAL };
enum tool_format tool_format_from_template(const char *tmpl);
/* Parses model output TEXT for tool calls of format F. Returns a cJSON array of OpenAI
 * tool_calls ({id, type: "function", function: {name, arguments (a JSON string)}}) or NULL when
 * there is none; *CONTENT_END gets the length of the text before the first call (the content
 * to keep). */
struct cJSON;
struct cJSON *tool_calls_parse(enum tool_format f, const char *text, size_t len, size_t *content_end);
/* Streaming: how many leading bytes of TEXT (len, the output so far) are surely content, not
 * part of a tool call of format F (the rest is held back until the output ends). */
size_t tool_content_safe(enum tool_format f, const char *text, size_t len);

#endif
