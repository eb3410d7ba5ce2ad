/* cli_serve.c - `pagoda serve`: the OpenAI-compatible HTTP server (src/server/). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/engine_flags.h"
#include "pagoda.h"
#include "server/server.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: pagoda serve -m MODEL [options]\n\n"
          "Serves the OpenAI API (/v1/chat/completions, /v1/completions, /v1/models), /tokenize,\n"
          "/detokenize, /health, /metrics (Prometheus) and a chat page at /. Stops on SIGINT/SIGTERM\n"
          "after letting running requests finish (docs/http.md).\n\n"
          "server options:\n"
          "  --host ADDR            IPv4 address to bind (default 127.0.0.1)\n"
          "  --port N               TCP port (default 8080; 0: any free port)\n"
          "  --api-key KEY          require 'Authorization: Bearer KEY' (default: $PAGODA_API_KEY, else none)\n"
          "  --served-model-name S  model id in the API (default: the model path)\n"
          "  --chat-template FILE   Jinja chat template to use instead of the model's\n"
          "  --max-waiting N        requests waiting for their first token before 429 (default 1024)\n"
          "  --shutdown-grace S     seconds running requests may finish after SIGTERM (default 30)\n"
          "  --max-body-mb N        largest request body (default 16)\n"
          "  --max-connections N    open connections (one thread each) at most (default 512)\n\n");
  struct pagoda_engine_params d; /* the values the parse starts from */
  pagoda_engine_params_default(&d);
  engine_flags_usage(f, &d);
}

static char *read_text(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
  if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
    free(s);
    s = NULL;
  }
  if (s)
    s[n] = 0;
  fclose(f);
  return s;
}

int cli_serve(int argc, char **argv) {
  struct pagoda_engine_params ep;
  pagoda_engine_params_default(&ep);
  struct server_config cfg = {.host = "127.0.0.1", .port = 8080, .max_waiting = 1024, .grace_ms = 30000,
                              .max_body = 16u << 20, .max_connections = 512};
  cfg.api_key = getenv("PAGODA_API_KEY");
  if (cfg.api_key && !cfg.api_key[0])
    cfg.api_key = NULL;
  const char *tmpl_path = NULL;
  for (int i = 1; i < argc; i++) {
    const char *v;
    int r;
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      usage(stdout);
      return 0;
    }
    if ((r = engine_flags_parse(&ep, argc, argv, &i)) != 0) {
      if (r < 0)
        return 2;
      continue;
    }
    if ((r = flag_value("--host", argc, argv, &i, &v)) != 0) {
      if (r < 0)
        return 2;
      cfg.host = v;
    } else if ((r = flag_value("--port", argc, argv, &i, &v)) != 0) {
      if (r < 0 || flag_int("--port", v, 0, 65535, &cfg.port))
        return 2;
    } else if ((r = flag_value("--api-key", argc, argv, &i, &v)) != 0) {
      if (r < 0)
        return 2;
      if (!v[0]) {
        fprintf(stderr, "error: --api-key is empty: give a key, or leave the flag out to serve without one\n");
        return 2;
      }
      cfg.api_key = v;
    } else if ((r = flag_value("--served-model-name", argc, argv, &i, &v)) != 0) {
      if (r < 0)
        return 2;
      cfg.model_name = v;
    } else if ((r = flag_value("--chat-template", argc, argv, &i, &v)) != 0) {
      if (r < 0)
        return 2;
      tmpl_path = v;
    } else if ((r = flag_value("--max-waiting", argc, argv, &i, &v)) != 0) {
      if (r < 0 || flag_int("--max-waiting", v, 1, 1 << 20, &cfg.max_waiting))
        return 2;
    } else if ((r = flag_value("--shutdown-grace", argc, argv, &i, &v)) != 0) {
      double s;
      if (r < 0 || flag_double("--shutdown-grace", v, 0, 86400, &s))
        return 2;
      cfg.grace_ms = (int)(s * 1000);
    } else if ((r = flag_value("--max-connections", argc, argv, &i, &v)) != 0) {
      if (r < 0 || flag_int("--max-connections", v, 1, 65536, &cfg.max_connections))
        return 2;
    } else if ((r = flag_value("--max-body-mb", argc, argv, &i, &v)) != 0) {
      int mb;
      if (r < 0 || flag_int("--max-body-mb", v, 1, 4096, &mb))
        return 2;
      cfg.max_body = (size_t)mb << 20;
    } else {
      fprintf(stderr, "error: unknown option '%s' (pagoda serve --help lists them)\n", argv[i]);
      return 2;
    }
  }
  if (!ep.model) {
    fprintf(stderr, "error: pagoda serve needs -m MODEL\n");
    return 2;
  }
  int worker_rc; /* --tp-rank > 0: this process serves rank 0's model calls instead */
  if (cli_tp_worker(&ep, &worker_rc))
    return worker_rc;
  if (!cfg.model_name)
    cfg.model_name = ep.model;
  char *tmpl = NULL;
  if (tmpl_path && !(tmpl = read_text(tmpl_path))) {
    fprintf(stderr, "error: cannot read --chat-template %s\n", tmpl_path);
    return 2;
  }
  if (tmpl) { /* refuse a broken template now rather than answer every chat with an error */
    static const char probe[] = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                                "\"add_generation_prompt\":true,\"bos_token\":\"\",\"eos_token\":\"\"}";
    char *out = NULL;
    size_t out_len = 0;
    if (pagoda_render_template(tmpl, probe, sizeof probe - 1, &out, &out_len) != PAGODA_OK) {
      int line, col;
      if (pagoda_template_error_location(&line, &col))
        fprintf(stderr, "error: --chat-template %s: line %d column %d: %s\n", tmpl_path, line, col,
                pagoda_last_error());
      else
        fprintf(stderr, "error: --chat-template %s: %s\n", tmpl_path, pagoda_last_error());
      free(tmpl);
      return 2;
    }
    free(out);
  }
  cfg.chat_template = tmpl;
  int rc = server_run(&ep, &cfg);
  free(tmpl);
  return rc;
}
