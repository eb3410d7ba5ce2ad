/* jinja_eval.h - the evaluator of a parsed chat template: scopes, loops, macros, calls, and the
 * attribute/item access rules of Jinja2's sandboxed environment. */
#ifndef PAGODA_JINJA_EVAL_H
#define PAGODA_JINJA_EVAL_H

#include "text/jinja_parser.h"
#include "text/jinja_value.h"

/* A scope: for-loop iterations, macro calls and with blocks push one; if blocks do not. */
struct jinja_frame {
  struct jinja_frame *parent;
  size_t n, cap;
  const char **names;       /* (cap) */
  struct jinja_value *vals; /* (cap) */
};

enum jinja_callable_kind {
  JINJA_FN_GLOBAL, /* range, dict, namespace, raise_exception, strftime_now (name) */
  JINJA_FN_METHOD, /* a Python method of self: "a".upper, d.items, loop.cycle (name) */
  JINJA_FN_MACRO,  /* a macro or the caller of a call block (node, closure) */
  JINJA_FN_JOINER, /* joiner(sep): '' on the first call, then sep (self) */
};

struct jinja_callable {
  enum jinja_callable_kind kind;
  const char *name;
  struct jinja_value self;
  const struct jinja_node *node; /* JINJA_N_MACRO or JINJA_N_CALL_BLOCK */
  struct jinja_frame *closure;
  struct jinja_value caller; /* for a macro invoked by a call block; else undefined */
  int used;                  /* JINJA_FN_JOINER: called before */
};

/* Arguments of a call, filter, test or method. */
struct jinja_args {
  struct jinja_value *pos; /* (n) */
  size_t n;
  const char **kwnames;   /* (num_kw) */
  struct jinja_value *kw; /* (num_kw) */
  size_t num_kw;
};

struct jinja_eval {
  struct jinja_state *st;
  struct jinja_buf *out;             /* where text goes now (macro bodies and set blocks swap it) */
  struct jinja_frame *frame;         /* innermost scope */
  const struct jinja_frame *globals; /* the context's variables (as passed, before any set) */
  struct jinja_value filter_input;   /* body text of a filter block or filtered set block */
  int loop_depth;
};

/* Renders BODY into ev->out. */
void jinja_eval_render(struct jinja_eval *ev, const struct jinja_node *body);

/* Jinja2 rules for obj.name and obj[key]: missing -> undefined carrying Jinja2's message. */
struct jinja_value jinja_eval_getattr(struct jinja_eval *ev, struct jinja_value obj, const char *name);
struct jinja_value jinja_eval_getitem(struct jinja_eval *ev, struct jinja_value obj,
                                      struct jinja_value key);
/* Calls a callable value. */
struct jinja_value jinja_eval_call(struct jinja_eval *ev, struct jinja_value fn,
                                   const struct jinja_args *a);
/* The items that iterating V yields (dict: keys, string: characters); *n their count. */
struct jinja_value *jinja_eval_iterate(struct jinja_eval *ev, struct jinja_value v, size_t *n);
/* The keyword argument NAME, else positional argument I, else NULL. */
const struct jinja_value *jinja_arg(const struct jinja_args *a, size_t i, const char *name);

/* Argument conversions with Python's errors: an int (NULL or none: DEF), truthiness (NULL: DEF),
 * a string (WHAT names it in the message). */
int64_t jinja_arg_int(struct jinja_eval *ev, const struct jinja_value *v, int64_t def);
int jinja_arg_bool(const struct jinja_value *v, int def);
const char *jinja_arg_str(struct jinja_eval *ev, const struct jinja_value *v, const char *what);

/* Sets NAME in frame F (replacing it when present). */
void jinja_frame_set(struct jinja_state *st, struct jinja_frame *f, const char *name,
                     struct jinja_value v);
/* Appends NAME without looking for it; lookups find the last binding. */
void jinja_frame_push(struct jinja_state *st, struct jinja_frame *f, const char *name,
                      struct jinja_value v);

#endif
