/* cli_io.c - reading all of stdin or a file, and loading a tokenizer by path or repo id, for the CLI subcommands. */
#include "cli/cli_io.h"
#include "pagoda.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

static char *read_all(FILE *in, size_t *len) {
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap + 1);
  if (!buf)
    return NULL;
  for (;;) {
    size_t got = fread(buf + n, 1, cap - n, in);
    n += got;
    if (n < cap) {
      if (ferror(in)) {
        free(buf);
        return NULL;
      }
      if (feof(in) || got == 0)
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

char *cli_read_stdin(size_t *len) { return read_all(stdin, len); }

char *cli_read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  char *buf = read_all(f, len);
  int saved = errno;
  fclose(f);
  errno = saved;
  return buf;
}

struct pagoda_tokenizer *cli_load_tokenizer(const char *model, const char *revision, const char *hf_file) {
  char *resolved = NULL;
  if (pagoda_resolve_model(model, revision, hf_file, &resolved)) {
    fprintf(stderr, "error: %s\n", pagoda_last_error());
    return NULL;
  }
  pagoda_tokenizer_t *t;
  int rc = pagoda_tokenizer_load(resolved, &t);
  free(resolved);
  if (rc != PAGODA_OK) {
    fprintf(stderr, "error: %s\n", pagoda_last_error());
    return NULL;
  }
  return t;
}
