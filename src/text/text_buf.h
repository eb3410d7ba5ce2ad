/* text_buf.h - a growable byte buffer for the tokenizer's per-call scratch space (grown, never
 * shrunk, so steady-state encoding does not allocate). */
#ifndef PAGODA_TEXT_BUF_H
#define PAGODA_TEXT_BUF_H

#include <stdlib.h>
#include <string.h>

struct text_buf {
  char *data; /* (cap) bytes, the first len used */
  size_t len, cap;
};

/* Ensures room for EXTRA more bytes; returns 0 or -1 on allocation failure. */
static inline int text_buf_reserve(struct text_buf *b, size_t extra) {
  if (b->len + extra <= b->cap)
    return 0;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < b->len + extra)
    cap *= 2;
  char *d = realloc(b->data, cap);
  if (!d)
    return -1;
  b->data = d;
  b->cap = cap;
  return 0;
}

static inline int text_buf_append(struct text_buf *b, const void *s, size_t n) {
  if (text_buf_reserve(b, n))
    return -1;
  if (n)
    memcpy(b->data + b->len, s, n);
  b->len += n;
  return 0;
}

static inline void text_buf_free(struct text_buf *b) {
  free(b->data);
  b->data = NULL;
  b->len = b->cap = 0;
}

#endif
