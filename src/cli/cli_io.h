/* cli_io.h - small I/O helpers shared by the CLI subcommands. */
#ifndef PAGODA_CLI_IO_H
#define PAGODA_CLI_IO_H

#include <stddef.h>

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

#endif
