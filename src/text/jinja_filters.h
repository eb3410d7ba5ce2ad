/* jinja_filters.h - Jinja2's builtin filters and tests, and HF's tojson. */
#ifndef PAGODA_JINJA_FILTERS_H
#define PAGODA_JINJA_FILTERS_H

#include "text/jinja_eval.h"

/* Applies filter NAME to IN; fails with Jinja2's "No filter named 'x'." for unknown names. */
struct jinja_value jinja_filter_apply(struct jinja_eval *ev, const char *name, struct jinja_value in,
                                      const struct jinja_args *a);
/* Runs test NAME on V. */
int jinja_test_apply(struct jinja_eval *ev, const char *name, struct jinja_value v,
                     const struct jinja_args *a);
/* The items filter: (key, value) tuples of a mapping; an undefined gives none. */
struct jinja_value jinja_filter_items(struct jinja_eval *ev, struct jinja_value v);
/* markupsafe.escape: & < > " ' as entities; the result is Markup. */
struct jinja_value jinja_html_escape(struct jinja_eval *ev, struct jinja_value v);

#endif
