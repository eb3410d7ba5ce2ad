/* cli_detokenize.c - `pagoda detokenize`: token ids on stdin -> the decoded text on stdout. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/cli_io.h"
#include "pagoda.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: pagoda detokenize -m PATH [--skip-special] < ids\n\n"
          "Reads token ids (decimal, separated by spaces, commas or newlines) from stdin and\n"
          "prints exactly the decoded text.\n\n"
          "  -m PATH          model directory (tokenizer.json), a tokenizer.json, a .gguf, or a\n"
          "                   Hugging Face repo id org/name (with --revision REV, --hf-file FILE)\n"
          "  --skip-special   leave out special tokens (BOS, EOS, <|im_end|>, ...)\n"
          "  -h, --help       this help\n");
}

/* Parses the ids in TEXT; returns the count or -1 (message printed). *IDS is malloc'd. */
static int parse_ids(const char *text, int32_t **ids_out) {
  int n = 0, cap = 256;
  int32_t *ids = malloc((size_t)cap * sizeof *ids);
  if (!ids) {
    fprintf(stderr, "error: out of memory\n");
    return -1;
  }
  const char *p = text;
  for (;;) {
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r' || *p == ',')
      p++;
    if (!*p)
      break;
    char *end;
    errno = 0;
    long v = strtol(p, &end, 10);
    if (end == p || errno || v < INT32_MIN || v > INT32_MAX ||
        !(*end == 0 || *end == ' ' || *end == '\t' || *end == '\n' || *end == '\r' || *end == ',')) {
      const char *e = p;
      while (*e && *e != ' ' && *e != '\n' && *e != '\t' && *e != ',' && e - p < 40)
        e++;
      fprintf(stderr, "error: '%.*s' is not a token id\n", (int)(e - p), p);
      free(ids);
      return -1;
    }
    if (n == cap) {
      cap *= 2;
      int32_t *m = realloc(ids, (size_t)cap * sizeof *ids);
      if (!m) {
        free(ids);
        fprintf(stderr, "error: out of memory\n");
        return -1;
      }
      ids = m;
    }
    ids[n++] = (int32_t)v;
    p = end;
  }
  *ids_out = ids;
  return n;
}

int cli_detokenize(int argc, char **argv) {
  int skip_special = 0, rc;
  const struct cli_switch switches[] = {{"--skip-special", &skip_special}, {NULL, NULL}};
  struct cli_tokenizer_input in;
  if (cli_tokenizer_setup(argc, argv, switches, usage, &in, &rc))
    return rc;
  rc = 1;
  int32_t *ids = NULL;
  int n = strlen(in.text) == in.len ? parse_ids(in.text, &ids) : -1;
  if (n < 0 && strlen(in.text) != in.len)
    fprintf(stderr, "error: NUL byte in the input\n");
  if (n >= 0) {
    int need = pagoda_tokenizer_decode(in.tokenizer, ids, n, skip_special, NULL, 0);
    char *out = need >= 0 ? malloc((size_t)need + 1) : NULL;
    if (need < 0) {
      fprintf(stderr, "error: %s\n", pagoda_last_error());
    } else if (!out) {
      fprintf(stderr, "error: out of memory\n");
    } else {
      pagoda_tokenizer_decode(in.tokenizer, ids, n, skip_special, out, (size_t)need + 1);
      fwrite(out, 1, (size_t)need, stdout);
      rc = fflush(stdout) ? fprintf(stderr, "error: cannot write the output to stdout\n"), 1 : 0;
    }
    free(out);
  }
  free(ids);
  cli_tokenizer_input_free(&in);
  return rc;
}
