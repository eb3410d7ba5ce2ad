/* jinja_filters.h - Jinja2's builtin filters and tests, HF's tojson, and the Python methods of
 * str, dict and list values that chat templates call. */
#ifndef PAGODA_JINJA_FILTERS_H
#define PAGODA_JINJA_FILTERS_H

#include "text/jinja_eval.h"

/* Applies filter NAME to IN; fails with Jinja2's "No filter named 'x'." for unknown names. */
struct jinja_value jinja_filter_apply(struct jinja_eval *ev, const char *name, struct jinja_value in,
                                      const struct jinja_args *a);
/* Runs test NAME on V. */
int jinja_test_apply(struct jinja_eval *ev, const char *name, struct jinja_value v, const struct jinja_args *a);
/* Whether SELF has a Python method NAME that templates may call. */
int jinja_method_exists(struct jinja_value self, const char *name);
/* The Python type name when NAME is a mutating method of SELF, which the immutable sandbox refuses
 * ("access to attribute 'append' of 'list' object is unsafe."); NULL otherwise. */
const char *jinja_method_unsafe(struct jinja_value self, const char *name);
/* Python's FMT % ARGS (a tuple supplies several arguments). */
struct jinja_value jinja_percent_format(struct jinja_eval *ev, struct jinja_value fmt, struct jinja_value args);
/* Calls method NAME of SELF. */
struct jinja_value jinja_method_call(struct jinja_eval *ev, struct jinja_value self, const char *name,
                                     const struct jinja_args *a);

/* markupsafe.escape: & < > " ' as entities; the result is Markup. */
struct jinja_value jinja_html_escape(struct jinja_eval *ev, struct jinja_value v);

#endif
