/* pretokenize.h - pre-tokenizers: split a normalized segment into words that BPE encodes
 * separately. tokenizer.json's Split / ByteLevel / Digits / Punctuation / Metaspace /
 * Whitespace / WhitespaceSplit (Sequence flattens into steps), and GGUF's regex lists. */
#ifndef PAGODA_PRETOKENIZE_H
#define PAGODA_PRETOKENIZE_H

#include <stddef.h>
#include <stdint.h>

#include "text/regex.h"
#include "text/text_buf.h"

enum pretokenize_kind {
  PRETOKENIZE_SPLIT,        /* regex or literal pattern with a behavior */
  PRETOKENIZE_BYTE_LEVEL,   /* optional prefix space, then the GPT-2 regex (use_regex) */
  PRETOKENIZE_DIGITS,       /* digits apart from the rest (each alone if individual) */
  PRETOKENIZE_PUNCTUATION,  /* punctuation characters with a behavior */
  PRETOKENIZE_METASPACE,    /* ' ' -> replacement, prepend per scheme, split before it */
  PRETOKENIZE_WHITESPACE,   /* keep \w+ and [^\w\s]+ runs */
  PRETOKENIZE_WHITESPACE_SPLIT /* drop whitespace, keep the runs between */
};

/* HF's SplitDelimiterBehavior. */
enum split_behavior {
  SPLIT_REMOVED,
  SPLIT_ISOLATED,
  SPLIT_MERGED_WITH_PREVIOUS,
  SPLIT_MERGED_WITH_NEXT,
  SPLIT_CONTIGUOUS
};

enum prepend_scheme { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER };

struct pretokenize_step {
  enum pretokenize_kind kind;
  enum split_behavior behavior;
  int invert;              /* Split: matches are the kept pieces' complement */
  struct regex *re;        /* owned: Split (regex pattern), ByteLevel with use_regex, Whitespace */
  char *lit;               /* owned: Split with a String pattern */
  size_t lit_len;
  int add_prefix_space;    /* ByteLevel */
  int individual;          /* Digits */
  char repl[8];            /* Metaspace replacement (UTF-8) */
  int repl_len;
  enum prepend_scheme prepend;
  int split;               /* Metaspace: split on the replacement */
};

struct pretokenizer {
  struct pretokenize_step *steps; /* (n) owned */
  int n;
};

/* A word: a span of the list's buffer. AT_ORIGIN: it starts at offset 0 of the input text
 * (Metaspace's prepend_scheme "first" only prepends there). */
struct piece {
  uint32_t off, len;
  uint8_t at_origin;
};

struct piece_list {
  struct piece *p; /* (cap) */
  int n, cap;
  struct text_buf buf; /* the pieces' bytes */
};

void piece_list_free(struct piece_list *l);

/* Reusable scratch space of pretokenizer_apply (zero-initialize; free with
 * pretokenize_scratch_free). */
struct pretokenize_scratch {
  struct pretokenize_span *spans; /* (cap) */
  int n, cap;
  struct text_buf buf;
};
void pretokenize_scratch_free(struct pretokenize_scratch *s);

void pretokenizer_free(struct pretokenizer *p);
int pretokenizer_add(struct pretokenizer *p, struct pretokenize_step step);
/* The GPT-2 pattern HF's ByteLevel pre-tokenizer uses. */
extern const char *const pretokenize_gpt2_pattern;

/* Splits IN (LEN bytes, valid UTF-8) into OUT (reset first); TMP and SCRATCH are scratch.
 * 0 or -1. */
int pretokenizer_apply(const struct pretokenizer *p, struct regex_ctx *rc, const char *in,
                       size_t len, int at_origin, struct piece_list *out, struct piece_list *tmp,
                       struct pretokenize_scratch *scratch);

#endif
