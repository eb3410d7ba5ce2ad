/* jinja_wrap.h - the truncate and wordwrap filters (Jinja2 semantics, defaults included). */
#ifndef PAGODA_JINJA_WRAP_H
#define PAGODA_JINJA_WRAP_H

#include "text/jinja_eval.h"

/* s|truncate(length=255, killwords=False, end='...', leeway=5): lengths in code points. */
struct jinja_value jinja_truncate(struct jinja_eval *ev, struct jinja_value s, const struct jinja_args *a);
/* s|wordwrap(width=79, break_long_words=True, wrapstring='\n', break_on_hyphens=True): each
 * line of S through Python's textwrap.wrap (expand_tabs and replace_whitespace off). */
struct jinja_value jinja_wordwrap(struct jinja_eval *ev, struct jinja_value s, const struct jinja_args *a);

#endif
