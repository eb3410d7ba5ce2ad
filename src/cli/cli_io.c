/* cli_io.c - reading all of stdin or a file, loading a tokenizer by path or repo id, and the option parsing
 * of the tokenizer commands, for the CLI subcommands. */
#include "cli/cli_io.h"
#include "pagoda.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int cli_tokenizer_setup(int argc, char **argv, const struct cli_switch *switches, void (*usage)(FILE *),
                        struct cli_tokenizer_input *in, int *rc) {
  const char *path = NULL, *revision = NULL, *hf_file = NULL;
  *rc = 2;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model")) {
      if (++i >= argc) {
        fprintf(stderr, "error: %s needs a path\n", argv[i - 1]);
        return 1;
      }
      path = argv[i];
    } else if (!strcmp(argv[i], "--revision") || !strcmp(argv[i], "--hf-file")) {
      if (++i >= argc) {
        fprintf(stderr, "error: %s needs a value\n", argv[i - 1]);
        return 1;
      }
      *(argv[i - 1][2] == 'r' ? &revision : &hf_file) = argv[i];
    } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      usage(stdout);
      *rc = 0;
      return 1;
    } else {
      const struct cli_switch *s = switches;
      while (s->name && strcmp(argv[i], s->name))
        s++;
      if (!s->name) {
        fprintf(stderr, "error: unknown option '%s'\n", argv[i]);
        usage(stderr);
        return 1;
      }
      *s->value = 1;
    }
  }
  if (!path) {
    fprintf(stderr, "error: -m PATH is required\n");
    usage(stderr);
    return 1;
  }
  *rc = 1;
  pagoda_tokenizer_t *t = cli_load_tokenizer(path, revision, hf_file);
  if (!t)
    return 1;
  in->text = cli_read_stdin(&in->len);
  if (!in->text) {
    fprintf(stderr, "error: cannot read stdin\n");
    pagoda_tokenizer_free(t);
    return 1;
  }
  in->tokenizer = t;
  return 0;
}

void cli_tokenizer_input_free(struct cli_tokenizer_input *in) {
  free(in->text);
  pagoda_tokenizer_free(in->tokenizer);
}
