/* tokenizer.h - text <-> token ids for SentencePiece-style and byte-level BPE vocabularies,
 * loaded from tokenizer.json (+ tokenizer_config.json) or GGUF metadata, and the streaming
 * detokenizer. One implementation behind one interface. */
#ifndef PAGODA_TOKENIZER_H
#define PAGODA_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

struct tokenizer;

/* PATH: a model directory (tokenizer.json [+ tokenizer_config.json]), a tokenizer.json file, or
 * a .gguf file (tokenizer.ggml.* metadata). NULL with err_last() set. Free with tokenizer_free. */
struct tokenizer *tokenizer_load(const char *path);
void tokenizer_free(struct tokenizer *t);

/* Encodes LEN bytes of TEXT. ADD_SPECIAL: add BOS/EOS as the tokenizer's config says.
 * PARSE_SPECIAL: special/added tokens written in the text become their ids (chat prompts only;
 * never for user content by default). Writes at most MAX_IDS ids and returns how many the
 * whole encoding has (call again with a larger buffer if that is > MAX_IDS), or -1 on error. */
int tokenizer_encode(const struct tokenizer *t, const char *text, size_t len, int add_special,
                     int parse_special, int32_t *ids, int max_ids);

int tokenizer_vocab_size(const struct tokenizer *t);
int tokenizer_bos_id(const struct tokenizer *t); /* -1 when none */
int tokenizer_eos_id(const struct tokenizer *t); /* -1 when none */
/* 1 if ID ends generation (EOS and end-of-turn tokens such as <|eot_id|>, <|im_end|>). */
int tokenizer_is_eog(const struct tokenizer *t, int32_t id);
/* The raw text of token ID (as stored in the vocabulary), or NULL when out of range. */
const char *tokenizer_token_text(const struct tokenizer *t, int32_t id, size_t *len);
/* The chat template (tokenizer_config.json's chat_template or GGUF tokenizer.chat_template);
 * NULL when the model has none. Owned by the tokenizer. */
const char *tokenizer_chat_template(const struct tokenizer *t);

/* Decodes N ids into OUT (cap bytes, NUL-terminated when room). Returns the full length in
 * bytes (may exceed cap-1), or -1 on error (e.g. id out of range). SKIP_SPECIAL drops special
 * tokens' text. */
int tokenizer_decode(const struct tokenizer *t, const int32_t *ids, int n, int skip_special,
                     char *out, size_t cap);

/* Streaming detokenizer: push one id at a time, get the new text that is complete UTF-8;
 * the concatenation of all deltas equals tokenizer_decode of all ids. */
struct detokenizer;
/* NULL on error. Free with detokenizer_free. */
struct detokenizer *detokenizer_create(const struct tokenizer *t, int skip_special);
void detokenizer_free(struct detokenizer *d);
void detokenizer_reset(struct detokenizer *d);
/* Marks D as decoding the middle of a text: the decoder steps that treat the start of a text
 * apart (Strip's leading spaces, Metaspace's first replacement) no longer apply. Call it after
 * priming D with the prompt, so that a continuation keeps its leading space even when the
 * prompt decodes to nothing (a lone BOS), as llama.cpp prints it: [BOS] + "\u2581Once" gives
 * " Once" (tokenizer_decode of the whole sequence still gives "Once", as HF does). */
void detokenizer_set_continuation(struct detokenizer *d);
/* Appends the text made available by ID to OUT (cap bytes, NUL-terminated); returns the number
 * of bytes written, or -1 on error (id out of range, or cap too small: cap >= 256 always works).
 * Text that does not fit in CAP (a token longer than cap) is kept and comes first in the next
 * push or flush, so the deltas still concatenate to the full decode (cap >= 5 suffices). */
int detokenizer_push(struct detokenizer *d, int32_t id, char *out, size_t cap);
/* Emits whatever is held back (an incomplete UTF-8 sequence becomes U+FFFD as HF does); when
 * that does not fit in CAP, call it again until it returns 0. */
int detokenizer_flush(struct detokenizer *d, char *out, size_t cap);

#endif
