/* jinja_lexer.h - splits a chat template into tokens, applying Jinja2's whitespace rules as HF
 * configures them (trim_blocks, lstrip_blocks, no trailing newline kept, - and + markers). */
#ifndef PAGODA_JINJA_LEXER_H
#define PAGODA_JINJA_LEXER_H

#include "text/jinja_value.h"

enum jinja_tok {
  JINJA_TOK_TEXT,        /* literal template text (value: string) */
  JINJA_TOK_VAR_BEGIN,   /* {{ */
  JINJA_TOK_VAR_END,     /* }} */
  JINJA_TOK_BLOCK_BEGIN, /* {% */
  JINJA_TOK_BLOCK_END,   /* %} */
  JINJA_TOK_NAME,        /* identifier (text) */
  JINJA_TOK_STRING,      /* string literal, escapes decoded (value) */
  JINJA_TOK_INT,         /* value */
  JINJA_TOK_FLOAT,       /* value */
  JINJA_TOK_OP,          /* operator or punctuation (text) */
  JINJA_TOK_EOF,
};

struct jinja_token {
  enum jinja_tok type;
  int line;
  size_t pos;       /* byte offset in the lexed source (errors report it as line and column) */
  const char *text; /* NUL-terminated: name or operator */
  struct jinja_value value;
};

/* Tokenizes SRC (N bytes); the token array (ending in JINJA_TOK_EOF) lives in ST's arena.
 * Fails through jinja_fail on malformed input. */
struct jinja_token *jinja_lex(struct jinja_state *st, const char *src, size_t n, size_t *num_tokens);

#endif
