/* jinja_string.h - Python's str operations on the interpreter's UTF-8 strings. Functions taking a
 * value convert it with str() first; all results live in the render's arena. */
#ifndef PAGODA_JINJA_STRING_H
#define PAGODA_JINJA_STRING_H

#include "text/jinja_eval.h"

enum jinja_case {
  JINJA_CASE_UPPER,
  JINJA_CASE_LOWER,
  JINJA_CASE_TITLE_WORDS, /* Jinja2's title filter: first letter of each word upper, rest lower */
  JINJA_CASE_CAPITALIZE,  /* str.capitalize */
  JINJA_CASE_PY_TITLE,    /* str.title */
};

/* Python's str.isspace for one code point. */
int jinja_string_isspace(int32_t c);
/* The code point at S[*i] (an invalid byte reads as itself); advances *i. */
int32_t jinja_string_next(const char *s, size_t n, size_t *i);
/* Python's str.splitlines boundaries: the end of the line that starts at S[I] (a break, or N),
 * with *BRK the length of the break there (\r\n is one; also \v \f \x1c-\x1e U+0085
 * U+2028 U+2029), 0 at N. */
size_t jinja_line_end(const char *s, size_t i, size_t n, size_t *brk);
/* Appends CP as UTF-8. */
void jinja_string_put(struct jinja_buf *b, int32_t cp);
/* Whether CP has case (an upper or lower form other than itself). */
int jinja_string_is_cased(int32_t c);

struct jinja_value jinja_string_case(struct jinja_eval *ev, struct jinja_value v, int mode);
/* strip/lstrip/rstrip: WHICH 1 left, 2 right, 3 both; CHARS NULL strips whitespace. */
struct jinja_value jinja_string_strip(struct jinja_eval *ev, struct jinja_value v,
                                      const struct jinja_value *chars, int which);
/* str.split / str.rsplit (SEP NULL or none: runs of whitespace; MAXSPLIT < 0: no limit). */
struct jinja_value jinja_string_split(struct jinja_eval *ev, struct jinja_value v,
                                      const struct jinja_value *sep, int64_t maxsplit);
struct jinja_value jinja_string_rsplit(struct jinja_eval *ev, struct jinja_value v,
                                       const struct jinja_value *sep, int64_t maxsplit);
/* str.replace (COUNT < 0: all). */
struct jinja_value jinja_string_replace(struct jinja_eval *ev, struct jinja_value v,
                                        const struct jinja_value *old, const struct jinja_value *new,
                                        int64_t count);
/* startswith (ENDS 0) / endswith (ENDS 1); ARG a string or a tuple of them. */
int jinja_string_affix(struct jinja_eval *ev, struct jinja_value v, const struct jinja_value *arg,
                       int ends);
/* SEP.join(str(item) for item in SEQ), items optionally through ATTRIBUTE. */
struct jinja_value jinja_string_join(struct jinja_eval *ev, struct jinja_value seq, const char *sep,
                                     size_t sep_len, const struct jinja_value *attribute);
/* FMT % ARGS, printf-style (a tuple supplies several arguments). */
struct jinja_value jinja_string_percent(struct jinja_eval *ev, struct jinja_value fmt,
                                        struct jinja_value args);
/* SELF.format(*args, **kwargs). */
struct jinja_value jinja_string_format(struct jinja_eval *ev, struct jinja_value self,
                                       const struct jinja_args *a);

#endif
