/* cli_tokenize.c - `pagoda tokenize`: all of stdin as one text -> token ids on one line. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

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
  int add_special = 0, parse_special = 0, rc;
  const struct cli_switch switches[] = {{"--add-special", &add_special}, {"--parse-special", &parse_special},
                                        {NULL, NULL}};
  struct cli_tokenizer_input in;
  if (cli_tokenizer_setup(argc, argv, switches, usage, &in, &rc))
    return rc;
  rc = 1;
  int cap = in.len < (size_t)(1 << 28) ? (int)in.len + 16 : 1 << 28;
  int32_t *ids = malloc((size_t)cap * sizeof *ids);
  int n = ids ? pagoda_tokenizer_encode(in.tokenizer, in.text, in.len, add_special, parse_special, ids, cap) : -1;
  if (n > cap) {
    int32_t *more = realloc(ids, (size_t)n * sizeof *ids);
    ids = more;
    n = more ? pagoda_tokenizer_encode(in.tokenizer, in.text, in.len, add_special, parse_special, ids, n) : -1;
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
  cli_tokenizer_input_free(&in);
  return rc;
}
