/* cli_io.c - reading all of stdin for the CLI subcommands. */
#include "cli/cli_io.h"

#include <stdio.h>
#include <stdlib.h>

char *cli_read_stdin(size_t *len) {
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap + 1);
  if (!buf)
    return NULL;
  for (;;) {
    size_t got = fread(buf + n, 1, cap - n, stdin);
    n += got;
    if (n < cap) {
      if (ferror(stdin)) {
        free(buf);
        return NULL;
      }
      if (feof(stdin) || got == 0)
        break;
      continue;
    }
    cap *= 2;
    char *nb = realloc(buf, cap + 1);
    if (!nb) {
      free(buf);
      return NULL;
    }
    buf = nb;
  }
  buf[n] = 0;
  *len = n;
  return buf;
}
