/* jinja_parser.c - recursive-descent parser for the Jinja subset of chat templates; the
 * precedence ladder is Jinja2's: condexpr < or < and < not < compare < +,- < ~ < *,/,//,% < **
 * < unary -,+ < postfix (. [] ()) and filters/tests. */
#include "text/jinja_parser.h"

#include <stdio.h>
#include <string.h>

struct jinja_parser {
  struct jinja_state *st;
  const struct jinja_token *t; /* (n) ending in JINJA_TOK_EOF */
  size_t n, pos;
};

/* Growable arrays of node pointers and of names in the arena. */
struct jinja_nodes {
  struct jinja_node **v;
  size_t n, cap;
};

struct jinja_names {
  const char **v;
  size_t n, cap;
};

/* Room for one more element in the arena array V holding NUM_ITEMS of *CAP elements of SIZE bytes: V itself
 * while it has room, else a copy of twice the capacity (*CAP updated; the arena frees the old one with the rest). */
static void *arena_grow(struct jinja_state *st, void *v, size_t num_items, size_t *cap, size_t size) {
  if (num_items < *cap)
    return v;
  size_t new_cap = *cap ? *cap * 2 : 4;
  void *nv = jinja_alloc(st, new_cap * size);
  if (num_items)
    memcpy(nv, v, num_items * size);
  *cap = new_cap;
  return nv;
}

static void jinja_nodes_push(struct jinja_state *st, struct jinja_nodes *a, struct jinja_node *x) {
  a->v = arena_grow(st, a->v, a->n, &a->cap, sizeof *a->v);
  a->v[a->n++] = x;
}

static void jinja_names_push(struct jinja_state *st, struct jinja_names *a, const char *x) {
  a->v = arena_grow(st, a->v, a->n, &a->cap, sizeof *a->v);
  a->v[a->n++] = x;
}

static const struct jinja_token *cur(struct jinja_parser *p) { return &p->t[p->pos]; }
static const struct jinja_token *peek2(struct jinja_parser *p) {
  return p->pos + 1 < p->n ? &p->t[p->pos + 1] : &p->t[p->n - 1];
}
static void advance(struct jinja_parser *p) {
  if (p->pos + 1 < p->n)
    p->pos++;
  p->st->at = p->t[p->pos].pos;
}

static int is_op(const struct jinja_token *t, const char *op) {
  return t->type == JINJA_TOK_OP && strcmp(t->text, op) == 0;
}
static int is_name(const struct jinja_token *t, const char *name) {
  return t->type == JINJA_TOK_NAME && strcmp(t->text, name) == 0;
}

static const char *describe(const struct jinja_token *t) {
  switch (t->type) {
  case JINJA_TOK_TEXT:
    return "template data";
  case JINJA_TOK_VAR_BEGIN:
    return "begin of print statement";
  case JINJA_TOK_VAR_END:
    return "end of print statement";
  case JINJA_TOK_BLOCK_BEGIN:
    return "begin of statement block";
  case JINJA_TOK_BLOCK_END:
    return "end of statement block";
  case JINJA_TOK_STRING:
    return "string";
  case JINJA_TOK_INT:
    return "integer";
  case JINJA_TOK_FLOAT:
    return "float";
  case JINJA_TOK_EOF:
    return "end of template";
  default:
    return t->text;
  }
}

static _Noreturn void unexpected(struct jinja_parser *p, const char *expected) {
  const struct jinja_token *t = cur(p);
  if (expected)
    jinja_fail(p->st, "expected token '%s', got '%s'", expected, describe(t));
  jinja_fail(p->st, "unexpected '%s'", describe(t));
}

static void expect_op(struct jinja_parser *p, const char *op) {
  if (!is_op(cur(p), op))
    unexpected(p, op);
  advance(p);
}

static const char *expect_name(struct jinja_parser *p) {
  if (cur(p)->type != JINJA_TOK_NAME)
    unexpected(p, "name");
  const char *s = cur(p)->text;
  advance(p);
  return s;
}

/* In a comma-separated list ended by CLOSE (a trailing comma allowed), after NUM_ITEMS items: 1 when another item
 * follows, the parser past its comma; 0 at CLOSE, which the caller consumes. */
static int list_has_next(struct jinja_parser *p, const char *close, size_t num_items) {
  if (is_op(cur(p), close))
    return 0;
  if (num_items) {
    expect_op(p, ",");
    if (is_op(cur(p), close))
      return 0;
  }
  return 1;
}

static void expect_block_end(struct jinja_parser *p) {
  if (cur(p)->type != JINJA_TOK_BLOCK_END)
    unexpected(p, "end of statement block");
  advance(p);
}

static struct jinja_node *node_new(struct jinja_parser *p, enum jinja_node_kind kind) {
  struct jinja_node *n = jinja_alloc(p->st, sizeof(*n));
  memset(n, 0, sizeof(*n));
  n->kind = kind;
  n->line = cur(p)->line;
  n->pos = cur(p)->pos;
  return n;
}

static void enter(struct jinja_parser *p) {
  if (++p->st->depth > JINJA_MAX_DEPTH)
    jinja_fail(p->st, "template nesting exceeds the limit of %d", JINJA_MAX_DEPTH);
}
static void leave(struct jinja_parser *p) { p->st->depth--; }

static struct jinja_node *parse_expression(struct jinja_parser *p, int with_condexpr);
static struct jinja_node *parse_unary(struct jinja_parser *p, int with_filter);
static struct jinja_node *parse_primary(struct jinja_parser *p);
static struct jinja_node *parse_postfix(struct jinja_parser *p, struct jinja_node *node);
static struct jinja_node *parse_filter(struct jinja_parser *p, struct jinja_node *node,
                                       int start_inline);

static int is_tuple_end(struct jinja_parser *p, const char *extra_end) {
  const struct jinja_token *t = cur(p);
  if (t->type == JINJA_TOK_VAR_END || t->type == JINJA_TOK_BLOCK_END || is_op(t, ")"))
    return 1;
  return extra_end && is_name(t, extra_end);
}

static struct jinja_node *parse_tuple(struct jinja_parser *p, int with_condexpr, const char *extra_end,
                                      int explicit_parens) {
  struct jinja_nodes items = {0};
  int is_tuple = 0;
  for (;;) {
    if (items.n)
      expect_op(p, ",");
    if (is_tuple_end(p, extra_end))
      break;
    jinja_nodes_push(p->st, &items, parse_expression(p, with_condexpr));
    if (is_op(cur(p), ","))
      is_tuple = 1;
    else
      break;
  }
  if (!is_tuple) {
    if (items.n)
      return items.v[0];
    if (!explicit_parens)
      jinja_fail(p->st, "Expected an expression, got '%s'", describe(cur(p)));
  }
  struct jinja_node *n = node_new(p, JINJA_N_TUPLE);
  n->args = items.v;
  n->num_args = items.n;
  return n;
}

static void parse_call_args(struct jinja_parser *p, struct jinja_node *n) {
  struct jinja_nodes args = {0}, kwargs = {0};
  struct jinja_names kwnames = {0};
  expect_op(p, "(");
  int need_comma = 0;
  while (!is_op(cur(p), ")")) {
    if (need_comma) {
      expect_op(p, ",");
      if (is_op(cur(p), ")"))
        break;
    }
    if (is_op(cur(p), "*") || is_op(cur(p), "**"))
      jinja_fail(p->st, "*args and **kwargs in calls are not supported");
    if (cur(p)->type == JINJA_TOK_NAME && is_op(peek2(p), "=")) {
      jinja_names_push(p->st, &kwnames, cur(p)->text);
      advance(p);
      advance(p);
      jinja_nodes_push(p->st, &kwargs, parse_expression(p, 1));
    } else {
      if (kwargs.n)
        jinja_fail(p->st, "invalid syntax for function call expression");
      jinja_nodes_push(p->st, &args, parse_expression(p, 1));
    }
    need_comma = 1;
  }
  expect_op(p, ")");
  n->args = args.v;
  n->num_args = args.n;
  n->kwargs = kwargs.v;
  n->kwnames = kwnames.v;
  n->num_kwargs = kwargs.n;
}

/* CALLEE(...): the parser stands at "(". */
static struct jinja_node *parse_call(struct jinja_parser *p, struct jinja_node *callee) {
  struct jinja_node *c = node_new(p, JINJA_N_CALL);
  c->a = callee;
  parse_call_args(p, c);
  return c;
}

static const char *parse_dotted_name(struct jinja_parser *p) {
  const char *name = expect_name(p);
  while (is_op(cur(p), ".")) {
    advance(p);
    const char *more = expect_name(p);
    size_t a = strlen(name), b = strlen(more);
    char *s = jinja_alloc(p->st, a + b + 2);
    memcpy(s, name, a);
    s[a] = '.';
    memcpy(s + a + 1, more, b + 1);
    name = s;
  }
  return name;
}

static struct jinja_node *parse_filter(struct jinja_parser *p, struct jinja_node *node,
                                       int start_inline) {
  while (is_op(cur(p), "|") || start_inline) {
    if (!start_inline)
      advance(p);
    start_inline = 0;
    struct jinja_node *f = node_new(p, JINJA_N_FILTER);
    f->name = parse_dotted_name(p);
    f->a = node;
    if (is_op(cur(p), "("))
      parse_call_args(p, f);
    node = f;
  }
  return node;
}

static struct jinja_node *parse_test(struct jinja_parser *p, struct jinja_node *node) {
  advance(p); /* is */
  struct jinja_node *t = node_new(p, JINJA_N_TEST);
  if (is_name(cur(p), "not")) {
    advance(p);
    t->op = 1;
  }
  t->name = parse_dotted_name(p);
  t->a = node;
  const struct jinja_token *c = cur(p);
  if (is_op(c, "(")) {
    parse_call_args(p, t);
  } else if ((c->type == JINJA_TOK_NAME || c->type == JINJA_TOK_STRING || c->type == JINJA_TOK_INT ||
              c->type == JINJA_TOK_FLOAT || is_op(c, "[") || is_op(c, "{")) &&
             !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
    if (is_name(c, "is"))
      jinja_fail(p->st, "You cannot chain multiple tests with is");
    struct jinja_node *arg = parse_postfix(p, parse_primary(p));
    t->args = jinja_alloc(p->st, sizeof(struct jinja_node *));
    t->args[0] = arg;
    t->num_args = 1;
  }
  return t;
}

static struct jinja_node *parse_subscribed(struct jinja_parser *p) {
  struct jinja_node *parts[3] = {NULL, NULL, NULL};
  if (is_op(cur(p), ":")) {
    advance(p);
  } else {
    struct jinja_node *e = parse_expression(p, 1);
    if (!is_op(cur(p), ":"))
      return e;
    advance(p);
    parts[0] = e;
  }
  if (!is_op(cur(p), "]") && !is_op(cur(p), ",") && !is_op(cur(p), ":"))
    parts[1] = parse_expression(p, 1);
  if (is_op(cur(p), ":")) {
    advance(p);
    if (!is_op(cur(p), "]") && !is_op(cur(p), ","))
      parts[2] = parse_expression(p, 1);
  }
  struct jinja_node *s = node_new(p, JINJA_N_SLICE);
  s->a = parts[0];
  s->b = parts[1];
  s->c = parts[2];
  return s;
}

static struct jinja_node *parse_postfix(struct jinja_parser *p, struct jinja_node *node) {
  for (;;) {
    const struct jinja_token *t = cur(p);
    if (is_op(t, ".")) {
      advance(p);
      const struct jinja_token *a = cur(p);
      if (a->type == JINJA_TOK_NAME) {
        struct jinja_node *g = node_new(p, JINJA_N_GETATTR);
        g->a = node;
        g->name = a->text;
        advance(p);
        node = g;
      } else if (a->type == JINJA_TOK_INT) {
        struct jinja_node *g = node_new(p, JINJA_N_GETITEM);
        struct jinja_node *k = node_new(p, JINJA_N_CONST);
        k->value = a->value;
        g->a = node;
        g->b = k;
        advance(p);
        node = g;
      } else {
        jinja_fail(p->st, "expected name or number");
      }
    } else if (is_op(t, "[")) {
      advance(p);
      struct jinja_nodes args = {0};
      while (!is_op(cur(p), "]")) {
        if (args.n)
          expect_op(p, ",");
        jinja_nodes_push(p->st, &args, parse_subscribed(p));
      }
      expect_op(p, "]");
      /* x[] is accepted by Jinja2 as x[()] (an empty tuple key). */
      struct jinja_node *g = node_new(p, JINJA_N_GETITEM);
      g->a = node;
      if (args.n == 1) {
        g->b = args.v[0];
      } else {
        g->b = node_new(p, JINJA_N_TUPLE);
        g->b->args = args.v;
        g->b->num_args = args.n;
      }
      node = g;
    } else if (is_op(t, "(")) {
      node = parse_call(p, node);
    } else {
      return node;
    }
  }
}

static struct jinja_node *parse_filter_expr(struct jinja_parser *p, struct jinja_node *node) {
  for (;;) {
    if (is_op(cur(p), "|")) {
      node = parse_filter(p, node, 0);
    } else if (is_name(cur(p), "is")) {
      node = parse_test(p, node);
    } else if (is_op(cur(p), "(")) {
      node = parse_call(p, node);
    } else {
      return node;
    }
  }
}

static struct jinja_node *parse_primary(struct jinja_parser *p) {
  const struct jinja_token *t = cur(p);
  enter(p);
  struct jinja_node *n;
  if (t->type == JINJA_TOK_NAME) {
    advance(p);
    if (!strcmp(t->text, "true") || !strcmp(t->text, "True") || !strcmp(t->text, "false") ||
        !strcmp(t->text, "False")) {
      n = node_new(p, JINJA_N_CONST);
      n->value = jinja_bool(t->text[0] == 't' || t->text[0] == 'T');
    } else if (!strcmp(t->text, "none") || !strcmp(t->text, "None")) {
      n = node_new(p, JINJA_N_CONST);
      n->value = jinja_none();
    } else {
      n = node_new(p, JINJA_N_NAME);
      n->name = t->text;
    }
  } else if (t->type == JINJA_TOK_STRING) {
    /* Adjacent string literals concatenate, as in Python. */
    struct jinja_buf b;
    jinja_buf_init(&b, p->st, 0, JINJA_MAX_OUTPUT);
    while (cur(p)->type == JINJA_TOK_STRING) {
      jinja_buf_add(&b, cur(p)->value.u.s->data, cur(p)->value.u.s->len);
      advance(p);
    }
    n = node_new(p, JINJA_N_CONST);
    n->value = jinja_buf_value(&b);
  } else if (t->type == JINJA_TOK_INT || t->type == JINJA_TOK_FLOAT) {
    advance(p);
    n = node_new(p, JINJA_N_CONST);
    n->value = t->value;
  } else if (is_op(t, "(")) {
    advance(p);
    n = parse_tuple(p, 1, NULL, 1);
    expect_op(p, ")");
  } else if (is_op(t, "[")) {
    advance(p);
    struct jinja_nodes items = {0};
    while (list_has_next(p, "]", items.n))
      jinja_nodes_push(p->st, &items, parse_expression(p, 1));
    expect_op(p, "]");
    n = node_new(p, JINJA_N_LIST);
    n->args = items.v;
    n->num_args = items.n;
  } else if (is_op(t, "{")) {
    advance(p);
    struct jinja_nodes keys = {0}, vals = {0};
    while (list_has_next(p, "}", keys.n)) {
      jinja_nodes_push(p->st, &keys, parse_expression(p, 1));
      expect_op(p, ":");
      jinja_nodes_push(p->st, &vals, parse_expression(p, 1));
    }
    expect_op(p, "}");
    n = node_new(p, JINJA_N_DICT);
    n->args = keys.v;
    n->num_args = keys.n;
    n->kwargs = vals.v;
    n->num_kwargs = vals.n;
  } else {
    unexpected(p, NULL);
  }
  n->pos = t->pos; /* where the primary starts (most nodes above are made past their token) */
  leave(p);
  return n;
}

static struct jinja_node *parse_unary(struct jinja_parser *p, int with_filter) {
  struct jinja_node *node;
  enter(p);
  if (is_op(cur(p), "-") || is_op(cur(p), "+")) {
    node = node_new(p, JINJA_N_UNARY);
    node->op = cur(p)->text[0];
    advance(p);
    node->a = parse_unary(p, 0);
  } else {
    node = parse_primary(p);
  }
  node = parse_postfix(p, node);
  if (with_filter)
    node = parse_filter_expr(p, node);
  leave(p);
  return node;
}

static struct jinja_node *binary(struct jinja_parser *p, enum jinja_node_kind kind, int op,
                                 struct jinja_node *a, struct jinja_node *b) {
  struct jinja_node *n = node_new(p, kind);
  n->op = op;
  n->a = a;
  n->b = b;
  return n;
}

/* A level of the ladder with one operator: OPERAND (TOKEN OPERAND)*, left-associative, each TOKEN making a node
 * KIND with OP. TOKEN is an operator ("**", "~") or a keyword ("and", "or"): the lexer never makes one of
 * them the other, so either matches. */
static struct jinja_node *parse_left_assoc(struct jinja_parser *p,
                                           struct jinja_node *(*operand)(struct jinja_parser *p), const char *token,
                                           enum jinja_node_kind kind, int op) {
  struct jinja_node *left = operand(p);
  while (is_op(cur(p), token) || is_name(cur(p), token)) {
    advance(p);
    left = binary(p, kind, op, left, operand(p));
  }
  return left;
}

static struct jinja_node *parse_filtered_unary(struct jinja_parser *p) { return parse_unary(p, 1); }

static struct jinja_node *parse_pow(struct jinja_parser *p) {
  return parse_left_assoc(p, parse_filtered_unary, "**", JINJA_N_BINARY, JINJA_OP_POW);
}

static struct jinja_node *parse_math2(struct jinja_parser *p) {
  struct jinja_node *left = parse_pow(p);
  for (;;) {
    int op = is_op(cur(p), "*")    ? JINJA_OP_MUL
             : is_op(cur(p), "/")  ? JINJA_OP_DIV
             : is_op(cur(p), "//") ? JINJA_OP_FLOORDIV
             : is_op(cur(p), "%")  ? JINJA_OP_MOD
                                   : 0;
    if (!op)
      return left;
    advance(p);
    left = binary(p, JINJA_N_BINARY, op, left, parse_pow(p));
  }
}

static struct jinja_node *parse_concat(struct jinja_parser *p) {
  return parse_left_assoc(p, parse_math2, "~", JINJA_N_BINARY, JINJA_OP_CONCAT);
}

static struct jinja_node *parse_math1(struct jinja_parser *p) {
  struct jinja_node *left = parse_concat(p);
  for (;;) {
    int op = is_op(cur(p), "+") ? JINJA_OP_ADD : is_op(cur(p), "-") ? JINJA_OP_SUB : 0;
    if (!op)
      return left;
    advance(p);
    left = binary(p, JINJA_N_BINARY, op, left, parse_concat(p));
  }
}

static struct jinja_node *parse_compare(struct jinja_parser *p) {
  struct jinja_node *left = parse_math1(p), *result = NULL;
  for (;;) {
    const struct jinja_token *t = cur(p);
    int op = 0;
    if (t->type == JINJA_TOK_OP) {
      static const char *names[] = {"==", "!=", "<", "<=", ">", ">="};
      static const int ops[] = {JINJA_OP_EQ, JINJA_OP_NE, JINJA_OP_LT,
                                JINJA_OP_LE, JINJA_OP_GT, JINJA_OP_GE};
      for (int i = 0; i < 6; i++)
        if (!strcmp(t->text, names[i]))
          op = ops[i];
      if (op)
        advance(p);
    } else if (is_name(t, "in")) {
      op = JINJA_OP_IN;
      advance(p);
    } else if (is_name(t, "not") && is_name(peek2(p), "in")) {
      op = JINJA_OP_NOTIN;
      advance(p);
      advance(p);
    }
    if (!op)
      return result ? result : left;
    struct jinja_node *right = parse_math1(p);
    struct jinja_node *cmp = binary(p, JINJA_N_COMPARE, op, left, right);
    /* a < b < c means (a < b) and (b < c). */
    result = result ? binary(p, JINJA_N_AND, 0, result, cmp) : cmp;
    left = right;
  }
}

static struct jinja_node *parse_not(struct jinja_parser *p) {
  if (is_name(cur(p), "not")) {
    struct jinja_node *n = node_new(p, JINJA_N_NOT);
    advance(p);
    enter(p);
    n->a = parse_not(p);
    leave(p);
    return n;
  }
  return parse_compare(p);
}

static struct jinja_node *parse_and(struct jinja_parser *p) {
  return parse_left_assoc(p, parse_not, "and", JINJA_N_AND, 0);
}

static struct jinja_node *parse_or(struct jinja_parser *p) {
  return parse_left_assoc(p, parse_and, "or", JINJA_N_OR, 0);
}

static struct jinja_node *parse_condexpr(struct jinja_parser *p) {
  struct jinja_node *e1 = parse_or(p);
  while (is_name(cur(p), "if")) {
    advance(p);
    struct jinja_node *c = node_new(p, JINJA_N_COND);
    c->a = parse_or(p);
    c->b = e1;
    if (is_name(cur(p), "else")) {
      advance(p);
      enter(p);
      c->c = parse_condexpr(p);
      leave(p);
    }
    e1 = c;
  }
  return e1;
}

static struct jinja_node *parse_expression(struct jinja_parser *p, int with_condexpr) {
  enter(p);
  struct jinja_node *n = with_condexpr ? parse_condexpr(p) : parse_or(p);
  leave(p);
  return n;
}

/* Assignment targets: a name, ns.attr (WITH_NS), or a tuple of names. */
static struct jinja_node *parse_assign_target(struct jinja_parser *p, int with_ns,
                                              const char *extra_end) {
  struct jinja_nodes items = {0};
  int is_tuple = 0;
  for (;;) {
    if (items.n)
      expect_op(p, ",");
    if (is_tuple_end(p, extra_end) || is_op(cur(p), "="))
      break;
    const char *name = expect_name(p);
    struct jinja_node *n;
    if (with_ns && is_op(cur(p), ".")) {
      advance(p);
      n = node_new(p, JINJA_N_NSREF);
      n->name = name;
      n->attr = expect_name(p);
    } else {
      n = node_new(p, JINJA_N_NAME);
      n->name = name;
    }
    jinja_nodes_push(p->st, &items, n);
    if (is_op(cur(p), ","))
      is_tuple = 1;
    else
      break;
  }
  if (items.n == 0)
    unexpected(p, "name");
  if (!is_tuple)
    return items.v[0];
  struct jinja_node *t = node_new(p, JINJA_N_TUPLE);
  t->args = items.v;
  t->num_args = items.n;
  return t;
}

/* Parameters of a macro or call block: (a, b=default, ...). */
static void parse_signature(struct jinja_parser *p, struct jinja_node *n) {
  struct jinja_names names = {0};
  struct jinja_nodes defaults = {0};
  expect_op(p, "(");
  while (list_has_next(p, ")", names.n)) {
    jinja_names_push(p->st, &names, expect_name(p));
    struct jinja_node *def = NULL;
    if (is_op(cur(p), "=")) {
      advance(p);
      def = parse_expression(p, 1);
    }
    jinja_nodes_push(p->st, &defaults, def);
  }
  expect_op(p, ")");
  n->kwnames = names.v;
  n->kwargs = defaults.v;
  n->num_kwargs = names.n;
}

static struct jinja_node *parse_body(struct jinja_parser *p, const char *const *ends);

/* Consumes "{% NAME" ... "%}" where NAME ends a body: the parser stands on NAME. */
static void end_tag(struct jinja_parser *p, const char *name) {
  if (!is_name(cur(p), name))
    unexpected(p, name);
  advance(p);
  expect_block_end(p);
}

/* The rest of a block statement whose head the parser stands at the end of: "%}", the body, "{% END %}". */
static struct jinja_node *parse_block_body(struct jinja_parser *p, const char *end) {
  expect_block_end(p);
  const char *const ends[] = {end, NULL};
  struct jinja_node *body = parse_body(p, ends);
  end_tag(p, end);
  return body;
}

static struct jinja_node *parse_statement(struct jinja_parser *p) {
  const struct jinja_token *t = cur(p);
  if (t->type != JINJA_TOK_NAME)
    unexpected(p, "statement name");
  const char *kw = t->text;
  advance(p);
  struct jinja_node *n;
  if (!strcmp(kw, "for")) {
    n = node_new(p, JINJA_N_FOR);
    n->a = parse_assign_target(p, 0, "in");
    if (!is_name(cur(p), "in"))
      unexpected(p, "in");
    advance(p);
    n->b = parse_tuple(p, 0, "recursive", 0);
    if (is_name(cur(p), "if")) {
      advance(p);
      n->c = parse_expression(p, 1);
    }
    if (is_name(cur(p), "recursive")) {
      advance(p);
      n->op = 1; /* the body may call loop(items) */
    }
    expect_block_end(p);
    static const char *const ends1[] = {"endfor", "else", NULL};
    n->body = parse_body(p, ends1);
    if (is_name(cur(p), "else")) {
      end_tag(p, "else");
      static const char *const ends2[] = {"endfor", NULL};
      n->else_body = parse_body(p, ends2);
    }
    end_tag(p, "endfor");
  } else if (!strcmp(kw, "if")) {
    n = node_new(p, JINJA_N_IF);
    n->a = parse_tuple(p, 0, NULL, 0);
    expect_block_end(p);
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    n->body = parse_body(p, ends);
    struct jinja_node *last = n;
    for (;;) {
      if (is_name(cur(p), "elif")) {
        advance(p);
        struct jinja_node *e = node_new(p, JINJA_N_IF);
        e->a = parse_tuple(p, 0, NULL, 0);
        expect_block_end(p);
        e->body = parse_body(p, ends);
        struct jinja_node *wrap = node_new(p, JINJA_N_BODY);
        wrap->args = jinja_alloc(p->st, sizeof(struct jinja_node *));
        wrap->args[0] = e;
        wrap->num_args = 1;
        last->else_body = wrap;
        last = e;
      } else if (is_name(cur(p), "else")) {
        end_tag(p, "else");
        static const char *const ends2[] = {"endif", NULL};
        last->else_body = parse_body(p, ends2);
      } else {
        break;
      }
    }
    end_tag(p, "endif");
  } else if (!strcmp(kw, "set")) {
    struct jinja_node *target = parse_assign_target(p, 1, NULL);
    if (is_op(cur(p), "=")) {
      advance(p);
      n = node_new(p, JINJA_N_SET);
      n->a = target;
      n->b = parse_tuple(p, 1, NULL, 0);
      expect_block_end(p);
    } else {
      n = node_new(p, JINJA_N_SET_BLOCK);
      n->a = target;
      if (is_op(cur(p), "|"))
        n->b = parse_filter(p, NULL, 0);
      n->body = parse_block_body(p, "endset");
    }
  } else if (!strcmp(kw, "macro")) {
    n = node_new(p, JINJA_N_MACRO);
    n->name = expect_name(p);
    parse_signature(p, n);
    expect_block_end(p);
    static const char *const ends[] = {"endmacro", NULL};
    n->body = parse_body(p, ends);
    advance(p);
    if (cur(p)->type == JINJA_TOK_NAME)
      advance(p);
    expect_block_end(p);
  } else if (!strcmp(kw, "call")) {
    n = node_new(p, JINJA_N_CALL_BLOCK);
    if (is_op(cur(p), "("))
      parse_signature(p, n);
    n->a = parse_expression(p, 1);
    if (n->a->kind != JINJA_N_CALL)
      jinja_fail(p->st, "expected call");
    n->body = parse_block_body(p, "endcall");
  } else if (!strcmp(kw, "filter")) {
    n = node_new(p, JINJA_N_FILTER_BLOCK);
    n->b = parse_filter(p, NULL, 1);
    n->body = parse_block_body(p, "endfilter");
  } else if (!strcmp(kw, "with")) {
    n = node_new(p, JINJA_N_WITH);
    struct jinja_names names = {0};
    struct jinja_nodes vals = {0};
    while (cur(p)->type != JINJA_TOK_BLOCK_END) {
      if (names.n)
        expect_op(p, ",");
      jinja_names_push(p->st, &names, expect_name(p));
      expect_op(p, "=");
      jinja_nodes_push(p->st, &vals, parse_expression(p, 1));
    }
    n->kwnames = names.v;
    n->kwargs = vals.v;
    n->num_kwargs = names.n;
    n->body = parse_block_body(p, "endwith");
  } else if (!strcmp(kw, "generation")) {
    /* transformers' AssistantTracker tag: marks assistant text, renders its body unchanged. */
    n = parse_block_body(p, "endgeneration");
  } else if (!strcmp(kw, "break") || !strcmp(kw, "continue")) {
    n = node_new(p, kw[0] == 'b' ? JINJA_N_BREAK : JINJA_N_CONTINUE);
    expect_block_end(p);
  } else {
    jinja_fail(p->st, "Encountered unknown tag '%s'", kw);
  }
  return n;
}

static struct jinja_node *parse_body(struct jinja_parser *p, const char *const *ends) {
  enter(p);
  struct jinja_nodes stmts = {0};
  struct jinja_node *body = node_new(p, JINJA_N_BODY);
  for (;;) {
    const struct jinja_token *t = cur(p);
    if (t->type == JINJA_TOK_EOF) {
      if (ends) {
        char tags[256] = "";
        for (size_t i = 0; ends[i]; i++)
          snprintf(tags + strlen(tags), sizeof tags - strlen(tags), "%s'%s'", i ? " or " : "", ends[i]);
        jinja_fail(p->st, "Unexpected end of template. Jinja was looking for the following tags: %s.",
                   tags);
      }
      break;
    }
    if (t->type == JINJA_TOK_TEXT) {
      struct jinja_node *n = node_new(p, JINJA_N_TEXT);
      n->value = t->value;
      advance(p);
      jinja_nodes_push(p->st, &stmts, n);
    } else if (t->type == JINJA_TOK_VAR_BEGIN) {
      advance(p);
      struct jinja_node *n = node_new(p, JINJA_N_OUTPUT);
      n->a = parse_tuple(p, 1, NULL, 0);
      if (cur(p)->type != JINJA_TOK_VAR_END)
        unexpected(p, "end of print statement");
      advance(p);
      jinja_nodes_push(p->st, &stmts, n);
    } else if (t->type == JINJA_TOK_BLOCK_BEGIN) {
      advance(p);
      int is_end = 0;
      for (size_t i = 0; ends && ends[i]; i++)
        if (is_name(cur(p), ends[i]))
          is_end = 1;
      if (is_end)
        break;
      jinja_nodes_push(p->st, &stmts, parse_statement(p));
    } else {
      unexpected(p, NULL);
    }
  }
  body->args = stmts.v;
  body->num_args = stmts.n;
  leave(p);
  return body;
}

/* An expression's position is where it starts: a binary, filter, test, call, attribute or
 * subscript node begins with its left operand (N->a), not at the token it was made at. */
static void fix_positions(struct jinja_node *n) {
  if (!n)
    return;
  fix_positions(n->a);
  fix_positions(n->b);
  fix_positions(n->c);
  fix_positions(n->body);
  fix_positions(n->else_body);
  for (size_t i = 0; i < n->num_args; i++)
    fix_positions(n->args[i]);
  for (size_t i = 0; i < n->num_kwargs; i++)
    fix_positions(n->kwargs[i]);
  if (n->a && n->a->pos < n->pos)
    n->pos = n->a->pos;
}

struct jinja_node *jinja_parse(struct jinja_state *st, const struct jinja_token *toks, size_t n) {
  struct jinja_parser p = {.st = st, .t = toks, .n = n, .pos = 0};
  st->at = toks[0].pos;
  struct jinja_node *root = parse_body(&p, NULL);
  fix_positions(root);
  return root;
}
