/* cli_io.h - small I/O helpers shared by the CLI subcommands. */
#ifndef PAGODA_CLI_IO_H
#define PAGODA_CLI_IO_H

#include <stddef.h>
#include <stdio.h>

/* Reads all of stdin into a NUL-terminated malloc'd buffer (free with free()); NULL on error.
 * *len gets the byte count (the text may contain NUL bytes). */
char *cli_read_stdin(size_t *len);
/* Likewise for the file PATH; NULL with errno set when it cannot be opened or read. */
char *cli_read_file(const char *path, size_t *len);

struct pagoda_tokenizer;
/* The tokenizer of MODEL (a path or a Hugging Face repo id, with REVISION / HF_FILE as
 * pagoda_resolve_model takes them); NULL after printing the `error:` line. Free with
 * pagoda_tokenizer_free. */
struct pagoda_tokenizer *cli_load_tokenizer(const char *model, const char *revision, const char *hf_file);

/* A switch of a command: NAME on the command line sets *VALUE to 1. */
struct cli_switch {
  const char *name;
  int *value;
};
/* What `pagoda tokenize` and `detokenize` work on: the tokenizer and all of stdin (LEN bytes, NUL-terminated
 * after them). Free with cli_tokenizer_input_free. */
struct cli_tokenizer_input {
  struct pagoda_tokenizer *tokenizer;
  char *text;
  size_t len;
};
/* The start of those two commands, which differ only in their switches and what they do with the text: parses
 * -m/--model, --revision, --hf-file, -h/--help and SWITCHES (ending in {NULL, NULL}), loads the tokenizer and
 * reads all of stdin. Returns 0 with *IN set when the command goes on; else 1 with *RC its exit status: 0 after
 * the help (USAGE on stdout), 2 after a usage error (USAGE on stderr), 1 when the tokenizer or stdin cannot be
 * read (`error:` printed). */
int cli_tokenizer_setup(int argc, char **argv, const struct cli_switch *switches, void (*usage)(FILE *),
                        struct cli_tokenizer_input *in, int *rc);
void cli_tokenizer_input_free(struct cli_tokenizer_input *in);

#endif
