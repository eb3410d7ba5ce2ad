/* cli_render_template.c - `pagoda render-template TEMPLATE.jinja CONTEXT.json`: prints the
 * rendering byte for byte (no newline added); a template error goes to stderr with exit 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/cli_io.h"
#include "pagoda.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: pagoda render-template [--error-location] TEMPLATE.jinja CONTEXT.json\n\n"
          "Renders the Jinja chat template TEMPLATE.jinja with the variables of CONTEXT.json (a JSON\n"
          "object: messages, tools, add_generation_prompt, bos_token, ...) as HF transformers does,\n"
          "and prints the rendering byte for byte (no newline added). A template error or\n"
          "raise_exception prints its message on stderr and exits 1: Jinja2's message byte for\n"
          "byte, or with --error-location as TEMPLATE.jinja:LINE:COLUMN: message.\n\n"
          "  --error-location prefix a template error with where it is in the template\n"
          "  -h, --help       this help\n");
}

int cli_render_template(int argc, char **argv) {
  if (argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
    usage(stdout);
    return 0;
  }
  int show_location = argc == 4 && !strcmp(argv[1], "--error-location");
  if (show_location) {
    argc--;
    argv++;
  }
  if (argc != 3) {
    fprintf(stderr, "error: expected [--error-location] TEMPLATE.jinja CONTEXT.json\n");
    usage(stderr);
    return 2;
  }
  size_t tlen, clen;
  char *tmpl = cli_read_file(argv[1], &tlen);
  if (!tmpl) {
    fprintf(stderr, "error: cannot read %s\n", argv[1]);
    return 1;
  }
  if (strlen(tmpl) != tlen) {
    fprintf(stderr, "error: %s contains a NUL byte\n", argv[1]);
    free(tmpl);
    return 1;
  }
  char *ctext = cli_read_file(argv[2], &clen);
  if (!ctext) {
    fprintf(stderr, "error: cannot read %s\n", argv[2]);
    free(tmpl);
    return 1;
  }
  size_t len;
  char *out;
  int st = pagoda_render_template(tmpl, ctext, clen, &out, &len);
  free(ctext);
  free(tmpl);
  int line, col;
  if (st == PAGODA_ERR_FORMAT && show_location && pagoda_template_error_location(&line, &col)) {
    fprintf(stderr, "%s:%d:%d: %s\n", argv[1], line, col, pagoda_last_error());
    return 1;
  }
  if (st == PAGODA_ERR_INVALID_ARG) {
    fprintf(stderr, "error: %s is not a JSON object\n", argv[2]);
    return 1;
  }
  if (st != PAGODA_OK) {
    fprintf(stderr, "%s\n", pagoda_last_error());
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
