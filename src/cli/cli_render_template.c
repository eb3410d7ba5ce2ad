/* cli_render_template.c - `pagoda render-template TEMPLATE.jinja CONTEXT.json`: prints the
 * rendering byte for byte (no newline added); a template error goes to stderr with exit 1. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "text/chat_template.h"
#include "text/jinja_render.h"

static char *read_text(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  size_t k;
  while (buf && (k = fread(buf + n, 1, cap - n - 1, f)) > 0) {
    n += k;
    if (n + 1 == cap) {
      char *b = realloc(buf, cap * 2);
      if (!b) {
        free(buf);
        buf = NULL;
        break;
      }
      buf = b;
      cap *= 2;
    }
  }
  int bad = ferror(f);
  fclose(f);
  if (!buf || bad) {
    free(buf);
    return NULL;
  }
  buf[n] = 0;
  *len = n;
  return buf;
}

int cli_render_template(int argc, char **argv) {
  if (argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
    printf("usage: pagoda render-template TEMPLATE.jinja CONTEXT.json\n\n"
           "Renders the chat template with the JSON object CONTEXT as its variables; prints the text.\n");
    return 0;
  }
  if (argc != 3) {
    fprintf(stderr, "error: expected TEMPLATE.jinja CONTEXT.json\nusage: pagoda render-template TEMPLATE.jinja CONTEXT.json\n");
    return 2;
  }
  size_t tlen, clen;
  char *tmpl = read_text(argv[1], &tlen);
  if (!tmpl) {
    fprintf(stderr, "error: cannot read %s\n", argv[1]);
    return 1;
  }
  if (strlen(tmpl) != tlen) {
    fprintf(stderr, "error: %s contains a NUL byte\n", argv[1]);
    free(tmpl);
    return 1;
  }
  char *ctext = read_text(argv[2], &clen);
  if (!ctext) {
    fprintf(stderr, "error: cannot read %s\n", argv[2]);
    free(tmpl);
    return 1;
  }
  cJSON *ctx = jinja_context_parse(ctext, clen);
  free(ctext);
  if (!ctx || !cJSON_IsObject(ctx)) {
    fprintf(stderr, "error: %s is not a JSON object\n", argv[2]);
    cJSON_Delete(ctx);
    free(tmpl);
    return 1;
  }
  size_t len;
  char *err = NULL;
  char *out = chat_template_render(tmpl, ctx, &len, &err);
  cJSON_Delete(ctx);
  free(tmpl);
  if (!out) {
    fprintf(stderr, "%s\n", err ? err : "template error"); /* the message as Jinja2 words it (shared .err files) */
    free(err);
    return 1;
  }
  int ok = fwrite(out, 1, len, stdout) == len && fflush(stdout) == 0;
  free(out);
  if (!ok) {
    fprintf(stderr, "error: cannot write the output\n");
    return 1;
  }
  return 0;
}
