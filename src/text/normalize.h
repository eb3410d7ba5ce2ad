/* normalize.h - tokenizer.json normalizers applied to each text segment before
 * pre-tokenization: NFC/NFD/NFKC/NFKD, Lowercase, Prepend, Replace, Strip, StripAccents. */
#ifndef PAGODA_NORMALIZE_H
#define PAGODA_NORMALIZE_H

#include <stddef.h>

#include "text/regex.h"
#include "text/text_buf.h"

enum normalize_kind {
  NORMALIZE_NFC,
  NORMALIZE_NFD,
  NORMALIZE_NFKC,
  NORMALIZE_NFKD,
  NORMALIZE_LOWERCASE,
  NORMALIZE_PREPEND,      /* text = a + text (when text is not empty) */
  NORMALIZE_REPLACE,      /* every occurrence of a (or of regex re) -> b */
  NORMALIZE_STRIP,        /* strip whitespace on the left and/or right */
  NORMALIZE_STRIP_ACCENTS /* drop combining marks (M*) */
};

struct normalize_step {
  enum normalize_kind kind;
  char *a, *b;          /* owned; NUL-terminated */
  size_t a_len, b_len;
  struct regex *re;     /* owned; Replace with a Regex pattern */
  int left, right;      /* Strip */
};

struct normalizer {
  struct normalize_step *steps; /* (n) owned */
  int n;
};

void normalizer_free(struct normalizer *n);
/* Appends a step (takes ownership of its strings and regex). 0 or -1. */
int normalizer_add(struct normalizer *n, struct normalize_step step);
/* Normalizes IN (LEN bytes, valid UTF-8) into OUT (reset first); TMP is scratch. 0 or -1. */
int normalizer_apply(const struct normalizer *n, struct regex_ctx *rc, const char *in, size_t len,
                     struct text_buf *out, struct text_buf *tmp);

#endif
