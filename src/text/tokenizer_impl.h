/* tokenizer_impl.h - the tokenizer's internal representation, shared by the encoder
 * (tokenizer.c), the decoder (detokenizer.c) and the two loaders (tokenizer_json.c,
 * tokenizer_gguf.c). Both file formats are lowered into this one description of the HF
 * pipeline: added tokens -> normalizer -> pre-tokenizer -> BPE model -> post-processor, and
 * the decoder chain for the way back. */
#ifndef PAGODA_TOKENIZER_IMPL_H
#define PAGODA_TOKENIZER_IMPL_H

#include <stdint.h>

#include "text/bpe.h"
#include "text/normalize.h"
#include "text/pretokenize.h"
#include "text/tokenizer.h"
#include "text/vocab.h"

enum tokenizer_model {
  TOKENIZER_MODEL_BPE, /* merges by rank (tokenizer.json BPE, GGUF "gpt2") */
  TOKENIZER_MODEL_SPM  /* merges by score (GGUF "llama": SentencePiece BPE) */
};

/* A token matched in the raw text before normalization (HF added_tokens, GGUF control and
 * user-defined tokens). */
struct added_token {
  int32_t id;
  char *text; /* owned, NUL-terminated; what is matched (normalized when `normalized`) */
  uint32_t len;
  uint8_t special;     /* matched only with parse_special; dropped by skip_special */
  uint8_t lstrip;      /* swallows whitespace on its left */
  uint8_t rstrip;      /* ... and on its right */
  uint8_t single_word; /* matches only between non-word characters */
  uint8_t normalized;  /* matched in the normalized text of each segment, not the raw text */
};

enum decode_kind {
  DECODE_BYTE_LEVEL,    /* GPT-2 alphabet -> bytes (the token's own bytes if not in it) */
  DECODE_BYTE_FALLBACK, /* "<0xXX>" -> that byte */
  DECODE_REPLACE,       /* a -> b in each token */
  DECODE_METASPACE,     /* replacement -> ' '; dropped in the first token if strip_first */
  DECODE_STRIP          /* strip `count` leading `ch` from the (fused) output */
};

struct decode_step {
  enum decode_kind kind;
  char *a, *b; /* owned: Replace pattern and content, Metaspace replacement in a */
  size_t a_len, b_len;
  int strip_first; /* Metaspace */
  int count;       /* Strip */
  char ch;         /* Strip */
};

struct tokenizer {
  struct vocab vocab;
  enum tokenizer_model model;
  struct bpe_merges merges;   /* rank model */
  int byte_level;             /* the vocabulary is written in the GPT-2 byte alphabet */
  int32_t byte_token[256];    /* id of "<0xXX>", -1 if absent */
  int byte_fallback;          /* unknown characters become their byte tokens */
  int fuse_unk;               /* consecutive unknowns become one unk */
  int ignore_merges;          /* a word that is a token is taken whole */
  int32_t unk_id;             /* -1 when none */
  int spm_add_space;          /* SPM: each raw segment gets a leading space */
  int ws_chunks;              /* no token has U+2581 after another character, so no merge can
                                 cross "x|U+2581": words are merged chunk by chunk (same result,
                                 but a text without pre-tokenizer is not one huge word) */

  struct normalizer norm;
  struct pretokenizer pre;

  struct added_token *added;  /* (num_added) owned */
  int num_added;
  int num_added_normalized;   /* how many of them have `normalized` */
  int32_t *added_index;       /* (num_added) indices into added grouped by first byte, longest first */
  int32_t added_start[257];   /* added_index[added_start[b] .. added_start[b+1]) start with b */
  uint8_t added_second[256][32]; /* bit c of [b]: some added token starts with bytes b, c (or
                                    is the single byte b) - a quick "no match here" test */

  struct decode_step *dec;    /* (num_dec) owned */
  int num_dec;

  uint8_t *special;           /* (vocab.n) 1 for special tokens (skip_special drops them) */
  uint8_t *eog;               /* (vocab.n) 1 for end-of-generation tokens */
  uint8_t *added_only;        /* (vocab.n) or NULL: 1 for an HF added token that is not in the
                                 model's vocab, which the BPE model itself never produces */
  uint8_t *norm_added;        /* (vocab.n) 1 when the id is a `normalized` added token: HF
                                 decodes it as its normalized content (norm_by_id) */
  int32_t *norm_by_id;        /* (num_norm_by_id) indices into added, sorted by id */
  int num_norm_by_id;
  int32_t bos_id, eos_id;
  int add_bos, add_eos;
  char *chat_template;        /* owned or NULL */
  uint32_t serial;            /* unique per loaded tokenizer: keys the per-thread word cache */
};

/* Loaders fill a zeroed tokenizer (vocab first); tokenizer_finish completes the derived
 * tables. Both return 0 or -1 with err_last() set. */
int tokenizer_load_json(struct tokenizer *t, const char *json_path, const char *dir);
int tokenizer_load_gguf(struct tokenizer *t, const char *path);
int tokenizer_finish(struct tokenizer *t);

/* Appends an added token (copies TEXT). */
int tokenizer_add_added(struct tokenizer *t, int32_t id, const char *text, size_t len, int special,
                        int lstrip, int rstrip, int single_word, int normalized);
int tokenizer_add_decode(struct tokenizer *t, struct decode_step step);
/* The text the decoder starts from for ID (a normalized added token's normalized content, else
 * the vocabulary text); NULL for an id without text. */
const char *tokenizer_decode_text(const struct tokenizer *t, int32_t id, size_t *len);
/* Marks the usual end-of-turn tokens (by text) as end of generation. */
void tokenizer_mark_eog_by_text(struct tokenizer *t);

#endif
