/* jinja_methods.h - the Python methods of str, dict and list values that chat templates call. */
#ifndef PAGODA_JINJA_METHODS_H
#define PAGODA_JINJA_METHODS_H

#include "text/jinja_eval.h"

/* Whether SELF has a Python method NAME that templates may call. */
int jinja_method_exists(struct jinja_value self, const char *name);
/* The Python type name when NAME is a mutating method of SELF, which the immutable sandbox refuses
 * ("access to attribute 'append' of 'list' object is unsafe."); NULL otherwise. */
const char *jinja_method_unsafe(struct jinja_value self, const char *name);
/* Calls method NAME of SELF. */
struct jinja_value jinja_method_call(struct jinja_eval *ev, struct jinja_value self, const char *name,
                                     const struct jinja_args *a);

#endif
