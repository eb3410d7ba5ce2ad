/* cli_tokenize.c - `pagoda tokenize`: all of stdin as one text -> token ids on one line. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/cli_io.h"
#include "pagoda.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: pagoda tokenize -m PATH [--add-special] [--parse-special] < text\n\n"
          "Reads all of stdin as one text and prints its token ids, separated by single spaces,\n"
          "on one line.\n\n"
          "  -m PATH          model directory (tokenizer.json), a tokenizer.json, a .gguf, or a\n"
          "                   Hugging Face repo id org/name (with --revision REV, --hf-file FILE)\n"
          "  --add-special    add BOS/EOS as the tokenizer's configuration says\n"
          "  --parse-special  special tokens written in the text (e.g. <|im_end|>) become their ids\n"
          "  -h, --help       this help\n");
}

int cli_tokenize(int argc, char **argv) {
  const char *path = NULL, *revision = NULL, *hf_file = NULL;
  int add_special = 0, parse_special = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model")) {
      if (++i >= argc) {
        fprintf(stderr, "error: %s needs a path\n", argv[i - 1]);
        return 2;
      }
      path = argv[i];
    } else if (!strcmp(argv[i], "--revision") || !strcmp(argv[i], "--hf-file")) {
      if (++i >= argc) {
        fprintf(stderr, "error: %s needs a value\n", argv[i - 1]);
        return 2;
      }
      *(argv[i - 1][2] == 'r' ? &revision : &hf_file) = argv[i];
    } else if (!strcmp(argv[i], "--add-special")) {
      add_special = 1;
    } else if (!strcmp(argv[i], "--parse-special")) {
      parse_special = 1;
    } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      usage(stdout);
      return 0;
    } else {
      fprintf(stderr, "error: unknown option '%s'\n", argv[i]);
      usage(stderr);
      return 2;
    }
  }
  if (!path) {
    fprintf(stderr, "error: -m PATH is required\n");
    usage(stderr);
    return 2;
  }
  pagoda_tokenizer_t *t = cli_load_tokenizer(path, revision, hf_file);
  if (!t)
    return 1;
  size_t len;
  char *text = cli_read_stdin(&len);
  if (!text) {
    fprintf(stderr, "error: cannot read stdin\n");
    pagoda_tokenizer_free(t);
    return 1;
  }
  int rc = 1;
  int cap = len < (size_t)(1 << 28) ? (int)len + 16 : 1 << 28;
  int32_t *ids = malloc((size_t)cap * sizeof *ids);
  int n = ids ? pagoda_tokenizer_encode(t, text, len, add_special, parse_special, ids, cap) : -1;
  if (n > cap) {
    int32_t *more = realloc(ids, (size_t)n * sizeof *ids);
    ids = more;
    n = more ? pagoda_tokenizer_encode(t, text, len, add_special, parse_special, ids, n) : -1;
  }
  if (n < 0) {
    fprintf(stderr, "error: %s\n", ids ? pagoda_last_error() : "out of memory");
  } else {
    for (int i = 0; i < n; i++)
      printf(i ? " %d" : "%d", (int)ids[i]);
    putchar('\n');
    rc = fflush(stdout) ? fprintf(stderr, "error: cannot write the output to stdout\n"), 1 : 0;
  }
  free(ids);
  free(text);
  pagoda_tokenizer_free(t);
  return rc;
}
