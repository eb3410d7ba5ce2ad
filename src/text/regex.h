/* regex.h - PCRE2 (JIT, UTF + UCP) patterns as the pre-tokenizers and normalizers use them:
 * compile once per tokenizer, match with per-call match data. */
#ifndef PAGODA_REGEX_H
#define PAGODA_REGEX_H

#include <stddef.h>

struct regex;

/* Per-call matching state (match data, JIT stack). One per thread/call; free with
 * regex_ctx_free. NULL on allocation failure. */
struct regex_ctx;
struct regex_ctx *regex_ctx_create(void);
void regex_ctx_free(struct regex_ctx *c);

/* Compiles PATTERN (LEN bytes, Oniguruma/Perl syntax as found in tokenizer.json) with UTF,
 * UCP and MULTILINE (Oniguruma's ^ and $ are line anchors). NULL with err_last() set. Free
 * with regex_free. */
struct regex *regex_compile(const char *pattern, size_t len);
void regex_free(struct regex *r);

/* Finds the first non-empty match in S[0, LEN) at or after START (S must be valid UTF-8 and
 * START a character boundary). Returns 1 and sets [*MS, *ME), 0 when none, -1 on a matching
 * error (err_last()). */
int regex_find(const struct regex *r, struct regex_ctx *c, const char *s, size_t len,
               size_t start, size_t *ms, size_t *me);

#endif
