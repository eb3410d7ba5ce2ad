/* jinja_parser.h - the syntax tree of a chat template and the parser that builds it (Jinja2's
 * grammar and operator precedence for the statements and expressions templates use). */
#ifndef PAGODA_JINJA_PARSER_H
#define PAGODA_JINJA_PARSER_H

#include "text/jinja_lexer.h"
#include "text/jinja_value.h"

enum jinja_node_kind {
  /* statements */
  JINJA_N_BODY,         /* args: statements */
  JINJA_N_TEXT,         /* value: the text */
  JINJA_N_OUTPUT,       /* a: expression to print */
  JINJA_N_IF,           /* a: condition; body; else_body (an elif is a nested JINJA_N_IF) */
  JINJA_N_FOR,          /* a: target; b: iterable; c: filter condition or NULL; body; else_body */
  JINJA_N_SET,          /* a: target; b: value */
  JINJA_N_SET_BLOCK,    /* a: target; b: filter chain or NULL; body */
  JINJA_N_MACRO,        /* name; params (kwnames, kwargs = defaults or NULL); body */
  JINJA_N_CALL_BLOCK,   /* a: the call; params of caller (kwnames, kwargs); body */
  JINJA_N_FILTER_BLOCK, /* b: filter chain whose innermost input is the body; body */
  JINJA_N_WITH,         /* kwnames = kwargs; body */
  JINJA_N_BREAK,
  JINJA_N_CONTINUE,
  /* expressions */
  JINJA_N_CONST,   /* value */
  JINJA_N_NAME,    /* name */
  JINJA_N_NSREF,   /* name.attr (assignment target only) */
  JINJA_N_GETATTR, /* a.name */
  JINJA_N_GETITEM, /* a[b] */
  JINJA_N_SLICE,   /* a:b:c, each may be NULL (inside a JINJA_N_GETITEM) */
  JINJA_N_CALL,    /* a(args, kwnames=kwargs) */
  JINJA_N_FILTER,  /* a|name(args, kwargs); a NULL: the block being filtered */
  JINJA_N_TEST,    /* a is [not] name(args); op: 1 when negated */
  JINJA_N_UNARY,   /* op ('-', '+') a */
  JINJA_N_BINARY,  /* a op b, op one of + - * / // % ** ~ (as JINJA_OP_*) */
  JINJA_N_COMPARE, /* a op b, op one of == != < <= > >= in notin */
  JINJA_N_AND,
  JINJA_N_OR,
  JINJA_N_NOT,
  JINJA_N_COND,  /* b if a else c (c NULL: undefined) */
  JINJA_N_LIST,  /* args */
  JINJA_N_TUPLE, /* args */
  JINJA_N_DICT,  /* args: keys; kwargs: values */
};

enum jinja_op {
  JINJA_OP_ADD = 1,
  JINJA_OP_SUB,
  JINJA_OP_MUL,
  JINJA_OP_DIV,
  JINJA_OP_FLOORDIV,
  JINJA_OP_MOD,
  JINJA_OP_POW,
  JINJA_OP_CONCAT,
  JINJA_OP_EQ,
  JINJA_OP_NE,
  JINJA_OP_LT,
  JINJA_OP_LE,
  JINJA_OP_GT,
  JINJA_OP_GE,
  JINJA_OP_IN,
  JINJA_OP_NOTIN,
};

struct jinja_node {
  enum jinja_node_kind kind;
  int line;
  size_t pos; /* byte offset of its first token in the source */
  int op;
  const char *name; /* identifier, attribute, filter or test name */
  const char *attr; /* JINJA_N_NSREF attribute */
  struct jinja_value value;
  struct jinja_node *a, *b, *c;
  struct jinja_node *body, *else_body;
  struct jinja_node **args; /* (num_args) */
  size_t num_args;
  const char **kwnames;       /* (num_kwargs) */
  struct jinja_node **kwargs; /* (num_kwargs) entries may be NULL (parameters without defaults) */
  size_t num_kwargs;
};

/* Parses tokens into a JINJA_N_BODY tree in ST's arena; fails through jinja_fail. */
struct jinja_node *jinja_parse(struct jinja_state *st, const struct jinja_token *toks, size_t n);

#endif
