/* vocab.h - the token table: id -> text/type/score and text -> id through an open-addressing
 * hash table. Texts live in one arena; nothing is allocated per lookup. */
#ifndef PAGODA_VOCAB_H
#define PAGODA_VOCAB_H

#include <stddef.h>
#include <stdint.h>

/* Token types, numbered as GGUF's tokenizer.ggml.token_type (llama.cpp's llama_token_type). */
enum vocab_type {
  VOCAB_TYPE_UNDEFINED = 0,
  VOCAB_TYPE_NORMAL = 1,
  VOCAB_TYPE_UNKNOWN = 2,
  VOCAB_TYPE_CONTROL = 3,
  VOCAB_TYPE_USER_DEFINED = 4,
  VOCAB_TYPE_UNUSED = 5,
  VOCAB_TYPE_BYTE = 6,
};

struct vocab {
  int n;                /* number of ids */
  char *arena;          /* (arena_len) all texts back to back, each NUL-terminated */
  size_t arena_len, arena_cap;
  uint32_t *text_off;   /* (n) offset of id's text in arena; UINT32_MAX when the id has none */
  uint32_t *text_len;   /* (n) */
  uint8_t *type;        /* (n) enum vocab_type */
  float *score;         /* (n) SentencePiece scores (0 when absent) */
  int32_t *slots;       /* (mask + 1) ids, -1 = empty; load factor <= 1/2 */
  uint32_t mask;
};

/* Allocates N empty ids (no text yet). Returns 0, or -1 with err_last() set. Release with
 * vocab_free. */
int vocab_init(struct vocab *v, int n);
void vocab_free(struct vocab *v);
/* Gives ID the text S (LEN bytes). A text already owned by another id is re-pointed at ID
 * (the last one wins, as in a JSON object or llama.cpp's token_to_id). */
int vocab_set(struct vocab *v, int32_t id, const char *s, size_t len);
/* The id whose text is exactly S, or -1. */
int32_t vocab_find(const struct vocab *v, const char *s, size_t len);
/* Text of ID (NUL-terminated) or NULL when out of range or unset. */
const char *vocab_text(const struct vocab *v, int32_t id, size_t *len);

uint64_t vocab_hash(const char *s, size_t len);

#endif
