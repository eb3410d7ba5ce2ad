/* file.h - read-only memory-mapped files and whole-file reads. */
#ifndef PAGODA_FILE_H
#define PAGODA_FILE_H

#include <stddef.h>

struct mapped_file {
  const unsigned char *data; /* (size) bytes, read-only; NULL for an empty file */
  size_t size;
  char *path; /* owned copy of the path, for error messages */
};

/* Maps PATH read-only. Returns 0, or -1 with err_last() set. Release with mapped_file_close. */
int mapped_file_open(struct mapped_file *f, const char *path);
void mapped_file_close(struct mapped_file *f);

/* Reads a whole file into a NUL-terminated malloc'd buffer (free with free()); NULL with
 * err_last() set on error. *len (optional) gets the size without the NUL. */
char *file_read_all(const char *path, size_t *len);

/* 1 if PATH is a directory, 0 otherwise. */
int file_is_dir(const char *path);
/* 1 if PATH exists (file or directory). */
int file_exists(const char *path);

#endif
